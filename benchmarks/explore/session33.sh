#!/usr/bin/env bash
# Session 33 (issue 20: the two branches session 32 prepared; issue 19: the backward role split's step knobs). One part per call.
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session33.sh N", carry=[".kit_bench"])
# 1: branch sparse-causal-tiles (branches/sparse-causal-tiles.patch: the refinement's causal tiles take the built-in
#    causal mask): its block-sparse and flex backward GPU tests, then bench_flex's flag / lists / varlen rows, main /
#    branch / main / branch interleaved (session32.sh part 9), ~8 min
# 2: branch refine-early-exit (branches/refine-early-exit.patch): its refinement tests, then refine_cost.py main /
#    branch twice (session32.sh part 10), ~4 min (part 1: the causal-tiles branch measured no gain, so its
#    sanitizer run was dropped)
# 3: the backward's step -> (query head, query block) through a FastDivmod divisor (sm_120a: the d128 role split's
#    causal step loop 1071 -> 1016 instructions, full 980 -> 975): bench_bwd (ours, default and deterministic)
#    main / prev (_br/prev.patch: the division) twice, interleaved, ~8 min
# 4: part 3's change: the backward and block-sparse backward GPU tests, then bench_flex's rows main / prev, ~7 min
# 4 ran with the divisor in every kernel: prefix-LM lists 7.77 -> 8.19 ms; since then list entries keep the division
#    (their SASS identical to before the session) and only the role split's dense steps take the divisor
# 5: the dropout and flex GPU suites (role-split dense steps with the divisor), then memcheck of the bwd, bwd_det
#    and bwd_rolesplit families, ~8 min
# 6: bench_bwd, every case and peer, both occupancies (the README's backward table), ~6 min
# 7: the step divisor kept to d128's role split (BwdConfig.step_divisor; part 6 had it in every role split: d64 full
#    254 -> 244 TFLOPS against session 31's run): d64 full and causal, main / d64div (_br/d64div.patch: the divisor
#    at d64 too) twice, interleaved, ~4 min
# 8: bench_bwd's 4x2048 8/2 row again, twice (part 6's second run gave its fwd+bwd below its backward alone: a
#    disturbed measurement of a 0.4 ms call), ~3 min
# 9: non-causal key blocks start at query block n (bwd_config.bwd_rotated_start): bench_bwd's d64 and d128
#    non-causal rows main / prev (_br/prev.patch: every key block from query block 0) twice, interleaved, then the
#    backward GPU suite, ~8 min
# 10: after part 9 (d64 0.97x, d128 1.02x slower: BwdConfig.rotated_start on d64's entry only): the dropout and flex
#    GPU suites (d64 non-causal dropout and mods on the rotated kernel), then bench_bwd's d64 rows, both
#    occupancies, every peer (merged into the README's table), ~5 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
flex_ab() {  # $1: tree, $2: label
  (cd "$1/benchmarks" && timeout 170 python3 bench_flex.py --occupancy sm120 --impls ours --cases "causal flag" \
     "block sparse" "varlen" --out "$OUT/flex_$2.json" 2>&1 | grep -v -i warn | grep "\[" | tail -7)
}
take() { mkdir -p _br && cp "benchmarks/explore/branches/$1.patch" _br/ && branch "$1"; }
case "$part" in
  1) take sparse-causal-tiles
     (cd /tmp/sparse-causal-tiles && shards 200 tests/test_block_sparse_gpu.py tests/test_flex_gpu.py \
        -k "backward or refine or bwd or grad")
     flex_ab "$root" main1; flex_ab /tmp/sparse-causal-tiles causal1; flex_ab "$root" main2
     flex_ab /tmp/sparse-causal-tiles causal2 ;;
  2) take refine-early-exit
     (cd /tmp/refine-early-exit && shards 120 tests/test_block_sparse_gpu.py -k "refine or backward_of_example")
     for t in "$root" /tmp/refine-early-exit "$root" /tmp/refine-early-exit; do
       (cd "$t" && timeout 90 python3 benchmarks/explore/refine_cost.py 2>&1 | grep -v -i warn | tail -2)
     done
     ;;
  3) branch prev
     for t in "$root:main1" /tmp/prev:prev1 "$root:main2" /tmp/prev:prev2; do
       (cd "${t%%:*}/benchmarks" && timeout 115 python3 bench_bwd.py --occupancy sm120 --impls ours ours_deterministic \
          --cases d128_4x4096_32/8 d64_4x4096_32/8_causal d128_4x2048_8/2 d96 --out "$OUT/bwd_${t##*:}.json" 2>&1 \
          | grep -v -i warn | grep "\[" | tail -8)
     done ;;
  4) shards 270 tests/test_bwd_gpu.py tests/test_block_sparse_gpu.py -k "not large and (bwd or backward or grad or \
        causal or gqa or varlen or deterministic or split)"
     branch prev
     flex_ab "$root" main1; flex_ab /tmp/prev prev1 ;;
  5) shards 200 tests/test_dropout_gpu.py tests/test_flex_gpu.py -k "not large"
     timeout 300 python3 tools/sanitize.py --families bwd bwd_det bwd_rolesplit --tools memcheck --jobs 4 \
       --json "$OUT/sanitizer_bwd.json" --log-dir "$OUT/sanlog" > "$OUT/sanitizer_bwd.txt" 2>&1
     tail -6 "$OUT/sanitizer_bwd.txt" ;;
  6) (cd benchmarks && timeout 575 python3 bench_bwd.py --occupancy both --out "$OUT/bwd.json" 2>&1 \
       | grep -v -i warn | grep "\[" | tail -24) ;;
  7) branch d64div
     for t in "$root:main1" /tmp/d64div:div1 "$root:main2" /tmp/d64div:div2; do
       (cd "${t%%:*}/benchmarks" && timeout 100 python3 bench_bwd.py --occupancy sm120 --impls ours \
          --cases d64_4x4096 --out "$OUT/bwd_${t##*:}.json" 2>&1 | grep -v -i warn | grep "\[" | tail -2)
     done ;;
  8) for i in 1 2; do
       (cd benchmarks && timeout 140 python3 bench_bwd.py --occupancy both --cases 4x2048 --out "$OUT/bwd_4x2048_$i.json" \
          2>&1 | grep -v -i warn | grep "\[" | tail -2)
     done ;;
  9) branch prev
     for t in "$root:main1" /tmp/prev:prev1 "$root:main2" /tmp/prev:prev2; do
       (cd "${t%%:*}/benchmarks" && timeout 90 python3 bench_bwd.py --occupancy sm120 --impls ours \
          --cases d64_4x4096_32/8 d128_4x4096_32/8 --out "$OUT/bwd_${t##*:}.json" 2>&1 | grep -v -i warn \
          | grep "\[" | grep -v causal)
     done
     shards 230 tests/test_bwd_gpu.py -k "not large" ;;
  10) shards 200 tests/test_dropout_gpu.py tests/test_flex_gpu.py -k "not large"
      (cd benchmarks && timeout 150 python3 bench_bwd.py --occupancy both --cases d64_4x4096 --out "$OUT/bwd_d64.json" \
         2>&1 | grep -v -i warn | grep "\[") ;;
  *) echo "part 1-10" ;;
esac
