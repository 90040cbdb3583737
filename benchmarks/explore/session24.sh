#!/usr/bin/env bash
# Session 24's device calls (issue 20: the aux slots and group split checked on a GPU, block sparsity), one part
# per call; each part
# stays under the 10-minute call limit and leaves at most a few files under $OUT (logs in one tarball):
#   run(command="source .kit_bench/device-setup.sh && bash benchmarks/explore/session24.sh 1", carry=[".kit_bench"])
# 1: GPU tests across the launch paths the aux slots touch (flex incl. the aux tests, backward incl. the forced
#    group splits, varlen, KV cache, serving loop, tile order), ~6 min
# 2: the forward API and split-KV GPU tests, ~8 min
# 3: compute-sanitizer on bwd, bwd_split and flex (memcheck, racecheck), ~7 min
# 4: bench_flex.py (mods and block sparsity vs the flags, dense, varlen and torch FlexAttention), ~6 min
# 5: block-sparse GPU tests (forward + backward) + the flex and backward tests, ~6 min
# 6: compute-sanitizer on the sparse family (memcheck, racecheck), ~2 min
# 7: the role-split backward walking block-sparse lists: block-sparse GPU tests, then bench_flex's random-map,
#    dense and causal cases at SM120 occupancy, ~5 min
set -u
cd "$(dirname "$0")/../.."
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) shards 540 tests/test_flex_gpu.py tests/test_bwd_gpu.py tests/test_varlen_gpu.py tests/test_kvcache_gpu.py \
       tests/test_serving_loop_gpu.py tests/test_tile_order_gpu.py ;;
  2) shards 560 tests/test_fwd_gpu.py tests/test_split_kv_gpu.py ;;
  3) timeout 560 python3 tools/sanitize.py --families bwd bwd_split flex --tools memcheck racecheck --jobs 3 \
       --json "$OUT/sanitizer.json" --log-dir /tmp/sanlog > "$OUT/sanitizer.txt" 2>&1
     tail -c 3000 "$OUT/sanitizer.txt"
     tar czf "$OUT/sanlog.tgz" -C /tmp sanlog 2>/dev/null ;;
  4) (cd benchmarks && timeout 580 python3 bench_flex.py --out "$OUT/flex.json" 2>&1 | grep -v -i warn | tail -30) ;;
  5) shards 560 tests/test_block_sparse_gpu.py tests/test_flex_gpu.py tests/test_bwd_gpu.py ;;
  6) timeout 400 python3 tools/sanitize.py --families sparse --tools memcheck racecheck --jobs 2 \
       --json "$OUT/sanitizer.json" --log-dir /tmp/sanlog > "$OUT/sanitizer.txt" 2>&1
     tail -c 1500 "$OUT/sanitizer.txt" ;;
  7) shards 200 tests/test_block_sparse_gpu.py
     (cd benchmarks && timeout 300 python3 bench_flex.py --occupancy sm120 --cases random dense "causal" \
        --out "$OUT/flex_rs.json" 2>&1 | grep -v -i warn | tail -12) ;;
  *) echo "part 1-7" ;;
esac
