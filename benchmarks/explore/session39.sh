#!/usr/bin/env bash
# Session 39 (issue 20: d128 dropout cost against session 38's faster d128 backward; issue 19: the kv_in_regs tiles
# off the grid, d64 kv_in_regs candidates, sanitizer of d128's varlen backward). One part per call:
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session39.sh N", carry=[".kit_bench"])
# (parts 3-4: source .kit_client/device-setup.sh, carry=[".kit_client"])
# 1: bench_dropout's d128 rows (dropout keeps the 64x64 split; the backward without it is the 64x96 kv_in_regs split
#    since session 38); deterministic_tiles.py --head-dim 64 with the two kv_in_regs candidates prepared in session 38
#    (64x128, one / two dO stages), three shapes, default and deterministic; memcheck of bwd_varlen_classes (d128
#    added: its non-deterministic varlen backward with corrupt metadata on the kv_in_regs entry), ~9 min
# 1 ran: dropout d128 fwd+bwd 14.57 / 12.08 ms (1.206x), causal 7.60 / 6.43 (1.182x; were 1.09x / 1.09x against the
#    64x64 backward); d64 kv_in_regs 64x128 0.98-1.02x the table's default time, two dO stages 0.98-1.03x, deterministic
#    1.05-1.22x its own default against the table's 1.08-1.22x: not adopted (results/deterministic_tiles_d64_h100_2026-11-27
#    .json); memcheck bwd_varlen_classes (d64 / d96 / d128) clean
# 2: off the grid: the d96 / d128 kv_in_regs entries against the splits they replaced at lengths that leave a partial
#    last key block (3000 tokens) and MQA (deterministic_tiles.py --shapes), and packed varlen documents
#    (varlen_tiles.py, 128-2048 tokens packed to 16384, 32/8 heads), default only, ~8 min
# 2 ran: the former splits' time over the entries': d96 2x3000 16/4 1.04x, causal 0.99x; 4x3000 32/1 1.08x / 1.01x;
#    1x8000 16/16 1.13x / 1.09x; varlen 1.10x / 1.08x. d128 2x3000 1.14x / 1.28x; 4x3000 32/1 1.19x / 1.17x; 1x8000
#    1.16x / 1.20x; varlen 1.19x / 1.10x (results/kv_in_regs_offgrid_h100_2026-11-27.json.gz)
# 3: carry .kit_client (tools/stage_client_kit.sh): bench_step.py, the training step end to end with every attention
#    in one process (session 31's run, 1.04x FA2 compiled, predates sessions 32-38's backward), 4 x 2048, ~6 min
# 4: carry .kit_client: bench_step.py at 1 x 8192 tokens (attention a larger share of the step), ~8 min
# 3 ran: llama (eager transformers, host-bound) ours 23.98 ms, SDPA-FA2 21.25 (ours x0.886), SDPA 22.22; plain compiled
#    ours 10.07 ms (issue 10.61: host-bound), FA2 7.95 (x0.790), SDPA 7.92. Then, one call each (not kept as parts):
#    explore/profile_train_step.py: ours 7.09 ms / SDPA 7.55, attention GPU time 1.91 / 2.32 ms, GPU idle 37.6% / 14.2%;
#    explore/step_host_probe.py (same process, alternated): ours through kernels 7.09, from the tree 6.34, FA2 5.46 ms,
#    all host-bound; explore/op_host_probe.py: the fwd op 76-84 us per call against 38 us for its impl called
#    directly, the bwd op 162-196 against 107-114 (SDPA's forward 39 us): torch.library.custom_op's Python layers
#    (autograd kernel, alias check, dynamo guard) ~40-80 us per op call
# 5: carry .kit_client: after the ops moved to torch.library.Library (one CompositeExplicitAutograd kernel and a fake,
#    no autograd; torch.compile reaches them through interface._CompiledFwd / _CompiledVarlenFwd): the GPU tests of
#    compile, CUDA graphs and the remembered calls; op_host_probe.py; bench_step.py, ~7 min
# 5 ran: 32/32; op_host_probe: the fwd op 29-51 us per call against its impl's 23-35, the bwd op 74-78 against 64-79
#    (the ops' own layers ~6-15 us, were ~40-80); bench_step: plain compiled ours 7.15 ms, FA2 7.55 (ours 1.055x), SDPA
#    7.57 (1.057x); llama (eager, unchanged path) ours 18.77, FA2 17.14 (x0.913)
# 6: carry .kit_client: A/B in one call, bench_step.py --models plain (ours, FA2) on this tree and on the tree before
#    the op change (branch base: _br/base.patch reverts interface.py and the build), alternated twice, ~5 min
# 6 ran: main ours 7.73 / FA2 7.54 ms, base 7.17 / 7.56, main 7.35 / 7.56, base 8.90 / 7.50: ours host-bound (issue
#    7.56-9.22 ms), the host's drift between processes larger than the change (inconclusive)
# 7: carry .kit_client: the same A/B in one process (explore/step_host_probe.py --base /tmp/base: both builds through
#    kernels under two repo ids, FA2, steps alternated, 12 rounds of 5), twice, ~4 min
# 7 ran: ours 8.06 / base 8.79 / FA2 6.76 ms, then 7.87 / 8.38 / 6.39: the change 0.92x / 0.94x the step time; every
#    attention host-bound in this three-model process (results/host_ops_h100_2026-11-27.json.gz)
# 8: the kv_in_regs entries at head dims inside their classes but off the class's own (d80 in d96's class, d112 in
#    d128's) against the splits they replaced, default backward (deterministic_tiles.py --dim), ~6 min
# 8 ran: the former splits' time over the entries': d80 4x4096 32/8 1.17x / causal 1.17x, 2x3000 16/4 1.08x / 1.04x;
#    d112 1.18x / 1.13x, 1.19x / 1.30x (merged into results/kv_in_regs_offgrid_h100_2026-11-27.json.gz)
# 9: ncu of the d96 64x128 kv_in_regs main kernel (full, 4x4096 32/8, SM120 occupancy): speed of light, warp states,
#    pipes, instruction mix and the SASS source counters (where the stalls sit), for the d96 full row's next step, ~2 min
# 9 ran: tensor pipe 47.6% of peak, issue slots 28.8% busy, IPC 1.19; stalls: wait 29.4%, short scoreboard 15.7%,
#    selected 14.9%, barrier 13.0% (8.6 points at group 1's first read of P: its warps wait for group 0's S + exp),
#    math 10.9%; HMMA 49.5% of samples; dQ's GEMM 13.4% of samples, 6.0 points short scoreboard (its LDSM);
#    6% excessive shared wavefronts, all in the cp.async of 96-column rows (results/ncu_bwd_d96_kvr_h100_2026-11-27.json)
# 10: P passed warp pair by warp pair in the kv_in_regs splits (FlashBwdRoleSplit.pair_p: named barriers 7-10 of 64
#    threads, group 1's warp w waiting only for group 0's warp w, whose P it reads; sm_120a: the 50 kv_in_regs configs
#    conform, registers unchanged but for -1 / -2 on three): A/B with bench_bwd (ours), this tree against the tree
#    before (branch base), alternated twice, ~5 min
# 10 ran: backward TFLOPS this tree / before, two rounds each: d96 4x4096 32/8 305, 304 / 298, 298 (+2.2%), causal
#    290, 289 / 287, 287 (+1%); d128 303, 300 / 291, 289 (+4%), causal 281, 281 / 274, 274 (+2.6%); 8x2048 16/16 causal
#    231, 249 / 225, 240 (+3%); 2x4096 16/4 causal 268, 263 / 265, 262 (+0.8%): adopted
# 11: the backward GPU tests and racecheck of bwd_rolesplit (the d96 / d128 kv_in_regs entries, deterministic) with
#    the pair barriers, ~9 min
# 11 ran: 186/186; racecheck bwd_rolesplit clean (0 hazards)
# 12: bench_bwd's d96 and d128 4x4096 32/8 rows (full, causal) with every peer at both occupancies, merged into
#    results/bwd_h100_2026-11-27.json (the device budget had no room for all eleven rows), ~4 min
# 12 ran: SM120 occupancy d96 306 TFLOPS, FA2 289 (1.06x), upstream 227 (1.35x); causal 289 / 234 (1.24x) / 214
#    (1.35x); d128 305 / upstream 215 (1.42x), causal 282 / 203 (1.39x); H100 occupancy d128 1.03x FA2, causal 1.10x,
#    d96 1.06x, causal 1.23x; deterministic 1.04-1.07x
# 13: dropout's d96 cost against the backward with pair barriers (dropout keeps the 64x96 split, unchanged; the
#    denominator got ~1-2% faster), ~3 min
# 13 ran: d96 fwd+bwd with / without dropout 10.69 / 8.73 ms (1.225x), causal 5.83 / 4.60 (1.266x; session 38: 5.86 /
#    4.71, 1.244x): the 1.25x target missed at d96 causal; the device budget then had no room for a fix
set -u
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) (cd benchmarks && timeout 150 python3 bench_dropout.py --occupancy sm120 --head-dims 128 \
        --out "$OUT/dropout_d128.json" 2>&1 | grep -v -i warn | grep "\[")
     (cd benchmarks && timeout 260 python3 explore/deterministic_tiles.py --head-dim 64 \
        --shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16 --configs table kvr_64x128 kvr_64x128_o2 \
        --out "$OUT/tiles_d64.json" 2>&1 | grep -v -i warn | grep "^d64")
     timeout 150 python3 tools/sanitize.py --families bwd_varlen_classes --tools memcheck \
        --json "$OUT/sanitizer_memcheck.json" 2>&1 | tail -3 ;;
  2) for d in 96 128; do
       (cd benchmarks && timeout 150 python3 explore/deterministic_tiles.py --head-dim $d --no-deterministic \
          --shapes 2x3000x16x4 4x3000x32x1 1x8000x16x16 --configs table smem_operands \
          --out "$OUT/offgrid_d$d.json" 2>&1 | grep -v -i warn | grep "^d$d")
     done
     (cd benchmarks && timeout 170 python3 explore/varlen_tiles.py --head-dims 96 128 --configs table smem_operands \
        --out "$OUT/varlen_tiles.json" 2>&1 | grep -v -i warn | grep "^d") ;;
  3) timeout 420 python3 benchmarks/bench_step.py --out "$OUT/step.json" 2>&1 | grep -v -i warn | tail -8 ;;
  4) timeout 580 python3 benchmarks/bench_step.py --seq 8192 --batch 1 --rounds 6 \
        --out "$OUT/step_s8192.json" 2>&1 | grep -v -i warn | tail -8 ;;
  5) shards 300 tests/test_call_plans.py tests/test_fwd_gpu.py tests/test_bwd_gpu.py tests/test_dropout_gpu.py \
       tests/test_flex_gpu.py tests/test_kvcache_gpu.py tests/test_serving_loop_gpu.py -k "compile or graph or plan or remember"
     timeout 100 python3 benchmarks/explore/op_host_probe.py --out "$OUT/op_host.json" 2>&1 | grep -v -i warn | grep " us/call"
     timeout 300 python3 benchmarks/bench_step.py --out "$OUT/step.json" 2>&1 | grep -v -i warn | grep "step " ;;
  6) branch base
     for t in "$root" /tmp/base "$root" /tmp/base; do
       (cd "$t" && timeout 130 python3 benchmarks/bench_step.py --models plain --impls ours sdpa_fa2 \
          --out "$OUT/step_$(basename "$t")_$SECONDS.json" 2>&1 | grep -v -i warn | grep "step " | sed "s|^|$(basename "$t") |")
     done ;;
  7) branch base
     for i in 1 2; do
       timeout 170 python3 benchmarks/explore/step_host_probe.py --base /tmp/base --rounds 12 --profile-steps 0 \
         --out "$OUT/probe_ab_$i.json" 2>&1 | grep -v -i warn | grep " step "
     done ;;
  8) for cd in 96:80 128:112; do
       (cd benchmarks && timeout 170 python3 explore/deterministic_tiles.py --head-dim ${cd%:*} --dim ${cd#*:} \
          --no-deterministic --shapes 4x4096x32x8 2x3000x16x4 --configs table smem_operands \
          --out "$OUT/dims_d${cd#*:}.json" 2>&1 | grep -v -i warn | grep "^d")
     done ;;
  9) timeout 200 ncu --kernel-name regex:RoleSplit --launch-skip 2 --launch-count 1 --section SpeedOfLight \
       --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters \
       --section MemoryWorkloadAnalysis -o /tmp/rep_d96 -f python3 benchmarks/explore/profile_bwd.py --head-dim 96 \
       > /dev/null 2>&1
     ncu -i /tmp/rep_d96.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/src_d96.csv.gz"
     ncu -i /tmp/rep_d96.ncu-rep --page details --csv 2>/dev/null > "$OUT/details_d96.csv"
     ls -la "$OUT"; grep -i "duration\|Issue Slots Busy\|Pipe\|Stall\|Throughput" "$OUT/details_d96.csv" | cut -c1-200 | head -60 ;;
  10) branch base
     for t in "$root" /tmp/base "$root" /tmp/base; do
       bwd_ab "$t" "$(basename "$t")_$SECONDS" ours d96_4x4096 d128_4x4096 d128_2x4096 d128_8x2048 | sed "s|^|$(basename "$t") |"
     done ;;
  11) shards 290 tests/test_bwd_gpu.py
     timeout 250 python3 tools/sanitize.py --families bwd_rolesplit --tools racecheck \
        --json "$OUT/sanitizer_racecheck.json" 2>&1 | tail -3 ;;
  12) (cd benchmarks && timeout 400 python3 bench_bwd.py --occupancy both --cases d96_4x4096 d128_4x4096 \
        --out "$OUT/bwd.json" 2>&1 | grep -v -i warn | grep "\[") ;;
  13) (cd benchmarks && timeout 200 python3 bench_dropout.py --occupancy sm120 --head-dims 96 \
        --out "$OUT/dropout_d96.json" 2>&1 | grep -v -i warn | grep "\[") ;;
esac
