#!/usr/bin/env bash
# Session 39 (issue 20: d128 dropout cost against session 38's faster d128 backward; issue 19: the kv_in_regs tiles
# off the grid, d64 kv_in_regs candidates, sanitizer of d128's varlen backward). One part per call:
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session39.sh N", carry=[".kit_bench"])
# 1: bench_dropout's d128 rows (dropout keeps the 64x64 split; the backward without it is the 64x96 kv_in_regs split
#    since session 38); deterministic_tiles.py --head-dim 64 with the two kv_in_regs candidates prepared in session 38
#    (64x128, one / two dO stages), three shapes, default and deterministic; memcheck of bwd_varlen_classes (d128
#    added: its non-deterministic varlen backward with corrupt metadata on the kv_in_regs entry), ~9 min
# 1 ran: dropout d128 fwd+bwd 14.57 / 12.08 ms (1.206x), causal 7.60 / 6.43 (1.182x; were 1.09x / 1.09x against the
#    64x64 backward); d64 kv_in_regs 64x128 0.98-1.02x the table's default time, two dO stages 0.98-1.03x, deterministic
#    1.05-1.16x its default against the table's 1.08-1.22x: not adopted (results/deterministic_tiles_d64_h100_2026-11-27
#    .json); memcheck bwd_varlen_classes (d64 / d96 / d128) clean
# 2: off the grid: the d96 / d128 kv_in_regs entries against the splits they replaced at lengths that leave a partial
#    last key block (3000 tokens) and MQA (deterministic_tiles.py --shapes), and packed varlen documents
#    (varlen_tiles.py, 128-2048 tokens packed to 16384, 32/8 heads), default only, ~8 min
# 2 ran: the former splits' time over the entries': d96 2x3000 16/4 1.04x, causal 0.99x; 4x3000 32/1 1.08x / 1.01x;
#    1x8000 16/16 1.13x / 1.09x; varlen 1.10x / 1.08x. d128 2x3000 1.14x / 1.28x; 4x3000 32/1 1.19x / 1.17x; 1x8000
#    1.16x / 1.20x; varlen 1.19x / 1.10x (results/kv_in_regs_offgrid_h100_2026-11-27.json)
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) (cd benchmarks && timeout 150 python3 bench_dropout.py --occupancy sm120 --head-dims 128 \
        --out "$OUT/dropout_d128.json" 2>&1 | grep -v -i warn | grep "\[")
     (cd benchmarks && timeout 260 python3 explore/deterministic_tiles.py --head-dim 64 \
        --shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16 --configs table kvr_64x128 kvr_64x128_o2 \
        --out "$OUT/tiles_d64.json" 2>&1 | grep -v -i warn | grep "^d64")
     timeout 150 python3 tools/sanitize.py --families bwd_varlen_classes --tools memcheck \
        --json "$OUT/sanitizer_memcheck.json" 2>&1 | tail -3 ;;
  2) for d in 96 128; do
       (cd benchmarks && timeout 150 python3 explore/deterministic_tiles.py --head-dim $d --no-deterministic \
          --shapes 2x3000x16x4 4x3000x32x1 1x8000x16x16 --configs table smem_operands \
          --out "$OUT/offgrid_d$d.json" 2>&1 | grep -v -i warn | grep "^d$d")
     done
     (cd benchmarks && timeout 170 python3 explore/varlen_tiles.py --head-dims 96 128 --configs table smem_operands \
        --out "$OUT/varlen_tiles.json" 2>&1 | grep -v -i warn | grep "^d") ;;
esac
