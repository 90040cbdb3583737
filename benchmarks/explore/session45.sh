#!/usr/bin/env bash
# Session 45 (issue 19: the end-to-end step against SDPA as it dispatches on an SM120; the ops' host time).
# One part per call, the client kit carried:
#   run(command="source .kit_client/device-setup.sh; bash benchmarks/explore/session45.sh N", carry=[".kit_client"])
# 1: bench_step's compiled transformers Llama at 4 x 2048 against sdpa_sm120 (SDPA's SM120 backend order: the
#    memory-efficient kernel for the mask transformers traces) and the H100's default; op_host_probe --profile, ~8 min
# 2: the same at 1 x 8192, ~7 min
# 3: bench_step's eager Llama and compiled plain GPT at 4 x 2048 with every attention, ~8 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
step() {  # $1: label, $2: timeout, rest: bench_step args
  local label="$1" limit="$2"; shift 2
  timeout "$limit" python3 benchmarks/bench_step.py "$@" --out "$OUT/step_$label.json" 2>&1 | grep -v -i warn \
    | grep "step \|ms .*x \|Error\|error" | head -40
}
case "$part" in
  1) step llama_compiled 420 --models llama_compiled --impls ours sdpa_sm120 sdpa
     timeout 120 python3 benchmarks/explore/op_host_probe.py --tree-only --profile --out "$OUT/op_host.json" 2>&1 \
       | grep -v -i warn | head -120 ;;
  2) step llama_compiled_s8192 500 --models llama_compiled --impls ours sdpa_sm120 sdpa --seq 8192 --batch 1 --rounds 6 ;;
  3) step eager_plain 540 --models llama plain ;;
esac
