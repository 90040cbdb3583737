#!/usr/bin/env bash
# Session 43 (issue 20: dropout's cost; the signed-P branch on the device).
# One part per call, the client kit carried (it holds everything but upstream's wheel, which no part here runs):
#   run(command="source .kit_client/device-setup.sh; bash benchmarks/explore/session43.sh N", carry=[".kit_client"])
# Branch sp = _br/sp.patch = branches/dropout-signed-p.patch (P passes signed in the dropout role splits, barrier PZ
# gone, d96's dropout on its kv_in_regs split).
# 1: on branch sp, the backward, dropout, flex and block-sparse GPU suites; racecheck, synccheck and memcheck of the
#    dropout family (its barriers changed), ~9 min
# 1 ran: 388/388 (12 shards, 362 s); synccheck and memcheck of dropout 0 errors; racecheck cut by its timeout
# 2: bench_dropout A/B, main against sp: ours + ours_dropout on main, every implementation on sp (the candidate
#    results file), then ours_dropout once more on each, d64 / d96 / d128, ~9 min
# 2 ran: fwd+bwd ms main ours / ours_dropout, then sp ours / ours_dropout (cost); second round main / sp ours_dropout:
#    d64 6.32 / 7.52 (1.189x), sp 6.33 / 8.06 (1.274x); 7.53 / 8.03; causal 3.40 / 3.94 (1.157x), sp 3.44 / 4.43
#    (1.287x); 3.93 / 4.46; d96 8.09 / 10.63 (1.313x), sp 8.04 / 10.01 (1.245x); 10.70 / 10.07; causal 4.32 / 5.31
#    (1.231x), sp 4.30 / 5.32 (1.237x); 5.34 / 5.36; d128 11.15 / 15.07 (1.351x), sp 11.20 / 15.49 (1.383x); 15.10 /
#    15.48; causal 6.02 / 7.15 (1.187x), sp 6.01 / 7.60 (1.264x); 7.30 / 7.63. sp: d96 full -6%, d64 / d128 (same
#    splits as main) +3-13% slower: not merged as is
# 3: bench_dropout A/B, main against v1 (= sp with the Philox words held across the walk outside the kv_in_regs
#    splits, as on main): ours + ours_dropout on main, ours_dropout on v1, then ours_dropout on each again, d64 / d128
# 3 ran: fwd+bwd with dropout, main / v1 (two rounds): d64 7.50, 7.47 / 7.83, 7.81; causal 3.93, 4.01 / 4.28, 4.27;
#    d128 14.84, 14.98 / 15.87, 15.88; causal 7.13, 7.35 / 7.46, 7.54: v1 still 3-9% slower, so signed P itself, not
#    the per-step read of the words, costs the smem-operand splits. Merged instead: signed P in the kv_in_regs splits
#    only (FlashBwdRoleSplit.signed_p), two tiles elsewhere (their SASS identical to main's: d64 full, d128 causal)
# 4: on the merged tree: racecheck of the dropout family; the dropout suite and the dropout cases of the backward,
#    flex and block-sparse suites, ~8 min
# 4 ran: racecheck dropout 0 hazards; test_dropout_gpu.py 48/48 (12 shards, 90 s); the -k dropout selection of the
#    other three suites collected nothing (their dropout cases live in test_dropout_gpu.py)
# 5: bench_dropout with every implementation, d64 / d96 / d128 / d256 (the results file), ~8 min
# 5 ran: fwd+bwd ms ours / with dropout (cost): d64 6.34 / 7.46 (1.177x), causal 3.40 / 3.97 (1.168x); d96 8.06 /
#    9.98 (1.238x), causal 4.29 / 5.33 (1.242x); d128 11.15 / 14.95 (1.341x), causal 6.01 / 7.12 (1.184x); d256 50.35
#    / 50.65 (1.006x), causal 23.53 / 24.58 (1.044x) (results/dropout_h100_2026-11-27.json)
# 6: the merged tree: memcheck + synccheck of the dropout family, the dropout suite's new d80 rows (d80's dropout
#    runs its kv_in_regs split); explore/op_host_probe.py --profile --tree-only (issue 19's host work per call,
#    with fwd+bwd through autograd beside SDPA's), ~5 min
# 6 ran: memcheck + synccheck dropout 0 errors; test_head_dims[80-80] 2/2; op host time: fwd op 33 us, bwd op 83,
#    bwd impl 70, SDPA fwd 43; fwd+bwd through autograd ours 553 / SDPA 379 us (a slow host phase)
# 7: explore/op_host_probe.py --breakdown --tree-only: the eager fwd+bwd call's host time by part (run twice: the
#    second with the backward body skipped and autograd.grad rows added; the third with time inside the backward
#    body through autograd and called directly), ~2 min
# 7 ran: fwd+bwd autograd ours 331 / 344 / 364 us, SDPA 221 / 204 / 246; fwd with a graph ours 42, SDPA 28; run_bwd
#    45-52 us (launches 4-6 us each, zeros of dQ's accumulator 10-12 us, as empty 5); backward body skipped 162 us;
#    inside _grads through autograd 138 us, run_bwd 124 (direct, same wrappers: 91), every wrapped call off the
#    main thread under autograd; autograd floor (identity Function) 81-103 us, native op 67-81
# 8: ncu of d128's 64x64 smem-operand role split (full, 4x4096 32/8, SM120 occupancy) with dropout 0.1 and without
#    (explore/profile_bwd.py --smem-operands): where dropout's extra time in that split goes, ~4 min
# 8 ran: 13.47 / 12.20 ms under ncu (1.10x), instructions +22%, issue slots 27.1 / 24.8% busy; group 0's first P
#    keep store after barrier PREAD 6.7% of the stall samples (results/ncu_dropout_d128_h100_2026-11-27.json)
# 9: the dropout suite with d96 rows added (odd lengths, windows, p, fp16, the mask regenerated, deterministic):
#    the kv_in_regs split's signed P beyond the head-dim rows, ~4 min
# 9 ran: 52/52 (12 shards, 67 s)
# 10: branch wip-d128-run (d128 dropout on its 64x96 kv_in_regs split, RunKeepFlags): the dropout suite, racecheck +
#    memcheck of the dropout family, bench_dropout d128 A/B against base (_br/base.patch: the tree back to main),
#    alternated twice, ~7 min
# 10 ran: dropout suite 52/52; racecheck of dropout 5126 errors (20 RAW hazards displayed), memcheck 0; fwd+bwd ms with
#    dropout, branch / base (two rounds): d128 full 13.83, 13.82 / 14.94, 14.94 (-7.4%; cost 1.237x against the
#    branch's 11.18 without), causal 7.41, 7.44 / 7.11, 7.31 (+2-4%) (results/dropout_d128_run_ab_h100_2026-11-27.json.gz)
# 11: racecheck of the dropout family on wip-d128-run with its log kept: which kernel and accesses race, ~3 min
# 11 ran: 21 hazard lines, all RAW in a FlashBwdRoleSplit kernel, block (3,1,1): writes by group 0 threads 48-51 and
#    112 at +0xadf0 (32-bit, consecutive bytes 0x12e40-0x12e53), reads by group 1 threads 160-161 at +0xb5c0 (16 bytes
#    each); not resolved this session (branch not merged: explore/branches/dropout-d128-run.patch)
# 12: branch d128run (_br/d128run.patch = branches/dropout-d128-run.patch): racecheck of one d128 dropout call
#    (explore/race_sass.py --run) with its log, and the SASS of the main kernel that call launches, ~3 min
# 12 ran: racecheck of that one call: 0 hazards; the SASS dump stopped (nvdisasm needs CUDA_HOME)
# 13: branch d128run: racecheck of the whole dropout family again with its log; the SASS of the d128 call's main kernel
#    (CUDA_HOME set for nvdisasm), ~4 min
# 13 ran: 20 RAW hazards again (block (2,1,0): group 0 thread 32's stores at +0xae20 / +0xae50, group 1 thread 192's
#    16-byte reads at +0xb5c0; results/racecheck_dropout_d128_run_h100_2026-11-27.log.gz); the SASS dump stopped
#    again (nvdisasm); the device time is spent
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) branch sp
     (cd /tmp/sp && shards 470 tests/test_bwd_gpu.py tests/test_dropout_gpu.py tests/test_flex_gpu.py \
        tests/test_block_sparse_gpu.py)
     (cd /tmp/sp && timeout 110 python3 tools/sanitize.py --families dropout --tools racecheck synccheck memcheck \
        --json "$OUT/sanitizer_dropout_sp.json" 2>&1 | tail -6) ;;
  2) branch sp
     i=0
     for t in "$root" /tmp/sp "$root" /tmp/sp; do
       i=$((i + 1)); impls="ours ours_dropout"; [ "$i" -eq 2 ] && impls=""; [ "$i" -gt 2 ] && impls=ours_dropout
       (cd "$t/benchmarks" && timeout 170 python3 bench_dropout.py --occupancy sm120 ${impls:+--impls $impls} \
          --head-dims 64 96 128 --out "$OUT/dropout_$(basename "$t")_$i.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
     done ;;
  3) branch v1
     i=0
     for t in "$root" /tmp/v1 "$root" /tmp/v1; do
       i=$((i + 1)); impls=ours_dropout; [ "$i" -eq 1 ] && impls="ours ours_dropout"
       (cd "$t/benchmarks" && timeout 120 python3 bench_dropout.py --occupancy sm120 --impls $impls \
          --head-dims 64 128 --out "$OUT/dropout_$(basename "$t")_$i.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
     done ;;
  4) timeout 330 python3 tools/sanitize.py --families dropout --tools racecheck \
        --json "$OUT/sanitizer_dropout_racecheck.json" 2>&1 | tail -3
     shards 240 tests/test_dropout_gpu.py
     mv "$OUT/tests_4.txt" "$OUT/tests_4a.txt"
     shards 200 tests/test_bwd_gpu.py tests/test_flex_gpu.py tests/test_block_sparse_gpu.py -k dropout ;;
  5) for hd in "64 96" "128 256"; do
       (cd benchmarks && timeout 250 python3 bench_dropout.py --occupancy sm120 --head-dims $hd \
          --out "$OUT/dropout_${hd// /_}.json" 2>&1 | grep -v -i warn | grep "\[")
     done ;;
  6) timeout 150 python3 tools/sanitize.py --families dropout --tools memcheck synccheck \
        --json "$OUT/sanitizer_dropout_mem_sync.json" 2>&1 | tail -3
     shards 150 tests/test_dropout_gpu.py -k "80-80"
     timeout 200 python3 benchmarks/explore/op_host_probe.py --profile --tree-only --out "$OUT/op_host.json" 2>&1 \
        | grep -v -i warn | head -150 ;;
  7) timeout 200 python3 benchmarks/explore/op_host_probe.py --breakdown --tree-only --out "$OUT/op_host_parts.json" \
        2>&1 | grep -v -i warn | head -60 ;;
  8) for run in "drop:--dropout 0.1" "plain:--smem-operands"; do
       name=${run%%:*}
       timeout 240 ncu --kernel-name regex:RoleSplit --launch-skip 2 --launch-count 1 --section SpeedOfLight \
         --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
         --section SourceCounters -o /tmp/rep_$name -f python3 benchmarks/explore/profile_bwd.py --head-dim 128 \
         ${run#*:} > /dev/null 2>&1
       ncu -i /tmp/rep_$name.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/src_$name.csv.gz"
       ncu -i /tmp/rep_$name.ncu-rep --page details --csv 2>/dev/null > "$OUT/details_$name.csv"
       echo "== $name"; grep -i "\"Duration\"\|Issue Slots Busy\|Executed Ipc A\|Stall\|Warp Cycles Per Issued" \
         "$OUT/details_$name.csv" | cut -c1-160 | head -30
     done ;;
  9) shards 300 tests/test_dropout_gpu.py ;;
  10) shards 200 tests/test_dropout_gpu.py
     timeout 170 python3 tools/sanitize.py --families dropout --tools racecheck memcheck \
        --json "$OUT/sanitizer_dropout_run.json" 2>&1 | tail -3
     branch base
     i=0
     for t in "$root" /tmp/base "$root" /tmp/base; do
       i=$((i + 1)); impls=ours_dropout; [ "$i" -eq 1 ] && impls="ours ours_dropout"
       (cd "$t/benchmarks" && timeout 80 python3 bench_dropout.py --occupancy sm120 --impls $impls \
          --head-dims 128 --out "$OUT/dropout_$(basename "$t")_$i.json" 2>&1 | grep -v -i warn \
          | grep "\[" | sed "s|^|$(basename "$t") |")
     done ;;
  11) timeout 200 python3 tools/sanitize.py --families dropout --tools racecheck --log-dir /tmp/slog \
        --json "$OUT/sanitizer_dropout_race.json" 2>&1 | tail -2
     ls /tmp/slog; f=$(ls /tmp/slog/* | head -1); grep -c "hazard" "$f"
     grep -i "kernel\|hazard\|Write\|Read\|Access" "$f" | sed 's/[ ]\+/ /g' | cut -c1-260 | head -40
     gzip -c "$f" > "$OUT/racecheck_dropout_log.gz" ;;
  12) branch d128run
     cd /tmp/d128run
     timeout 200 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 60 \
       python3 benchmarks/explore/race_sass.py --run > "$OUT/race.log" 2>&1
     grep -c "hazard" "$OUT/race.log"; grep -o "at [a-z_0-9A-Z]*+0x[0-9a-f]*" "$OUT/race.log" | sed 's/at kernel[^+]*/at /' \
       | sort | uniq -c | head
     timeout 200 python3 benchmarks/explore/race_sass.py --sass "$OUT/main.sass" 2>&1 | grep -v -i warn | tail -4
     for f in "$OUT"/main.sass.*.cubin; do (cuobjdump -sass "$f" > "$f.cuobjdump.txt" 2>&1 || true); done
     ls -la "$OUT" ;;
  13) branch d128run
     cd /tmp/d128run
     export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v cuobjdump || echo /usr/local/cuda/bin/x)")")}"
     timeout 200 python3 tools/sanitize.py --families dropout --tools racecheck --log-dir /tmp/slog13 \
        --json "$OUT/sanitizer_race13.json" 2>&1 | tail -2
     f=$(ls /tmp/slog13/* | head -1); grep -c "hazard" "$f"; gzip -c "$f" > "$OUT/race13.log.gz"
     grep -o "at [a-z_0-9A-Z]*+0x[0-9a-f]*" "$f" | sed 's/at kernel[^+]*/at /' | sort | uniq -c | head
     timeout 150 python3 benchmarks/explore/race_sass.py --sass "$OUT/main_sass" 2>&1 | grep -v -i warn | tail -3
     ls "$OUT" ;;
esac
