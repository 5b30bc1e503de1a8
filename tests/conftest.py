"""Shared fixtures: the kernel is built by scripts/build_local.py (a no-op when up to date) and
loaded the way users load it, through kernels.get_kernel with LOCAL_KERNELS. The session's order:
tests/test_cuda_compile.py last, its nvcc build started in the background at collection."""
import os
import shutil
import subprocess
import sys
import tempfile
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


# tests/test_cuda_compile.py's build (nvcc for seven architectures: the CI's longest setup) runs in
# the background from collection on, at the lowest priority, when other tests share the session:
# their single-threaded stretches leave a core that ptxas then uses. Its module runs last.
_CUDA_MODULE = "test_cuda_compile.py"


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they deselect
def pytest_collection_modifyitems(session, config, items):
    cuda = [item for item in items if item.path.name == _CUDA_MODULE]
    if not cuda or len(cuda) == len(items) or config.option.collectonly:
        return
    items[:] = [item for item in items if item.path.name != _CUDA_MODULE] + cuda
    module, out = cuda[0].module, Path(tempfile.mkdtemp(prefix="det-infer-cuda-"))
    module.start_background(out)
    _BACKGROUND_BUILDS.append((module, out))


_BACKGROUND_BUILDS = []


def pytest_sessionfinish(session, exitstatus):
    for module, out in _BACKGROUND_BUILDS:  # a session that ends early (-x, ^C) does not wait for nvcc
        module.stop_background()
        shutil.rmtree(out, ignore_errors=True)
