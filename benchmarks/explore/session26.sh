#!/usr/bin/env bash
# Session 26's device calls, one part per call (each under the 10-minute call limit):
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session26.sh 1", carry=[".kit_bench"])
# 1: dropout under torch.compile / CUDA graphs (the custom ops' new seed slot): the dropout GPU tests, the
#    backward suite (compile, graph replay) and the forward's compile / graph / serving tests, ~7 min
# 2: block-sparse tiles in the longest-first (banded) order: block-sparse GPU tests, then bench_flex's list cases,
#    the causal flag, dense and varlen documents at SM120 occupancy, ~6 min
# 3: mask_mods on the d128 role split: flex and block-sparse GPU tests, then bench_flex's mask_mod, list, flag and
#    varlen cases at SM120 occupancy, ~8 min
# 4: sanitizer (memcheck + racecheck) on the sparse, flex and dropout families (the role split with mask_mods, the
#    longest-first sparse order, the device-built seed slot), the block-sparse GPU tests (remembered backward
#    lists), bench_flex's list cases, ~7 min
# Owed (device time ran out in session 26; run in session 27 through session27.sh, all green):
# 5: on branch rolesplit-dropout (git checkout it first): the dropout GPU tests and the backward suite (d128 dropout
#    now on the role split), then explore/dropout_bwd_tiles.py, ~9 min; bench_dropout.py after, if it passes
# 6: the graph tests through reference.capture, then bench_flex's list, flag and varlen rows on the H100, ~6 min
# 7: carry=[".kit_client"] (source .kit_client/device-setup.sh): train_check.py --models gpt_oss (the narrower
#    gpt-oss model), ~6 min
# 8: ncu of the causal flag, causal as lists, the random map and dense forwards (explore/profile_lists.py), to find
#    where causal-as-lists loses its 12-17% to the flag, ~4 min
# 9: on branch sparse-walk-carry (git checkout it first): block-sparse GPU tests, then bench_flex's list rows, ~5 min
set -u
cd "$(dirname "$0")/../.."
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) shards 560 tests/test_dropout_gpu.py tests/test_bwd_gpu.py \
       tests/test_fwd_gpu.py::test_torch_compile_fullgraph_uses_the_namespaced_op \
       tests/test_fwd_gpu.py::test_cuda_graph_capture_and_replay tests/test_fwd_gpu.py::test_torch_compile_fullgraph_varlen \
       tests/test_kvcache_gpu.py tests/test_serving_loop_gpu.py ;;
  2) shards 240 tests/test_block_sparse_gpu.py tests/test_dropout_gpu.py::test_mods_and_block_sparsity
     (cd benchmarks && timeout 330 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
        "dense" "varlen" --out "$OUT/flex_order.json" 2>&1 | grep -v -i warn | tail -14) ;;
  3) shards 330 tests/test_flex_gpu.py tests/test_block_sparse_gpu.py
     (cd benchmarks && timeout 240 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
        "varlen" "mask_mod)" "causal mask_mod" --out "$OUT/flex_rs.json" 2>&1 | grep -v -i warn | tail -14) ;;
  4) (timeout 400 python3 tools/sanitize.py --families sparse flex dropout --tools memcheck racecheck --jobs 2 \
        --json "$OUT/sanitizer.json" --log-dir /tmp/sanlog > "$OUT/sanitizer.txt" 2>&1) &
     shards 300 tests/test_block_sparse_gpu.py
     wait; tail -c 1200 "$OUT/sanitizer.txt"
     (cd benchmarks && timeout 150 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
        "varlen" --out "$OUT/flex_cache.json" 2>&1 | grep -v -i warn | tail -8) ;;
  5) shards 420 tests/test_dropout_gpu.py tests/test_bwd_gpu.py
     timeout 150 python3 benchmarks/explore/dropout_bwd_tiles.py --out "$OUT/dropout_bwd_tiles.json" 2>&1 \
       | grep -v -i warn | tail -8 ;;
  6) shards 200 tests/test_fwd_gpu.py::test_cuda_graph_capture_and_replay tests/test_bwd_gpu.py::test_bwd_cuda_graph_replay \
       tests/test_dropout_gpu.py::test_dropout_cuda_graph_replay
     (cd benchmarks && timeout 330 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
        "dense" "varlen" --out "$OUT/flex.json" 2>&1 | grep -v -i warn | tail -10) ;;
  7) timeout 560 python3 tools/train_check.py --models gpt_oss --out "$OUT/train_gpt_oss.json" 2>&1 | tail -12 ;;
  8) for c in "causal flag" "causal mask_mod + block sparse" "random 25% blocks (block sparse)" "dense (no mask)"; do
       f="$OUT/ncu_$(echo "$c" | tr -c 'a-z0-9\n' '_' | cut -c1-24).csv"
       FA4_SM120_OCCUPANCY=model timeout 140 ncu --kernel-name regex:Flash --launch-skip 2 --launch-count 1 \
         --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
         --page raw --csv python3 benchmarks/explore/profile_lists.py --case "$c" > "$f" 2>/dev/null
       echo "$c: $(wc -l < "$f") lines"
     done ;;
  9) shards 200 tests/test_block_sparse_gpu.py
     (cd benchmarks && timeout 200 python3 bench_flex.py --occupancy sm120 --cases "block sparse" "causal flag" \
        --out "$OUT/flex_carry.json" 2>&1 | grep -v -i warn | tail -8) ;;
  *) echo "part 1-9" ;;
esac
