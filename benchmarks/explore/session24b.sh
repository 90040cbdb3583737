#!/usr/bin/env bash
# Session 24's block-sparsity device calls (issue 20), one part per call:
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session24b.sh 1", carry=[".kit_bench"])
# 1: block-sparse GPU tests (forward + backward) + the flex and backward tests (both kernels changed), ~6 min
# 2: compute-sanitizer on the sparse family (memcheck, racecheck) and the flex family (memcheck), ~4 min
# 3: bench_flex.py (sparse cases against the dense / flag kernels and torch FlexAttention), ~6 min
set -u
cd "$(dirname "$0")/../.."
part="${1:-1}"
shards() {  # shards <timeout> <tests...>
  local limit="$1"; shift
  timeout "$limit" python3 tools/pytest_shards.py -n 12 --log-dir /tmp/sh -- -m gpu "$@" > "$OUT/tests_$part.txt" 2>&1
  tail -20 "$OUT/tests_$part.txt"
  grep -h -B2 -A30 "^FAILED\|^E  " /tmp/sh/*.log 2>/dev/null | head -400 > "$OUT/failures_$part.txt"
}
case "$part" in
  1) shards 560 tests/test_block_sparse_gpu.py tests/test_flex_gpu.py tests/test_bwd_gpu.py ;;
  2) timeout 560 python3 tools/sanitize.py --families sparse flex --tools memcheck racecheck --jobs 3 \
       --json "$OUT/sanitizer.json" --log-dir /tmp/sanlog > "$OUT/sanitizer.txt" 2>&1
     tail -c 3000 "$OUT/sanitizer.txt"
     tar czf "$OUT/sanlog.tgz" -C /tmp sanlog 2>/dev/null ;;
  3) (cd benchmarks && timeout 580 python3 bench_flex.py --out "$OUT/flex.json" 2>&1 | grep -v -i warn | tail -30) ;;
  *) echo "part 1-3" ;;
esac
