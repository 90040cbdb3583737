#!/usr/bin/env bash
# Session 45 (issue 19: the end-to-end step against SDPA as it dispatches on an SM120; the ops' host time).
# One part per call, the client kit carried:
#   run(command="source .kit_client/device-setup.sh; bash benchmarks/explore/session45.sh N", carry=[".kit_client"])
# 1: bench_step's compiled transformers Llama at 4 x 2048 against sdpa_sm120 (SDPA's SM120 backend order: the
#    memory-efficient kernel for the mask transformers traces) and the H100's default; op_host_probe --profile, ~8 min
# 1 ran: SDPA's order did not hold (sdpa_sm120 ran cuDNN: ATen sets its default order at a process's first SDPA
#    call, after the context had set it; fixed in train_check.sdpa_backend). Step / issue / GPU ms: ours 11.18 /
#    11.20 / 4.02, SDPA default (cuDNN with the mask) 9.69 / 9.72 / 5.59 (0.87x): host-bound (this host slower than
#    session 44's); cuDNN's masked backward 0.59 ms a call against ours 0.29. op_host_probe: fwd op 37 us, bwd op 83
# 2: the same at 4 x 2048 (6 rounds) and 1 x 8192, with the host operations of a profiled step, ~8 min
# 2 ran: sdpa_sm120 ran the memory-efficient kernels (fmha_cutlassF / B); so did `sdpa`: torch.compile kept the
#    first sdpa model's graph for the second (one code object, models alike but for their weights; bench_step.own_code
#    since). Step / issue / GPU ms, 4x2048: ours 8.32 / 8.74 / 4.72, sdpa_sm120 10.35 / 8.22 / 10.28 (ours 1.24x);
#    1x8192: ours 14.29 / 14.55 / 8.78 (22 graph pieces: transformers' flash path breaks per layer at batch 1),
#    sdpa_sm120 33.49 / 10.56 / 33.42 (ours 2.34x); masked memory-efficient backward 1.41 ms a call at 4x2048
#    against ours 0.29, 5.57 against 1.01 at 1x8192
# 3: each attention its own graphs (own_code): the compiled Llama at 4 x 2048 and 1 x 8192; the eager Llama and
#    the compiled plain GPT at 4 x 2048 with every attention, ~9 min
# 3 ran: compiled `sdpa` still ran the memory-efficient kernels (the order after sdpa_sm120's context, not cuDNN's;
#    `sdpa` has its order set since); 4x2048 ours 8.78 / 9.63 / 5.00, sdpa_sm120 10.34 / 8.12 / 10.58 (1.18x);
#    1x8192 ours 23.84 / 24.17 / 9.45 (a slow host phase: 14.29 in part 2), sdpa_sm120 33.51 / 9.37 / 33.24 (1.41x);
#    eager Llama ours 20.59 / 20.63 / 8.26, sdpa_sm120 (FA2: no mask in eager) 18.25 (0.89x), sdpa_fa2 18.77
#    (0.91x), cuDNN 18.02 (0.88x); plain ours 10.72 / 10.75 / 7.43, FA2 8.96-8.98 / 8.92 / 7.70 (0.84x), host-bound:
#    our backward op 2.13 ms of 4 calls under the profiler, the backward graph's host time 7.33 against 5.57 ms
# 4: the compiled Llama with `sdpa` in cuDNN's order; step_host_probe's cProfile of the plain step, ~5 min
# 4 ran: `sdpa` ran cuDNN (fort_native_sdpa_sm90 kernels): ours 9.88 / 9.91 / 5.07, cuDNN 8.79 / 8.81 / 6.72 (0.89x,
#    host-bound); step_host_probe (8 x 512): plain ours 7.64 ms, ours_tree 7.07, FA2 5.82, all host-bound; cProfile:
#    80 op calls per 10 steps 21 ms, run_bwd 225 us a call (under cProfile)
# 5: the results: every attention, the compiled Llama at 4 x 2048 and 1 x 8192, the eager Llama and the plain GPT
#    at 4 x 2048, ~8 min
# 5 ran, not kept: the kernels show the graph caches serving one order's graph to another (4x2048 sdpa_sm120 ran
#    cuDNN, a graph part 4 compiled; 1x8192 and plain `sdpa` ran sdpa_sm120's kernels); bench_step turns torch.compile's
#    autograd and FX graph caches off since. Kept from it: 1x8192 ours 16.76 / 17.27 / 9.08, sdpa_sm120
#    (memory-efficient) 33.44 (2.00x); eager Llama ours 19.32, FA2 16.98-17.28 (0.88-0.89x), cuDNN 17.85 (0.92x)
# 6: part 5 with the caches off (the results), ~9 min
# 6 ran (every attention's kernels as named): step / issue / GPU ms, compiled Llama 4x2048: ours 9.63 / 9.66 / 5.15,
#    sdpa_sm120 (memory-efficient) 10.38 / 8.28 / 10.31 (1.08x), cuDNN 6.23 / 8.63 / 6.52 (0.65x); 1x8192: ours 24.79 /
#    25.15 / 9.54 (a slow host phase), sdpa_sm120 33.41 / 9.13 / 33.30 (1.35x), cuDNN 14.75 / 17.63 / 14.67 (0.60x);
#    eager Llama ours 19.42 / 8.23 GPU, sdpa_sm120 = FA2 17.68 (0.91x), sdpa_fa2 16.84 (0.87x), cuDNN 18.12 (0.93x);
#    plain ours 7.74 / 7.64 / 7.26, sdpa_sm120 (FA2) 7.56 (0.98x), FA2 7.28 (0.94x), `sdpa` 7.71 (0.996x)
# 7: the compiled Llama under torch.compile(mode="reduce-overhead") (its graphs replayed as CUDA graphs: the host's
#    issue time out of the step), 4 x 2048 and 1 x 8192, ~6 min
# 7 ran: 2 graph launches a step (ours 49 at 8192: 22 graph pieces); 4x2048 ours 3.96 ms, sdpa_sm120 10.17 (2.57x),
#    cuDNN 5.59 (1.41x); 1x8192 ours 13.36 (issue 13.31, GPU 8.88), sdpa_sm120 33.14 (2.48x), cuDNN 14.53 (1.09x)
# 8: explore/step_op_timing.py: the op bodies' parts timed inside the compiled plain GPT's and transformers Llama's
#    steps against the same backward call in a loop, what the backward op receives, ~3 min
# 8 ran: us per call in step / loop, Llama: _grads 337 / 177, run_bwd 296 / 160, launches 24 / 15 / 9.5 (11 / 10 /
#    7), bwd_launch 25 / 10.5, _call_key 23, fwd _run_plan 54; plain: _grads 297 / 112; dLSE arrives zero-filled
#    (4, 8, 2048) fp32 (AOTAutograd's tangent for the unused LSE); plain's q / k / v strided views (kept in place)
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
step() {  # $1: label, $2: timeout, rest: bench_step args
  local label="$1" limit="$2"; shift 2
  timeout "$limit" python3 benchmarks/bench_step.py "$@" --out "$OUT/step_$label.json" 2>&1 | grep -v -i warn \
    | grep "step \|ms .*x \|launches\|Error\|error\|skipping" | head -40
}
case "$part" in
  1) step llama_compiled 420 --models llama_compiled --impls ours sdpa_sm120 sdpa
     timeout 120 python3 benchmarks/explore/op_host_probe.py --tree-only --profile --out "$OUT/op_host.json" 2>&1 \
       | grep -v -i warn | head -120 ;;
  2) step llama_compiled 200 --models llama_compiled --impls ours sdpa_sm120 sdpa --rounds 6
     step llama_compiled_s8192 300 --models llama_compiled --impls ours sdpa_sm120 sdpa --seq 8192 --batch 1 --rounds 6 ;;
  8) timeout 200 python3 benchmarks/explore/step_op_timing.py --out "$OUT/op_timing.json" 2>&1 | grep -v -i warn \
       | grep "step\|issue\|Error\|error" | head -40 ;;
  7) step llama_compiled_cg 200 --models llama_compiled --rounds 6 --compile-mode reduce-overhead
     step llama_compiled_cg_s8192 160 --models llama_compiled --seq 8192 --batch 1 --rounds 4 \
       --compile-mode reduce-overhead ;;
  5|6) step llama_compiled 180 --models llama_compiled --rounds 6
     step llama_compiled_s8192 170 --models llama_compiled --seq 8192 --batch 1 --rounds 4
     step eager_plain 240 --models llama plain --rounds 6 ;;
  4) step llama_compiled 200 --models llama_compiled --impls ours sdpa --rounds 4
     timeout 200 python3 benchmarks/explore/step_host_probe.py --rounds 4 --profile-steps 10 --out "$OUT/probe.json" \
       2>&1 | grep -v -i warn | head -150 ;;
  3) step llama_compiled 200 --models llama_compiled --rounds 6
     step llama_compiled_s8192 200 --models llama_compiled --impls ours sdpa_sm120 sdpa --seq 8192 --batch 1 --rounds 4
     step eager_plain 300 --models llama plain --rounds 6 ;;
esac
