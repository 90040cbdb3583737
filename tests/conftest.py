"""Suite-wide test setup. Kept minimal on purpose: feature fixtures live next to their tests.

sys.path (torch-ext, tests) and the `gpu` marker are configured in pytest.ini.
"""

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    # Imported only when a GPU test was collected, so CPU-only collection stays fast.
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
