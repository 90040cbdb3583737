# Sourced by the session scripts: ``shards <timeout> <tests...>`` runs GPU tests in 12 shards (tools/pytest_shards.py),
# the summary to $OUT/tests_$part.txt (its tail printed) and the failures' context to $OUT/failures_$part.txt.
shards() {
  local limit="$1"; shift
  timeout "$limit" python3 tools/pytest_shards.py -n 12 --log-dir /tmp/sh -- -m gpu "$@" > "$OUT/tests_$part.txt" 2>&1
  tail -16 "$OUT/tests_$part.txt"
  grep -h -B2 -A30 "^FAILED\|^E  " /tmp/sh/*.log 2>/dev/null | head -300 > "$OUT/failures_$part.txt"
}
