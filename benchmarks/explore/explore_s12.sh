#!/usr/bin/env bash
# Session 12 exploration on the device (tune_fwd --config sets at the SM120 model's occupancy):
# d192/128 (never tuned on the device), d96 / d64 causal with FwdConfig.mask_select, d64 full.
set -u
cd "$(dirname "$0")/../.."
export FA4_SM120_CACHE_DIR=$PWD/.cache/fa4
T="python3 benchmarks/tune_fwd.py --jobs 16"
run() { name=$1; shift; echo "== $name"; $T --out "$OUT/$name.json" "$@" 2>&1 | grep -v Warning; }
run d192x128 --head-dims 192 --head-dim-v 128 --causal both \
  --config 64,32,4,2,1,cp_async --config 64,32,4,2,0,cp_async --config 64,48,4,2,1,cp_async \
  --config 64,32,4,3,1,cp_async --config 64,32,4,2,1,tma,1,1 --config 64,32,4,2,1,tma,1,0,0,0,1 \
  --config 128,32,4,2,0,tma --config 128,32,4,2,0,cp_async --config 128,32,4,2,1,tma \
  --config 128,32,8,2,0,tma,1,1,1 --config 128,32,8,2,1,tma,1,1,1 --config 128,32,8,2,1,cp_async
run d96_causal --head-dims 96 --causal causal \
  --config 256,64,8,2,0,tma,1,1,1,0,0,0 --config 128,64,8,2,1,tma,1,1,1 --config 128,64,8,2,1,tma,1,1,1,0,0,0 \
  --config 256,32,8,2,0,tma,1,1,1 --config 256,64,8,2,0,tma,0,1,1,0,0,0 --config 128,64,4,2,1,cp_async \
  --config 128,64,4,2,0,tma,0,1 --config 256,64,8,2,0,tma,1,1,1,0,0,0
run d64_causal --head-dims 64 --causal causal \
  --config 128,64,4,2,1,cp_async --config 64,64,4,2,1,tma,1,1 --config 128,64,4,2,1,cp_async,1,1 \
  --config 128,64,4,2,0,cp_async --config 128,32,4,2,1,cp_async --config 128,64,4,2,1,cp_async,0 \
  --config 64,64,4,2,1,cp_async,1,1 --config 128,64,4,2,1,cp_async
run d64_full --head-dims 64 --causal full \
  --config 128,64,4,2,0,cp_async --config 128,64,4,2,1,cp_async --config 128,32,4,2,0,cp_async \
  --config 128,64,4,2,0,cp_async,0 --config 128,64,4,2,0,cp_async,1,1 --config 128,64,4,2,0,cp_async
