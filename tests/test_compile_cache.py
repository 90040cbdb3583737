"""Compile cache: memory, disk (AOT object + checksummed sidecar), locking, env and directory rules.

CPU-only except the one ``gpu`` test: a tiny ``@cute.jit`` kernel (b = 2a) is compiled for sm_120a on
fake tensors once per module, and ``compile_fn`` hands that object out while counting calls, so every
test exports a real object file. The concurrency test and the import test run fresh interpreters.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import cutlass
import cutlass.cute as cute
import pytest

import flash_attn_4_sm120.compile_cache as cc
from flash_attn_4_sm120.compile_cache import CompileCache, default_cache

TESTS_DIR = Path(__file__).resolve().parent
TORCH_EXT = TESTS_DIR.parent / "torch-ext"
PACKAGE_DIR = TORCH_EXT / "flash_attn_4_sm120"
KEY = ("tiny", "double", "sm_120a")


@cute.kernel
def _double_kernel(mA: cute.Tensor, mB: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < mA.shape[0]:
        mB[i] = mA[i] * 2.0


@cute.jit
def _double(mA: cute.Tensor, mB: cute.Tensor, stream):
    _double_kernel(mA, mB).launch(grid=[cute.ceil_div(mA.shape[0], 128), 1, 1], block=[128, 1, 1], stream=stream)


def compile_tiny(target: str = "sm_120a"):
    """``b = 2 * a`` for 1-D fp32 tensors of any length, compiled for ``target`` (no GPU needed)."""
    n = cute.sym_int()
    a = cute.runtime.make_fake_tensor(cutlass.Float32, (n,), stride=(1,), assumed_align=16)
    b = cute.runtime.make_fake_tensor(cutlass.Float32, (n,), stride=(1,), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(_double, a, b, stream, options=f"--enable-tvm-ffi --gpu-arch {target}")


class CountingCompile:
    """A ``compile_fn`` that returns one precompiled object and counts its calls."""

    def __init__(self, compiled):
        self.compiled = compiled
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.compiled


@pytest.fixture(scope="module")
def tiny():
    return compile_tiny()


@pytest.fixture
def compile_fn(tiny):
    return CountingCompile(tiny)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No test sees the developer's cache: env points nowhere real unless a test sets it."""
    for name in (cc.CACHE_DIR_ENV, cc.DISK_CACHE_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home-unused"))
    monkeypatch.setattr(cc, "_DEFAULT_CACHES", {})


def entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*.o"))


def sidecar(obj: Path) -> Path:
    return obj.with_suffix(".json")


def assert_valid_entry(obj: Path) -> None:
    import hashlib

    meta = json.loads(sidecar(obj).read_text())
    data = obj.read_bytes()
    assert len(data) > 0 and meta["size"] == len(data)
    assert meta["sha256"] == hashlib.sha256(data).hexdigest()


# -- memory and disk layers -----------------------------------------------------------------------


def test_memory_hit_does_not_recompile(tmp_path, compile_fn):
    cache = CompileCache("fwd", tmp_path / "c")
    fn1 = cache.get(KEY, compile_fn)
    fn2 = cache.get(KEY, compile_fn)
    assert fn2 is fn1
    assert compile_fn.calls == 1
    assert (cache.stats.compiles, cache.stats.memory_hits, cache.stats.disk_hits) == (1, 1, 0)


def test_memory_only_cache_returns_the_compiled_object(tmp_path, compile_fn, tiny):
    cache = CompileCache("fwd", None)
    assert cache.get(KEY, compile_fn) is tiny
    assert cache.get(KEY, compile_fn) is tiny
    assert compile_fn.calls == 1 and cache.stats.disk_writes == 0


def test_second_instance_loads_from_disk_without_compiling(tmp_path, compile_fn, tiny):
    root = tmp_path / "c"
    cold = CompileCache("fwd", root)
    fn_cold = cold.get(KEY, compile_fn)
    assert (cold.stats.compiles, cold.stats.disk_writes, cold.stats.disk_hits) == (1, 1, 0)
    # The cold call already runs the object read back from disk, like every later process.
    assert fn_cold is not tiny and callable(fn_cold)
    [obj] = entries(root)
    assert_valid_entry(obj)

    warm = CompileCache("fwd", root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn_warm = warm.get(KEY, compile_fn)
    assert [w for w in caught if "flash_attn_4_sm120" in str(w.message)] == []
    assert compile_fn.calls == 1
    assert (warm.stats.compiles, warm.stats.disk_hits, warm.stats.disk_writes) == (0, 1, 0)
    assert warm.stats.load_seconds > 0 and warm.stats.compile_seconds == 0
    assert type(fn_warm).__name__ == "Function"  # tvm_ffi.Function
    assert warm.get(KEY, compile_fn) is fn_warm and warm.stats.memory_hits == 1


def test_different_keys_and_namespaces_get_different_entries(tmp_path, compile_fn):
    root = tmp_path / "c"
    keys = [KEY, ("tiny", "double", "sm_121a")]
    writer = CompileCache("fwd", root)
    for key in keys:
        writer.get(key, compile_fn)
    CompileCache("bwd", root).get(KEY, compile_fn)
    objs = entries(root)
    assert len(objs) == 3 and len({o.name for o in objs}) == 3
    assert compile_fn.calls == 3

    reader = CompileCache("fwd", root)
    for key in keys:
        reader.get(key, compile_fn)
    assert (reader.stats.disk_hits, reader.stats.compiles) == (2, 0)


def _truncate(obj: Path) -> None:
    obj.write_bytes(obj.read_bytes()[: obj.stat().st_size // 2])


def _empty(obj: Path) -> None:
    obj.write_bytes(b"")


def _flip_byte(obj: Path) -> None:
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))


def _garbage_with_matching_checksum(obj: Path) -> None:
    import hashlib

    garbage = os.urandom(obj.stat().st_size)
    obj.write_bytes(garbage)
    meta = json.loads(sidecar(obj).read_text())
    meta.update(size=len(garbage), sha256=hashlib.sha256(garbage).hexdigest())
    sidecar(obj).write_text(json.dumps(meta))


def _delete_sidecar(obj: Path) -> None:
    sidecar(obj).unlink()


def _garbage_sidecar(obj: Path) -> None:
    sidecar(obj).write_text("{not json")


def _sidecar_of_another_key(obj: Path) -> None:
    meta = json.loads(sidecar(obj).read_text())
    meta["key"] = meta["key"].replace("double", "triple")
    sidecar(obj).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage",
    [
        _truncate,
        _empty,
        _flip_byte,
        _garbage_with_matching_checksum,
        _delete_sidecar,
        _garbage_sidecar,
        _sidecar_of_another_key,
    ],
    ids=lambda f: f.__name__.strip("_").replace("_", "-"),
)
def test_damaged_entry_is_recompiled_and_replaced(tmp_path, compile_fn, damage):
    root = tmp_path / "c"
    CompileCache("fwd", root).get(KEY, compile_fn)
    [obj] = entries(root)
    good_size = obj.stat().st_size
    damage(obj)

    repair = CompileCache("fwd", root)
    fn = repair.get(KEY, compile_fn)
    assert callable(fn)
    assert (repair.stats.compiles, repair.stats.disk_errors, repair.stats.disk_writes) == (1, 1, 1)
    assert entries(root) == [obj] and obj.stat().st_size == good_size
    assert_valid_entry(obj)

    after = CompileCache("fwd", root)
    after.get(KEY, compile_fn)
    assert (after.stats.disk_hits, after.stats.compiles, after.stats.disk_errors) == (1, 0, 0)


def test_failed_export_keeps_the_compiled_function_and_leaves_no_files(tmp_path):
    class NotExportable:
        def __call__(self):
            return "ran"

        def export_to_c(self, object_file_path, function_name):
            Path(object_file_path).write_bytes(b"partial")
            raise OSError(28, "No space left on device")

    compiled = NotExportable()
    cache = CompileCache("fwd", tmp_path / "c")
    with pytest.warns(UserWarning, match="could not write a compile cache entry"):
        fn = cache.get(KEY, lambda: compiled)
    assert fn is compiled
    assert (cache.stats.compiles, cache.stats.disk_writes, cache.stats.disk_errors) == (1, 0, 1)
    leftovers = [p.name for p in (tmp_path / "c").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert leftovers == []


def test_compile_error_propagates_and_releases_the_lock(tmp_path, compile_fn):
    root = tmp_path / "c"

    def broken():
        raise NotImplementedError("head_dim=320 is not supported; head_dim <= 256 is")

    with pytest.raises(NotImplementedError, match="head_dim=320"):
        CompileCache("fwd", root).get(KEY, broken)
    cache = CompileCache("fwd", root, lock_timeout_s=0.5)
    cache.get(KEY, compile_fn)
    assert (cache.stats.compiles, cache.stats.disk_writes, cache.stats.disk_errors) == (1, 1, 0)


def test_key_with_an_address_in_its_repr_is_refused(tmp_path, compile_fn):
    with pytest.raises(ValueError, match="memory address"):
        CompileCache("fwd", tmp_path / "c").get(("fwd", object()), compile_fn)
    assert compile_fn.calls == 0


def test_lock_timeout_falls_back_to_memory_and_leaves_disk_alone(tmp_path, compile_fn, tiny):
    root = tmp_path / "c"
    CompileCache("fwd", root).get(KEY, compile_fn)
    [obj] = entries(root)
    before = obj.read_bytes()
    [lock_path] = root.rglob("*.lock")
    cache = CompileCache("fwd", root, lock_timeout_s=0.2)
    got = {}

    def first_call():
        t0 = time.monotonic()
        got["fn"] = cache.get(KEY, compile_fn)
        got["waited"] = time.monotonic() - t0

    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another rank is exporting, and takes too long
        caller = threading.Thread(target=first_call, daemon=True)
        caller.start()
        caller.join(timeout=10)
        assert not caller.is_alive(), "get() kept waiting for the lock past lock_timeout_s"
    finally:
        os.close(fd)
    assert got["fn"] is tiny
    assert (cache.stats.compiles, cache.stats.disk_hits, cache.stats.disk_errors) == (1, 0, 1)
    assert 0.2 <= got["waited"] < 5
    assert obj.read_bytes() == before


def test_entry_written_while_waiting_for_the_exclusive_lock_is_loaded(tmp_path, compile_fn, monkeypatch):
    # Two ranks miss under the shared lock; the one that gets the exclusive lock second must load, not compile.
    root = tmp_path / "c"
    other_rank = CompileCache("fwd", root)
    original_acquire = cc._EntryLock.acquire
    state = {"other_ran": False}

    def acquire(self, exclusive):
        if exclusive and not state["other_ran"]:
            state["other_ran"] = True
            other_rank.get(KEY, compile_fn)  # the other rank wins the race and writes the entry
        original_acquire(self, exclusive)

    monkeypatch.setattr(cc._EntryLock, "acquire", acquire)
    cache = CompileCache("fwd", root)
    cache.get(KEY, compile_fn)
    assert other_rank.stats.disk_writes == 1
    assert (cache.stats.compiles, cache.stats.disk_hits, cache.stats.disk_writes) == (0, 1, 0)
    assert compile_fn.calls == 1


# -- versions and sources ---------------------------------------------------------------------------


def test_source_digest_tracks_py_files_only(tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    base = cc.digest_sources(pkg)
    (pkg / "__pycache__").mkdir(exist_ok=True)
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (pkg / "notes.txt").write_text("not code")
    assert cc.digest_sources(pkg) == base
    softmax = pkg / "_kernels" / "softmax.py"
    softmax.write_text(softmax.read_text() + "\n# edited\n")
    edited = cc.digest_sources(pkg)
    assert edited != base
    (pkg / "_kernels" / "new_kernel.py").write_text("")
    assert cc.digest_sources(pkg) not in (base, edited)
    assert len(cc._source_digest()) == 64 and cc._source_digest.cache_info().currsize == 1  # computed once


def test_changed_sources_miss_the_old_entry(tmp_path, compile_fn, monkeypatch):
    root = tmp_path / "c"
    CompileCache("fwd", root).get(KEY, compile_fn)
    monkeypatch.setattr(cc, "_source_digest", lambda: "0" * 64)
    edited = CompileCache("fwd", root)
    edited.get(KEY, compile_fn)
    assert (edited.stats.disk_hits, edited.stats.compiles) == (0, 1)
    assert len(entries(root)) == 2


def test_other_cutlass_version_uses_its_own_subdir(tmp_path, compile_fn, monkeypatch):
    root = tmp_path / "c"
    CompileCache("fwd", root).get(KEY, compile_fn)
    monkeypatch.setattr(cc, "_installed_versions", lambda: ("9.9.9", "0.0.1"))
    other = CompileCache("fwd", root)
    other.get(KEY, compile_fn)
    assert (other.stats.disk_hits, other.stats.compiles) == (0, 1)
    subdirs = sorted(p.name for p in root.iterdir())
    assert len(subdirs) == 2 and any("cutlass-dsl-9.9.9" in s for s in subdirs)
    meta = json.loads(sidecar(entries(root / next(s for s in subdirs if "9.9.9" in s))[0]).read_text())
    for fact in ("9.9.9", cc.__version__, cc.CUTLASS_DSL_VERSION, "'namespace', 'fwd'", repr(KEY)):
        assert fact in meta["key"]


# -- environment and directories ------------------------------------------------------------------


@pytest.mark.parametrize("source", ["FA4_SM120_CACHE_DIR", "XDG_CACHE_HOME", "HOME"])
def test_root_follows_the_environment_at_first_use(tmp_path, compile_fn, monkeypatch, source):
    cache = default_cache()  # created before the environment is set: nothing is read yet
    expected = {
        "FA4_SM120_CACHE_DIR": tmp_path / "relocated",
        "XDG_CACHE_HOME": tmp_path / "xdg" / "flash_attn_4_sm120",
        "HOME": tmp_path / "home" / ".cache" / "flash_attn_4_sm120",
    }[source]
    if source == "FA4_SM120_CACHE_DIR":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-loses"))
        monkeypatch.setenv(source, str(expected))
    elif source == "XDG_CACHE_HOME":
        monkeypatch.setenv(source, str(tmp_path / "xdg"))
    else:
        monkeypatch.setenv(source, str(tmp_path / "home"))
    cache.get(KEY, compile_fn)
    assert cache.stats.disk_writes == 1
    assert [p.relative_to(expected).parts[1] for p in entries(tmp_path)] == ["fwd"]
    assert default_cache() is cache and default_cache("fwd") is cache
    assert default_cache("bwd") is not cache and default_cache("bwd").namespace == "bwd"


def test_disk_cache_off_never_touches_disk(tmp_path, compile_fn, tiny, monkeypatch):
    monkeypatch.setenv(cc.DISK_CACHE_ENV, "0")
    monkeypatch.setenv(cc.CACHE_DIR_ENV, str(tmp_path / "env-dir"))

    def no_disk(*args, **kwargs):
        raise AssertionError("disk layer used although FA4_SM120_DISK_CACHE=0")

    monkeypatch.setattr(cc._EntryLock, "acquire", no_disk)
    monkeypatch.setattr(cc, "_private_dir", no_disk)
    for cache in (default_cache(), CompileCache("fwd", tmp_path / "explicit-dir")):
        assert cache.get(KEY, compile_fn) is tiny
        assert cache.get(KEY, compile_fn) is tiny
        assert (cache.stats.compiles, cache.stats.memory_hits) == (1, 1)
        assert (cache.stats.disk_hits, cache.stats.disk_writes, cache.stats.disk_errors) == (0, 0, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_new_dirs_are_0700_and_files_0600_whatever_the_umask(tmp_path, compile_fn):
    root = tmp_path / "a" / "b" / "cache"
    old = os.umask(0)
    try:
        CompileCache("fwd", root).get(KEY, compile_fn)
    finally:
        os.umask(old)
    [obj] = entries(root)
    for d in (root, obj.parent.parent, obj.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in obj.parent.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o702], ids=["group-writable", "world-writable", "other-writable"])
def test_dir_writable_by_others_is_refused_once_and_runs_memory_only(tmp_path, compile_fn, tiny, mode):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.warns(UserWarning, match="writable by group or others") as record:
        first = CompileCache("fwd", root)
        assert first.get(KEY, compile_fn) is tiny
        first.get(("tiny", "other-key"), compile_fn)
        second = CompileCache("bwd", root)
        assert second.get(KEY, compile_fn) is tiny
    assert len([w for w in record if "compile cache directory" in str(w.message)]) == 1
    assert list(root.iterdir()) == []
    assert (first.stats.compiles, first.stats.disk_writes) == (2, 0)


def test_versions_subdir_writable_by_others_is_refused(tmp_path, compile_fn):
    root = tmp_path / "c"
    CompileCache("fwd", root).get(KEY, compile_fn)
    [versions] = list(root.iterdir())
    os.chmod(versions, 0o777)
    with pytest.warns(UserWarning, match="writable by group or others"):
        cache = CompileCache("fwd", root)
        cache.get(KEY, compile_fn)
    assert (cache.stats.disk_hits, cache.stats.compiles) == (0, 1)


def test_dir_owned_by_another_uid_is_refused(tmp_path, compile_fn, monkeypatch):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    owner = root.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.warns(UserWarning, match=f"owned by uid {owner}"):
        cache = CompileCache("fwd", root)
        cache.get(KEY, compile_fn)
    assert list(root.iterdir()) == [] and cache.stats.disk_writes == 0


def test_import_has_no_side_effects(tmp_path):
    # The package __init__ may import torch (custom-op registration); compile_cache itself adds nothing.
    code = textwrap.dedent(
        """
        import os, sys
        import flash_attn_4_sm120
        before_env, before_mods = dict(os.environ), set(sys.modules)
        import flash_attn_4_sm120.compile_cache
        assert dict(os.environ) == before_env, "environment changed"
        added = sorted(m.split(".")[0] for m in set(sys.modules) - before_mods)
        heavy = sorted({m for m in added if m in ("cutlass", "tvm_ffi", "torch")})
        assert not heavy, heavy
        """
    )
    env = dict(os.environ, PYTHONPATH=str(TORCH_EXT), HOME=str(tmp_path / "home"),
               XDG_CACHE_HOME=str(tmp_path / "xdg"), FA4_SM120_CACHE_DIR=str(tmp_path / "dir"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert list(tmp_path.iterdir()) == []


# -- several processes ------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import dataclasses, json, sys, time
    from pathlib import Path
    sys.path[:0] = [{torch_ext!r}, {tests!r}]
    import test_compile_cache as t
    from flash_attn_4_sm120.compile_cache import CompileCache

    mode, root, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    target = sys.argv[5] if len(sys.argv) > 5 else "sm_120a"
    cache = CompileCache("fwd", root)
    ready.touch()
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    t0 = time.perf_counter()
    fn = cache.get(("tiny", "double", target), lambda: t.compile_tiny(target))
    first_call_s = time.perf_counter() - t0
    result = dict(dataclasses.asdict(cache.stats), first_call_s=first_call_s)
    if mode == "run":
        import torch
        a = torch.arange(1000, dtype=torch.float32, device="cuda")
        b = torch.full_like(a, float("nan"))
        fn(a, b)
        torch.cuda.synchronize()
        result["max_err"] = (b - 2 * a).abs().max().item()
    print("RESULT " + json.dumps(result))
    """
)


def run_children(tmp_path: Path, root: Path, count: int, mode: str = "get", target: str = "sm_120a") -> list[dict]:
    """Start ``count`` interpreters that all call ``get`` for one key at the same moment."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(torch_ext=str(TORCH_EXT), tests=str(TESTS_DIR)))
    go = tmp_path / "go"
    procs = []
    for i in range(count):
        ready = tmp_path / f"ready{i}"
        cmd = [sys.executable, str(script), mode, str(root), str(ready), str(go), target]
        procs.append((ready, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    deadline = time.monotonic() + 120
    while not all(r.exists() for r, _ in procs) and time.monotonic() < deadline:
        if any(p.poll() is not None for _, p in procs):
            break
        time.sleep(0.01)
    go.touch()
    results = []
    for _, p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        [line] = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        results.append(json.loads(line.removeprefix("RESULT ")))
    return results


@pytest.mark.check
def test_concurrent_writers_leave_one_valid_entry(tmp_path):
    root = tmp_path / "c"
    results = run_children(tmp_path, root, count=2)
    assert sum(r["compiles"] for r in results) == 1, results
    assert sum(r["disk_hits"] for r in results) == 1, results
    assert sum(r["disk_writes"] for r in results) == 1 and sum(r["disk_errors"] for r in results) == 0
    [obj] = entries(root)
    assert_valid_entry(obj)
    # No temporary files left; the process that did not compile loaded this entry (its disk hit).
    assert sorted(p.suffix for p in obj.parent.iterdir()) == [".json", ".lock", ".o"]


@pytest.mark.gpu
def test_disk_loaded_kernel_runs_in_a_fresh_process(tmp_path):
    import torch

    major, minor = torch.cuda.get_device_capability()
    target = f"sm_{major}{minor}a"
    root = tmp_path / "c"
    (tmp_path / "cold").mkdir()
    (tmp_path / "warm").mkdir()
    [cold] = run_children(tmp_path / "cold", root, count=1, mode="run", target=target)
    [warm] = run_children(tmp_path / "warm", root, count=1, mode="run", target=target)
    assert (cold["compiles"], cold["disk_writes"]) == (1, 1)
    assert (warm["compiles"], warm["disk_hits"]) == (0, 1)
    assert cold["max_err"] == 0.0 and warm["max_err"] == 0.0
