#!/usr/bin/env bash
# Session 44 (issue 20: d128's dropout on its 64x96 kv_in_regs split, the racecheck hazards of session 43).
# One part per call, the client kit carried:
#   run(command="source .kit_client/device-setup.sh; bash benchmarks/explore/session44.sh N", carry=[".kit_client"])
# The tree: branches/dropout-d128-run.patch applied, plus the signed protocol's barrier PZ pair (group 0 arrives,
# group 1 syncs before its dS barrier), so both groups pass 5 bar.sync and 2 bar.arrive per step (the signed
# protocol had 5 / 1 against 4 / 2). _br/base.patch takes a copy of the tree back to main.
# 1: racecheck of the dropout family twice (logs kept), synccheck of it once, ~8 min
# 1 ran: racecheck of dropout 0 hazards in 2 of 2 runs (27 s, 26 s; session 43's tree without the PZ pair: 5126
#    errors, 2 of 2); synccheck 0 errors
# 2: the dropout suite; bench_dropout d128 A/B, base against the tree, alternated twice, ~8 min
# 2 ran: dropout suite 52/52 (12 shards, 81 s); fwd+bwd ms with dropout, base / tree (two rounds): d128 full 15.00,
#    14.96 / 13.61, 13.58 (-9%; tree cost 1.221x against 11.14 without), causal 7.10, 7.25 / 7.37, 7.38 (+2-4%)
# 3: bench_dropout d96 A/B (the merged signed split gained the PZ pair) and d128 causal at 2x8192, alternated, ~8 min
# 3 ran: base / tree: d96 full 10.02, 10.01 / 9.99, 10.03, causal 5.34, 5.36 / 5.34, 5.36 (the PZ pair costs
#    nothing measurable); d128 2x8192 full 29.24, 29.21 / 26.86, 26.88 (-8%), causal 13.73, 13.73 / 14.04, 14.03
#    (+2%). Rule taken: d128's run split on full walks only (bwd_config._prefers_smem_operands)
# 4: the final tree (causal / windowed d128 dropout back on the 64x64 split): the dropout suite with its new d128
#    full rows; racecheck (twice), memcheck of the dropout family, ~7 min
# 4 ran: dropout suite 52/52 (12 shards, 106 s; d128 full rows added); racecheck 0 hazards in 2 of 2 runs; memcheck 0
# 5: bench_dropout with every implementation, d64 / d96 / d128 / d256 (the results file), ~8 min
# 5 ran: fwd+bwd ms ours / with dropout (cost): d64 6.32 / 7.50 (1.188x), causal 3.38 / 3.95 (1.169x); d96 8.04 /
#    9.94 (1.236x), causal 4.29 / 5.32 (1.239x); d128 11.19 / 13.55 (1.211x), causal 5.97 / 7.11 (1.191x); d256 50.26 /
#    50.63 (1.007x), causal 23.53 / 24.60 (1.045x) (results/dropout_h100_2026-11-27.json)
# 6: issue 19's step target on the transformers Llama under torch.compile (bench_step.py --models llama_compiled:
#    its forward and loss compiled, graph breaks allowed), 4 x 2048 and 1 x 8192, ~9 min
# 6 ran (second try; the first had sdpa_fa2, whose flash backend refuses the explicit mask transformers builds under
#    compile): step / host issue ms, ours / SDPA's default: 4x2048 8.88 / 8.96, 8.18 / 8.04 (0.92x); 1x8192 18.27 /
#    18.39, 15.26 / 12.41 (0.84x): ours host-bound in both, SDPA at 4x2048
# 7: explore/hf_compile_breaks.py: torch._dynamo.explain of the compiled Llama's forward + loss per attention (graph
#    breaks, reasons, frames), 4 x 2048 and 1 x 8192, ~3 min
# 7 ran: 4x2048 both attentions one graph, no breaks (ours 176 ops, SDPA 189); 1x8192 ours 17 graphs / 16 breaks, all
#    transformers' data-dependent branch in _flash_attention_forward (modeling_flash_attention_utils.py:846, the
#    packed-sequence check at batch 1), SDPA none (results/step_llama_compiled_h100_2026-11-27.json)
# 8: the final tree: the backward, dropout, flex and block-sparse GPU suites (issue 20's features), ~8 min
# 8 ran: 392/392 (12 shards, 316 s)
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v cuobjdump || echo /usr/local/cuda/bin/x)")")}"
ab() {  # $1: label, $2: timeout, rest: bench_dropout args; base / tree alternated twice, ours_dropout (first: + ours)
  local label="$1" limit="$2"; shift 2
  local i=0 t impls
  for t in /tmp/base "$root" /tmp/base "$root"; do
    i=$((i + 1)); impls=ours_dropout; [ "$i" -le 2 ] && impls="ours ours_dropout"
    (cd "$t/benchmarks" && timeout "$limit" python3 bench_dropout.py --occupancy sm120 --impls $impls "$@" \
       --out "$OUT/dropout_${label}_$(basename "$t")_$i.json" 2>&1 | grep -v -i warn \
       | grep "\[" | sed "s|^|$(basename "$t") |")
  done
}
case "$part" in
  1) for r in 1 2; do
       timeout 230 python3 tools/sanitize.py --families dropout --tools racecheck --log-dir /tmp/slog$r \
          --json "$OUT/sanitizer_race$r.json" 2>&1 | tail -2
       f=$(ls /tmp/slog$r/* | head -1); echo "run $r: $(grep -c hazard "$f") hazard lines"
       gzip -c "$f" > "$OUT/race$r.log.gz"
       grep -o "at [a-z_0-9A-Z]*+0x[0-9a-f]*" "$f" | sed 's/at kernel[^+]*/at /' | sort | uniq -c | head
     done
     timeout 100 python3 tools/sanitize.py --families dropout --tools synccheck \
        --json "$OUT/sanitizer_sync.json" 2>&1 | tail -2 ;;
  2) shards 200 tests/test_dropout_gpu.py
     branch base
     ab d128 100 --head-dims 128 ;;
  4) shards 240 tests/test_dropout_gpu.py
     for r in 1 2; do
       timeout 100 python3 tools/sanitize.py --families dropout --tools racecheck \
          --json "$OUT/sanitizer_race$r.json" 2>&1 | tail -1
     done
     timeout 100 python3 tools/sanitize.py --families dropout --tools memcheck --json "$OUT/sanitizer_mem.json" 2>&1 \
        | tail -1 ;;
  5) for hd in "64 96" "128 256"; do
       (cd benchmarks && timeout 280 python3 bench_dropout.py --occupancy sm120 --head-dims $hd \
          --out "$OUT/dropout_${hd// /_}.json" 2>&1 | grep -v -i warn | grep "\[")
     done ;;
  6) timeout 290 python3 benchmarks/bench_step.py --models llama_compiled --impls ours sdpa --out "$OUT/step_llama_compiled.json" 2>&1 \
        | grep -v -i warn | grep "step \|Error\|error" | head -20
     timeout 290 python3 benchmarks/bench_step.py --models llama_compiled --impls ours sdpa --seq 8192 --batch 1 --rounds 6 \
        --out "$OUT/step_llama_compiled_s8192.json" 2>&1 | grep -v -i warn | grep "step \|Error\|error" | head -20 ;;
  7) timeout 200 python3 benchmarks/explore/hf_compile_breaks.py --out "$OUT/breaks.json" 2>&1 | grep -v -i warn \
        | grep -v "^ *$" | head -60
     timeout 150 python3 benchmarks/explore/hf_compile_breaks.py --seq 8192 --batch 1 --out "$OUT/breaks_s8192.json" \
        2>&1 | grep -v -i warn | grep -v "^ *$" | head -40 ;;
  8) shards 560 tests/test_bwd_gpu.py tests/test_dropout_gpu.py tests/test_flex_gpu.py tests/test_block_sparse_gpu.py ;;
  3) branch base
     ab d96 100 --head-dims 96
     ab d128_2x8192 100 --head-dims 128 --shape 2x8192x32x8 ;;
esac
