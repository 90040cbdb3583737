#!/usr/bin/env bash
# Session 25's device calls (issue 20: dropout, forward and backward), one part per call; each stays under the
# 10-minute call limit and leaves at most a few files under $OUT:
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session25.sh 1", carry=[".kit_bench"])
# 1: dropout GPU tests, then bench_dropout.py at both occupancies, ~8 min
# 2: the dropout, flex, block-sparse and backward GPU tests (the new trailing kernel slot) + sanitizer on dropout,
#    ~8 min
# 3: bench_dropout.py at both occupancies, ~6 min
# 4: the dropout backward's cost split (explore/dropout_bwd_tiles.py: tile change vs the mask), ~4 min
# 5: block sparsity walked by the overlapped / ping-pong mainloop: block-sparse GPU tests, then bench_flex's
#    block-sparse, causal-flag and dense cases at SM120 occupancy, ~8 min
set -u
cd "$(dirname "$0")/../.."
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) shards 300 tests/test_dropout_gpu.py
     (cd benchmarks && timeout 380 python3 bench_dropout.py --out "$OUT/dropout.json" 2>&1 \
        | grep -v -i warn | tail -12) ;;
  2) (timeout 420 python3 tools/sanitize.py --families dropout --tools memcheck racecheck --jobs 2 \
        --json "$OUT/sanitizer.json" --log-dir /tmp/sanlog > "$OUT/sanitizer.txt" 2>&1) &
     shards 560 tests/test_dropout_gpu.py tests/test_flex_gpu.py tests/test_block_sparse_gpu.py tests/test_bwd_gpu.py
     wait; tail -c 1500 "$OUT/sanitizer.txt" ;;
  4) timeout 500 python3 benchmarks/explore/dropout_bwd_tiles.py --out "$OUT/dropout_bwd_tiles.json" 2>&1 \
       | grep -v -i warn | tail -8 ;;
  3) (cd benchmarks && timeout 580 python3 bench_dropout.py --out "$OUT/dropout.json" 2>&1 | grep -v -i warn | tail -20) ;;
  5) shards 220 tests/test_block_sparse_gpu.py tests/test_dropout_gpu.py::test_mods_and_block_sparsity
     (cd benchmarks && timeout 300 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
        "dense" --out "$OUT/flex_pp.json" 2>&1 | grep -v -i warn | tail -8) ;;
  *) echo "part 1-5" ;;
esac
