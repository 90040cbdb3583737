#!/usr/bin/env bash
# Session 31 ran parts 1-12 (results: notes/perf.md, session 31). One part per call (each under the 10-minute limit).
#   run(command="source .kit_client/device-setup.sh; bash benchmarks/explore/session31.sh N", carry=[".kit_client"])
# 1: carry .kit_client: where the transformers Llama step's time goes, ours against SDPA-FA2 (host submit time
#    against wall time, GPU busy time, host-device syncs, CPU ops, cProfile; profile_hf_step.py), then
#    overhead.py's host microseconds per call (the training rows beside SDPA's), ~6 min
# 2: carry .kit_client: after the training calls' remembered plans (main): the GPU tests of the plans, the
#    backward (basic, GQA, sinks, varlen, deterministic, group split), the KV-cache entry and the transformers
#    client, ~6 min
# 3: carry .kit_client: A/B of the training calls' host work, main against the tree before it (_br/base.patch, the
#    reverse diff of torch-ext and build): overhead.py twice each, interleaved, then the Llama step
#    (profile_hf_step.py, ours) twice each, interleaved, SDPA-FA2 once between, ~8 min
# 4: carry .kit_client: after the custom ops remember their calls (main): the GPU tests of the plans, compile and
#    graph capture, then bench_step.py (the training step with every attention in one process, steps alternated),
#    Llama and plain, ~9 min
# 5: carry .kit_client: bench_step.py on the tree before the session (_br/base.patch), ours and SDPA-FA2, ~5 min
# 6: carry .kit_bench: the group split's A/B with the banded order (session 30's review: bwd_group_split models the
#    per-pair order; the band-aware model prefers no split at every causal shape), SM120 occupancy; then the
#    group-split and band GPU tests (their fixtures now clear the memoized launch decisions), ~8 min
# 7: carry .kit_bench: after the band-aware group split (main): bench_bwd, both occupancies, every implementation
#    (the README's backward table), ~9.5 min
# 8: carry .kit_bench: the group split's A/B in the deterministic mode (its highest-first per-pair order; the
#    default's no longer splits, and deterministic 4 x 2048 8/2 measured 1.36x the default's time in part 7), then
#    the backward GPU tests of GQA, group split, bands and the basics under the new rule, ~5 min
# 9, 10: carry .kit_bench: the GPU suites the session's interface changes reach (every entry's plans, autograd and
#    compile paths): backward, dropout, plans, GQA packing (9); varlen, KV cache, flex, block sparsity, forward (10)
# 11: carry .kit_client: bench_step.py at 1 x 8192 tokens (attention a larger share of the step), ~5 min
# 12: carry .kit_bench: after the review mend of the backward ops' remembered validation: plans, compile, graph and
#     varlen GPU tests, ~4 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) timeout 330 python3 benchmarks/explore/profile_hf_step.py --out "$OUT/hf_step.json" 2>&1 | grep -v -i warn
     timeout 220 python3 benchmarks/overhead.py --out "$OUT/overhead.json" 2>&1 | grep -v -i warn | head -30 ;;
  2) shards 380 tests/test_call_plans.py tests/test_kvcache_gpu.py tests/test_client_transformers_gpu.py \
       "tests/test_bwd_gpu.py::test_bwd_basic" "tests/test_bwd_gpu.py::test_bwd_gqa" "tests/test_bwd_gpu.py::test_bwd_sink" \
       "tests/test_bwd_gpu.py::test_bwd_varlen" -k "not large" ;;
  3) branch base
     for t in "$root" /tmp/base "$root" /tmp/base; do
       echo "== overhead $t"
       (cd "$t" && timeout 100 python3 benchmarks/overhead.py --out "$OUT/overhead_$(basename "$t")_$SECONDS.json" 2>&1 \
          | grep "^train\|^torch SDPA flash  \|^flash_attn_func, unsplit  ")
     done
     for t in "$root" /tmp/base sdpa "$root" /tmp/base; do
       if [ "$t" = sdpa ]; then
         timeout 60 python3 benchmarks/explore/profile_hf_step.py --impls sdpa_fa2 --out "$OUT/hf_sdpa.json" 2>&1 | grep "^=="
       else
         (cd "$t" && timeout 60 python3 benchmarks/explore/profile_hf_step.py --impls ours \
            --out "$OUT/hf_$(basename "$t")_$SECONDS.json" 2>&1 | grep "^==")
       fi
     done ;;
  4) shards 200 tests/test_call_plans.py tests/test_fwd_gpu.py tests/test_bwd_gpu.py tests/test_dropout_gpu.py \
       -k "compile or graph or plan or remember"
     timeout 360 python3 benchmarks/bench_step.py --out "$OUT/step.json" 2>&1 | grep -v -i warn | tail -8 ;;
  5) branch base && cd /tmp/base && timeout 500 python3 benchmarks/bench_step.py --impls ours sdpa_fa2 \
       --out "$OUT/step_base.json" 2>&1 | grep -v -i warn | tail -6 ;;
  6) (cd benchmarks && FA4_SM120_OCCUPANCY=model timeout 420 python3 explore/group_split_ab.py \
        --out "$OUT/group_split_ab.json" 2>&1 | grep -v -i warn | grep "^\[")
     shards 150 tests/test_bwd_gpu.py -k "group_split or bands" ;;
  7) (cd benchmarks && timeout 575 python3 bench_bwd.py --occupancy both --out "$OUT/bwd.json" 2>&1 \
       | grep -v -i warn | grep "\[" | tail -24) ;;
  8) (cd benchmarks && FA4_SM120_OCCUPANCY=model timeout 200 python3 explore/group_split_ab.py --deterministic \
        --shapes 0 2 4 --out "$OUT/group_split_ab_det.json" 2>&1 | grep -v -i warn | grep "^\[")
     shards 200 tests/test_bwd_gpu.py -k "gqa or group_split or bands or basic or varlen or determin" ;;
  9) shards 560 tests/test_bwd_gpu.py tests/test_dropout_gpu.py tests/test_call_plans.py tests/test_pack_gqa_gpu.py ;;
  10) shards 560 tests/test_varlen_gpu.py tests/test_kvcache_gpu.py tests/test_flex_gpu.py tests/test_block_sparse_gpu.py \
        tests/test_fwd_gpu.py -k "not large" ;;
  11) timeout 560 python3 benchmarks/bench_step.py --seq 8192 --batch 1 --rounds 6 \
        --out "$OUT/step_s8192.json" 2>&1 | grep -v -i warn | tail -8 ;;
  12) shards 300 tests/test_call_plans.py tests/test_bwd_gpu.py tests/test_dropout_gpu.py tests/test_flex_gpu.py \
        -k "compile or graph or plan or remember or varlen" ;;
  *) echo "part 1-12" ;;
esac
