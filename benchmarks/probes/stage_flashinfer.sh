#!/usr/bin/env bash
# Stage FlashInfer 0.7.2 (the serving peer of bench_serving.py) for the device, which has no network and no
# room for its 65 MB wheel beside the CuTe kit in one 64 MiB carry. Run here, on the CPU machine (it has nvcc
# 13.0): FlashInfer's attention modules are built ahead of time for sm_90a (no GPU needed; a stub libcuda.so
# satisfies the link), placed where FlashInfer loads AOT modules (flashinfer/data/aot/<name>/<name>.so), and
# the package is packed without its CUDA sources. Output: .kit_fi/ (git-ignored), ~11 MB.
#
# On the device, two calls back to back (the machine stays warm 30 s between calls and keeps /tmp/site):
#   run(command="source .devkit/device-setup.sh && python3 -c 'import cutlass'", carry=[".devkit"])
#   run(command="source .kit_fi/fi-setup.sh && cd benchmarks && python3 bench_serving.py --out $OUT/s.json",
#       carry=[".kit_fi"])
#
# Modules built (bf16, int32 page indices, no rotary / window / softcap): the CUDA-core decode kernel at head
# dims 64, 128, 256 and the fa2 paged prefill kernel (primary and stride-independent) at 64 and 128 (the decode
# wrapper uses them with use_tensor_cores=True); both again with e4m3 K/V at d128 (bench_fp8.py); the fa2 MLA
# kernel at 512 / 64 (bench_mla.py).
# bench_serving.flashinfer_paged asks for backend="fa2", the backend FlashInfer runs on SM120 (its fa3 backend is
# SM90 wgmma, not an SM120 peer).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
WORK=${WORK:-/tmp/fi_stage}
OUT=$ROOT/.kit_fi
mkdir -p "$WORK/deps" "$WORK/site" "$WORK/stubs" "$WORK/ws" "$OUT"
"$PY" -m pip download -q --no-deps -d "$WORK" flashinfer-python==0.7.2
"$PY" -m pip download -q --no-deps -d "$WORK/deps" nvidia-ml-py tabulate click tqdm einops ninja
"$PY" -m pip install -q --no-deps --no-index --target "$WORK/site" "$WORK"/deps/*.whl
rm -rf "$WORK/pkg" && mkdir -p "$WORK/pkg" && (cd "$WORK/pkg" && "$PY" -m zipfile -e "$WORK"/flashinfer_python-0.7.2-py3-none-any.whl .)
# FlashInfer's MLA kernel picks its tile from the device's shared memory per SM at run time (two 64-key stages in
# 217 KB on an H100 / H200, which no SM120 CTA can hold). The kit's build reads an SM120's 102400 bytes instead, so
# on the device it runs the tile it runs on SM120 (one 16-key stage) and can be pinned to an SM120's occupancy.
MLA_H="$WORK/pkg/flashinfer/data/include/flashinfer/attention/mla.cuh"
grep -q "cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);" "$MLA_H"
sed -i 's/cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);/cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);\n  smem_limit_per_sm = std::min(smem_limit_per_sm, 102400);  \/\/ an SM120 (bench kit)/' "$MLA_H"
gcc -shared -o "$WORK/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 -x c /dev/null
export LIBRARY_PATH=/usr/local/cuda-13.0/lib:$WORK/stubs FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$WORK/ws
PATH=$WORK/site/bin:$PATH PYTHONPATH=$WORK/pkg:$WORK/site "$PY" - <<'EOF'
import torch
from flashinfer.jit.attention.modules import gen_batch_decode_module
from flashinfer.prefill import _gen_batch_prefill_independent_paged_module, _gen_batch_prefill_primary_module

bf16, i32 = torch.bfloat16, torch.int32
for d in (64, 128, 256):
    gen_batch_decode_module(bf16, bf16, bf16, i32, d, d, 0, False, False).build()
for d in (64, 128):
    args = (bf16, bf16, bf16, i32, d, d, 0, False, False, False)
    _gen_batch_prefill_primary_module("fa2", *args).build()
    _gen_batch_prefill_independent_paged_module("fa2", *args).build()
# FP8 (e4m3) K/V beside bf16 q at d128: bench_fp8.py's FP8-KV decode peer (CUDA-core decode; the fa2 prefill
# kernel for query groups above 4)
e4m3 = torch.float8_e4m3fn
gen_batch_decode_module(bf16, e4m3, bf16, i32, 128, 128, 0, False, False).build()
args = (bf16, e4m3, bf16, i32, 128, 128, 0, False, False, False)
_gen_batch_prefill_primary_module("fa2", *args).build()
_gen_batch_prefill_independent_paged_module("fa2", *args).build()
# MLA (512 latent + 64 rope columns, bf16): bench_mla.py's peer, FlashInfer's fa2 MLA kernel (its fa3 one is SM90
# wgmma, not an SM120 peer)
from flashinfer.jit.attention.modules import gen_batch_mla_module
gen_batch_mla_module("fa2", bf16, bf16, bf16, i32, 512, 64, False).build()
EOF
# Python files and csrc's top-level templates and sources, which module specs read even when AOT (the
# headers and the other kernels' sources are what the AOT modules replace), plus the modules
(cd "$WORK/pkg" && find flashinfer -type f \( -name "*.py" -o -name "*.json" -o -name "py.typed" \) -size -2M \
   -not -path "flashinfer/data/*" > "$WORK/files.txt" && find flashinfer_python-0.7.2.dist-info -type f >> "$WORK/files.txt" \
   && find flashinfer/data/csrc -maxdepth 1 -type f >> "$WORK/files.txt")  # module specs read these even when AOT
rm -rf "$WORK/out" && mkdir -p "$WORK/out" && tar -C "$WORK/pkg" -cf - -T "$WORK/files.txt" | tar -C "$WORK/out" -xf -
for so in $(find "$WORK/ws" -name "*.so"); do
  name=$(basename "$so" .so); mkdir -p "$WORK/out/flashinfer/data/aot/$name"; cp "$so" "$WORK/out/flashinfer/data/aot/$name/"
done
tar -C "$WORK/out" -cJf "$OUT/flashinfer-0.7.2-trim-aot-sm90a.tar.xz" flashinfer flashinfer_python-0.7.2.dist-info
cp "$WORK"/deps/nvidia_ml_py-*.whl "$WORK"/deps/tabulate-*.whl "$WORK"/deps/click-*.whl "$WORK"/deps/tqdm-*.whl \
   "$WORK"/deps/einops-*.whl "$OUT/"
cat > "$OUT/fi-setup.sh" <<'EOF'
# Source on a warm device machine whose /tmp/site holds the CuTe kit (.devkit/device-setup.sh ran there).
_fi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -f /tmp/fisite/.ok ]; then
  mkdir -p /tmp/fisite && tar -xJf "$_fi"/flashinfer-*.tar.xz -C /tmp/fisite || return 1
  python3 -m pip install -q --no-index --no-deps --target /tmp/fisite "$_fi"/*.whl || return 1
  touch /tmp/fisite/.ok
fi
[ -f /tmp/site/.devkit-ok ] || { echo "the CuTe kit is not installed here: run .devkit/device-setup.sh first"; return 1; }
export PYTHONPATH=/tmp/fisite:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
_rt=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + '/**/libcudart.so.13', recursive=True)})))")
export LD_LIBRARY_PATH=${_rt}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FLASHINFER_DISABLE_JIT=1 FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
EOF
du -sh "$OUT"
