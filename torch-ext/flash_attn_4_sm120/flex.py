"""Host side of flex attention: what makes a ``score_mod`` / ``score_mod_bwd`` / ``mask_mod``
callable part of a kernel's identity.

A mod is traced into the kernel, so two different mods must never share a compiled kernel and the same mod
must never recompile. ``callable_key`` digests what decides the traced code:

* the function's source (its bytecode and constants when the source is unavailable), qualified name and
  ``__vec_size__``;
* its defaults and the values its closure captures;
* the values of the module globals its code names (``co_names``, nested code objects included), so editing
  a global constant recompiles instead of reusing a stale kernel (upstream hashes closures only);
* recursively, the same for functions it captures or names (a helper called by the mod).

Values must be plain data (numbers, strings, bools, None, tuples / frozensets of them) or callables and
modules; anything else (a tensor, a mutable object) raises ``ValueError`` naming the variable: such values
belong in ``aux_tensors`` / ``aux_scalars``, which are runtime arguments. The source text is read once per
code object; the values are read on every call, so a changed capture or global gives a new key.
"""

from __future__ import annotations

import dis
import hashlib
import inspect
import types
from dataclasses import dataclass
from typing import Callable, Optional

_PLAIN = (int, float, bool, str, bytes, type(None), complex)
#: aux scalars' type names: Python's and the CuTe DSL numerics' (``compiler.AUX_SCALAR_TYPES`` gives their kernel
#: parameter types); the values are runtime arguments
AUX_SCALAR_NAMES = ("int", "float", "bool", "Int32", "Float32", "Boolean")


def _plain_repr(value, where: str) -> str:
    """repr of a plain-data value (recursing into tuples / frozensets); ``where`` names it in errors."""
    if isinstance(value, _PLAIN):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, tuple):
        return "(" + ",".join(_plain_repr(v, where) for v in value) + ")"
    if isinstance(value, frozenset):
        return "{" + ",".join(sorted(_plain_repr(v, where) for v in value)) + "}"
    raise ValueError(f"{where} is a {type(value).__name__}: a mod may capture only numbers, strings, tuples, "
                     f"functions and modules (it is traced into the kernel); pass tensors through aux_tensors "
                     f"and changing numbers through aux_scalars")


def _code_names(code: types.CodeType) -> list:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _code_names(const)
    return names


_CODE_TEXT: dict = {}


def _code_text(fn) -> str:
    code = fn.__code__
    text = _CODE_TEXT.get(code)
    if text is None:
        try:
            text = inspect.getsource(fn)
        except (OSError, TypeError):
            text = f"{code.co_code.hex()}|{code.co_consts!r}|{code.co_names!r}"
        _CODE_TEXT[code] = text
    return text


def _value_text(value, where: str, seen: set) -> str:
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return "fn:" + _digest(value.__func__ if isinstance(value, types.MethodType) else value, seen)
    if isinstance(value, type) or callable(value) and not isinstance(value, _PLAIN + (tuple, frozenset)):
        # classes and builtins (cute.where, math.exp, ...): their identity, not their contents
        return f"obj:{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
    return _plain_repr(value, where)


def _digest(fn, seen: set) -> str:
    if id(fn) in seen:  # recursion (a mod calling itself, or two helpers calling each other)
        return f"recursive:{fn.__qualname__}"
    seen = seen | {id(fn)}
    name = getattr(fn, "__qualname__", repr(fn))
    parts = [name, _code_text(fn), f"vec:{getattr(fn, '__vec_size__', None)!r}"]
    for label, values in (("default", fn.__defaults__ or ()), ("kwdefault", (fn.__kwdefaults__ or {}).values())):
        parts += [f"{label}:{_value_text(v, f'a default of {name}', seen)}" for v in values]
    cells = fn.__closure__ or ()
    for var, cell in zip(fn.__code__.co_freevars, cells):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a name bound later in the enclosing scope)
            value = None
        parts.append(f"free:{var}={_value_text(value, f'{var!r} captured by {name}', seen)}")
    globs = fn.__globals__
    for var in sorted(set(_code_names(fn.__code__))):
        if var in globs:
            parts.append(f"global:{var}={_value_text(globs[var], f'global {var!r} read by {name}', seen)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def callable_key(fn: Callable) -> str:
    """The digest of a mod (see the module docstring; a ``cute.jit``-decorated function is keyed by the function
    it wraps); raises ``ValueError`` for a value it cannot key on and ``TypeError`` for something that is not a
    Python function."""
    target = inspect.unwrap(fn.__func__ if isinstance(fn, types.MethodType) else fn)
    if not isinstance(target, types.FunctionType):
        raise TypeError(f"a mod must be a Python function (def or lambda), got {type(fn).__name__}")
    return _digest(target, set())


def reads_batch_head(fn: Callable) -> tuple:
    """(reads b, reads h): whether a mod's code may read its batch / head arguments (its first two parameters).
    Conservative: True unless the function's own bytecode never loads the parameter (a closure over it, a
    ``locals()`` call, a ``*args`` signature or a callable that is not a plain function count as reads). The
    block-sparse refinement evaluates a mask_mod once for every batch or head only where it reads them."""
    target = inspect.unwrap(fn.__func__ if isinstance(fn, types.MethodType) else fn)
    if not isinstance(target, types.FunctionType):
        return True, True
    code = target.__code__
    first = 1 if isinstance(fn, types.MethodType) else 0  # a bound method's self comes first
    if code.co_argcount < first + 2 or {"locals", "vars", "eval", "exec"} & set(_code_names(code)):
        return True, True
    loads = set()
    for ins in dis.get_instructions(code):
        pure_store = ins.opname in ("STORE_FAST", "STORE_DEREF", "DELETE_FAST", "DELETE_DEREF")
        if not pure_store and any(part in ins.opname for part in ("FAST", "DEREF", "CELL", "CLOSURE")):
            loads.update(ins.argval if isinstance(ins.argval, tuple) else (ins.argval,))
    names = code.co_varnames[first:first + 2]
    return tuple(name in loads or name in code.co_cellvars for name in names)


def dtype_name(t) -> str:
    """An aux tensor's element type as the compile key records it (torch's name: "float32", "int32", ...)."""
    return str(t.dtype).replace("torch.", "")


@dataclass(frozen=True)
class ModKey:
    """The compile-time identity of a call's mods: one digest per callable (None when absent), their vector
    widths, and the aux tensors' (dtype, ndim) and aux scalars' types (values are runtime)."""

    score_mod: Optional[str] = None
    score_mod_bwd: Optional[str] = None
    mask_mod: Optional[str] = None
    score_vec: int = 1
    aux_tensors: tuple = ()
    aux_scalars: tuple = ()

    @staticmethod
    def of(score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None, aux_scalars=None):
        """The key of a call's mods, or None when it has none (the kernels without mods)."""
        if score_mod is None and score_mod_bwd is None and mask_mod is None:
            if aux_tensors or aux_scalars:
                raise ValueError("aux_tensors / aux_scalars are inputs of score_mod / mask_mod: pass a mod too")
            return None
        if score_mod_bwd is not None and score_mod is None:
            raise ValueError("score_mod_bwd is the gradient of a score_mod: pass score_mod too")
        vec = getattr(score_mod, "__vec_size__", 1) if score_mod is not None else 1
        if vec not in (1, 2):
            raise ValueError(f"score_mod.__vec_size__={vec}: 1 or 2 supported on SM120 (mma.sync fragments hold "
                             f"pairs of adjacent columns)")
        if mask_mod is not None and getattr(mask_mod, "__vec_size__", 1) != 1:
            raise ValueError("mask_mod.__vec_size__ must be 1 on SM120")
        tensors = tuple((dtype_name(t), t.dim()) for t in (aux_tensors or ()))
        scalars = tuple(type(s).__name__ for s in (aux_scalars or ()))
        for name in scalars:
            if name not in AUX_SCALAR_NAMES:
                raise ValueError(f"aux_scalars hold Python ints, floats and bools or cutlass.Int32 / Float32 / Boolean "
                                 f"values; got {name}")
        return ModKey(*(callable_key(f) if f is not None else None for f in (score_mod, score_mod_bwd, mask_mod)),
                      score_vec=vec, aux_tensors=tensors, aux_scalars=scalars)


#: ModKey -> (score_mod, score_mod_bwd, mask_mod): the callables a key was first seen with. Equal keys mean equal
#: traced code, so any of them compiles the kernel; the compiler reads them here (``callables``) because the
#: kernel's compile key holds only the ModKey.
_CALLABLES: dict = {}


def register(key: ModKey, score_mod=None, score_mod_bwd=None, mask_mod=None) -> ModKey:
    """Remember the callables of ``key`` for the compiler; returns ``key``."""
    _CALLABLES.setdefault(key, (score_mod, score_mod_bwd, mask_mod))
    return key


def callables(key: ModKey) -> tuple:
    """(score_mod, score_mod_bwd, mask_mod) registered for ``key``; raises ``KeyError`` naming the key when a
    kernel is compiled for mods this process never saw (a disk-cache miss for another process's mods)."""
    try:
        return _CALLABLES[key]
    except KeyError:
        raise KeyError(f"no callables registered for {key}: compile a kernel with mods through the API call that "
                       f"passes them") from None
