#!/usr/bin/env bash
# Session 27's device calls (session 26's owed parts), one part per call (each under the 10-minute call limit).
# The two unmerged branches travel as patches onto main under _br/ (untracked, removed after the session; the device
# carry limit leaves no room for whole trees), applied to a copy of the tree on the device:
#   git diff 99a2a73 rolesplit-dropout -- . ':!build' > _br/rd.patch
#   git diff c2fc139 sparse-walk-carry -- . ':!build' > _br/carry.patch
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session27.sh N", carry=[".kit_bench"])
# 1: branch rolesplit-dropout: dropout + backward GPU suites, then bench_dropout d64/d128 (SM120 occupancy), ~10 min
# 2: branch sparse-walk-carry: block-sparse GPU tests; main: the graph tests through reference.capture; then
#    bench_flex's list and flag rows for main and for the branch in one call, ~9 min
# 3: ncu of causal flag / causal lists / random map / dense forwards (explore/profile_lists.py), ~4 min
# 5: (main, both branches merged) bench_dropout at SM120 occupancy, all cases; then ncu source counters (per SASS
#    instruction executed counts) of the causal flag and causal as lists forwards, exported as CSV, ~6 min
# 6: the forward's full-list steps without the mask_mod: block-sparse GPU tests, then bench_flex's list and flag
#    rows at SM120 occupancy, ~7 min
# 7: the d64 deterministic backward's tile (explore/deterministic_tiles.py), ~3 min
# 8: d64's backward on the 64x128 role split: the backward and dropout GPU suites, then bench_bwd's d64 rows at
#    SM120 occupancy (ours, upstream's SM120 path, FA2 in one run), ~6 min
# 4: carry=[".kit_client"] (source .kit_client/device-setup.sh): train_check.py --models gpt_oss, ~6 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) branch rd && cd /tmp/rd
     shards 330 tests/test_dropout_gpu.py tests/test_bwd_gpu.py
     (cd benchmarks && timeout 220 python3 bench_dropout.py --occupancy sm120 --cases d64 d128 \
        --out "$OUT/dropout_rd.json" 2>&1 | grep -v -i warn | tail -14) ;;
  2) branch carry
     (cd /tmp/carry && part=2c && shards 200 tests/test_block_sparse_gpu.py)
     part=2m; shards 150 tests/test_fwd_gpu.py::test_cuda_graph_capture_and_replay \
       tests/test_bwd_gpu.py::test_bwd_cuda_graph_replay tests/test_dropout_gpu.py::test_dropout_cuda_graph_replay
     for t in "$root" /tmp/carry; do
       echo "== $t"
       (cd "$t/benchmarks" && timeout 100 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
          --out "$OUT/flex_$(basename "$t").json" 2>&1 | grep -v -i warn | tail -8)
     done ;;
  3) branch carry && cd /tmp/carry
     for c in "causal flag" "causal mask_mod + block sparse" "random 25% blocks (block sparse)" "dense (no mask)"; do
       f="$OUT/ncu_$(echo "$c" | tr -c 'a-z0-9\n' '_' | cut -c1-24).csv"
       FA4_SM120_OCCUPANCY=model timeout 140 ncu --kernel-name regex:Flash --launch-skip 2 --launch-count 1 \
         --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
         --page raw --csv python3 benchmarks/explore/profile_lists.py --case "$c" > "$f" 2>/dev/null
       echo "$c: $(wc -l < "$f") lines"
     done ;;
  4) timeout 560 python3 tools/train_check.py --models gpt_oss --out "$OUT/train_gpt_oss.json" 2>&1 | tail -12 ;;
  5) (cd benchmarks && timeout 300 python3 bench_dropout.py --occupancy both --out "$OUT/dropout.json" 2>&1 \
        | grep -v -i warn | tail -8)
     for c in "causal flag" "causal mask_mod + block sparse"; do
       n="$(echo "$c" | tr -c 'a-z0-9\n' '_' | cut -c1-12)"
       FA4_SM120_OCCUPANCY=model timeout 150 ncu --kernel-name regex:Flash --launch-skip 2 --launch-count 1 \
         --section SourceCounters --section InstructionStats -o "/tmp/rep_$n" -f \
         python3 benchmarks/explore/profile_lists.py --case "$c" > /dev/null 2>&1
       ncu -i "/tmp/rep_$n.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$n.csv" 2>&1
       echo "$c: $(wc -l < "$OUT/src_$n.csv") lines"
     done ;;
  6) shards 160 tests/test_block_sparse_gpu.py
     (cd benchmarks && timeout 300 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
        --out "$OUT/flex_fullskip.json" 2>&1 | grep -v -i warn | tail -8) ;;
  7) timeout 330 python3 benchmarks/explore/deterministic_tiles.py --out "$OUT/det_tiles.json" 2>&1 \
       | grep -v -i warn | tail -14 ;;
  8) shards 200 tests/test_bwd_gpu.py tests/test_dropout_gpu.py
     (cd benchmarks && timeout 170 python3 bench_bwd.py --occupancy sm120 --cases d64 --out "$OUT/bwd_d64.json" 2>&1 \
        | grep -v -i warn | tail -6) ;;
  *) echo "part 1-8" ;;
esac
