"""Custom-op namespace of this build.

``tools/build_variant.py`` rewrites this file in ``build/torch-cuda`` with a namespace unique to the
build (derived from the source digest), so two builds loaded in one process register distinct ops.
"""

OPS_NAMESPACE = "_flash_attn_4_sm120_dev"


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{OPS_NAMESPACE}::{op_name}"
