"""The kernels-hub package: build.toml validates with kernel-builder's own parser, the local build
lays out the variant kernel-builder would, and get_kernel loads it as users do."""
import ast
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VARIANT_PREFIX = "torch213-cxx11-cpu-"


def test_build_toml_validates_with_kernels():
    from kernels._rust import Build

    build = Build.open(str(ROOT))
    assert sorted(str(b).lower().split(".")[-1] for b in build.general.backends) == ["cpu", "cuda"]


def test_build_toml_validation_can_fail(tmp_path):
    from kernels._rust import Build

    text = (ROOT / "build.toml").read_text().replace('license = "Apache-2.0"', 'license = "Apache-2.0"\nbogus = 1')
    (tmp_path / "build.toml").write_text(text)
    with pytest.raises(ValueError, match="bogus"):
        Build.open(str(tmp_path))


def test_build_toml_fields():
    build = tomllib.loads((ROOT / "build.toml").read_text())
    g = build["general"]
    assert (g["name"], g["version"], g["edition"], g["license"]) == ("det-infer", 1, 5, "Apache-2.0")
    assert g["backends"] == ["cpu", "cuda"] and g["hub"]["repo-id"] == "phanerozoic/det-infer"
    assert set(build["kernel"]) == {"det_infer_cpu", "det_infer_cuda"}
    for name, sec in build["kernel"].items():
        assert (ROOT / name).is_dir(), f"[kernel.{name}] is named after its source folder"
        for src in sec["src"]:
            assert (ROOT / src).is_file(), src
    listed = set(build["kernel"]["det_infer_cpu"]["src"])
    on_disk = {str(p.relative_to(ROOT)) for d in ("contract", "det_infer_cpu", "megakernel", "model") for p in (ROOT / d).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert listed == on_disk, "every CPU source, contract header, model header and megakernel file is listed in build.toml"
    # The CUDA build carries the CPU engine too: its list is the CPU list plus det_infer_cuda/ only.
    cuda = set(build["kernel"]["det_infer_cuda"]["src"])
    assert listed <= cuda and all(s.startswith("det_infer_cuda/") for s in cuda - listed)


def test_flake_uses_kernel_builder():
    flake = (ROOT / "flake.nix").read_text()
    assert 'kernel-builder.url = "github:huggingface/kernels"' in flake
    assert "genKernelFlakeOutputs" in flake and "inherit self;" in flake and "path = ./.;" in flake


def test_generated_files_are_not_committed():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert not [f for f in tracked if f.endswith(("registration.h", "_ops.py")) or f.startswith("build/")]


def _variant():
    found = [p for p in (ROOT / "build").iterdir() if p.name.startswith(VARIANT_PREFIX)]
    assert len(found) == 1, found
    return found[0]


def test_variant_layout(di):
    variant = _variant()
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["name"] == "det-infer" and meta["version"] == 1 and meta["license"] == "Apache-2.0"
    assert meta["backend"] == {"type": "cpu"} and meta["python-depends"] == []
    assert meta["id"].startswith("_det_infer_cpu_")
    assert (variant / f"{meta['id']}.abi3.so").is_file()
    assert len(list(variant.glob("*.so"))) == 1
    ops_py = (variant / "_ops.py").read_text()
    assert f"torch.ops.{meta['id']}" in ops_py
    for py in (ROOT / "torch-ext" / "det_infer").glob("*.py"):
        assert (variant / py.name).read_text() == py.read_text()
    # Loaded the way users load it, under the metadata's unique module name.
    assert di.__name__ == meta["id"]
    assert di.add_op_namespace_prefix("unary_f32") == f"{meta['id']}::unary_f32"
    assert hasattr(di.ops, "unary_f32") and callable(di.contract.exp)
    from kernels._rust import Metadata

    Metadata.read_from_file(str(variant / "metadata.json"))


def test_rebuild_is_a_noop_when_nothing_changed():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_local.py")], capture_output=True,
                       text=True, check=True)
    assert "up to date" in r.stdout


def test_kernel_python_imports_only_stdlib_torch_and_itself():
    allowed = set(sys.stdlib_module_names) | {"torch"}
    for py in (ROOT / "torch-ext" / "det_infer").glob("*.py"):
        tree = ast.parse(py.read_text())
        for node in tree.body:  # module level only: optional libraries are imported in functions
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module.split(".")[0]]
            for n in names:
                assert n in allowed, f"{py.name} imports {n} at module level"


def test_get_kernel_through_local_kernels_in_a_fresh_process():
    """The README's line for using the build from your own code."""
    env = {"LOCAL_KERNELS": f"phanerozoic/det-infer={ROOT / 'build'}", "PATH": "/usr/bin:/bin"}
    code = ("from kernels import get_kernel; import torch; "
            "di = get_kernel('phanerozoic/det-infer', version=1); "
            "print(di.contract.exp(torch.tensor([1.0])).item(), di.CONTRACT_VERSION)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2.7182817459106445", "2"]  # e, and contract 2


def test_missing_variant_is_a_clear_error(tmp_path):
    env = {"LOCAL_KERNELS": f"phanerozoic/det-infer={tmp_path}", "PATH": "/usr/bin:/bin"}
    code = "from kernels import get_kernel; get_kernel('phanerozoic/det-infer', version=1)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "Cannot find a build variant" in r.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="no nvcc")
def test_cuda_variant_needs_cuda_torch():
    import torch

    if torch.version.cuda:
        pytest.skip("torch has CUDA here; scripts/device_check.sh builds the variant")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_local.py"), "--backend", "cuda"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "needs a CUDA build of torch" in r.stderr
