"""The role-split backward's two warp groups pass the same number of bar.sync and the same number of bar.arrive per
step for every feature combination: compute-sanitizer's racecheck pairs barriers by count and reported thousands of
hazards across the CTA barrier when the groups' counts differ (with dropout: 6 against 5; with the signed dropout
protocol: 6 each, but 5 / 1 bar.sync / bar.arrive against 4 / 2). A static check of the source of
``FlashBwdRoleSplit.step`` (no compile): its ``if wg == 0`` branches, each trace-time ``const_expr`` branch taken
as the spec and config say, and run-time branches required to pass equal counts on both sides."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from types import SimpleNamespace

import pytest

from flash_attn_4_sm120._kernels import bwd_rolesplit

_BARRIER_CALLS = {"barrier", "barrier_arrive"}


def _step_tree() -> ast.FunctionDef:
    src = textwrap.dedent(inspect.getsource(bwd_rolesplit.FlashBwdRoleSplit.step))
    return ast.parse(src).body[0]


def _is_barrier(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _BARRIER_CALLS
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "arch")


def _const_expr_arg(test: ast.AST):
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "const_expr":
        return test.args[0]
    return None


def _count(stmts, env, kind=None) -> int:
    """Barriers one thread passes through ``stmts`` (trace-time branches resolved by ``env``): every one, or those
    of one ``kind`` (``"barrier"``, a bar.sync; ``"barrier_arrive"``, a bar.arrive)."""
    n = 0
    for node in stmts:
        if isinstance(node, ast.If):
            arg = _const_expr_arg(node.test)
            if arg is not None:
                taken = eval(compile(ast.Expression(arg), "<step>", "eval"), {}, env)  # noqa: S307 (our source)
                n += _count(node.body if taken else node.orelse, env, kind)
            else:
                body, orelse = _count(node.body, env, kind), _count(node.orelse, env, kind)
                assert body == orelse, f"run-time branch at line {node.lineno} passes {body} / {orelse} barriers"
                n += body
            continue
        n += sum(1 for sub in ast.walk(node) if _is_barrier(sub) and kind in (None, sub.func.attr))
    return n


def _group_branch(tree: ast.FunctionDef) -> ast.If:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and getattr(node.test.left, "id", "") == "wg":
            return node
    raise AssertionError("FlashBwdRoleSplit.step has no `if wg == 0` branch")


def _env(dropout=False, sparse=False, mods=False, stages_do=1, det=False, kvr=False, tile_n=128, lowest_first=False,
         causal=True) -> dict:
    """The names step's ``const_expr`` conditions read, for one feature combination (``pair_p``, ``lag_dk`` and
    ``signed_p`` the kernel's own rules, on this spec and config; causal, the highest-first order: ``tile_n`` 128 takes d96's 64 S
    registers per thread, where the deterministic mode runs without ``lag_dk``, 96 d128's 48)."""
    spec = SimpleNamespace(dropout=dropout, block_sparse=(128, 128) if sparse else None,
                           mods=object() if mods else None, deterministic=det, lowest_first=lowest_first,
                           causal=causal, local=False)
    cfg = SimpleNamespace(stages_do=stages_do, kv_in_regs=kvr, tile_m=64, tile_n=tile_n, role_warps=4)
    this = SimpleNamespace(spec=spec, config=cfg)
    this.pair_p = lambda: bwd_rolesplit.FlashBwdRoleSplit.pair_p(this)
    this.lag_dk = lambda: bwd_rolesplit.FlashBwdRoleSplit.lag_dk(this)
    this.signed_p = lambda: bwd_rolesplit.FlashBwdRoleSplit.signed_p(this)
    return {"self": this, "cfg": cfg, "turn": (0, 0, 0) if det else None}


@pytest.mark.parametrize("tile_n", [96, 128])
@pytest.mark.parametrize("dropout,sparse,mods,stages_do,det,kvr", list(itertools.product(
    [False, True], [False, True], [False, True], [1, 2], [False, True], [False, True])))
def test_both_groups_pass_the_same_number_of_barriers(dropout, sparse, mods, stages_do, det, kvr, tile_n):
    env = _env(dropout, sparse, mods, stages_do, det, kvr, tile_n)
    branch = _group_branch(_step_tree())
    for kind in sorted(_BARRIER_CALLS):
        group0, group1 = _count(branch.body, env, kind), _count(branch.orelse, env, kind)
        assert group0 == group1 > 0, f"group 0 passes {group0} {kind} per step, group 1 {group1}"


def test_the_check_sees_a_mismatch():
    """An extra barrier in one group's branch is caught (the counter reads the code it should), by kind too."""
    tree = _step_tree()
    branch = _group_branch(tree)
    extra = ast.parse("cute.arch.barrier(barrier_id=9, number_of_threads=128)").body[0]
    env = _env(dropout=True)
    assert _count(branch.body + [extra], env) == _count(branch.orelse, env) + 1
    assert _count(branch.body + [extra], env, "barrier") == _count(branch.orelse, env, "barrier") + 1
    assert _count(branch.body + [extra], env, "barrier_arrive") == _count(branch.orelse, env, "barrier_arrive")


@pytest.mark.parametrize("kvr,dropout,det,lowest_first,causal,tile_n,expected", [
    (True, False, False, False, True, 128, True),     # d96's entry, default mode
    (True, False, False, False, True, 96, True),      # d128's entry
    (True, True, False, False, True, 128, True),      # dropout: P passes group-wide (no pairs), dK still lags
    (False, False, False, False, True, 128, True),    # the smem-operand splits
    (False, True, False, False, True, 64, True),      # d64 / d128's dropout splits
    (True, False, True, False, True, 128, False),     # highest-first turn beside the mask at 64 S registers: spilled
    (True, False, True, False, False, 128, True),     # ... without a mask it fits
    (True, False, True, True, True, 128, True),       # lowest-first order: no such turn
    (True, False, True, False, True, 96, True),       # 48 S registers (d128): fits
    (False, False, True, False, False, 128, False),   # deterministic smem-operand splits: d64 ran 10% slower lagged
    (False, False, True, True, True, 64, False),      # ... in either order
])
def test_lag_dk_rule(kvr, dropout, det, lowest_first, causal, tile_n, expected):
    """``FlashBwdRoleSplit.lag_dk``: every role split (deterministic: the ``kv_in_regs`` ones), less the sm_120a
    gate's exception."""
    this = _env(dropout=dropout, det=det, kvr=kvr, tile_n=tile_n, lowest_first=lowest_first, causal=causal)["self"]
    assert this.lag_dk() is expected


@pytest.mark.parametrize("kvr,dropout,expected", [
    (True, True, True),     # d96's 64x128 dropout split: one signed tile (two spilled group 1)
    (False, True, False),   # the smem-operand dropout splits: two tiles (signed ran 3-13% slower there)
    (True, False, False),   # no dropout: no keep flags to carry
    (False, False, False),
])
def test_signed_p_rule(kvr, dropout, expected):
    """``FlashBwdRoleSplit.signed_p``: dropout's P passes signed in the ``kv_in_regs`` splits only; the barrier
    count test above takes both ways (dropout with and without ``kvr``)."""
    this = _env(dropout=dropout, kvr=kvr)["self"]
    assert this.signed_p() is expected
