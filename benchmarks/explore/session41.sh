#!/usr/bin/env bash
# Session 41 (issue 19: the peers on the lag_dk tree, lag_dk in every role split; issue 20: the documents forward).
# One part per call:
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session41.sh N", carry=[".kit_bench"])
# Parts 5-7 and 9 carried .kit_lite (.kit_bench less upstream's wheel: the carry limit refused the whole kit beside
# this session's files), part 8 .kit_up (upstream's wheel and a setup that reuses a warm machine's /tmp/site).
# Branch la: benchmarks/explore/branches/lag-all.patch copied to _br/la.patch (lag_dk in every role split); branch
# nolag (part 4): _br/nolag.patch, lag_dk's return prefixed with "False and" (lag_dk off everywhere).
# 1: bench_bwd's d96 and d128 4x4096 32/8 rows (full, causal) with every peer at both occupancies on the lag_dk
#    tree; memcheck of bwd_varlen_classes (good and corrupt cu_seqlens / seqused, d64 / d96 / d128 role splits,
#    lag_dk in d96 / d128) and dropout (d96 causal's class tile masking P call by call), ~9 min
# 1 ran: SM120 occupancy backward TFLOPS ours / FA2 / upstream: d96 340 / 289 / 229 (1.18x FA2), causal 316 / 236 /
#    217 (1.34x); d128 325 / - / 216, causal 305 / - / 203; H100 occupancy d128 323 / 292 (1.11x), causal 301 / 270;
#    memcheck bwd_varlen_classes and dropout: 0 errors
# 2: bench_bwd's other three d128 rows (8x2048 16/16, 4x2048 8/2, 2x4096 16/4, causal) with every peer at both
#    occupancies, ~5 min
# 2 ran: 8x2048 16/16 causal 263 / - / 180, 2x4096 16/4 causal 282 / - / 185; 4x2048 8/2 causal 121 (0.707 ms, with
#    the deterministic mode at 0.539: host noise, see part 4)
# 3: A/B main against la, alternated twice: bench_bwd ours at d64 4x4096 32/8 (full, causal: the d64 table entry
#    runs lag_dk only in la); bench_dropout ours_dropout at d64 / d128 once per tree; first, bench_bwd's d128
#    4x2048 8/2 causal row again with every peer (part 4 found part 2's a host-noise outlier), ~8 min
# 3 ran: 8/2 again: ours 224 / upstream 148 TFLOPS at SM120 occupancy (its H100-occupancy cells noisy: fwd+bwd 150
#    under bwd 187); d64 backward main / la: 264, 264 / 281, 283 TFLOPS (+6.8%), causal 247, 249 / 258, 255 (+3.5%);
#    dropout fwd+bwd main / la: d64 7.90 / 7.42 ms, causal 4.11 / 3.94, d128 14.55 / 14.77, causal 7.56 / 7.11
# 4: bench_bwd's d128 4x2048 8/2 causal row (ours, deterministic; both occupancies: part 2 had 0.707 ms at SM120
#    occupancy against 0.420 in session 38, and the deterministic mode faster than the default) on main against
#    branch nolag (_br/nolag.patch: lag_dk off), alternated twice, ~3 min
# 5: lag_dk in every role split (lag-all.patch merged): racecheck of bwd_rolesplit and dropout; then
#    explore/docs_tiles.py: the documents forward by document length (256-2048) on every block-sparse tile the
#    predicate admits, varlen and FlexAttention's sm_120 tiles, SM120 occupancy, ~9 min
# 5 ran: racecheck bwd_rolesplit (deterministic, d64 / d96 / d128 entries, varlen) and dropout (the d64 / d96 /
#    d128 dropout splits) clean, 0 hazards, with lag_dk in every split; docs_tiles.py stopped at its imports (its
#    path to benchmarks/): rerun as part 7 (the machine had gone cold: a fresh one, the kit without upstream's
#    wheel, .kit_lite, since the carry limit refused .kit_bench beside this session's files)
# 7: part 5's explore/docs_tiles.py, ~6 min
# 6: the backward, dropout, flex and block-sparse GPU suites on the lag-all tree, ~8 min
# 6 ran: 388/388 (12 shards, 290 s)
# 7 ran: forward ms by document length (ours' 128x64 ping-pong / 64x64 one-stage / 64x64 two-stage / 128x64
#    8-warp cp.async / varlen / FlexAttention sm_120): 256: 0.279 / 0.253 / 0.377 / 0.290 / 0.282 / 0.297; 512 (the
#    dispatch with the documents mask_mod 0.388): 0.370 / 0.359 / 0.527 / 0.388 / 0.379 / 0.385; 1024: 0.551 /
#    0.574 / 0.826 / 0.607 / 0.624 / -; 2048: 0.887 / 1.033 / 1.455 / 1.016 / 1.041 / 0.983. Fitted t = c0 + steps x
#    c1 (4 lengths, residuals <= 9 us): the ping-pong tile's fixed cost per tile 3.5 key-block steps (4.95 us per
#    SM; 0.153 of 0.370 ms at 512), the 64x64 one-stage tile's 1.4 of its (half-height) steps
# 8: bench_flex's documents rows (lists + mask_mod, varlen) at SM120 occupancy and bench_bwd's d64 rows with every
#    peer at both occupancies, on the lag-all tree (kit: .kit_up, upstream's wheel on the warm machine), ~5 min
# 8 ran: documents of 512 as lists + mask_mod: ours 0.399 / 1.666 ms (forward / fwd+bwd), FlexAttention sm_120
#    0.387 / 2.612 (fwd+bwd 1.57x, forward 0.97x); as varlen 0.389 / 1.514. d64 backward at SM120 occupancy 4.902 ms
#    (was 5.273: +7.6%), causal 2.645 (2.772: +4.8%), upstream 6.392 / 3.432 (1.30x / 1.30x); H100 occupancy FA2
#    4.983 / 2.921 (1.02x / 1.10x); but the deterministic mode slowed: 5.716 -> 6.301 ms, causal 3.002 -> 3.116
# 9: lag_dk off again in the deterministic smem-operand splits (kv_in_regs keep it): bench_bwd's d64 rows (ours,
#    deterministic) at SM120 occupancy (a cold machine: .kit_lite), ~3 min
# 9 ran: d64 284 / deterministic 242 TFLOPS (as session 38's 240), causal 260 / 228
# 4 ran (listed here; run between parts 2 and 3): SM120 occupancy main / nolag: 226, 223 / 210, 213 TFLOPS (lag_dk +6%); H100
#    occupancy and the fwd+bwd cells move 147-246 between rounds (a 0.4 ms row: host-bound)
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) (cd benchmarks && timeout 440 python3 bench_bwd.py --occupancy both --cases d96_4x4096 d128_4x4096 \
        --out "$OUT/bwd_4x4096.json" 2>&1 | grep -v -i warn | grep "\[")
     timeout 140 python3 tools/sanitize.py --families bwd_varlen_classes dropout --tools memcheck \
        --json "$OUT/sanitizer_memcheck.json" 2>&1 | tail -4 ;;
  2) (cd benchmarks && timeout 400 python3 bench_bwd.py --occupancy both --cases d128_8x2048 d128_4x2048 d128_2x4096 \
        --out "$OUT/bwd_d128_gqa.json" 2>&1 | grep -v -i warn | grep "\[") ;;
  3) (cd benchmarks && timeout 100 python3 bench_bwd.py --occupancy both --cases d128_4x2048 \
        --out "$OUT/bwd_8x2.json" 2>&1 | grep -v -i warn | grep "\[")
     branch la
     for t in "$root" /tmp/la "$root" /tmp/la; do
       bwd_ab "$t" "$(basename "$t")_$SECONDS" ours d64_4x4096 | sed "s|^|$(basename "$t") |"
     done
     for t in "$root" /tmp/la; do
       (cd "$t/benchmarks" && timeout 150 python3 bench_dropout.py --occupancy sm120 --impls ours_dropout \
          --head-dims 64 128 --out "$OUT/dropout_$(basename "$t").json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
     done ;;
  5) timeout 250 python3 tools/sanitize.py --families bwd_rolesplit dropout --tools racecheck \
        --json "$OUT/sanitizer_racecheck.json" 2>&1 | tail -4
     (cd benchmarks && timeout 320 python3 explore/docs_tiles.py --out "$OUT/docs_tiles.json" 2>&1 \
        | grep -v -i warn | grep "^documents") ;;
  7) (cd benchmarks && timeout 400 python3 explore/docs_tiles.py --out "$OUT/docs_tiles.json" 2>&1 \
        | grep -v -i warn | grep "^documents\|Error\|error" | tail -20) ;;
  8) (cd benchmarks && timeout 160 python3 bench_flex.py --occupancy sm120 --cases "512 (mask_mod + block" "512 (varlen)" \
        --out "$OUT/flex_docs.json" 2>&1 | grep -v -i warn | grep "\[")
     (cd benchmarks && timeout 180 python3 bench_bwd.py --occupancy both --cases d64_4x4096 \
        --out "$OUT/bwd_d64.json" 2>&1 | grep -v -i warn | grep "\[") ;;
  9) (cd benchmarks && timeout 120 python3 bench_bwd.py --occupancy sm120 --impls ours ours_deterministic \
        --cases d64_4x4096 --out "$OUT/bwd_d64_det.json" 2>&1 | grep -v -i warn | grep "\[") ;;
  6) shards 470 tests/test_bwd_gpu.py tests/test_dropout_gpu.py tests/test_flex_gpu.py tests/test_block_sparse_gpu.py ;;
  4) branch nolag
     for t in "$root" /tmp/nolag "$root" /tmp/nolag; do
       (cd "$t/benchmarks" && timeout 100 python3 bench_bwd.py --occupancy both --impls ours ours_deterministic \
          --cases d128_4x2048 --out "$OUT/bwd_8x2_$(basename "$t")_$SECONDS.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
     done ;;
esac
