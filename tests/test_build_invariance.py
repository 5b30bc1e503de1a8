"""One contract, one digest: the fixed input set of tests/native/contract_digest.cpp gives the same
SHA-256 under every compiler, optimization level and ISA we can build for, under aarch64
emulation, and through the kernel's own torch ops (det_fixtures/contract_inputs.py)."""
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from det_fixtures import contract_inputs
from det_fixtures.host import cpu_has
import pytest
from det_fixtures.pins import CONTRACT_MATH_DIGEST

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "native" / "contract_digest.cpp"
IN_CI = os.environ.get("CI") == "true"

BASE = ["-std=c++17", "-ffp-contract=off"]
BUILDS = {
    "gcc-O0": ["g++", "-O0", *BASE],
    "gcc-O3-x86-64": ["g++", "-O3", "-march=x86-64", *BASE],
    "gcc-O3-x86-64-v3": ["g++", "-O3", "-march=x86-64-v3", *BASE],
    "gcc-O3-x86-64-v4": ["g++", "-O3", "-march=x86-64-v4", *BASE],
    "clang16-O0": ["clang++-16", "-O0", *BASE],
    "clang16-O3-x86-64-v3": ["clang++-16", "-O3", "-march=x86-64-v3", *BASE],
    "aarch64-gcc-O3-qemu": ["aarch64-linux-gnu-g++", "-O3", "-static", *BASE],
}


def _missing(reason):
    """Tools are installed by scripts/setup.sh; CI must have them, elsewhere skip and say why."""
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def _digest(cmd, tmp_path, name, run_args=()):
    exe = tmp_path / name
    subprocess.run([*cmd, str(SRC), "-o", str(exe)], check=True)
    runner = ["qemu-aarch64"] if "aarch64" in cmd[0] else []
    out = subprocess.run([*runner, str(exe), *run_args], check=True, capture_output=True).stdout
    return hashlib.sha256(out).hexdigest()


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_native_build_digest(build, tmp_path):
    cmd = BUILDS[build]
    if platform.machine() != "x86_64" and "x86-64" in " ".join(cmd):
        pytest.skip("x86-64 build on another host")
    if shutil.which(cmd[0]) is None:
        _missing(f"{cmd[0]} not installed (scripts/setup.sh installs it)")
    if "aarch64" in cmd[0] and shutil.which("qemu-aarch64") is None:
        _missing("qemu-aarch64 not installed (scripts/setup.sh installs qemu-user)")
    if "-march=x86-64-v4" in cmd and not cpu_has("avx512f"):
        pytest.skip("this CPU has no AVX-512 to run an x86-64-v4 binary")
    assert _digest(cmd, tmp_path, build) == CONTRACT_MATH_DIGEST


def test_kernel_ops_digest(di):
    """The built kernel (target_clones: baseline and x86-64-v3 code) through its torch ops."""
    assert contract_inputs.digest_through_ops(di) == CONTRACT_MATH_DIGEST


@pytest.mark.parametrize("threads", ["1", "2"])
def test_kernel_ops_digest_thread_count(threads):
    env = dict(os.environ, OMP_NUM_THREADS=threads, LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    code = ("from det_fixtures import contract_inputs; from kernels import get_kernel; "
            "print(contract_inputs.digest_through_ops(get_kernel('phanerozoic/det-infer', version=1)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == CONTRACT_MATH_DIGEST


def test_negative_control_ftz_changes_the_digest(tmp_path):
    """The digest is sensitive: the same build with flush-to-zero forced under the guard differs."""
    if platform.machine() != "x86_64":
        pytest.skip("the control flips MXCSR")
    cmd = BUILDS["gcc-O3-x86-64"]
    assert _digest(cmd, tmp_path, "ftz", ["--ftz"]) != CONTRACT_MATH_DIGEST


def test_fast_math_is_refused(tmp_path):
    """The contract headers refuse to compile under -ffast-math."""
    r = subprocess.run(["g++", "-O2", "-ffast-math", "-std=c++17", "-c", str(SRC), "-o",
                        str(tmp_path / "x.o")], capture_output=True, text=True)
    assert r.returncode != 0 and "never build with -ffast-math" in r.stderr
