#!/usr/bin/env bash
# Owed device calls after session 28, one part per call (each under the 10-minute limit). Unmerged branches travel
# as patches onto main under _br/ (untracked; the device carry limit has no room for whole trees):
#   git diff $(git merge-base main d64-small-grid) d64-small-grid -- . ':!build' > _br/smallgrid.patch
#   git diff $(git merge-base main dropout-8bit) dropout-8bit -- . ':!build' > _br/byte.patch
# (the branches' own changes only; rebase them on main first if a patch does not apply)
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session29.sh N", carry=[".kit_bench"])
# 1: branch d64-small-grid: explore/small_grid_ab.py with CUDA-graph replays (GPU time only) and eager, the sub-wave
#    rule against the table tile at the same shapes; merge if the graph timings show the sub-wave MHA and GQA
#    grids faster and nothing slower, ~5 min
# 2: tune_bwd over classes 64 and 96 with the role-split candidates (session 28's part 3, never run), ~9 min
# 3: d96's table tile against its 8-warp and role-split 64x64 tiles (explore/deterministic_tiles.py --head-dim 96),
#    ~5 min
# 4: branch dropout-8bit (byte values: whole Philox calls in the backward's 32-column warp layouts): the dropout GPU
#    suite, then bench_dropout at SM120 occupancy for main and the branch in one call, ~8 min
# 5: branch dropout-8bit: memcheck + racecheck + synccheck of the dropout family, ~3 min
# 6: d96's table entry on the 64x64 role split (main): the backward GPU suite and the dropout suite, then bench_bwd's
#    d96 rows at both occupancies, ~8 min
# 7: memcheck + racecheck + synccheck of bwd, bwd_det, bwd_rolesplit and dropout (d96 added to each), ~6 min
# 8: dropout's cost per kernel (explore/dropout_kernels.py: torch.profiler GPU times, d64 / d128 full, causal and
#    a window, d64 also on the 64x64 role split), ~3 min
# 9: ncu of the d64 backward's main kernel (the 64x128 role split) full / causal / window, with and without
#    dropout: duration, instructions, stall reasons (explore/profile_bwd.py), ~5 min
# 10: the causal key-block order's bands (explore/bwd_band.py, CUDA-graph times per band), then the backward GPU
#    suite, ~9 min
# 11: after the band rule (the schedule model): bwd_band.py again (with the rule's row), bench_bwd's causal rows
#    and bench_dropout's d64 causal at SM120 occupancy, ~7 min
# 12: the backward GPU tests (causal and the band test) and memcheck + racecheck of the bwd family, ~5 min
# 13: bench_bwd's causal rows at the H100's own occupancy and bench_dropout at SM120 occupancy (every case), after
#    the banded order, ~7 min
# 14: carry=[".kit_client"] (source .kit_client/device-setup.sh): the training-step timing at 4 x 2048 (llama, plain;
#    40 steps, as train_timing_s2048_h100_2026-11-25.json) after the d96 and causal-order changes, ~5 min
# 15: after d256's exclusion from the banded order: the backward GPU tests at d256 and the band test, ~3 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) branch smallgrid && cd /tmp/smallgrid
     timeout 250 python3 benchmarks/explore/small_grid_ab.py --graph --out "$OUT/small_grid_ab_graph.json" 2>&1 \
       | grep -v -i warn | tail -10
     timeout 200 python3 benchmarks/explore/small_grid_ab.py --out "$OUT/small_grid_ab_eager.json" 2>&1 \
       | grep -v -i warn | tail -10 ;;
  2) timeout 560 python3 benchmarks/tune_bwd.py --conformance benchmarks/results/conformance_bwd_candidates_sm120a_2026-11-25.json.gz \
       --classes 64 96 --out "$OUT/tune_bwd.json" 2>&1 | grep -v -i warn | tail -30 ;;
  3) timeout 300 python3 benchmarks/explore/deterministic_tiles.py --head-dim 96 \
       --out "$OUT/bwd_tiles_d96.json" 2>&1 | grep -v -i warn | tail -24 ;;
  4) branch byte && (cd /tmp/byte && shards 300 tests/test_dropout_gpu.py)
     for t in "$root" /tmp/byte; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 130 python3 bench_dropout.py --occupancy sm120 --cases d64 d128 \
          --out "$OUT/dropout_$(basename "$t").json" 2>&1 | grep -v -i warn | tail -4)
     done ;;
  5) branch byte && cd /tmp/byte && timeout 400 python3 tools/sanitize.py --families dropout \
       --tools memcheck racecheck synccheck --jobs 3 --json "$OUT/sanitizer_dropout.json" --log-dir "$OUT/sanlog" \
       > "$OUT/sanitizer_dropout.txt" 2>&1; tail -6 "$OUT/sanitizer_dropout.txt" ;;
  6) shards 330 tests/test_bwd_gpu.py tests/test_dropout_gpu.py
     (cd benchmarks && timeout 200 python3 bench_bwd.py --occupancy both --cases d96 --out "$OUT/bwd_d96.json" 2>&1 \
       | grep -v -i warn | tail -8) ;;
  7) timeout 560 python3 tools/sanitize.py --families bwd bwd_det bwd_rolesplit dropout \
       --tools memcheck racecheck synccheck --jobs 4 --json "$OUT/sanitizer_bwd_d96.json" --log-dir "$OUT/sanlog" \
       > "$OUT/sanitizer_bwd_d96.txt" 2>&1; tail -16 "$OUT/sanitizer_bwd_d96.txt" ;;
  8) timeout 400 python3 benchmarks/explore/dropout_kernels.py --rs64 --out "$OUT/dropout_kernels.json" 2>&1 \
       | grep -v -i warn | tail -12 ;;
  9) for m in full causal window; do
       for p in 0 0.1; do
         case $m in full) a="";; causal) a="--causal";; window) a="--window 1024";; esac
         FA4_SM120_OCCUPANCY=model timeout 100 ncu --kernel-name regex:RoleSplit --launch-skip 1 --launch-count 1 \
           --section SpeedOfLight --section WarpStateStats --section InstructionStats --section LaunchStats \
           --section Occupancy --page raw --csv python3 benchmarks/explore/profile_bwd.py --head-dim 64 $a \
           --dropout $p > "$OUT/ncu_d64_${m}_p$p.csv" 2>/dev/null
         echo "$m p=$p: $(wc -l < "$OUT/ncu_d64_${m}_p$p.csv") lines"
       done
     done ;;
  10) timeout 330 python3 benchmarks/explore/bwd_band.py --out "$OUT/bwd_band.json" 2>&1 | grep -v -i warn | tail -12
      shards 240 tests/test_bwd_gpu.py ;;
  11) timeout 200 python3 benchmarks/explore/bwd_band.py --out "$OUT/bwd_band.json" 2>&1 | grep -v -i warn | tail -12
      (cd benchmarks && timeout 260 python3 bench_bwd.py --occupancy sm120 --cases causal --out "$OUT/bwd_causal.json" \
         2>&1 | grep -v -i warn | tail -10
       timeout 100 python3 bench_dropout.py --occupancy sm120 --cases "d64 causal" --out "$OUT/dropout_d64c.json" \
         2>&1 | grep -v -i warn | tail -2) ;;
  12) shards 200 tests/test_bwd_gpu.py -k "causal or band or gqa or varlen"
      timeout 300 python3 tools/sanitize.py --families bwd --tools memcheck racecheck --jobs 2 \
        --json "$OUT/sanitizer_bwd_band.json" --log-dir "$OUT/sanlog" > "$OUT/sanitizer_bwd_band.txt" 2>&1
      tail -4 "$OUT/sanitizer_bwd_band.txt" ;;
  13) cd benchmarks
      timeout 280 python3 bench_bwd.py --occupancy h100 --cases causal --out "$OUT/bwd_causal_h100.json" 2>&1 \
        | grep -v -i warn | grep "\[" | tail -10
      timeout 290 python3 bench_dropout.py --occupancy sm120 --out "$OUT/dropout.json" 2>&1 | grep -v -i warn \
        | grep "\[" | tail -8 ;;
  14) timeout 540 python3 tools/train_check.py --steps 40 --seq 2048 --batch 4 --models llama plain \
        --out "$OUT/train_timing_s2048.json" 2>&1 | grep -v -i warn | tail -12 ;;
  15) shards 200 tests/test_bwd_gpu.py -k "256 or band" ;;
  *) echo "part 1-15" ;;
esac
