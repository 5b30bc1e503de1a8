"""The GPU side compiles for every target architecture with the exact-IEEE flags of build.toml,
and its machine code passes the audit of docs/SPEC.md §2.5: only round-to-nearest PTX division,
reciprocal and square root, no approximate PTX, no approximate MUFU transcendental, no
floating-point atomics, no spills. No GPU needed: nvcc and cuobjdump only."""
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI") == "true"
CUDA_SOURCES = sorted(str(p) for p in (ROOT / "det_infer_cuda").glob("*.cu"))
REQUIRED_ARCHS = {"75", "80", "89", "90", "120"}

# PTX: any approximate form, or transcendental instruction, or a float atomic/reduction.
FORBIDDEN_PTX = re.compile(
    r"\b(?:(?:div|rcp|sqrt|rsqrt)\.(?:approx|full)|ex2\.|lg2\.|sin\.|cos\.|tanh\.|rsqrt\."
    r"|(?:atom|red)(?:\.\w+)*\.(?:f16|bf16|f32|f64))")
# SASS: approximate transcendental units and float atomics. MUFU.RCP/RCP64H/RSQ/RSQ64H remain:
# ptxas emits them only as the seeds of its correctly rounded div.rn/rcp.rn/sqrt.rn expansions,
# and the PTX check above proves those are the only division/root forms used.
# Also no tensor-core MMA of any generation (its internal rounding differs between them).
FORBIDDEN_SASS = re.compile(r"MUFU\.(?:EX2|LG2|SIN|COS|TANH|SQRT)|\b(?:ATOM|ATOMG|ATOMS|RED)\.[A-Z.]*F(?:16|32|64)"
                            r"|\b(?:HMMA|HGMMA|DMMA|IMMA|QMMA|OMMA|UTCHMMA|UTCQMMA|UTCOMMA)\b")


def _tool(path_candidates, name):
    for p in path_candidates:
        if p and Path(p).exists():
            return str(p)
    reason = f"{name} not found (scripts/setup.sh installs it)"
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def _cuda_section():
    build = tomllib.loads((ROOT / "build.toml").read_text())
    return build["kernel"]["det_infer_cuda"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = _tool([Path(cuda_home) / "bin" / "nvcc", shutil.which("nvcc")], "nvcc")
    sec = _cuda_section()
    archs = [c.replace(".", "") for c in sec["cuda-capabilities"]]
    gencode = []
    for a in archs:
        gencode += ["-gencode", f"arch=compute_{a},code=[sm_{a},compute_{a}]"]
    out = tmp_path_factory.mktemp("cuda")
    objs, ptxas_log = [], ""
    for src in CUDA_SOURCES:
        obj = out / (Path(src).stem + ".o")
        r = subprocess.run([nvcc, "-std=c++20", "-O3", *sec["cuda-flags"], *gencode, "-Xptxas", "-v",
                            "-c", src, "-o", str(obj)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        objs.append(obj)
        ptxas_log += r.stderr
    return {"archs": archs, "objs": objs, "ptxas": ptxas_log}


def test_targets_cover_required_architectures(compiled):
    assert REQUIRED_ARCHS <= set(compiled["archs"])
    assert CUDA_SOURCES, "no CUDA sources found"


def test_build_flags_are_exact_ieee():
    flags = _cuda_section()["cuda-flags"]
    for f in ("--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"):
        assert f in flags


def test_no_spills(compiled):
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", compiled["ptxas"])
    assert spills, compiled["ptxas"][-2000:]
    assert all(s == "0" and l == "0" for s, l in spills), spills


def _dump(kind, obj):
    cuobjdump = _tool([ROOT / ".tools/cuobjdump/nvidia/cu13/bin/cuobjdump", shutil.which("cuobjdump")],
                      "cuobjdump")
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.tools/nvdisasm/nvidia/cu13/bin'}:{env.get('PATH', '')}"
    r = subprocess.run([cuobjdump, f"-{kind}", str(obj)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_ptx_audit(compiled):
    for obj in compiled["objs"]:
        ptx = _dump("ptx", obj)
        for a in compiled["archs"]:
            assert f".target sm_{a}" in ptx, f"no PTX for sm_{a} in {obj.name}"
        assert not FORBIDDEN_PTX.findall(ptx), sorted(set(FORBIDDEN_PTX.findall(ptx)))
        assert "div.rn.f32" in ptx  # the audit sees the real division instructions


def test_megakernel_registers_and_grid_barrier(compiled):
    """Every architecture's megakernel fits the register file without spilling (checked above for
    all functions) and its only atomics are the grid barrier's integer ones."""
    entries = re.findall(r"Compiling entry function '(\w*det_mk_kernel\w*)' for 'sm_(\d+)'\n"
                         r"(?:.*\n)*?ptxas info\s+: Used (\d+) registers", compiled["ptxas"])
    assert {a for _, a, _ in entries} == set(compiled["archs"]), entries
    assert all(int(r) <= 255 for _, _, r in entries)
    sass = _dump("sass", next(o for o in compiled["objs"] if o.stem == "det_megakernel"))
    assert re.search(r"\bATOMG?\.E\.(?:ADD|EXCH)", sass), "the grid barrier's integer atomics are in the SASS"


def test_sass_audit(compiled):
    for obj in compiled["objs"]:
        sass = _dump("sass", obj)
        archs = set(re.findall(r"arch = sm_(\d+)", sass))
        assert set(compiled["archs"]) <= archs, archs
        assert "FFMA" in sass and "MUFU.RCP" in sass  # the dump is real machine code
        assert not FORBIDDEN_SASS.findall(sass), sorted(set(FORBIDDEN_SASS.findall(sass)))


def test_audit_patterns_catch_violations():
    """The audit can fail: approximate instructions are recognized when present."""
    assert FORBIDDEN_PTX.search("ex2.approx.ftz.f32 %f1, %f2;")
    assert FORBIDDEN_PTX.search("div.full.f32 %f1, %f2, %f3;")
    assert FORBIDDEN_PTX.search("atom.global.add.f32 %f1, [%rd1], %f2;")
    assert not FORBIDDEN_PTX.search("div.rn.f32 %f1, %f2, %f3;")
    assert FORBIDDEN_SASS.search("MUFU.EX2 R0, R1 ;")
    assert FORBIDDEN_SASS.search("RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2.64], R5 ;")
    assert not FORBIDDEN_SASS.search("MUFU.RCP64H R3, R5 ;")
    assert FORBIDDEN_SASS.search("HMMA.16816.F32 R4, R8, R12, R4 ;")
    assert not FORBIDDEN_SASS.search("ATOMG.E.ADD.STRONG.GPU PT, R2, [R4.64], R7 ;")  # the grid barrier
