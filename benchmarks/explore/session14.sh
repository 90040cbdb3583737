#!/usr/bin/env bash
# Session 14 on the device: the generalization matrix (TMA K/V widths, banded longest-first causal order), then
# the tile-efficiency sweep (entry_sweep short_*: table entries against smaller-M tiles, long and short sequences).
set -u
cd "$(dirname "$0")/../.."
export FA4_SM120_CACHE_DIR=$PWD/.cache/fa4
(cd benchmarks && python3 warm_cache.py --jobs 15 --matrix --sm120-only 2>&1 | grep -v -i warning | tail -3
 python3 bench_fwd.py --matrix --occupancy sm120 --out "$OUT/fwd_matrix.json" 2>&1 | grep -v -i warning | tail -90)
python3 benchmarks/explore/entry_sweep.py --warm-jobs 15 --occupancy model \
  --sets short_d64 short_d80 short_d96 short_d128 short_d192 2>&1 | grep -v -i warning > "$OUT/short_tiles.log"
mv "$OUT/explore.json" "$OUT/short_tiles.json" 2>/dev/null
