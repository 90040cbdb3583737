#!/usr/bin/env bash
# Session 31's device calls, one part per call (each under the 10-minute limit).
#   run(command="source .kit_client/device-setup.sh; bash benchmarks/explore/session31.sh N", carry=[".kit_client"])
# 1: carry .kit_client: where the transformers Llama step's time goes, ours against SDPA-FA2 (host submit time
#    against wall time, GPU busy time, host-device syncs, CPU ops, cProfile; profile_hf_step.py), then
#    overhead.py's host microseconds per call (the training rows beside SDPA's), ~6 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) timeout 330 python3 benchmarks/explore/profile_hf_step.py --out "$OUT/hf_step.json" 2>&1 | grep -v -i warn
     timeout 220 python3 benchmarks/overhead.py --out "$OUT/overhead.json" 2>&1 | grep -v -i warn | head -30 ;;
  *) echo "part 1" ;;
esac
