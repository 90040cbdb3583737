#!/usr/bin/env bash
# Session 30 ran parts 1, 3 (twice), 4, 6-13; 2 and 5 not run (their branches were not merged). Results: notes/perf.md,
# session 30.
# Owed device calls after session 29, one part per call (each under the 10-minute limit). Unmerged branches travel
# as patches onto main under _br/ (untracked; make them first, rebasing the branch on main if one does not apply):
#   git diff $(git merge-base main det-banded) det-banded -- . ':!build' > _br/detband.patch
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session30.sh N", carry=[".kit_bench"])
# 1: branch det-banded (the deterministic causal backward in the banded order, highest first in each band; model:
#    d64 4x4096 32/8 1.158 -> 1.143 of the bound at its band 4): the backward GPU tests (deterministic, causal,
#    band), then bench_bwd's causal rows at SM120 occupancy for main and the branch in one call (the
#    ours_deterministic column), ~9 min; merge if deterministic causal is faster and nothing else moves
# 2: branch det-banded: memcheck + racecheck + synccheck of bwd_det, ~3 min
# 3: carry=[".kit_client"] (source .kit_client/device-setup.sh): the training-step timing at 4 x 2048 (session 29's
#    part 14 ran on a slow host: SDPA +57% against 2026-11-25), ~2 min
# 4: branch det-release (the deterministic turn released a step later, under the next step's first GEMM): the
#    deterministic backward GPU tests, then bench_bwd's ours / ours_deterministic at SM120 occupancy, every case,
#    main and the branch in one call, ~6 min
# 5: branch det-release: memcheck + racecheck + synccheck of bwd_det, ~3 min
# 6: where the deterministic mode's time goes: probes (untracked patches: ``nowait`` skips the turn's wait,
#    timing only; ``hifirst`` runs the default mode's key blocks highest first, per pair, as the deterministic
#    mode launches them) against main in one call, ours / ours_deterministic; then Nsight Compute's source page
#    (warp stall samples per SASS line) of main's d64 causal backward, default and deterministic, ~8 min
# 7: branches det-release (now: group 1 reads the turn and releases the previous step's in its wait for P) and
#    det-relaxed (its turn reads relaxed: no L1 invalidation): deterministic GPU tests on both, then
#    ours / ours_deterministic at SM120 occupancy, every case, main and both branches in one call, ~8 min
# 8: after the deterministic role split's turn moved into group 1's slack (main): bench_bwd, both occupancies, every
#    implementation (the README's backward table), ~9 min
# 9: memcheck + racecheck + synccheck of bwd_det and bwd_rolesplit, then the backward GPU tests of the
#    deterministic mode and the role split, ~5 min
# 10: racecheck of bwd_det and bwd_rolesplit (part 9's ran out of time behind a 248 s cold compile), ~8 min
# 11: branch det-ms-late (the 8-warp kernel's deterministic release from the last warp; thread 0's warp reads the
#    turn): deterministic GPU tests at d192 / d256, then ours / ours_deterministic at d192 and d256, main and the
#    branch, ~4 min
# 12: branch sparse-banded (the block-sparse backward's key blocks longest first in bands): the block-sparse GPU
#     tests, then bench_flex's flag and list rows at SM120 occupancy, main (ours only) and the branch (with
#     FlexAttention), ~8 min
# 13: branch sparse-banded: memcheck + racecheck of the sparse family, ~5 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) branch detband && (cd /tmp/detband && shards 260 tests/test_bwd_gpu.py -k "determin or causal or band")
     for t in "$root" /tmp/detband; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 140 python3 bench_bwd.py --occupancy sm120 --cases 4x4096_32/8_causal \
          --out "$OUT/bwd_det_$(basename "$t").json" 2>&1 | grep -v -i warn | grep "\[" | tail -4)
     done ;;
  2) branch detband && cd /tmp/detband && timeout 400 python3 tools/sanitize.py --families bwd_det \
       --tools memcheck racecheck synccheck --jobs 3 --json "$OUT/sanitizer_bwd_det.json" --log-dir "$OUT/sanlog" \
       > "$OUT/sanitizer_bwd_det.txt" 2>&1; tail -6 "$OUT/sanitizer_bwd_det.txt" ;;
  3) timeout 540 python3 tools/train_check.py --steps 40 --seq 2048 --batch 4 --models llama plain \
       --out "$OUT/train_timing_s2048.json" 2>&1 | grep -v -i warn | tail -12 ;;
  4) branch detrelease && (cd /tmp/detrelease && shards 140 tests/test_bwd_gpu.py -k "determin")
     for t in "$root" /tmp/detrelease; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 215 python3 bench_bwd.py --occupancy sm120 --impls ours ours_deterministic \
          --out "$OUT/bwd_det_$(basename "$t").json" 2>&1 | grep -v -i warn | grep "\[" | tail -10)
     done ;;
  5) branch detrelease && cd /tmp/detrelease && timeout 400 python3 tools/sanitize.py --families bwd_det \
       --tools memcheck racecheck synccheck --jobs 3 --json "$OUT/sanitizer_bwd_det.json" --log-dir "$OUT/sanlog" \
       > "$OUT/sanitizer_bwd_det.txt" 2>&1; tail -6 "$OUT/sanitizer_bwd_det.txt" ;;
  6) for p in nowait hifirst; do branch $p; done
     for t in "$root" /tmp/nowait /tmp/hifirst; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 120 python3 bench_bwd.py --occupancy sm120 --impls ours ours_deterministic \
          --cases d64_4x4096_32/8_causal d128_4x4096_32/8 d192 --out "$OUT/bwd_probe_$(basename "$t").json" 2>&1 \
          | grep -v -i warn | grep "\[" | tail -5)
     done
     for det in "" --deterministic; do
       timeout 100 ncu --kernel-name regex:RoleSplit --launch-skip 1 --launch-count 1 --section SourceCounters \
         --section WarpStateStats --section SpeedOfLight -o /tmp/rep$det -f python3 benchmarks/explore/profile_bwd.py \
         --head-dim 64 --causal $det > /dev/null 2>&1
       ncu -i /tmp/rep$det.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/src_d64c$det.csv.gz"
       ncu -i /tmp/rep$det.ncu-rep --page details --csv 2>/dev/null > "$OUT/details_d64c$det.csv"
     done; ls -la "$OUT" ;;
  7) for p in detrelease detrelaxed; do
       branch $p && (cd /tmp/$p && shards 100 tests/test_bwd_gpu.py -k "determin"; cp "$OUT/tests_7.txt" "$OUT/tests_7_$p.txt")
     done
     for t in "$root" /tmp/detrelease /tmp/detrelaxed; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 150 python3 bench_bwd.py --occupancy sm120 --impls ours ours_deterministic \
          --out "$OUT/bwd_det_$(basename "$t").json" 2>&1 | grep -v -i warn | grep "\[" | tail -10)
     done ;;
  8) (cd benchmarks && timeout 570 python3 bench_bwd.py --occupancy both --out "$OUT/bwd.json" 2>&1 \
       | grep -v -i warn | grep "\[" | tail -20) ;;
  9) timeout 330 python3 tools/sanitize.py --families bwd_det bwd_rolesplit --tools memcheck racecheck synccheck \
       --jobs 3 --json "$OUT/sanitizer_bwd_det.json" --log-dir "$OUT/sanlog" > "$OUT/sanitizer_bwd_det.txt" 2>&1
     tail -8 "$OUT/sanitizer_bwd_det.txt"
     shards 200 tests/test_bwd_gpu.py -k "determin or role or dropout" ;;
  10) timeout 580 python3 tools/sanitize.py --families bwd_det bwd_rolesplit --tools racecheck \
       --jobs 2 --json "$OUT/sanitizer_bwd_det_race.json" --log-dir "$OUT/sanlog" > "$OUT/sanitizer_bwd_det_race.txt" 2>&1
      tail -4 "$OUT/sanitizer_bwd_det_race.txt" ;;
  11) branch detmslate && (cd /tmp/detmslate && shards 150 tests/test_bwd_gpu.py -k "determin and (192 or 256)")
      for t in "$root" /tmp/detmslate; do
        echo "== $t"
        (cd "$t/benchmarks" && timeout 120 python3 bench_bwd.py --occupancy sm120 --impls ours ours_deterministic \
           --cases d192 d256 --out "$OUT/bwd_det_$(basename "$t").json" 2>&1 | grep -v -i warn | grep "\[" | tail -3)
      done ;;
  12) branch sparseband && (cd /tmp/sparseband && shards 150 tests/test_block_sparse_gpu.py)
      (cd benchmarks && timeout 150 python3 bench_flex.py --occupancy sm120 --impls ours --cases "causal flag" \
         "block sparse" --out "$OUT/flex_main.json" 2>&1 | grep -v -i warn | grep "\[" | tail -6)
      (cd /tmp/sparseband/benchmarks && timeout 240 python3 bench_flex.py --occupancy sm120 --cases "causal flag" \
         "block sparse" --out "$OUT/flex_sparseband.json" 2>&1 | grep -v -i warn | grep "\[" | tail -6) ;;
  13) branch sparseband && cd /tmp/sparseband && timeout 500 python3 tools/sanitize.py --families sparse \
        --tools memcheck racecheck --jobs 2 --json "$OUT/sanitizer_sparse.json" --log-dir "$OUT/sanlog" \
        > "$OUT/sanitizer_sparse.txt" 2>&1; tail -4 "$OUT/sanitizer_sparse.txt" ;;
  *) echo "part 1-13" ;;
esac
