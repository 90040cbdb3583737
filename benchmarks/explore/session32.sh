#!/usr/bin/env bash
# Session 32 (issue 20: the block-sparse backward's tiles refined by the mask_mod). One part per call.
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session32.sh N", carry=[".kit_bench"])
# 1: the block-sparse and flex GPU tests (the refinement's exact classes, per-batch mask_mods, aux tensors changed
#    in place, every gradient test through refined lists), then bench_flex's flag, list and varlen rows at SM120
#    occupancy (ours only), main and the tree before the refinement (_br/base.patch), interleaved, ~9 min
# 2: bench_flex, every case and peer, both occupancies (the README's flex table), ~5 min
# 3: the backward walks its lists ascending (part 2's documents row: 1.49x FlexAttention; the causal lists'
#    backward 13% over the flag's with the same tiles and loop size): block-sparse backward GPU tests, then the
#    A/B of part 1 (main, base, main), ~7 min
# 4: where the lists' backward loses to the flag's with the same tiles (part 3: the walk's direction moved nothing;
#    reverted): ncu of the d128 role split's main kernel, causal flag, causal as lists, documents as lists and as
#    varlen (duration, active cycles max / mean, instructions, warp states), ~4 min
# 5: the role split's walk reads its list entries a step ahead (part 4: long-scoreboard stalls 1.43 against the
#    flag's 0.70): block-sparse and flex backward GPU tests, then the A/B main / prev (the refinement alone,
#    _br/prev.patch) / base (the tree before the session) / main, ~9 min
# 6: the carried walk in the 8-warp kernel too (not d256's 32 x 32 tile): block-sparse, flex and dropout GPU tests,
#    then memcheck + racecheck of the sparse (now with a refinement reading an aux tensor) and flex families, ~9 min
# 7: why documents as lists did not move with the carried walk (1.71 against varlen's 1.57 ms): ncu source
#    counters (stall samples per SASS instruction) of the d128 backward, documents as lists and as varlen, ~3 min
# 8: backward list entries packed as g << 16 | m (part 7: the entry's integer division by the query tiles held
#    4% of the lists kernel's stall samples): block-sparse backward GPU tests, then the A/B main / prev (the tree
#    before the packing, _br/prev.patch), interleaved, ~7 min
# 9 (prepared, not run this session): branch sparse-causal-tiles (branches/sparse-causal-tiles.patch: the
#    refinement's causal tiles take the built-in causal mask): its block-sparse and flex backward GPU tests, then
#    the A/B main / branch / main / branch, ~8 min
# 10 (prepared, not run this session): branch refine-early-exit (branches/refine-early-exit.patch: the refinement stops
#    reading a tile once it shows a kept and a dropped element): its refinement tests, then refine_cost.py (the
#    refinement's device time on documents and on a random map of truly partial tiles), main / branch twice, ~5 min
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
flex_ab() {  # $1: tree, $2: label
  (cd "$1/benchmarks" && timeout 170 python3 bench_flex.py --occupancy sm120 --impls ours --cases "causal flag" \
     "block sparse" "varlen" --out "$OUT/flex_$2.json" 2>&1 | grep -v -i warn | grep "\[" | tail -7)
}
case "$part" in
  1) shards 230 tests/test_block_sparse_gpu.py tests/test_flex_gpu.py -k "not large"
     branch base
     flex_ab "$root" main1; flex_ab /tmp/base base1; flex_ab "$root" main2 ;;
  2) (cd benchmarks && timeout 580 python3 bench_flex.py --out "$OUT/flex.json" 2>&1 | grep -v -i warn | grep "\[" \
       | tail -24) ;;
  3) shards 200 tests/test_block_sparse_gpu.py -k "backward or refine"
     branch base
     flex_ab "$root" main1; flex_ab /tmp/base base1; flex_ab "$root" main2 ;;
  4) for c in "causal flag" "causal mask_mod + block sparse" "documents of 512 (mask_mod + block sparse)" \
              "documents of 512 (varlen)"; do
       f="$OUT/ncu_$(echo "$c" | tr -c 'a-z0-9\n' '_').csv"
       FA4_SM120_OCCUPANCY=model timeout 100 ncu --kernel-name regex:RoleSplit --launch-skip 2 --launch-count 1 \
         --section SpeedOfLight --section WarpStateStats --section InstructionStats --section LaunchStats \
         --metrics sm__cycles_active.max,sm__cycles_active.avg,smsp__inst_executed.sum,lts__t_sectors_op_red.sum \
         --page raw --csv python3 benchmarks/explore/profile_lists.py --backward --case "$c" > "$f" 2>/dev/null
       echo "$c: $(wc -l < "$f") lines"
     done ;;
  5) shards 150 tests/test_block_sparse_gpu.py tests/test_flex_gpu.py -k "backward or refine or bwd or grad"
     branch base; branch prev
     flex_ab "$root" main1; flex_ab /tmp/prev prev1; flex_ab /tmp/base base1; flex_ab "$root" main2 ;;
  6) shards 300 tests/test_block_sparse_gpu.py tests/test_flex_gpu.py tests/test_dropout_gpu.py -k "not large"
     timeout 270 python3 tools/sanitize.py --families sparse flex --tools memcheck racecheck --jobs 4 \
       --json "$OUT/sanitizer_sparse.json" --log-dir "$OUT/sanlog" > "$OUT/sanitizer_sparse.txt" 2>&1
     tail -8 "$OUT/sanitizer_sparse.txt" ;;
  7) for c in "documents of 512 (mask_mod + block sparse)" "documents of 512 (varlen)"; do
       t=$(echo "$c" | tr -c 'a-z0-9\n' '_')
       FA4_SM120_OCCUPANCY=model timeout 120 ncu --kernel-name regex:RoleSplit --launch-skip 2 --launch-count 1 \
         --section SourceCounters --section WarpStateStats --section SpeedOfLight -o "/tmp/rep_$t" -f \
         python3 benchmarks/explore/profile_lists.py --backward --case "$c" > /dev/null 2>&1
       ncu -i "/tmp/rep_$t.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/src_$t.csv.gz"
       ncu -i "/tmp/rep_$t.ncu-rep" --page details --csv 2>/dev/null > "$OUT/details_$t.csv"
     done; ls -la "$OUT" ;;
  8) shards 150 tests/test_block_sparse_gpu.py -k "backward or refine or lists"
     branch prev
     flex_ab "$root" main1; flex_ab /tmp/prev prev1; flex_ab "$root" main2; flex_ab /tmp/prev prev2 ;;
  9) mkdir -p _br && cp benchmarks/explore/branches/sparse-causal-tiles.patch _br/ && branch sparse-causal-tiles
     (cd /tmp/sparse-causal-tiles && shards 200 tests/test_block_sparse_gpu.py tests/test_flex_gpu.py \
        -k "backward or refine or bwd or grad")
     flex_ab "$root" main1; flex_ab /tmp/sparse-causal-tiles causal1; flex_ab "$root" main2
     flex_ab /tmp/sparse-causal-tiles causal2 ;;
  10) mkdir -p _br && cp benchmarks/explore/branches/refine-early-exit.patch _br/ && branch refine-early-exit
      (cd /tmp/refine-early-exit && shards 150 tests/test_block_sparse_gpu.py -k "refine or backward_of_example")
      for t in "$root" /tmp/refine-early-exit "$root" /tmp/refine-early-exit; do
        (cd "$t" && timeout 100 python3 benchmarks/explore/refine_cost.py 2>&1 | grep -v -i warn | tail -2)
      done ;;
  *) echo "part 1-10" ;;
esac
