#!/usr/bin/env python3
"""Local stand-in for kernel-builder: compile det-infer for the installed torch and lay out the
build variant exactly as kernel-builder would.

    build/<variant>/                 e.g. torch213-cxx11-cpu-x86_64-linux
        __init__.py ... (torch-ext/det_infer/*.py)
        _ops.py                      generated: ops namespace + add_op_namespace_prefix
        _det_infer_<backend>_<id>.abi3.so
        metadata.json                name, id, version, license, python-depends, backend

Sources and flags come from build.toml (the [torch] section and every [kernel.*] section of the
chosen backend), so this build and kernel-builder's compile the same files the same way. The
unique id is a hash of every input (sources, flags, torch version, compilers): an unchanged tree
is not rebuilt. Nix cannot run here, which is why this script exists (docs/SPEC.md §12).

Usage: build_local.py [--backend cpu|cuda] [--out build] [--force] [--print-archs]

DET_CUDA_ARCHS (e.g. "9.0", or "8.0,9.0") builds the cuda variant for those compute capabilities
only, instead of build.toml's list (scripts/device_check.sh builds just the lent GPU's); the
variant's metadata.json lists what was built, and the choice is part of the unique id. The cuda
variant also needs nvcc's CUDA major version to equal the one torch was built with.
DET_CUDA_EXTRA_FLAGS (e.g. "-lineinfo", for Nsight Compute's source view: device_check's ncu
stage) adds nvcc flags to the cuda variant; they are part of the unique id too. Build such a
variant into its own --out: it is not the one to ship.
"""
import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY_PACKAGE = "det_infer"  # torch-ext/<python name>/

# Our own small registration header (kernel-builder generates an equivalent one): it expands
# TORCH_EXTENSION_NAME in TORCH_LIBRARY and gives the .so a PyInit so that Python can import it.
REGISTRATION_H = """\
#pragma once
#include <Python.h>
#define DET_CAT_(a, b) a##b
#define DET_CAT(a, b) DET_CAT_(a, b)
#define DET_STR_(a) #a
#define DET_STR(a) DET_STR_(a)
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)
#define REGISTER_EXTENSION(NAME)                                                  \\
  PyMODINIT_FUNC DET_CAT(PyInit_, NAME)() {                                       \\
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, DET_STR(NAME),     \\
                                        nullptr, 0, nullptr};                     \\
    return PyModule_Create(&module);                                              \\
  }
"""

OPS_PY = '''\
import torch
from . import {ops_name}
ops = torch.ops.{ops_name}

def add_op_namespace_prefix(op_name: str):
    """
    Prefix op by namespace.
    """
    return f"{ops_name}::{{op_name}}"
'''


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def tool_version(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def find_nvcc():
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    return nvcc if nvcc.exists() else shutil.which("nvcc")


def nvcc_cuda_version(nvcc):
    """(major, minor) of nvcc's CUDA release, from `nvcc --version` ("release 13.0, V13.0.88")."""
    m = re.search(r"release (\d+)\.(\d+)", tool_version([str(nvcc), "--version"]))
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_cuda_majors(torch_cuda, nvcc_version):
    """An error message when nvcc's CUDA major differs from torch's (the extension would link one
    CUDA runtime and run under another), else None."""
    if nvcc_version is None:
        return "cannot read nvcc's CUDA version (`nvcc --version` printed no 'release X.Y')"
    torch_major = int(torch_cuda.split(".")[0])
    if nvcc_version[0] != torch_major:
        return (f"nvcc is CUDA {nvcc_version[0]}.{nvcc_version[1]} but torch was built with CUDA {torch_cuda}: "
                f"the majors must match (set CUDA_HOME to a CUDA {torch_major}.x toolkit)")
    return None


def cuda_archs(toml_caps):
    """The compute capabilities to build: DET_CUDA_ARCHS when set (e.g. "9.0" or "8.0,9.0"; commas,
    semicolons or spaces between), else build.toml's."""
    raw = os.environ.get("DET_CUDA_ARCHS", "").strip()
    if not raw:
        return list(toml_caps)
    caps = [c for c in re.split(r"[,;\s]+", raw) if c]
    bad = [c for c in caps if not re.fullmatch(r"\d+\.\d+a?", c)]
    if bad or not caps:
        raise SystemExit(f"DET_CUDA_ARCHS={raw!r}: expected compute capabilities such as 9.0 or 8.0,9.0 "
                         f"(not {', '.join(bad) or 'nothing'})")
    return list(dict.fromkeys(caps))


def variant_name(torch, backend):
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    abi = "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "cxx98"
    if backend == "cuda":
        cu_major, cu_minor = torch.version.cuda.split(".")[:2]
        tag = f"cu{cu_major}{cu_minor}"
    else:
        tag = "cpu"
    return f"torch{major}{minor}-{abi}-{tag}-{platform.machine()}-linux"


def sources_for(build, backend):
    """(source files, cxx flags, cuda flags, cuda capabilities) for one backend, from build.toml."""
    torch_sec = build["torch"]
    srcs = list(torch_sec["src"])
    cxx, cuda, caps = list(torch_sec.get("cxx-flags", [])), [], []
    for name, sec in sorted(build.get("kernel", {}).items()):
        if sec["backend"] != backend:
            continue
        srcs += sec["src"]
        cxx += [f for f in sec.get("cxx-flags", []) if f not in cxx]
        cuda += sec.get("cuda-flags", [])
        caps += sec.get("cuda-capabilities", [])
    if not any(Path(s).suffix in (".cpp", ".cu") for s in srcs if s not in torch_sec["src"]):
        raise SystemExit(f"build.toml has no [kernel.*] section with backend = {backend!r}")
    return sorted(set(srcs)), cxx, cuda, caps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", default=str(ROOT / "build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if nothing changed")
    ap.add_argument("--print-archs", action="store_true",
                    help="print the compute capabilities the cuda variant would be built for, and exit")
    args = ap.parse_args()
    if args.print_archs:
        toml_caps = sources_for(tomllib.loads((ROOT / "build.toml").read_text()), "cuda")[3]
        print(",".join(cuda_archs(toml_caps)))
        return

    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    build = tomllib.loads((ROOT / "build.toml").read_text())
    name = build["general"]["name"]
    backend = args.backend
    nvcc = None
    if backend == "cuda":
        nvcc = find_nvcc()
        if torch.version.cuda is None or nvcc is None:
            raise SystemExit("the cuda variant needs a CUDA build of torch and nvcc (CUDA_HOME)")
        mismatch = check_cuda_majors(torch.version.cuda, nvcc_cuda_version(nvcc))
        if mismatch:
            raise SystemExit(f"build_local: {mismatch}")
    srcs, cxx_flags, cuda_flags, caps = sources_for(build, backend)
    if backend == "cuda":
        caps = cuda_archs(caps)
        cuda_flags = [*cuda_flags, *os.environ.get("DET_CUDA_EXTRA_FLAGS", "").split()]

    # The unique id: every input of the build, hashed.
    h = hashlib.sha256()
    for s in srcs + ["build.toml", "scripts/build_local.py"]:
        h.update(s.encode() + b"\0" + (ROOT / s).read_bytes() + b"\0")
    for pyf in sorted((ROOT / "torch-ext" / PY_PACKAGE).glob("*.py")):
        h.update(pyf.name.encode() + b"\0" + pyf.read_bytes())
    h.update(torch.__version__.encode() + tool_version(["c++", "--version"]).encode())
    if nvcc:
        h.update(tool_version([str(nvcc), "--version"]).encode())
        h.update(("archs:" + ",".join(caps) + " flags:" + " ".join(cuda_flags)).encode())
    uid = h.hexdigest()[:10]
    ops_name = f"_{name.replace('-', '_')}_{backend}_{uid}"

    out_dir = Path(args.out) / variant_name(torch, backend)
    so_name = f"{ops_name}.abi3.so"
    meta_path = out_dir / "metadata.json"
    if not args.force and (out_dir / so_name).exists() and meta_path.exists():
        if json.loads(meta_path.read_text()).get("id") == ops_name:
            print(f"{out_dir}: up to date ({ops_name})")
            return

    obj_dir = ROOT / "build" / ".obj" / f"{backend}-{uid}"
    gen_dir = obj_dir / "gen"
    gen_dir.mkdir(parents=True, exist_ok=True)
    (gen_dir / "registration.h").write_text(REGISTRATION_H)

    defines = [f"-DTORCH_EXTENSION_NAME={ops_name}", "-DPy_LIMITED_API=0x03090000",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               "-DCUDA_KERNEL" if backend == "cuda" else "-DCPU_KERNEL"]
    includes = [f"-I{p}" for p in include_paths(device_type="cuda" if backend == "cuda" else "cpu")]
    includes += [f"-I{sysconfig.get_paths()['include']}", f"-I{gen_dir}", f"-I{ROOT}"]
    base_cxx = ["-std=c++20", "-O3", "-fPIC", "-fno-gnu-unique", "-Wall"] + cxx_flags

    jobs = []
    for s in srcs:
        src = ROOT / s
        obj = obj_dir / (s.replace("/", "__") + ".o")
        if src.suffix == ".cpp":
            jobs.append((["c++", *base_cxx, *defines, *includes, "-c", src, "-o", obj], obj))
        elif src.suffix == ".cu":
            gencode = []
            for cap in caps:
                sm = cap.replace(".", "")
                gencode += ["-gencode", f"arch=compute_{sm},code=sm_{sm}"]
            jobs.append(([nvcc, "-std=c++20", "-O3", "--threads=0", "-Xcompiler=-fPIC", *cuda_flags, *gencode, *defines,
                          *includes, "-c", src, "-o", obj], obj))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda job: run(job[0]), jobs))
    objs = [obj for _, obj in jobs]

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.so"):
        old.unlink()
    libs = [f"-L{p}" for p in library_paths(device_type="cuda" if backend == "cuda" else "cpu")]
    libs += ["-lc10", "-ltorch", "-ltorch_cpu"]
    if backend == "cuda":
        libs += ["-lc10_cuda", "-ltorch_cuda", f"-L{Path(nvcc).parent.parent / 'lib64'}", "-lcudart"]
    run(["c++", "-shared", "-fopenmp", *objs, "-o", out_dir / so_name, *libs])

    for pyf in (ROOT / "torch-ext" / PY_PACKAGE).glob("*.py"):
        shutil.copy2(pyf, out_dir / pyf.name)
    (out_dir / "_ops.py").write_text(OPS_PY.format(ops_name=ops_name))
    backend_info = {"type": backend}
    if backend == "cuda":
        # numeric order (7.5 before 10.0), ignoring a feature suffix such as "9.0a"
        backend_info["archs"] = sorted(set(caps), key=lambda c: [int("0" + "".join(filter(str.isdigit, p)))
                                                                  for p in c.split(".")])
    meta = {
        "name": name,
        "id": ops_name,
        "version": build["general"]["version"],
        "license": build["general"]["license"],
        "python-depends": build["general"].get("python-depends", []),
        "backend": backend_info,
    }
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"built {out_dir}/{so_name}")


if __name__ == "__main__":
    sys.exit(main())
