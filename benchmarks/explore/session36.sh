#!/usr/bin/env bash
# Session 36 (issue 20: dropout d64 causal forward + backward 1.32x the time without, target 1.25x). One part per call.
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session36.sh N", carry=[".kit_bench"])
# The change (branch dropout-bytes): 8-bit draws, one Philox call per 16 scores (16 x 32 cells), applied to the 16-bit
# P pairs by PRMT + set.ge.u32.f16x2 + AND; sm_120a SASS of the d64 forward's unmasked step 1043 -> 896 instructions
# (655 without dropout), the d64 64x128 role split's step 2052 -> 1889.
# 1: the dropout GPU tests on this tree, then bench_dropout (SM120 occupancy, ours with and without dropout) on main
#    (_br/main.patch: this tree back to main) and this tree, two rounds, d64 full / causal and d128 causal, ~9 min
# 1 ran: dropout tests 40/42 (d96 causal dq 1.00x and d128 causal p = 0.1 dk 1.55x the 2x rule's bound); dropout cost
#    (fwd / fwd+bwd) main -> bytes, two rounds: d64 full 1.47 / 1.26-1.28 -> 1.27-1.30 / 1.20-1.22, d64 causal 1.58-1.60 /
#    1.32-1.34 -> 1.33 / 1.19-1.20, d128 causal 1.20-1.22 / 1.11 -> 1.14-1.15 / 1.07-1.09
# 2: explore/dropout_grad_probe.py on main and this tree (the gradients' error over 6 seeds against the 2x rule, the
#    backward's mask off dV), ~4 min
# 2 ran: the backward's mask equals dropout_keep_mask in both trees (d64 / d96 / d128, causal or not); the 2x rule's
#    ratio over 6 seeds exceeds 1 on both trees (main: d64 causal 1.33 / 1.23; bytes: d96 causal 1.01-1.06, d128
#    causal dk 1.55, d64 causal dq 1.81): the role split's dS mixed P z rounded to 16 bits (bf16(P / (1 - p))) with
#    an O whose 1 / (1 - p) the forward applied in fp32 (error ~ rounding(1 / (1 - p)) dP at rows of few keys).
#    Fixed: sP holds P keep (the forward's 16-bit operand), group 1 scales dP, dV is scaled at the end
# 3: the final tree: the dropout GPU tests, dropout_grad_probe.py (this tree), bench_dropout (SM120 occupancy, every
#    case, FA2 beside), ~9 min
# 3 ran: 42/42, ratios <= 0.94, bench_dropout: d64 causal 1.16x, d64 1.25x, d128 1.09x / 1.09x, d256 1.00x / 1.04x
# 4: memcheck + racecheck + synccheck of the dropout family, the backward tests beside dropout, ~8 min. Ran: 3/3 clean,
#    69/69. The sm_120a gate then showed three 8-warp / 4-warp backward dropout configs spilling 12-56 B with the
#    P keep form (dV scaled at the end); the 8-warp kernel's dS comes from fp32 P (no 16-bit P z enters it), so it
#    keeps the P z form (all three conform again)
# 5: the final tree's dropout GPU tests and dropout_grad_probe.py, ~4 min. Ran: 42/42, ratios <= 0.94
# 6: branch dropout-fold (the role split stores dS (1 - p) = P keep dP - P D' (1 - p): no multiply per score in group
#    1; dQ's fragment and dK's epilogue take 1 / (1 - p); sm_120a d64 causal step 1889 -> 1804 instructions): the
#    dropout tests and dropout_grad_probe.py on it, then bench_dropout main / fold, d64 and d128 causal, ~5 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
drop_ab() {  # $1: tree, $2: label
  (cd "$1/benchmarks" && timeout 150 python3 bench_dropout.py --occupancy sm120 --impls ours ours_dropout \
     --cases "d64" "d128 causal" --out "$OUT/dropout_$2.json" 2>&1 | grep -v -i warn | grep "\[")
}
case "$part" in
  1) shards 200 tests/test_dropout_gpu.py
     branch main
     for r in 1 2; do
       echo "== round $r main"; drop_ab /tmp/main "main_$r"
       echo "== round $r bytes"; drop_ab "$root" "bytes_$r"
     done ;;
  2) branch main
     for t in /tmp/main "$root"; do
       echo "== $t"; (cd benchmarks && timeout 200 python3 explore/dropout_grad_probe.py --tree "$t" 2>&1 | grep -v -i warn)
     done ;;
  3) shards 200 tests/test_dropout_gpu.py
     (cd benchmarks && timeout 150 python3 explore/dropout_grad_probe.py 2>&1 | grep -v -i warn)
     (cd benchmarks && timeout 200 python3 bench_dropout.py --occupancy sm120 --out "$OUT/dropout.json" 2>&1 \
        | grep -v -i warn | grep "\[") ;;
  5) shards 200 tests/test_dropout_gpu.py
     (cd benchmarks && timeout 150 python3 explore/dropout_grad_probe.py 2>&1 | grep -v -i warn) ;;
  6) shards 200 tests/test_dropout_gpu.py
     (cd benchmarks && timeout 150 python3 explore/dropout_grad_probe.py 2>&1 | grep -v -i warn | head -4)
     branch main
     echo "== main"; drop_ab /tmp/main main_6
     echo "== fold"; drop_ab "$root" fold_6 ;;
  4) timeout 330 python3 tools/sanitize.py --families dropout --json "$OUT/sanitizer_dropout.json" 2>&1 | tail -8
     shards 200 tests/test_bwd_gpu.py -k "dropout or deterministic or causal" ;;
esac
