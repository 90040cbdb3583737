#!/usr/bin/env bash
# Session 38 (issue 19: d96 non-causal backward 0.94x FA2 at SM120 occupancy, FA2's 64x128 tile keeping V in
# registers). One part per call:
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session38.sh N", carry=[".kit_bench"])
# The change: d96's role split on 64x128 tiles with each group's S / dP B operand in registers for the whole walk
# (group 0 its warp's 32 K rows, group 1 its 32 V rows: 48 registers at d96, BwdConfig.kv_in_regs), so V's shared
# memory holds P and dS: 95232 B where a 64x128 split with a V tile needs 116 KB. sm_120a: the 25 dispatchable d96 /
# d72 configs conform at 249-255 registers, 0 spills; dropout (140-152 B spilled) and varlen in the highest-first
# deterministic order (one local word) keep the 64x96 split (BWD_TABLE_SMEM_OPERANDS).
# 1: the d96 backward / dropout GPU tests on this tree (the 64x128 kv_in_regs entry); deterministic_tiles.py
#    --head-dim 96 (the entry against the former 64x96 split and the kv_in_regs tile with dK / dV on 4x1 warps,
#    default and deterministic, full and causal, three shapes); bench_bwd's d96 rows with the peers, ~9 min
# 1 ran: 32/32; the 64x128 kv_in_regs entry against the 64x96 split, default: 4x4096 32/8 full 6.89 / 7.75 ms (0.89x),
#    causal 3.59 / 3.98 (0.90x); 2x4096 16/4 1.76 / 2.15 (0.82x), causal 0.93 / 1.13 (0.82x); 8x2048 16/16 1.89 / 2.11
#    (0.90x), causal 1.08 / 1.16 (0.93x); deterministic 1.06-1.21x its default; dK / dV on 4x1 warps 0.98-1.01x;
#    bench_bwd d96 full ours 299 TFLOPS, FA2 286 (1.05x), upstream 225 (1.33x); causal 284 / 235 (1.21x) / 213 (1.33x)
# 2: racecheck and memcheck of bwd_rolesplit (d96's kv_in_regs entry, deterministic: V's region turning into P and dS
#    after the CTA barrier), memcheck of bwd (default) and bwd_varlen_classes (d96 varlen on the new entry); dropout
#    cost at d96 (its 64x96 split, now measured against the faster kv_in_regs backward without dropout), ~9 min
# 2 ran: dropout cost d96 1.211x full (fwd+bwd 10.82 / 8.94 ms), causal 1.242x (5.86 / 4.71; was 1.09x / 1.15x against
#    the 64x96 backward); racecheck bwd_rolesplit clean (0 hazards); memcheck cut off by the part's timeout in warm-up
# 3: memcheck of bwd_rolesplit and bwd_varlen_classes; the backward and dropout GPU suites on this tree, ~9.5 min
# 3 ran: memcheck bwd_rolesplit and bwd_varlen_classes clean; 230/230
# 4: bench_bwd in full at both occupancies on this tree (the README's backward table), ~7 min
# 4 ran: d96 full 298 TFLOPS, FA2 283 (1.05x), upstream 225 (1.32x); causal 286 / 233 (1.23x) / 211 (1.36x); the other
#    rows within noise of session 37's (results/bwd_h100_2026-11-27.json)
# 5: d128 on a 64x96 kv_in_regs split (a warp's 24 K or V rows, one n8 atom per warp step: bwd_config.bwd_sdp_n_step;
#    98304 B; sm_120a 255 registers, 0 spills): the d128 backward tests with it as the table entry (branch kvr128,
#    _br/kvr128.patch), then deterministic_tiles.py --head-dim 128 against the 64x64 entry, three shapes, ~7 min
# 5 ran: 44/44; kv_in_regs 64x96 / 64x64 at d128, default: 4x4096 32/8 full 9.45 / 10.72 ms (0.88x), causal 4.96 / 5.64
#    (0.88x); 2x4096 16/4 2.57 / 2.76 (0.93x), causal 1.32 / 1.43 (0.92x); 8x2048 16/16 2.54 / 2.86 (0.89x), causal
#    1.38 / 1.61 (0.86x); deterministic 1.04-1.28x its default (8x2048 16/16 full 3.24 ms: 1.28x, was 1.47x)
# 6: d128's entry becomes the 64x96 kv_in_regs split (dropout and highest-first varlen deterministic keep the 64x64
#    split: BWD_TABLE_SMEM_OPERANDS[128]); the backward + dropout GPU suites, racecheck of bwd_rolesplit (d64's 64x64
#    split patched in, d96 / d128 on their kv_in_regs entries, deterministic), ~8 min
# 6 ran: 230/230; racecheck bwd_rolesplit clean
# 7: bench_bwd's five d128 rows at both occupancies (merged into part 4's run: the device budget had no room for all
#    eleven), memcheck of bwd_rolesplit and bwd_varlen_classes, ~5 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) shards 240 tests/test_bwd_gpu.py tests/test_dropout_gpu.py -k "96"
     (cd benchmarks && timeout 240 python3 explore/deterministic_tiles.py --head-dim 96 \
        --shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16 --configs table rolesplit_64x96_div kvr_64x128_dkv4 \
        --out "$OUT/tiles_d96.json" 2>&1 | grep -v -i warn | grep "^d96")
     (cd benchmarks && timeout 120 python3 bench_bwd.py --occupancy sm120 --cases d96 --out "$OUT/bwd_d96.json" \
        2>&1 | grep -v -i warn | grep "\[") ;;
  2) (cd benchmarks && timeout 150 python3 bench_dropout.py --occupancy sm120 --head-dims 96 \
        --out "$OUT/dropout_d96.json" 2>&1 | grep -v -i warn | grep "\[")
     timeout 220 python3 tools/sanitize.py --families bwd_rolesplit --tools racecheck \
        --json "$OUT/sanitizer_racecheck.json" 2>&1 | tail -3
     timeout 180 python3 tools/sanitize.py --families bwd_rolesplit bwd bwd_varlen_classes --tools memcheck \
        --json "$OUT/sanitizer_memcheck.json" 2>&1 | tail -4 ;;
  3) timeout 250 python3 tools/sanitize.py --families bwd_rolesplit bwd_varlen_classes --tools memcheck \
        --json "$OUT/sanitizer_memcheck.json" 2>&1 | tail -4
     shards 320 tests/test_bwd_gpu.py tests/test_dropout_gpu.py ;;
  4) (cd benchmarks && timeout 540 python3 bench_bwd.py --occupancy both --out "$OUT/bwd.json" 2>&1 \
        | grep -v -i warn | grep "\[") ;;
  5) branch kvr128
     (cd /tmp/kvr128 && shards 150 tests/test_bwd_gpu.py -k "128")
     (cd benchmarks && timeout 240 python3 explore/deterministic_tiles.py --head-dim 128 \
        --shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16 --configs table kvr_64x96 \
        --out "$OUT/tiles_d128.json" 2>&1 | grep -v -i warn | grep "^d128") ;;
  6) shards 300 tests/test_bwd_gpu.py tests/test_dropout_gpu.py
     timeout 220 python3 tools/sanitize.py --families bwd_rolesplit --tools racecheck \
        --json "$OUT/sanitizer_racecheck.json" 2>&1 | tail -3 ;;
  7) (cd benchmarks && timeout 300 python3 bench_bwd.py --occupancy both --cases d128 --out "$OUT/bwd.json" 2>&1 \
        | grep -v -i warn | grep "\[")
     timeout 150 python3 tools/sanitize.py --families bwd_rolesplit bwd_varlen_classes --tools memcheck \
        --json "$OUT/sanitizer_memcheck.json" 2>&1 | tail -4 ;;
esac
