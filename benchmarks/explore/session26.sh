#!/usr/bin/env bash
# Session 26's device calls, one part per call (each under the 10-minute call limit):
#   run(command="source .kit_bench/device-setup.sh; bash benchmarks/explore/session26.sh 1", carry=[".kit_bench"])
# 1: dropout under torch.compile / CUDA graphs (the custom ops' new seed slot): the dropout GPU tests, the
#    backward suite (compile, graph replay) and the forward's compile / graph / serving tests, ~7 min
set -u
cd "$(dirname "$0")/../.."
part="${1:-1}"
source benchmarks/explore/shards.sh
case "$part" in
  1) shards 560 tests/test_dropout_gpu.py tests/test_bwd_gpu.py \
       tests/test_fwd_gpu.py::test_torch_compile_fullgraph_uses_the_namespaced_op \
       tests/test_fwd_gpu.py::test_cuda_graph_capture_and_replay tests/test_fwd_gpu.py::test_torch_compile_fullgraph_varlen \
       tests/test_kvcache_gpu.py tests/test_serving_loop_gpu.py ;;
  *) echo "part 1" ;;
esac
