"""A recorded copy of upstream flash-attn-4's public signatures (flash-attn-4 4.0.0b36 on PyPI,
``flash_attn/cute/interface.py``), which code written against upstream calls with: each function's parameters in
order, as (name, default), ``REQUIRED`` for a parameter without one. ``tests/test_scheduler_metadata.py`` checks the
bundle's functions of the same name against them."""

#: a parameter without a default
REQUIRED = object()

UPSTREAM_VERSION = "4.0.0b36"

SIGNATURES = {
    "get_scheduler_metadata": [
        ("max_seqlen_q", REQUIRED),
        ("max_seqlen_k", REQUIRED),
        ("nheads", REQUIRED),
        ("nheads_kv", REQUIRED),
        ("headdim", REQUIRED),
        ("num_splits", REQUIRED),
        ("headdim_v", None),
        ("pack_gqa", None),
        ("causal", False),
        ("window_size_left", None),
        ("window_size_right", None),
        ("seqlen_k_new", 0),
        ("cu_seqlens_q", None),
        ("cu_seqlens_k", None),
        ("cu_seqlens_k_new", None),
        ("seqused_q", None),
        ("seqused_k", None),
        ("leftpad_k", None),
        ("seqlen_k_per_split", None),
        ("_arch", None),
    ],
}
