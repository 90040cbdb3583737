#!/usr/bin/env bash
# Session 40 (issue 20: dropout's d96 causal cost over the line; issue 19: P by warp pairs in every role split).
# One part per call:
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session40.sh N", carry=[".kit_bench"])
# Branch rp: benchmarks/explore/branches/rolesplit-pairs.patch copied to _br/rp.patch (every role split passes P,
# and with dropout its read and P keep, by warp pairs; includes dropout-pairs.patch).
# 1: A/B main against rp, alternated twice: bench_dropout --impls ours ours_dropout at d64 / d96 / d128 (the d64
#    rows and every dropout row run changed kernels in rp; d96 / d128 without dropout are the kv_in_regs entries,
#    unchanged: the control), ~8 min
# 1 ran (fwd+bwd ms, ours / with dropout, main vs rp, two rounds): d64 6.67 / 6.59, 6.69 / 6.62 (rp -1%), causal
#    3.53 / 3.50, 3.52 / 3.50; d64 dropout 7.98 / 7.95, 8.07 / 7.98, causal 4.09 / 4.16, 4.10 / 4.14 (rp +1.3%); d96
#    dropout 10.76 / 10.71, 10.85 / 10.90, causal 5.86 / 5.82, 5.88 / 5.80; d128 dropout 14.60 / 14.70, 14.78 / 15.02,
#    causal 7.57 / 7.67, 7.68 / 7.78 (rp +1.3%); the controls (d96 / d128 without dropout) within 1%. Dropout cost at
#    d96 causal: main 1.286x, 1.243x; rp 1.274x, 1.218x. rp not adopted (d64 +1%, dropout mixed). d96 causal's forward
#    pays 1.37-1.38x for dropout (1.05 -> 1.45 ms) against 1.13-1.16x at d96 full / d128 causal: its 128x64 4-warp tile
#    applies the mask element by element from half Philox calls (config.dropout_on_pairs)
# 2: explore/dropout_tiles.py: the backward's dropout split (d96 64x96, d128 64x64, both operands from shared memory)
#    against the 64x64 kv_in_regs splits (sm_120a with dropout: 204-250 registers, no local memory), and the d96
#    forward's class tile against 128x64 8-warp two-stage and 64x64 4-warp tiles (keep flags on pairs), three shapes,
#    ~6 min
# 2 ran: backward with dropout over the class entry without it, dispatch (smem-operand split) / kvr_64x64 / _o2: d96
#    4x4096 full 1.249x / 1.584x / 1.586x, causal 1.248x / 1.420x / 1.407x; d128 full 1.271x / 1.371x / 1.380x (dq2
#    1.343x), causal 1.226x / 1.295x / 1.251x; 2x4096 16/4 and 8x2048 16/16 alike (kvr 1.00-1.27x slower but d128 o2
#    causal 8x2048 0.976x): not adopted. d96 forward with dropout, 4x4096 causal: 128x64 8-warp two-stage 1.581 ms,
#    64x64 4-warp 1.605 against the class tile's ~1.45 (their plain forwards 1.415 / 1.440 against 1.153): not
#    adopted (results/dropout_tiles_h100_2026-11-27.json.gz, part 2's rows)
# 3: explore/dropout_tiles.py --kinds fwd --head-dims 96: the class tile's narrower twin, 128x32 on 4 warps,
#    one and two stages (the pairs fit: 32 S registers per thread; 128x48 breaks d96's 32-row copy passes), plain and
#    with dropout, three shapes, ~3 min
# 3 ran: d96 forward with dropout, dispatch (128x64, element by element from half calls) / 128x32 one stage / two:
#    4x4096 causal 1.427 / 1.412 / 1.434 ms (plain 1.102 / 1.281 / 1.245), full 2.592 / 2.806 / 2.785; 2x4096 16/4
#    causal 0.406 / 0.395 / 0.402, 8x2048 16/16 causal 0.437 / 0.431 / 0.431: the narrower tiles' slower plain forward
#    eats the pairs' saving: not adopted
# 4: d96 causal's class tile converts and masks P call by call (dropout_mask.convert_keep_pairs: cvt.rn.bf16x2 + PRMT
#    / set / AND per pair from whole Philox calls; sm_120a 255 registers, no local memory): the dropout GPU tests (a
#    new one runs the 128x64 tile at 1024 tokens: 177 took the 64-row alternate) and bench_dropout's d96 rows (ours,
#    with and without dropout), this tree against the tree before (branch base), alternated twice, ~7 min
# 4 ran: 48/48; d96 causal forward with dropout 1.26, 1.32 ms against 1.42, 1.45 (-10%), fwd+bwd 5.72, 5.73 against
#    5.84, 5.86 (-2%); the runs' plain fwd+bwd 4.57-4.76 ms (both trees the same kernels): dropout cost at d96 causal
#    1.228x on their mean (1.253x, 1.205x per round) against the tree before's 1.255x (1.265x, 1.248x); d96 full
#    unchanged (10.83-10.85 ms both trees): adopted
# 5: bench_dropout's d96 and d128 rows with every peer (FA2 with and without dropout) on the final tree, merged into
#    results/dropout_h100_2026-11-27.json (d64's rows: session 36), ~5 min
# 5 ran: d96 fwd+bwd with / without dropout 10.75 / 8.73 ms (1.231x), causal 5.70 / 4.61 (1.236x); d128 14.58 / 11.75
#    (1.241x), causal 7.56 / 6.31 (1.197x); FA2 d96 9.50 / causal 5.65 ms without dropout
# 6: issue 19, the kv_in_regs splits' group 1 runs each step's dK at the start of the next (FlashBwdRoleSplit.lag_dk:
#    dK(i - 1) before dP(i), so group 1 reaches P with two GEMMs done against group 0's S and exponentials; group 1
#    loads the next Q tile after a group barrier; step 0's dK adds zeros; the last runs after the walk; sm_120a: the
#    kv_in_regs configs at 255 registers, no local memory): A/B with bench_bwd (ours) against the tree before
#    (branch base), d96 / d128 4x4096 32/8 full and causal, alternated, ~4 min
# 6 ran: backward TFLOPS this tree / before, two rounds: d96 340, 340 / 307, 307 (+10.7%); causal 317, 319 / 288, 290
#    (+10%); d128 325, 312 / 305, 301 (+4-7%); causal 304, 305 / 283, 284 (+7.5%)
# 7: the backward GPU suite and racecheck of bwd_rolesplit on the lag_dk tree (the device budget's rest), ~8 min
#    (lag_dk off for the deterministic highest-first order with a mask beside 64 S registers per thread: d96's causal
#    and windowed deterministic configs kept 4-8 B of local memory on sm_120a with it)
# 7 ran: 186/186; racecheck bwd_rolesplit (deterministic, d64 64x64 split, d96 / d128 kv_in_regs entries, varlen)
#    clean, 0 hazards. The device budget is spent: bench_bwd with every peer on this tree is owed
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) branch rp
     for t in "$root" /tmp/rp "$root" /tmp/rp; do
       lim=$([ -e "/tmp/done_$(basename "$t")" ] && echo 90 || echo 190)
       (cd "$t/benchmarks" && timeout $lim python3 bench_dropout.py --occupancy sm120 --impls ours ours_dropout \
          --head-dims 64 96 128 --out "$OUT/dropout_$(basename "$t")_$SECONDS.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
       touch "/tmp/done_$(basename "$t")"
     done ;;
  2) (cd benchmarks && timeout 560 python3 explore/dropout_tiles.py --out "$OUT/dropout_tiles.json" 2>&1 \
        | grep -v -i warn | grep "^d") ;;
  3) (cd benchmarks && timeout 400 python3 explore/dropout_tiles.py --kinds fwd --head-dims 96 \
        --out "$OUT/dropout_tiles_fwd.json" 2>&1 | grep -v -i warn | grep "^d") ;;
  4) branch base
     shards 240 tests/test_dropout_gpu.py
     for t in "$root" /tmp/base "$root" /tmp/base; do
       lim=$([ -e "/tmp/done4_$(basename "$t")" ] && echo 60 || echo 120)
       (cd "$t/benchmarks" && timeout $lim python3 bench_dropout.py --occupancy sm120 --impls ours ours_dropout \
          --head-dims 96 --out "$OUT/dropout_$(basename "$t")_$SECONDS.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
       touch "/tmp/done4_$(basename "$t")"
     done ;;
  6) branch base
     for t in "$root" /tmp/base "$root" /tmp/base; do
       bwd_ab "$t" "$(basename "$t")_$SECONDS" ours d96_4x4096 d128_4x4096 | sed "s|^|$(basename "$t") |"
     done ;;
  7) shards 230 tests/test_bwd_gpu.py
     timeout 170 python3 tools/sanitize.py --families bwd_rolesplit --tools racecheck \
        --json "$OUT/sanitizer_racecheck.json" 2>&1 | tail -3 ;;
  5) (cd benchmarks && timeout 560 python3 bench_dropout.py --occupancy sm120 --head-dims 96 128 \
        --out "$OUT/dropout.json" 2>&1 | grep -v -i warn | grep "\[") ;;
esac
