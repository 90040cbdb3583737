#!/usr/bin/env bash
# Owed device calls after session 27 (device time ran out), one part per call (each under the 10-minute limit):
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session28.sh N", carry=[".kit_bench"])
# 1: sanitizer (memcheck + racecheck) on the backward family (d64's table entry is now the 64x128 role split) and
#    the block-sparse family (the forward's full-list steps without the mask_mod), ~8 min
# 2: bench_bwd's d64 rows at the H100's own occupancy (the 64x128 role split, 91 KB: two CTAs per H100 SM) and
#    bench_dropout's d64 rows (the dropout cost against the faster d64 backward), ~6 min
# 3: tune_bwd over every class with the role-split candidates (the table's 4-warp d96 entry and the d64 entry were
#    chosen before the fragment-order dQ and the role split's later changes), ~9 min
# 4: small MHA grids at d64 (the 64x128 tile launches half the CTAs) against the former 4-warp tile, then d96's
#    table tile against its 8-warp and role-split 64x64 tiles (explore/deterministic_tiles.py), ~6 min
# 6: sanitizer (memcheck + racecheck) on the dropout family alone (the role split's new PREAD barrier; session 26's
#    racecheck of that family did not finish inside a call shared with others), ~9 min
# 5: branch d64-dropout-rs128 as a patch (git diff main d64-dropout-rs128 -- . ':!build' > _br/rs128.patch; it
#    moves d64 causal / window dropout to the 64x128 role split): the dropout GPU suite on the branch, then
#    bench_dropout's d64 rows at SM120 occupancy for main and the branch in one call; merge if green and cheaper, ~8 min
# 7: branch rolesplit-one-draw as a patch (_br/onedraw.patch: the role split's dropout draws the keep flags once per
#    tile): the dropout GPU suite on the branch, then bench_dropout's d64 / d128 rows at SM120 occupancy for main
#    and the branch in one call, ~7 min
# 8: part 6 on the branch rolesplit-one-draw (its new PZ barrier), ~9 min
# 9: racecheck of the dropout family on main and on the one-draw branch (part 8 found RAW hazards in the role
#    split on the branch; main's role-split dropout never ran under racecheck), full logs and the role split's
#    device SASS (to place the hazards' offsets), ~5 min
# 10: racecheck of explore/race_probe.py's cases (the dropout family's d128 role-split case varied one thing at a
#    time: dropout, deterministic, whole tiles, MHA; and its d64 case), on main, ~4 min
# 11: on the one-draw branch with barrier PZ a full barrier (both groups at the same barrier count per step): the
#    race_probe cases, then memcheck + racecheck + synccheck of the dropout family, ~6 min
# 12: racecheck (race_probe base, whole_tiles) and synccheck (base) of the one-draw branch (group 0: P0 + arrive PZ)
#    and of the same with one more group-1 barrier (both groups at the same barrier count per step), ~5 min
# 13: branch onedraw-rs128 (_br/final.patch: the one-draw role split with equal barrier counts, and d64 causal /
#    window dropout on the 64x128 role split): the dropout GPU suite, then bench_dropout d64 / d128 at SM120
#    occupancy for main, rolesplit-one-draw (_br/onedraw.patch) and the final branch in one call, ~8 min
# 14: memcheck + racecheck + synccheck of the dropout and bwd_rolesplit families on the final branch, ~5 min
# 15: (main, the final branch merged) bench_dropout d64 / d128 at the H100's own occupancy, ~4 min
# 16: part 2's bench_bwd d64 at the H100's occupancy and part 4's small MHA grids at d64, in one call, ~7 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) timeout 560 python3 tools/sanitize.py --families bwd bwd_det sparse --tools memcheck racecheck --jobs 2 \
       --json "$OUT/sanitizer.json" --log-dir /tmp/sanlog > "$OUT/sanitizer.txt" 2>&1; tail -c 1500 "$OUT/sanitizer.txt" ;;
  2) (cd benchmarks && timeout 280 python3 bench_bwd.py --occupancy h100 --cases d64 --out "$OUT/bwd_d64_h100.json" \
        2>&1 | grep -v -i warn | tail -4)
     (cd benchmarks && timeout 280 python3 bench_dropout.py --occupancy both --cases d64 --out "$OUT/dropout_d64.json" \
        2>&1 | grep -v -i warn | tail -6) ;;
  3) timeout 560 python3 benchmarks/tune_bwd.py --conformance benchmarks/results/conformance_bwd_candidates_sm120a_2026-11-25.json.gz \
       --classes 64 96 --out "$OUT/tune_bwd.json" 2>&1 | grep -v -i warn | tail -30 ;;
  4) timeout 200 python3 benchmarks/explore/deterministic_tiles.py --head-dim 64 --no-deterministic \
       --shapes 1x2048x8x8 2x1024x16x16 1x1024x16x16 1x4096x16x16 --configs four_warp_64x64 \
       --out "$OUT/bwd_tiles_d64_small.json" 2>&1 | grep -v -i warn | tail -16
     timeout 300 python3 benchmarks/explore/deterministic_tiles.py --head-dim 96 \
       --out "$OUT/bwd_tiles_d96.json" 2>&1 | grep -v -i warn | tail -24 ;;
  5) branch rs128 && (cd /tmp/rs128 && shards 300 tests/test_dropout_gpu.py)
     for t in "$root" /tmp/rs128; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 110 python3 bench_dropout.py --occupancy sm120 --cases d64 \
          --out "$OUT/dropout_d64_$(basename "$t").json" 2>&1 | grep -v -i warn | tail -5)
     done ;;
  6) timeout 580 python3 tools/sanitize.py --families dropout --tools memcheck racecheck --jobs 2 \
       --json "$OUT/sanitizer_dropout.json" --log-dir /tmp/sanlog > "$OUT/sanitizer_dropout.txt" 2>&1
     tail -c 1500 "$OUT/sanitizer_dropout.txt" ;;
  7) branch onedraw && (cd /tmp/onedraw && shards 300 tests/test_dropout_gpu.py)
     for t in "$root" /tmp/onedraw; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 150 python3 bench_dropout.py --occupancy sm120 --cases d64 d128 \
          --out "$OUT/dropout_$(basename "$t").json" 2>&1 | grep -v -i warn | tail -5)
     done ;;
  8) branch onedraw && cd /tmp/onedraw && timeout 580 python3 tools/sanitize.py --families dropout --tools memcheck racecheck \
       --jobs 2 --json "$OUT/sanitizer_dropout.json" --log-dir /tmp/sanlog > "$OUT/sanitizer_dropout.txt" 2>&1
     tail -c 1500 "$OUT/sanitizer_dropout.txt" ;;
  9) race() {  # race NAME: racecheck of the dropout family in the current tree, full logs and the role split's SASS
       rm -rf /tmp/fa4sm120-sanitize-cache
       timeout 170 python3 tools/sanitize.py --families dropout --tools racecheck --jobs 2 --json "$OUT/race_$1.json" \
         --log-dir "$OUT/race_$1" > "$OUT/race_$1.txt" 2>&1; tail -1 "$OUT/race_$1.txt"
       grep -h "hazard detected\|Write Thread\|Read Thread" "$OUT/race_$1"/*.log | sed 's/kernel_cutlass.*+/+/' | sort | uniq -c \
         | sort -rn | head -12
       mkdir -p "$OUT/sass_$1"
       find /tmp/fa4sm120-sanitize-cache -name "*.o" | while read -r f; do
         cuobjdump -sass "$f" 2>/dev/null > /tmp/x.sass
         grep -q "FlashBwdRoleSplit" /tmp/x.sass && gzip -c /tmp/x.sass > "$OUT/sass_$1/$(basename "$f" .o).sass.gz"
       done; ls "$OUT/sass_$1" | wc -l; }
     race main
     branch onedraw && cd /tmp/onedraw && race onedraw ;;
  10) export FA4_SM120_CACHE_DIR=/tmp/probe-cache
      for c in $(python3 benchmarks/explore/race_probe.py --list); do python3 benchmarks/explore/race_probe.py --case "$c" \
        > /dev/null 2>&1 || echo "$c failed"; done  # compile first, without the sanitizer
      for c in $(python3 benchmarks/explore/race_probe.py --list); do
        timeout 100 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 4 \
          python3 benchmarks/explore/race_probe.py --case "$c" > "$OUT/probe_$c.log" 2>&1
        echo "$c: $(grep -c 'case .*: done' "$OUT/probe_$c.log") done, $(grep 'RACECHECK SUMMARY' "$OUT/probe_$c.log")"
      done ;;
  11) branch onedraw && cd /tmp/onedraw && export FA4_SM120_CACHE_DIR=/tmp/probe-cache-b
      for c in base whole_tiles d64_full; do python3 benchmarks/explore/race_probe.py --case "$c" > /dev/null 2>&1 \
        || echo "$c failed"; done
      for c in base whole_tiles d64_full; do
        timeout 100 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 4 \
          python3 benchmarks/explore/race_probe.py --case "$c" > "$OUT/probe_$c.log" 2>&1
        echo "$c: $(grep -c 'case .*: done' "$OUT/probe_$c.log") done, $(grep 'RACECHECK SUMMARY' "$OUT/probe_$c.log")"
      done
      unset FA4_SM120_CACHE_DIR
      timeout 300 python3 tools/sanitize.py --families dropout --tools memcheck racecheck synccheck --jobs 3 \
        --json "$OUT/sanitizer_dropout.json" --log-dir "$OUT/sanlog" > "$OUT/sanitizer_dropout.txt" 2>&1
      tail -5 "$OUT/sanitizer_dropout.txt" ;;
  12) for b in onedraw onedraw3; do
        branch "$b"
        (cd "/tmp/$b" && export FA4_SM120_CACHE_DIR="/tmp/probe-$b"
         for c in base whole_tiles; do python3 benchmarks/explore/race_probe.py --case "$c" > /dev/null 2>&1 || echo "$c failed"; done
         for c in base whole_tiles; do
           timeout 90 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 4 \
             python3 benchmarks/explore/race_probe.py --case "$c" > "$OUT/probe_${b}_$c.log" 2>&1
           echo "$b $c racecheck: $(grep -c 'case .*: done' "$OUT/probe_${b}_$c.log") done, $(grep 'RACECHECK SUMMARY' "$OUT/probe_${b}_$c.log")"
         done
         timeout 90 compute-sanitizer --tool synccheck --print-limit 4 python3 benchmarks/explore/race_probe.py --case base \
           > "$OUT/sync_${b}.log" 2>&1
         echo "$b base synccheck: $(grep -c 'case .*: done' "$OUT/sync_${b}.log") done, $(grep 'ERROR SUMMARY' "$OUT/sync_${b}.log")")
      done ;;
  13) branch final && (cd /tmp/final && shards 300 tests/test_dropout_gpu.py)
      branch onedraw
      for t in "$root" /tmp/onedraw /tmp/final; do
        echo "== $t"
        (cd "$t/benchmarks" && timeout 130 python3 bench_dropout.py --occupancy sm120 --cases d64 d128 \
           --out "$OUT/dropout_$(basename "$t").json" 2>&1 | grep -v -i warn | tail -4)
      done ;;
  14) branch final && cd /tmp/final && timeout 400 python3 tools/sanitize.py --families dropout bwd_rolesplit \
        --tools memcheck racecheck synccheck --jobs 3 --json "$OUT/sanitizer_dropout.json" --log-dir "$OUT/sanlog" \
        > "$OUT/sanitizer_dropout.txt" 2>&1; tail -8 "$OUT/sanitizer_dropout.txt" ;;
  15) (cd benchmarks && timeout 300 python3 bench_dropout.py --occupancy h100 --cases d64 d128 \
         --out "$OUT/dropout_h100occ.json" 2>&1 | grep -v -i warn | tail -5) ;;
  16) (cd benchmarks && timeout 250 python3 bench_bwd.py --occupancy h100 --cases d64 --out "$OUT/bwd_d64_h100.json" \
         2>&1 | grep -v -i warn | tail -4)
      timeout 200 python3 benchmarks/explore/deterministic_tiles.py --head-dim 64 --no-deterministic \
        --shapes 1x2048x8x8 2x1024x16x16 1x1024x16x16 1x4096x16x16 --configs four_warp_64x64 \
        --out "$OUT/bwd_tiles_d64_small.json" 2>&1 | grep -v -i warn | tail -16 ;;
  *) echo "part 1-16" ;;
esac
