#!/usr/bin/env bash
# Session 36 (issue 20: dropout d64 causal forward + backward 1.32x the time without, target 1.25x). One part per call.
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session36.sh N", carry=[".kit_bench"])
# The change (branch dropout-bytes): 8-bit draws, one Philox call per 16 scores (16 x 32 cells), applied to the 16-bit
# P pairs by PRMT + set.ge.u32.f16x2 + AND; sm_120a SASS of the d64 forward's unmasked step 1043 -> 896 instructions
# (655 without dropout), the d64 64x128 role split's step 2052 -> 1889.
# 1: the dropout GPU tests on this tree, then bench_dropout (SM120 occupancy, ours with and without dropout) on main
#    (_br/main.patch: this tree back to main) and this tree, two rounds, d64 full / causal and d128 causal, ~9 min
# 2: memcheck + racecheck + synccheck of the dropout family, the backward tests beside dropout, ~8 min
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
  2) timeout 330 python3 tools/sanitize.py --families dropout --json "$OUT/sanitizer_dropout.json" 2>&1 | tail -8
     shards 200 tests/test_bwd_gpu.py -k "dropout or deterministic or causal" ;;
esac
