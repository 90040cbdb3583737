#!/usr/bin/env bash
# Session 37 (issue 19: d96 causal backward 0.95x FA2 / 1.05x upstream's SM120 path at SM120 occupancy). One part per
# call:  run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session37.sh N", carry=[".kit_bench"])
# The change: d96's role split on 64x96 tiles (96 keys per CTA, 98304 B; K / V and dK / dV moved by a warp group each,
# bwd_config.bwd_kv_copy_threads, since the CTA's 64-row copy pass does not divide 96 keys) instead of 64x64 with a
# double-buffered dO. Per FLOP: a third fewer dQ reductions and Q / dO tile loads, 12 MMAs per k-step of S / dP per
# warp for 5 ldmatrix.x4 (was 8 for 4). sm_120a: 52 candidates and the 23 dispatchable configs conform (206-255 regs,
# 0 spills, 99328 B).
# 1: the d96 backward / dropout GPU tests on this tree (the 64x96 entry); deterministic_tiles.py --head-dim 96 (table
#    64x96 against the former 64x64 entry and the 16x96 S warp split, default and deterministic, full and causal,
#    three shapes); bench_bwd's d96 row with the peers (SM120 occupancy), ~8 min
# 1 ran: 29/29; d96 64x96 against the former 64x64 entry, default: 4x4096 32/8 full 7.78 / 10.22 ms (0.76x), causal
#    4.06 / 4.59 (0.88x), 2x4096 16/4 full 2.18 / 2.64, causal 1.12 / 1.21, 8x2048 16/16 full 2.15 / 2.56, causal
#    1.17 / 1.34; deterministic 1.02-1.27x the default (was 1.04-1.73x); the 16x96 S split 1.04-1.09x slower than
#    32x48; bench_bwd d96 causal ours 255 TFLOPS, FA2 236 (1.08x), upstream 214 (1.19x)
# 2: d128 on 32x96 role-split tiles (84-92 KB: 32-row query tiles leave room for 96 keys) against the 64x64 table
#    entry (deterministic_tiles.py --head-dim 128, three shapes); memcheck of the bwd family and racecheck of
#    bwd_rolesplit (d96's 64x96 entry with its group copies), ~8 min
# 2 ran: 32x96 against 64x64 (default): 1.03-1.11x slower at 4x4096 32/8 and 2x4096 16/4 full and causal and at
#    8x2048 16/16 full, 0.967x at 8x2048 16/16 causal (1.61 -> 1.56 ms); deterministic 8x2048 16/16 full 1.48x -> 1.28x
#    the default; memcheck bwd / bwd_rolesplit clean; racecheck cut off by the part's timeout
# 3: racecheck of bwd_rolesplit; d128 32x96 against 64x64 at four short / MHA causal shapes; bench_bwd's d96 row at
#    both occupancies (ours, deterministic, FA2, upstream), ~7 min
# 3 ran: racecheck bwd_rolesplit clean; 32x96 / 64x64 at d128: 16x1024 32/8 1.006x / 1.042x causal, 4x2048 8/2 1.136x /
#    1.103x, 8x1024 16/16 1.045x / 1.004x, 4x2048 32/32 1.046x / 0.977x: only MHA causal at 2048 gains (not adopted);
#    bench_bwd d96 causal: SM120 occupancy ours 253, FA2 235 (1.08x), upstream 213 (1.19x); H100 occupancy ours 254,
#    FA2 234 (1.09x), upstream 241, cuDNN 356
# 4: d96's step knobs on the 64x96 tile (the FastDivmod step divisor, the rotated non-causal start), three shapes; the
#    backward and dropout GPU suites on the final tree, ~7 min
# 4 ran: the step divisor on 64x96 0.974-1.003x (4x4096 32/8 full 0.988x, causal 0.993x; 2x4096 16/4 0.981x /
#    1.003x; 8x2048 16/16 0.974x / 0.986x), the rotated start 0.981-1.016x; the backward + dropout GPU suites 226/226
#    (the 64x96 entry without the divisor)
# 5: the final tree (d96's 64x96 entry with the step divisor): the d96 backward / dropout tests, bench_bwd in full at
#    both occupancies (the README's backward table), ~8 min
# 5 ran: 29/29; bench_bwd (bwd_h100_2026-11-27.json): d96 causal 256 TFLOPS against FA2 234 (1.094x) and upstream 214
#    (1.196x), deterministic 1.02x; the other rows within noise of session 33's
# 6: memcheck of the bwd family on the final tree (d96's entry with the step divisor); bench_dropout: d96 on the
#    4x4096 32/8 grid (the 64x96 split's half calls) with FA2 beside, 2x3000 16/4 d80 / d128 (off the grid), and the
#    grid at the H100's own occupancy (byte-valued draws), ~8 min
# 6 ran: memcheck bwd clean; dropout cost d96 1.09x / 1.15x causal, 2x3000 16/4 d80 1.09x / 1.14x, d128 1.10x /
#    1.10x; the grid at the H100's occupancy 1.01-1.19x (FA2 1.00-1.21x); FA2's d96 full fwd+bwd 9.50 ms against ours
#    9.84 (forwards 2.50 / 2.03): its backward ahead at d96 non-causal
# 7: bench_bwd's d96 rows, the new non-causal one beside the causal one, both occupancies, ~3 min
# 7 ran: d96 full ours 270 TFLOPS, FA2 288 (0.94x), upstream 228 (1.18x); causal 257 / 235 (1.09x) / 212 (1.21x)
# 8: varlen no longer sends d64 / d96 to their heavy 8-warp tiles (bwd_config._is_heavy): the role splits hold it
#    (sm_120a: 13 new dispatchable configs and 12 varlen + dropout ones conform, 219-255 registers); the varlen
#    backward / dropout / flex / call-plan tests (d96 added to test_bwd_varlen, test_varlen of dropout over d64 / d96 /
#    d128), then explore/varlen_tiles.py (documents of 128-2048 tokens packed to 16384, 32/8 heads: the role split
#    against the heavy tile, d64 / d96, full and causal), ~6 min
# 8 ran: 28/28; varlen backward, heavy 8-warp tile / role split: d64 1.165x full, 1.143x causal; d96 1.346x / 1.356x
#    (role split 2.33 / 1.43 ms at d64, 3.22 / 1.89 at d96): adopted
# 9: memcheck of varlen backward calls at d64 / d96 (good and corrupt metadata) on the role splits, ~4 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) shards 240 tests/test_bwd_gpu.py tests/test_dropout_gpu.py -k "96"
     (cd benchmarks && timeout 200 python3 explore/deterministic_tiles.py --head-dim 96 \
        --shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16 --configs table rolesplit_64x64 rolesplit_64x96_s4 \
        --out "$OUT/tiles_d96.json" 2>&1 | grep -v -i warn | grep "^d96")
     (cd benchmarks && timeout 120 python3 bench_bwd.py --occupancy sm120 --cases d96 --out "$OUT/bwd_d96.json" \
        2>&1 | grep -v -i warn | grep "\[") ;;
  2) (cd benchmarks && timeout 300 python3 explore/deterministic_tiles.py --head-dim 128 \
        --shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16 --out "$OUT/tiles_d128.json" 2>&1 | grep -v -i warn | grep "^d128")
     timeout 260 python3 tools/sanitize.py --families bwd bwd_rolesplit --tools memcheck racecheck \
        --json "$OUT/sanitizer_bwd.json" 2>&1 | tail -6 ;;
  3) timeout 200 python3 tools/sanitize.py --families bwd_rolesplit --tools racecheck \
        --json "$OUT/sanitizer_rolesplit.json" 2>&1 | tail -3
     (cd benchmarks && timeout 200 python3 explore/deterministic_tiles.py --head-dim 128 --no-deterministic \
        --configs table rolesplit_32x96 --shapes 16x1024x32x8 4x2048x8x2 8x1024x16x16 4x2048x32x32 \
        --out "$OUT/tiles_d128_short.json" 2>&1 | grep -v -i warn | grep "^d128")
     (cd benchmarks && timeout 200 python3 bench_bwd.py --occupancy both --cases d96 --out "$OUT/bwd_d96.json" \
        2>&1 | grep -v -i warn | grep "\[") ;;
  4) (cd benchmarks && timeout 200 python3 explore/deterministic_tiles.py --head-dim 96 --no-deterministic \
        --configs table rolesplit_64x96_div rolesplit_64x96_rot --shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16 \
        --out "$OUT/tiles_d96_knobs.json" 2>&1 | grep -v -i warn | grep "^d96")
     shards 330 tests/test_bwd_gpu.py tests/test_dropout_gpu.py ;;
  5) shards 240 tests/test_bwd_gpu.py tests/test_dropout_gpu.py -k "96"
     (cd benchmarks && timeout 500 python3 bench_bwd.py --occupancy both --out "$OUT/bwd.json" 2>&1 \
        | grep -v -i warn | grep "\[") ;;
  6) timeout 240 python3 tools/sanitize.py --families bwd --tools memcheck --json "$OUT/sanitizer_bwd_final.json" 2>&1 \
        | tail -2
     (cd benchmarks && timeout 120 python3 bench_dropout.py --occupancy sm120 --head-dims 96 \
        --impls ours ours_dropout sdpa_flash_fa2 sdpa_flash_fa2_dropout --out "$OUT/dropout_d96.json" 2>&1 \
        | grep -v -i warn | grep "\[")
     (cd benchmarks && timeout 120 python3 bench_dropout.py --occupancy sm120 --shape 2x3000x16x4 --head-dims 80 128 \
        --impls ours ours_dropout --out "$OUT/dropout_offgrid.json" 2>&1 | grep -v -i warn | grep "\[")
     (cd benchmarks && timeout 200 python3 bench_dropout.py --occupancy h100 --out "$OUT/dropout_h100occ.json" 2>&1 \
        | grep -v -i warn | grep "\[") ;;
  7) (cd benchmarks && timeout 300 python3 bench_bwd.py --occupancy both --cases d96 --out "$OUT/bwd_d96.json" 2>&1 \
        | grep -v -i warn | grep "\[") ;;
  8) shards 240 tests/test_bwd_gpu.py tests/test_dropout_gpu.py tests/test_flex_gpu.py tests/test_call_plans.py \
        -k "varlen or packed or seqused"
     (cd benchmarks && timeout 240 python3 explore/varlen_tiles.py --out "$OUT/varlen_tiles.json" 2>&1 \
        | grep -v -i warn | grep "^d") ;;
  9) timeout 300 python3 tools/sanitize.py --families bwd_varlen_classes --tools memcheck \
        --json "$OUT/sanitizer_varlen.json" 2>&1 | tail -3 ;;
esac
