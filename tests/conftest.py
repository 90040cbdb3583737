"""Suite-wide test setup. Kept minimal on purpose: feature fixtures live next to their tests.

sys.path (torch-ext, tests) and the markers (`gpu`, `check`) are configured in pytest.ini.

Tests marked `gpu` skip when torch sees no CUDA device. The skip is raised here at setup, not added as a
mark, so the short summary reports all of them on one line instead of one line per test function.
"""

import pytest

_GPU_SKIP = "needs a CUDA GPU (torch.cuda.is_available() is False)"
_cuda_key = pytest.StashKey[bool]()


def pytest_runtest_setup(item):
    # Default priority: after the skipping plugin's marks (tryfirst), before the runner sets up fixtures.
    if item.get_closest_marker("gpu") is None:
        return
    cuda = item.config.stash.get(_cuda_key, None)
    if cuda is None:
        # Imported only once a GPU test is about to run, so CPU-only selections never import torch here.
        import torch

        cuda = item.config.stash[_cuda_key] = torch.cuda.is_available()
    if not cuda:
        pytest.skip(_GPU_SKIP)

