"""Compile cache: the in-process dict, then an on-disk AOT object, then ``cute.compile``.

``CompileCache(namespace).get(key, compile_fn)`` returns a callable for ``key``:
  1. from the in-process dict (one dict lookup; no lock, no repr, no hashing of sources);
  2. else from disk: ``<root>/<versions>/<namespace>/<entry>.o`` with a JSON sidecar ``<entry>.json``
     holding the object's size, its sha256 and the full key. The sidecar is checked before any native
     code is loaded (a truncated or foreign object is never handed to the loader); then
     ``cute.runtime.load_module(path, enable_tvm_ffi=True)`` and ``getattr(module, <function name>)``;
  3. else ``compile_fn()`` (a ``cute.compile(..., options="--enable-tvm-ffi")`` result) is exported with
     ``export_to_c`` and read back from disk, so a cold call and a warm call run the same artifact and a
     broken export shows up in the run that wrote it. If anything on disk fails, the compiled function
     itself is returned.

Keys. ``key`` is the caller's tuple of frozen, hashable values with a stable ``repr`` (problem, config,
execution model, compile target). The cache folds in what callers cannot see: the namespace, this
package's version, the pinned and the installed nvidia-cutlass-dsl versions, the tvm-ffi version, the
host CPU (the object holds host code; a cache dir may be shared by x86 and Arm nodes) and a sha256 of
every ``.py`` file of this package (any kernel edit invalidates old entries; computed once, lazily).
The entry name is the sha256 of the full key's ``repr``; the sidecar stores that ``repr`` and a load
checks it. A key whose ``repr`` holds an address (``<... at 0x7f...>``) is refused with ``ValueError``:
it would miss on disk in every new process.

Directory. ``FA4_SM120_CACHE_DIR`` relocates the root, else ``$XDG_CACHE_HOME/flash_attn_4_sm120``, else
``~/.cache/flash_attn_4_sm120``; ``FA4_SM120_DISK_CACHE=0`` turns the disk layer off. Both are read when a
cache first needs the disk, never at import. Directories are created 0700. A directory that exists and
is writable by group/others, or is owned by another uid, is refused with one warning per process (loading
an object file is running its code) and the cache runs memory-only. Entries live under a subdirectory
named by the package and cutlass-dsl versions, so releases never mix; nothing is ever deleted except a
bad entry being replaced.

Concurrency (several ranks of one job share a directory). Per entry, a lock file ``<entry>.lock`` takes
``fcntl.flock``: shared while loading, exclusive while checking again, compiling and exporting, so one
process compiles and the others wait and load its object. Writes go to a temporary name in the same
directory, are fsynced and ``os.replace``d (object first, then sidecar; the checksum ties them). If a lock
cannot be taken within ``lock_timeout_s``, the kernel is compiled in memory and the disk is left alone.
The kernel releases a dead process's flock, so a crashed writer leaves no stale lock.

Failures on disk are never fatal: an unreadable, truncated or unloadable entry is recompiled and
replaced; a failed export leaves the compiled function in memory (one warning per cache). Exceptions
from ``compile_fn`` itself propagate.

Measuring first-call time: a cold disk costs ``stats.compile_seconds + export_seconds + load_seconds``
(the read-back), a warm one ``stats.load_seconds``; compare two fresh processes on one directory. The
first ``load_module`` of a process also pays the DSL's one-time runtime setup: a bf16 d=128 causal forward
kernel (sm_120a, 99 KB object) took 1.62 s compile + 0.11 s export cold against 0.44-0.53 s warm, nearly
all of it that setup (later loads: 2 ms); 2-core CPU container, CUTE_DSL_DISABLE_FILE_CACHING=1, 2026-11-22.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Union

from ._version import CUTLASS_DSL_VERSION, __version__

CACHE_DIR_ENV = "FA4_SM120_CACHE_DIR"
DISK_CACHE_ENV = "FA4_SM120_DISK_CACHE"
_DIR_NAME = "flash_attn_4_sm120"
#: Version of the on-disk layout (sidecar fields, naming). Part of every key.
_FORMAT = 1
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.-]+")
_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")


class _FromEnv:
    def __repr__(self) -> str:
        return "<resolved from FA4_SM120_CACHE_DIR / XDG_CACHE_HOME / HOME>"


#: ``CompileCache(disk_dir=...)`` default: resolve the root from the environment when the disk is first used.
FROM_ENV: Any = _FromEnv()


@dataclasses.dataclass
class CacheStats:
    """Counters of one ``CompileCache``. Seconds are wall-clock totals over all keys."""

    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0
    disk_writes: int = 0
    #: Disk-layer failures: bad entries found (then replaced), failed exports, lock timeouts, unusable dirs.
    disk_errors: int = 0
    compile_seconds: float = 0.0
    #: ``export_to_c`` + fsync + rename (the cold path's extra cost over compiling).
    export_seconds: float = 0.0
    #: Checksum + ``load_module`` + symbol lookup, for disk hits and the read-back after an export.
    load_seconds: float = 0.0


class _LockTimeout(Exception):
    pass


class _BadEntry(Exception):
    pass


def default_cache_root() -> Path:
    """The disk cache root named by the environment now (not created)."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / _DIR_NAME
    return Path.home() / ".cache" / _DIR_NAME


def _disk_disabled_by_env() -> bool:
    return os.environ.get(DISK_CACHE_ENV, "1").strip().lower() in ("0", "false", "no", "off")


def digest_sources(package_dir: Path) -> str:
    """sha256 over every ``.py`` file under ``package_dir`` (relative path, length, bytes), in path order."""
    h = hashlib.sha256()
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts and p.is_file())
    for path in files:
        data = path.read_bytes()
        h.update(path.relative_to(package_dir).as_posix().encode())
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _source_digest() -> str:
    return digest_sources(Path(__file__).resolve().parent)


@functools.lru_cache(maxsize=None)
def _installed_versions() -> tuple[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    def _v(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "unknown"

    return _v("nvidia-cutlass-dsl"), _v("apache-tvm-ffi")


def _build_fingerprint() -> tuple:
    """Everything outside the caller's key that changes the compiled artifact."""
    cutlass_dsl, tvm_ffi = _installed_versions()
    return (
        ("format", _FORMAT),
        ("flash_attn_4_sm120", __version__),
        ("cutlass_dsl_pinned", CUTLASS_DSL_VERSION),
        ("cutlass_dsl", cutlass_dsl),
        ("tvm_ffi", tvm_ffi),
        ("host", platform.machine()),
        ("sources", _source_digest()),
    )


def _versions_dirname() -> str:
    name = f"{__version__}-cutlass-dsl-{_installed_versions()[0]}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


# Directories already refused in this process: one warning each.
_REFUSED_DIRS: set[str] = set()
_REFUSED_LOCK = threading.Lock()


def _refuse_dir(root: Path, reason: str) -> None:
    with _REFUSED_LOCK:
        if str(root) in _REFUSED_DIRS:
            return
        _REFUSED_DIRS.add(str(root))
    warnings.warn(
        f"flash_attn_4_sm120: not using the compile cache directory {root}: {reason}. Kernels are compiled "
        f"in memory only. Point {CACHE_DIR_ENV} at a directory of your own with mode 0700, or set "
        f"{DISK_CACHE_ENV}=0 to silence this.",
        UserWarning,
        stacklevel=5,
    )


def _private_dir(path: Path) -> Optional[str]:
    """Create ``path`` 0700 if missing; return why it is unsafe to load code from, or None."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        return f"cannot create or stat {path} ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable by this user"
    return None


class _EntryLock:
    """``fcntl.flock`` on ``<entry>.lock``, polled until ``timeout`` seconds."""

    def __init__(self, path: Path, timeout: float):
        self.path = path
        self.timeout = timeout
        self._fd: Optional[int] = None

    def acquire(self, exclusive: bool) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + self.timeout
        delay = 0.005
        try:
            while True:
                try:
                    fcntl.flock(fd, mode)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise _LockTimeout(f"{self.path} stayed locked for {self.timeout:g} s") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.2)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _fsync_path(path: Union[Path, str], directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CompileCache:
    """Compiled kernels of one namespace (``"fwd"``, ``"bwd"``, ...): memory, then disk, then compile.

    ``disk_dir``: the cache root (entries go under ``<disk_dir>/<versions>/<namespace>/``); by default it is
    resolved from the environment when the disk is first needed; ``None`` keeps this cache memory-only.
    ``FA4_SM120_DISK_CACHE=0`` turns the disk off either way.
    """

    def __init__(self, namespace: str, disk_dir: Optional[Path] = FROM_ENV, *, lock_timeout_s: float = 120.0):
        if not _NAMESPACE_RE.fullmatch(namespace):
            raise ValueError(f"compile cache namespace {namespace!r} must match [A-Za-z0-9_.-]+")
        self.namespace = namespace
        self.lock_timeout_s = lock_timeout_s
        self.stats = CacheStats()
        self._disk_dir_arg = disk_dir
        self._entry_dir: Optional[Path] = None
        self._disk_resolved = False
        self._memory: dict[tuple, Callable] = {}
        self._lock = threading.Lock()
        self._warned_export = False

    def __repr__(self) -> str:
        where = self._entry_dir if self._disk_resolved else self._disk_dir_arg
        return f"CompileCache({self.namespace!r}, disk={where}, entries_in_memory={len(self._memory)})"

    def keys(self) -> list:
        """The keys held in memory (what this process has loaded or compiled)."""
        return list(self._memory)

    def get(self, key: tuple, compile_fn: Callable[[], Any]) -> Callable:
        """The compiled function for ``key``; ``compile_fn()`` runs only when neither memory nor disk has it."""
        fn = self._memory.get(key)
        if fn is not None:
            self.stats.memory_hits += 1
            return fn
        with self._lock:
            fn = self._memory.get(key)
            if fn is not None:
                self.stats.memory_hits += 1
                return fn
            fn = self._get_uncached(key, compile_fn)
            self._memory[key] = fn
            return fn

    # -- slow path ---------------------------------------------------------------------------------

    def _get_uncached(self, key: tuple, compile_fn: Callable[[], Any]) -> Callable:
        if _ADDRESS_RE.search(repr(key)):
            raise ValueError(
                f"compile cache key {key!r} has a repr that holds a memory address; use frozen dataclasses, "
                f"enums, ints, strs and bools so the key is stable across processes"
            )
        entry_dir = self._disk()
        if entry_dir is None:
            return self._compile(compile_fn)
        full_repr = repr((("namespace", self.namespace), _build_fingerprint(), key))
        entry = hashlib.sha256(full_repr.encode()).hexdigest()
        lock = _EntryLock(entry_dir / f"{entry}.lock", self.lock_timeout_s)

        # 1. Shared lock: load a complete entry if one is there.
        try:
            lock.acquire(exclusive=False)
        except (_LockTimeout, OSError):
            self.stats.disk_errors += 1
            return self._compile(compile_fn)
        try:
            fn = self._load(entry_dir, entry, full_repr)
        except _BadEntry:
            fn = None  # judged again under the exclusive lock, which may replace it
        finally:
            lock.release()
        if fn is not None:
            self.stats.disk_hits += 1
            return fn

        # 2. Exclusive lock: another process may have written it meanwhile; else compile, export, read back.
        try:
            lock.acquire(exclusive=True)
        except (_LockTimeout, OSError):
            self.stats.disk_errors += 1
            return self._compile(compile_fn)
        try:
            try:
                fn = self._load(entry_dir, entry, full_repr)
            except _BadEntry:
                self.stats.disk_errors += 1
                self._remove(entry_dir, entry)
                fn = None
            if fn is not None:
                self.stats.disk_hits += 1
                return fn
            compiled = self._compile(compile_fn)
            return self._store(entry_dir, entry, full_repr, compiled)
        finally:
            lock.release()

    def _disk(self) -> Optional[Path]:
        """The entry directory, resolved (env read, dirs created and checked) on first use; None = memory only."""
        if self._disk_resolved:
            return self._entry_dir
        self._disk_resolved = True
        root = self._disk_dir_arg
        if root is None or _disk_disabled_by_env():
            return None
        try:
            root = default_cache_root() if root is FROM_ENV else Path(root).expanduser()
        except (RuntimeError, KeyError) as e:  # no HOME to expand
            self.stats.disk_errors += 1
            _refuse_dir(Path(str(root)), f"cannot resolve it ({e})")
            return None
        root = Path(os.path.abspath(root))
        entry_dir = root / _versions_dirname() / self.namespace
        for d in (root, entry_dir.parent, entry_dir):
            reason = _private_dir(d)
            if reason is not None:
                self.stats.disk_errors += 1
                _refuse_dir(root, reason)
                return None
        self._entry_dir = entry_dir
        return entry_dir

    def _compile(self, compile_fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        fn = compile_fn()
        self.stats.compile_seconds += time.perf_counter() - t0
        self.stats.compiles += 1
        return fn

    def _load(self, entry_dir: Path, entry: str, full_repr: str) -> Optional[Callable]:
        """The entry's function; None if there is no entry; ``_BadEntry`` if it is incomplete or broken."""
        obj_path, meta_path = entry_dir / f"{entry}.o", entry_dir / f"{entry}.json"
        if not obj_path.exists() and not meta_path.exists():
            return None
        t0 = time.perf_counter()
        try:
            meta = json.loads(meta_path.read_text())
            data = obj_path.read_bytes()
        except (OSError, ValueError) as e:
            raise _BadEntry(f"unreadable entry {obj_path}: {e}") from e
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT or meta.get("key") != full_repr:
            raise _BadEntry(f"sidecar {meta_path} does not describe this key")
        if len(data) == 0 or len(data) != meta.get("size") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise _BadEntry(f"{obj_path} is truncated or corrupted ({len(data)} bytes)")
        function_name = meta.get("function")
        if not isinstance(function_name, str) or not function_name.isidentifier():
            raise _BadEntry(f"sidecar {meta_path} names no function")
        try:
            import cutlass.cute as cute

            module = cute.runtime.load_module(str(obj_path), enable_tvm_ffi=True)
            fn = getattr(module, function_name)
        except Exception as e:  # noqa: BLE001 - any loader failure means: recompile
            raise _BadEntry(f"cannot load {obj_path}: {e}") from e
        self.stats.load_seconds += time.perf_counter() - t0
        return fn

    def _store(self, entry_dir: Path, entry: str, full_repr: str, compiled: Any) -> Callable:
        """Export ``compiled`` as the entry and return the function read back; ``compiled`` if that fails."""
        # A unique symbol per entry: two objects loaded in one process never export the same name.
        function_name = f"fa4_{entry[:24]}"
        obj_path, meta_path = entry_dir / f"{entry}.o", entry_dir / f"{entry}.json"
        t0 = time.perf_counter()
        tmp_paths: list[str] = []
        try:
            for stale in entry_dir.glob(f".{entry}.*.tmp*"):  # left by a writer that died; we hold the lock
                stale.unlink(missing_ok=True)
            fd, tmp_obj = tempfile.mkstemp(dir=entry_dir, prefix=f".{entry}.", suffix=".tmp.o")
            os.close(fd)
            tmp_paths.append(tmp_obj)
            compiled.export_to_c(object_file_path=tmp_obj, function_name=function_name)
            data = Path(tmp_obj).read_bytes()
            if not data:
                raise OSError(f"export_to_c wrote an empty object to {tmp_obj}")
            _fsync_path(tmp_obj)
            meta = {
                "format": _FORMAT,
                "function": function_name,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "key": full_repr,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            fd, tmp_meta = tempfile.mkstemp(dir=entry_dir, prefix=f".{entry}.", suffix=".tmp.json")
            tmp_paths.append(tmp_meta)
            with os.fdopen(fd, "w") as f:
                json.dump(meta, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_obj, obj_path)
            os.replace(tmp_meta, meta_path)
            _fsync_path(entry_dir, directory=True)
        except Exception as e:  # noqa: BLE001 - disk trouble must not cost the caller its kernel
            for p in tmp_paths:
                Path(p).unlink(missing_ok=True)
            self._export_failed(entry_dir, e)
            return compiled
        self.stats.export_seconds += time.perf_counter() - t0
        self.stats.disk_writes += 1
        try:
            fn = self._load(entry_dir, entry, full_repr)
        except _BadEntry as e:
            self._remove(entry_dir, entry)
            self._export_failed(entry_dir, e)
            return compiled
        return fn if fn is not None else compiled

    def _export_failed(self, entry_dir: Path, error: Exception) -> None:
        self.stats.disk_errors += 1
        if not self._warned_export:
            self._warned_export = True
            warnings.warn(
                f"flash_attn_4_sm120: could not write a compile cache entry in {entry_dir} "
                f"({type(error).__name__}: {error}); the kernel stays compiled in memory",
                UserWarning,
                stacklevel=5,
            )

    @staticmethod
    def _remove(entry_dir: Path, entry: str) -> None:
        for suffix in (".o", ".json"):
            try:
                (entry_dir / f"{entry}{suffix}").unlink(missing_ok=True)
            except OSError:
                pass


_DEFAULT_CACHES: dict[str, CompileCache] = {}
_DEFAULT_LOCK = threading.Lock()


def default_cache(namespace: str = "fwd") -> CompileCache:
    """The process-wide cache of ``namespace``, created on first call (its disk dir is read from env then)."""
    cache = _DEFAULT_CACHES.get(namespace)
    if cache is None:
        with _DEFAULT_LOCK:
            cache = _DEFAULT_CACHES.get(namespace)
            if cache is None:
                cache = _DEFAULT_CACHES[namespace] = CompileCache(namespace)
    return cache
