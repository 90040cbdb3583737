#!/bin/bash
# Build .kit_client/ (git-ignored) for client and training checks on the device: the devkit's runtime (cutlass-dsl
# 4.8.1 + cu13 libs, tvm-ffi) with kernels 0.17.2 and the trimmed transformers 5.20, without the benchmark-only
# wheels (flash-attn-4, quack) and torch-c-dlpack-ext (no build for the device's torch 2.11). The wheels are
# unpacked and re-packed as one xz archive, with the parts nothing imports dropped (cutlass-dsl's experimental
# iket profiler, tvm-ffi's bundled libbacktrace sources, aarch64/QNX stubs): 58 MB instead of 66, so the
# 64 MiB carry holds it and the tree. Then, on the device:
#   run(command="source .kit_client/device-setup.sh && python3 tools/train_check.py --out $OUT/train.json",
#       carry=[".kit_client"])
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kit=$root/.devkit
[ -d "$kit" ] || bash "$root/../shared/devkit/stage.sh"
optional=${TRANSFORMERS_TRIM:-$root/../shared/devkit/optional/transformers-5.20-trim.tar.xz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/site" "$work/rest" "$work/tsite" "$root/.kit_client"
for w in "$kit"/apache_tvm_ffi-*.whl "$kit"/nvidia_cutlass_dsl*.whl "$kit"/kernels-*.whl; do
  python3 -m zipfile -e "$w" "$work/site/"
done
rm -rf "$work/site/nvidia_cutlass_dsl/dsl_packages/iket" "$work/site/tvm_ffi/3rdparty"
cp -a "$work/site/." "$work/rest/"
tar -xJf "$optional" -C "$work/tsite"
(cd "$work" && tar -cf - rest tsite | xz -9e -T0 > "$root/.kit_client/rest.tar.xz")
cp "$kit"/cutlass_dsl_libs_cu13-*.tar.xz "$root/.kit_client/"
cat > "$root/.kit_client/device-setup.sh" <<'SETUP'
#!/bin/bash
# Source from the project root with .kit_client carried: unpacks the client kit into /tmp/site and /tmp/tsite
# once per machine (a marker names the archive's size) and puts them on PYTHONPATH.
_kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_mark=/tmp/site/.clientkit-$(stat -c %s "$_kit"/rest.tar.xz)
if [ ! -f "$_mark" ]; then
  rm -rf /tmp/site /tmp/tsite /tmp/ckx && mkdir -p /tmp/site /tmp/ckx
  tar -xJf "$_kit"/rest.tar.xz -C /tmp/ckx || return 1
  cp -a /tmp/ckx/rest/. /tmp/site/ && mv /tmp/ckx/tsite /tmp/tsite
  tar -xJf "$_kit"/cutlass_dsl_libs_cu13-*.tar.xz -C /tmp/site || return 1
  touch "$_mark"
fi
export PYTHONPATH=/tmp/tsite:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
SETUP
chmod +x "$root/.kit_client/device-setup.sh"
grep -qx '/.kit_client/' "$root/.git/info/exclude" 2>/dev/null || echo '/.kit_client/' >> "$root/.git/info/exclude"
du -sb "$root/.kit_client"
