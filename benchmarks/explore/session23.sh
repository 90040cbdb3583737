#!/usr/bin/env bash
# Issue 19 on the device, one call (~8 min, .kit_bench carried): the whole backward GPU suite on the d128
# role-split table, the two-CTA-per-SM candidates at d64/d96, the host overhead of a training call, and where
# the compiled plain model's step time goes. Results under $OUT; nothing is adopted here.
#   run(command="source .kit_bench/device-setup.sh && bash benchmarks/explore/session23.sh", carry=[".kit_bench"])
set -u
cd "$(dirname "$0")/../.."
python3 tools/pytest_shards.py -n 12 --log-dir "$OUT/sh" -- -m gpu tests/test_bwd_gpu.py > "$OUT/tests.txt" 2>&1
tail -16 "$OUT/tests.txt"
(cd benchmarks && timeout 240 python3 tune_bwd.py \
   --conformance results/conformance_bwd_candidates_sm120a_2026-11-25.json.gz --classes 64 96 --role-split none \
   --min-ctas-per-sm 2 --out "$OUT/tune_2cta.json" 2>&1 | grep -v -i warn | grep -E "FA2|TFLOPS" | tail -70)
timeout 120 python3 benchmarks/overhead.py --out "$OUT/overhead.json" 2>&1 | grep -v -i warn | grep "us/call"
timeout 150 python3 benchmarks/explore/profile_train_step.py --seq 2048 --batch 4 --out "$OUT/train_profile.json" \
  2>&1 | grep -v -i warn | tail -60
