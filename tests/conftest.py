"""Shared fixtures: the kernel is built by scripts/build_local.py (a no-op when up to date) and
loaded the way users load it, through kernels.get_kernel with LOCAL_KERNELS."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "phanerozoic/det-infer"


def _build(backend):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_local.py"), "--backend", backend],
                   check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def di():
    import torch

    _build("cpu")
    if torch.version.cuda:  # a CUDA torch (the GPU check): get_kernel then picks the cu* variant
        _build("cuda")
    os.environ.setdefault("LOCAL_KERNELS", f"{REPO_ID}={ROOT / 'build'}")
    from kernels import get_kernel

    return get_kernel(REPO_ID, version=1)
