# Sourced by the session scripts: ``shards <timeout> <tests...>`` runs GPU tests in 12 shards (tools/pytest_shards.py),
# the summary to $OUT/tests_$part.txt (its tail printed) and the failures' context to $OUT/failures_$part.txt;
# ``branch NAME`` copies the tree (from $root, else the current directory) to /tmp/NAME and applies _br/NAME.patch
# (an unmerged branch's diff against main: the device carry limit has no room for whole trees);
# ``bwd_ab TREE LABEL IMPLS CASES...`` runs bench_bwd.py at SM120 occupancy in TREE, into $OUT/bwd_LABEL.json.
shards() {
  local limit="$1"; shift
  timeout "$limit" python3 tools/pytest_shards.py -n 12 --log-dir /tmp/sh -- -m gpu "$@" > "$OUT/tests_$part.txt" 2>&1
  tail -16 "$OUT/tests_$part.txt"
  grep -h -B2 -A30 "^FAILED\|^E  " /tmp/sh/*.log 2>/dev/null | head -300 > "$OUT/failures_$part.txt"
}
branch() {
  local src="${root:-$PWD}"
  rm -rf "/tmp/$1" && mkdir "/tmp/$1" && tar -C "$src" --exclude=./.kit_bench --exclude=./.kit_client --exclude=./.venv --exclude=./.git -cf - . \
    | tar -C "/tmp/$1" -xf - && (cd "/tmp/$1" && (git apply "$src/_br/$1.patch" || patch -p1 < "$src/_br/$1.patch"))
}
bwd_ab() {  # $1: tree, $2: label, $3: impls, rest: cases
  local tree="$1" label="$2" impls="$3"; shift 3
  (cd "$tree/benchmarks" && timeout 150 python3 bench_bwd.py --occupancy sm120 --impls $impls --cases "$@" \
     --out "$OUT/bwd_$label.json" 2>&1 | grep -v -i warn | grep "\[")
}
