#!/usr/bin/env bash
# Session 42 (issue 20: dropout's cost on the lag_dk tree; issue 19: the training step after lag_dk).
# One part per call, the client kit carried (it holds everything but upstream's wheel, which no part here runs):
#   run(command="source .kit_client/device-setup.sh; bash benchmarks/explore/session42.sh N", carry=[".kit_client"])
# 1: memcheck of bwd_varlen_classes (good and corrupt cu_seqlens / seqused; d64's varlen split lags dK since
#    session 41); bench_dropout with every implementation (ours, ours with dropout 0.1, FA2 with and without) at
#    d64 / d96 / d128 / d256, SM120 occupancy, on the final tree, ~9 min
# 1 ran: memcheck bwd_varlen_classes 0 errors; fwd+bwd ms ours / with dropout (cost): d64 6.35 / 7.50 (1.182x), causal
#    3.41 / 3.98 (1.168x); d96 8.10 / 10.62 (1.312x), causal 4.34 / 5.33 (1.230x); d128 11.25 / 15.01 (1.335x), causal
#    6.03 / 7.14 (1.185x); d256 50.51 / 50.67 (1.003x), causal 23.55 / 24.63 (1.046x): 1.25x missed at d96 / d128 full
# 2: bench_step.py: the training step end to end with every attention after lag_dk (issue 19's step target), ~7 min
# 2 ran: llama (eager) ours 23.42 / FA2 20.40 / SDPA 20.58 ms (0.87x); plain (compiled) 8.09 / 7.46 / 7.44 (0.92x),
#    ours host-bound (issue 8.80 ms over its 8.09 step)
# Parts 3 and 5 ran with a change in this tree's bwd_rolesplit.py (part 3: branches/dropout-early-p.patch; part 5:
# its group-0 half) and branch base = _br/base.patch, that change reversed (main). Neither change was merged.
# 3: A/B of early_p_read (group 0 draws P keep before barrier PREAD, group 1 reads P before dP, dropout with lag_dk)
#    against base, alternated twice: bench_dropout ours / ours_dropout at d64 / d96 / d128, ~7 min
# 3 ran: fwd+bwd with dropout, change / base (two rounds): d64 7.88, 7.93 / 7.45, 7.45; causal 4.09, 4.15 / 3.95, 3.91;
#    d96 11.08, 11.14 / 10.58, 10.62; causal 5.76, 5.81 / 5.30, 5.33; d128 14.53, 14.68 / 14.93, 14.93; causal 7.42,
#    7.52 / 7.13, 7.24: 4-9% slower but d128 full (-2%); not merged
# 5: A/B of group 0's draw alone (P keep into registers before barrier PREAD, during group 1's dP; group 1's order
#    unchanged) against base, alternated twice: bench_dropout ours_dropout at d64 / d96 / d128, ~5 min
# 5 ran: change / base: d64 7.55, 7.55 / 7.52, 7.55; causal 3.97 both; d96 10.64, 10.74 / 10.65, 10.77; causal 5.32,
#    5.39 / 5.30, 5.43; d128 14.99, 15.06 / 15.01, 15.10; causal 7.13, 7.33 / 7.12, 7.37: within 0.5%, not merged
# 6: bench_step.py --models plain again at 4 x 2048 (part 2 had ours 0.92x FA2, session 39 1.055x: host phase or
#    not) and at 1 x 8192 (attention a larger share of the GPU step; session 39: 1.07x), ~6 min
# 6 ran: 4x2048 ours 6.95 / FA2 7.51 / SDPA 7.49 ms (1.08x), GPU-bound (issue 6.40 / 5.87 / 5.33); 1x8192 10.85 /
#    13.13 / 13.05 (1.21x FA2, 1.20x SDPA)
# 7: lag_dk off the grid (session 41's "not covered"): the table's backward at 2x3000 16/4, 4x3000 32/1 (MQA) and
#    1x8000 16/16, full and causal, d64 / d96 / d128, this tree against branch nolag (_br/nolag.patch: lag_dk's
#    return prefixed with "False and"), default mode, ~8 min
# 7 ran: nolag's time over this tree's, full / causal: d64 2x3000 1.085 / 1.074, 4x3000 32/1 1.064 / 1.060, 1x8000
#    1.113 / 1.039; d96 1.066 / 1.101, 1.108 / 1.110, 1.103 / 1.099; d128 1.101 / 1.039, 1.071 / 1.058, 1.056 / 1.079
#    (results/lag_dk_offgrid_h100_2026-11-27.json.gz)
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) timeout 150 python3 tools/sanitize.py --families bwd_varlen_classes --tools memcheck \
        --json "$OUT/sanitizer_memcheck.json" 2>&1 | tail -4
     for hd in "64 96" "128 256"; do
       (cd benchmarks && timeout 210 python3 bench_dropout.py --occupancy sm120 --head-dims $hd \
          --out "$OUT/dropout_${hd// /_}.json" 2>&1 | grep -v -i warn | grep "\[")
     done ;;
  2) timeout 420 python3 benchmarks/bench_step.py --out "$OUT/step.json" 2>&1 | grep -v -i warn | tail -8 ;;
  3) branch base
     i=0
     for t in "$root" /tmp/base "$root" /tmp/base; do
       impls="ours ours_dropout"; i=$((i + 1)); [ "$i" -gt 2 ] && impls=ours_dropout
       (cd "$t/benchmarks" && timeout 170 python3 bench_dropout.py --occupancy sm120 --impls $impls \
          --head-dims 64 96 128 --out "$OUT/dropout_$(basename "$t")_$SECONDS.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
     done ;;
  5) branch base
     for t in "$root" /tmp/base "$root" /tmp/base; do
       (cd "$t/benchmarks" && timeout 130 python3 bench_dropout.py --occupancy sm120 --impls ours_dropout \
          --head-dims 64 96 128 --out "$OUT/dropout_$(basename "$t")_$SECONDS.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
     done ;;
  6) timeout 200 python3 benchmarks/bench_step.py --models plain --out "$OUT/step_plain.json" 2>&1 | grep -v -i warn \
        | grep "step "
     timeout 300 python3 benchmarks/bench_step.py --models plain --seq 8192 --batch 1 --rounds 6 \
        --out "$OUT/step_s8192.json" 2>&1 | grep -v -i warn | grep "step " ;;
  7) branch nolag
     for d in 64 96 128; do
       for t in "$root" /tmp/nolag; do
         (cd "$t/benchmarks" && timeout 80 python3 explore/deterministic_tiles.py --head-dim $d --no-deterministic \
            --shapes 2x3000x16x4 4x3000x32x1 1x8000x16x16 --configs table \
            --out "$OUT/offgrid_d${d}_$(basename "$t").json" 2>&1 | grep -v -i warn | grep "^d$d" \
            | sed "s|^|$(basename "$t") |")
       done
     done ;;
esac
