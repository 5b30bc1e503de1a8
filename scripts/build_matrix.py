#!/usr/bin/env python3
"""The release matrix: every CUDA toolchain x architecture compiled and audited, the variants that
can be linked here built, loaded without a GPU and ABI-checked. scripts/build_matrix.sh runs this.

kernel-builder publishes one build variant per torch release and CUDA toolchain (cu126 ... cu132)
from Nix, which cannot run here. This script proves the same matrix with what pip installs:

1. toolchains  nvcc 12.6, 12.8 (nvidia-cuda-nvcc-cu12), 13.0, 13.2 (nvidia-cuda-nvcc) from PyPI with
               their runtime and cccl headers, each `pip install --target` into the cache, beside
               the machine's own nvcc ($CUDA_HOME, "system").
2. compile     every det_infer_cuda/*.cu (the megakernel and the contract headers it includes) for
               every architecture of build.toml that the toolchain lists (`nvcc --list-gpu-arch`),
               with build.toml's cuda-flags and `-Xptxas -v` (registers, spills, stack, smem).
3. audit       every object through cuobjdump -sass / -ptx against the audit rules of
               tests/test_cuda_compile.py (imported, not copied): no approximate PTX, no MUFU
               transcendental, no float atomics, no tensor-core MMA; the megakernel at most
               MAX_REGISTERS registers, its grid barriers of the expected shape, and its local-memory
               instructions (LDL/STL) reported (the CI test holds nvcc 13.0's to a ceiling).
4. variants    scripts/build_local.py --backend cpu with this venv's torch (torch213 cpu) and
               --backend cuda with torch 2.14.1+cu130 in a separate venv in the cache.
5. load        each variant through kernels.get_local_kernel(build_dir, backend=...) in a fresh
               process with CUDA_VISIBLE_DEVICES="" (no device touched: checked).
6. abi         kernel-abi-check (the PyPI bindings of kernel-builder's check-abi) on every .so:
               Python stable ABI 3.9 must pass; manylinux_2_28 reported; DT_NEEDED listed.

The sources compiled and built are the committed HEAD (a `git archive` snapshot in the cache) unless
--worktree is given, so the report names a commit. Results: <cache>/results/matrix-<stamp>.json and
.md (the tables of docs/RESULTS.md §10); the exit status is non-zero when any check fails.

    scripts/build_matrix.sh [--quick] [--cache DIR] [--toolchains cu126,cu128,cu130,cu132,system]
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each toolchain's pinned packages (nvcc + the runtime and cccl headers of the same release). CUDA 13
# splits nvcc into nvcc, crt (host headers) and nvvm (cicc): all pinned to the same release.
TOOLCHAINS = {
    "cu126": ["nvidia-cuda-nvcc-cu12==12.6.85", "nvidia-cuda-runtime-cu12==12.6.77", "nvidia-cuda-cccl-cu12==12.6.77"],
    "cu128": ["nvidia-cuda-nvcc-cu12==12.8.93", "nvidia-cuda-runtime-cu12==12.8.90", "nvidia-cuda-cccl-cu12==12.8.90"],
    "cu130": ["nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-crt==13.0.88", "nvidia-nvvm==13.0.88",
              "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cccl==13.0.85"],
    "cu132": ["nvidia-cuda-nvcc==13.2.86", "nvidia-cuda-crt==13.2.86", "nvidia-nvvm==13.2.86",
              "nvidia-cuda-runtime==13.2.86", "nvidia-cuda-cccl==13.2.86"],
}
SYSTEM = "system"  # $CUDA_HOME/bin/nvcc (13.0 on the project's machines): what CI compiles with
# The 12.x toolchains on PyPI have ptxas but no front end: their PTX comes from the system nvcc, its
# `.version` line set to the newest PTX ISA that toolchain's ptxas reads, and their ptxas makes the
# machine code (register allocation, spills and the SASS that the audit reads are all ptxas's).
PTX_ISA = {"cu126": "8.5", "cu128": "8.7"}

# The CUDA variant that can be linked here: the CUDA build of torch that pip installs, in its own venv.
CUDA_TORCH = "torch==2.14.1"
CUDA_VENV = "venv-torch2141-cu130"
CUDA_VENV_EXTRA = ["numpy==2.4.6"]  # silences torch's numpy warning; pinned like requirements.txt

ABI3_VERSION = "3.9"            # kernel-builder check-abi defaults
MANYLINUX = "manylinux_2_28"

# The variant's name as build_local.py computes it, in the interpreter that built it.
VARIANT_CHILD = "import sys, torch; sys.path.insert(0, sys.argv[1]); import build_local; " \
                "print(build_local.variant_name(torch, sys.argv[2]))"

LOAD_CHILD = r"""
import json, sys, torch
from pathlib import Path
from kernels import get_local_kernel
build, backend = Path(sys.argv[1]), sys.argv[2]
di = get_local_kernel(build, backend=backend)
value = di.contract.exp(torch.tensor([1.0])).item()  # a CPU op of the loaded .so
maps = open("/proc/self/maps").read()
print(json.dumps({"module": di.__name__, "file": di.__file__, "exp1": value, "contract": di.CONTRACT_VERSION,
                  "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "cuda_initialized": torch.cuda.is_initialized(), "libcuda_mapped": "libcuda.so" in maps}))
"""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("+", " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], **kw)


def audit_module():
    """The CI test itself, whose rules and SASS readers the audit uses (one definition of each)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_cuda_compile

    return test_cuda_compile


def audit_rules():
    """The audit's regular expressions, from the CI test itself (one definition of the rules)."""
    t = audit_module()
    return t.FORBIDDEN_PTX, t.FORBIDDEN_SASS


def ptxas_options(flags):
    """What nvcc passes on to ptxas from these nvcc flags (as `nvcc --dryrun` shows): the register
    bound and every -Xptxas option. The ptxas toolchains get them too, so the same rule holds."""
    out = []
    for f in flags:
        m = re.fullmatch(r"--?maxrregcount[= ](\d+)", f)
        if m:
            out.append(f"-maxrregcount={m.group(1)}")
        m = re.fullmatch(r"(?:-Xptxas|--ptxas-options)=(.+)", f)
        if m:
            out += m.group(1).split(",")
    return out


# ---------------------------------------------------------------------------------------------- 1
def install_toolchain(name, cache):
    """pip install --target the toolchain's pinned packages (idempotent); returns its folder."""
    dest = cache / "toolchains" / name
    stamp = dest / ".pins"
    pins = "\n".join(TOOLCHAINS[name])
    if stamp.exists() and stamp.read_text() == pins:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    r = run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
             "--target", dest, *TOOLCHAINS[name]])
    if r.returncode:
        raise SystemExit(f"toolchain {name}: pip install failed")
    for d in dest.glob("nvidia/*/bin"):
        for f in d.iterdir():
            f.chmod(0o755)
    for f in dest.glob("nvidia/*/nvvm/bin/*"):
        f.chmod(0o755)
    stamp.write_text(pins)
    return dest


def toolchain_tools(name, cache):
    """(compiler path, extra include flags, version string) of a toolchain: its nvcc, or for the 12.x
    toolchains its ptxas (PyPI's nvidia-cuda-nvcc-cu12 ships ptxas and libnvvm only, no nvcc driver,
    cudafe++ or cicc)."""
    if name == SYSTEM:
        tool, incs = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc", []
    else:
        dest = install_toolchain(name, cache)
        kind = "ptxas" if name in PTX_ISA else "nvcc"
        found = sorted(dest.glob(f"nvidia/*/bin/{kind}"))
        if len(found) != 1:
            raise SystemExit(f"toolchain {name}: expected one {kind}, found {found}")
        tool = found[0]
        incs = [f"-I{d}" for d in sorted(dest.glob("nvidia/*/include"))]
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout
    version = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    return tool, incs, version.group(2) if version else out.strip().splitlines()[-1]


def supported_archs(tool):
    """The real architectures a toolchain offers: `nvcc --list-gpu-arch`, or ptxas's --gpu-name values."""
    if Path(tool).name == "ptxas":
        out = subprocess.run([tool, "--help"], capture_output=True, text=True, check=True).stdout
        return set(re.findall(r"'sm_(\d+)'", out))
    out = subprocess.run([tool, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"compute_(\d+)\b", out))


# ---------------------------------------------------------------------------------------------- 2
def parse_ptxas(log_text):
    """Entry functions' resources (read by the CI test's own reader) and the spills of every
    function from `ptxas -v` output."""
    entries = [{"function": fn, "arch": arch, **res}
               for (fn, arch), res in audit_module().ptxas_entries(log_text).items()]
    spills = [(int(s), int(l)) for s, l in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log_text)]
    return entries, spills


def cuobjdump_env():
    tools = ROOT / ".tools"
    cuobjdump = tools / "cuobjdump/nvidia/cu13/bin/cuobjdump"
    if not cuobjdump.exists():
        cuobjdump = shutil.which("cuobjdump")
        if cuobjdump is None:
            raise SystemExit("cuobjdump not found (scripts/setup.sh installs it under .tools/)")
    env = dict(os.environ)
    env["PATH"] = f"{tools / 'nvdisasm/nvidia/cu13/bin'}:{env.get('PATH', '')}"
    return str(cuobjdump), env


def audit_object(obj, arch, rules, ptx_text=None):
    """Audit one object's machine code (SASS) and PTX against the CI rules; ptx_text is the PTX when
    obj is a bare cubin (ptxas toolchains), else cuobjdump extracts it from the object's fatbin."""
    forbidden_ptx, forbidden_sass = rules
    cuobjdump, env = cuobjdump_env()
    sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, env=env)
    problems = []
    if ptx_text is None:
        ptx = subprocess.run([cuobjdump, "-ptx", obj], capture_output=True, text=True, env=env)
        ptx_text = ptx.stdout
        if ptx.returncode:
            problems.append(f"cuobjdump -ptx failed: {ptx.stderr[-500:]}")
    if sass.returncode:
        problems.append(f"cuobjdump -sass failed: {sass.stderr[-500:]}")
    if f"code for sm_{arch}" not in sass.stdout or "FFMA" not in sass.stdout:
        problems.append(f"no sm_{arch} machine code in the dump")
    if f".target sm_{arch}" not in ptx_text:
        problems.append(f"no sm_{arch} PTX")
    bad_sass = sorted(set(forbidden_sass.findall(sass.stdout)))
    bad_ptx = sorted(set(forbidden_ptx.findall(ptx_text)))
    instrs = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s", sass.stdout, re.M))
    # Local memory and the grid barrier's shape, over every function of this arch's machine code.
    t = audit_module()
    funcs = t.sass_functions(sass.stdout).get(arch, {})
    ldl = stl = 0
    barriers, bad_barriers = [], []
    for code in funcs.values():
        l, st = t.local_memory_counts(code)
        ldl, stl = ldl + l, stl + st
        good, bad = t.grid_barriers(code)
        barriers, bad_barriers = barriers + good, bad_barriers + bad
    if bad_barriers:
        problems.append(f"regions with atomics but not the grid barrier's shape: {sorted(set(bad_barriers))}")
    return {"sass_violations": bad_sass, "ptx_violations": bad_ptx, "problems": problems, "sass_instructions": instrs,
            "int_atomics": sorted(set(re.findall(r"\bATOMG?\.E\.(?:ADD|EXCH)\S*", sass.stdout))),
            "ldl": ldl, "stl": stl, "grid_barriers": len(barriers),
            "pass": not (bad_sass or bad_ptx or problems)}


def compile_and_audit(name, cache, src_root, archs, jobs, rules):
    tool, incs, version = toolchain_tools(name, cache)
    system_nvcc = toolchain_tools(SYSTEM, cache)[0]
    flags = cuda_section(src_root)["cuda-flags"]
    listed = supported_archs(tool)
    built = [a for a in archs if a in listed]
    work = cache / "objs" / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sources = sorted((src_root / "det_infer_cuda").glob("*.cu"))
    tasks = [(a, s) for a in built for s in sources]
    ptxas_mode = name in PTX_ISA

    def one(task):
        arch, src = task
        rec = {"toolchain": name, "tool": Path(tool).name, "version": version, "arch": arch, "source": src.name}
        ptx_text = None
        if ptxas_mode:
            # Front end: the system nvcc with the same flags, to PTX; back end: this toolchain's ptxas
            # with the options nvcc itself passes it (`nvcc --dryrun`: -arch, -m64, --fmad false).
            ptx = work / f"{src.stem}.sm_{arch}.ptx"
            r = subprocess.run([str(system_nvcc), "-std=c++20", "-O3", *flags, f"-arch=compute_{arch}", "-ptx",
                                str(src), "-o", str(ptx)], capture_output=True, text=True)
            if r.returncode == 0:
                ptx_text = re.sub(r"^\.version \d+\.\d+$", f".version {PTX_ISA[name]}", ptx.read_text(), count=1,
                                  flags=re.M)
                ptx.write_text(ptx_text)
                obj = work / f"{src.stem}.sm_{arch}.cubin"
                fmad = "false" if "--fmad=false" in flags else "true"
                r = subprocess.run([str(tool), f"-arch=sm_{arch}", "-m64", "-v", "--fmad", fmad, *ptxas_options(flags),
                                    str(ptx), "-o", str(obj)], capture_output=True, text=True)
        else:
            obj = work / f"{src.stem}.sm_{arch}.o"
            r = subprocess.run([str(tool), "-std=c++20", "-O3", *flags, "-gencode",
                                f"arch=compute_{arch},code=[sm_{arch},compute_{arch}]", "-Xptxas", "-v", *incs,
                                "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        rec["compiled"] = r.returncode == 0
        if r.returncode:
            rec["error"] = r.stderr[-3000:]
            rec["pass"] = False
            log(f"{name} sm_{arch} {src.name}: COMPILE FAILED\n{r.stderr[-1500:]}")
            return rec
        rec["entries"], spills = parse_ptxas(r.stderr)
        rec["spill_bytes"] = sum(st + ld for st, ld in spills)
        rec.update(audit_object(obj, arch, rules, ptx_text))
        # The register margin of tests/test_cuda_compile.py, on every toolchain.
        limit = audit_module().MAX_REGISTERS
        rec["over_register_limit"] = [e["function"] for e in rec["entries"] if (e["registers"] or 0) > limit]
        rec["pass"] = (rec["pass"] and rec["spill_bytes"] == 0 and bool(rec["entries"]) and not rec["over_register_limit"]
                       and (src.name != "det_megakernel.cu" or rec["grid_barriers"] > 0))
        log(f"{name} sm_{arch} {src.name}: {'ok' if rec['pass'] else 'FAIL'}")
        return rec

    log(f"== {name}: {Path(tool).name} {version}, archs {', '.join('sm_' + a for a in built)}")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        records = list(pool.map(one, tasks))
    return {"toolchain": name, "tool": Path(tool).name, "version": version, "packages": TOOLCHAINS.get(name, []),
            "front_end": f"system nvcc {toolchain_tools(SYSTEM, cache)[2]} (PTX .version {PTX_ISA[name]})"
            if ptxas_mode else f"nvcc {version}", "archs": built, "unsupported": [a for a in archs if a not in listed],
            "records": records}


def cuda_section(src_root):
    return tomllib.loads((src_root / "build.toml").read_text())["kernel"]["det_infer_cuda"]


def target_archs(src_root):
    return [c.replace(".", "") for c in cuda_section(src_root)["cuda-capabilities"]]


# ---------------------------------------------------------------------------------------------- 4
def cuda_venv(cache):
    venv = cache / CUDA_VENV
    py = venv / "bin" / "python"
    # Every dependency of kernels pinned to requirements.txt; torch's own nvidia-* pins come with it.
    constraints = [l for l in (ROOT / "requirements.txt").read_text().splitlines()
                   if l and not l.startswith("#") and not l.startswith("torch==")]
    kernels_pin = next(l for l in constraints if l.startswith("kernels=="))
    want = "\n".join([CUDA_TORCH, kernels_pin, *CUDA_VENV_EXTRA, *constraints])
    stamp = venv / ".pins"
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    if not py.exists():
        run([shutil.which("python3.11") or sys.executable, "-m", "venv", venv], check=True)
    cfile = cache / "constraints-cu130.txt"
    cfile.write_text("\n".join(constraints) + "\n")
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", cfile, CUDA_TORCH, kernels_pin,
         *CUDA_VENV_EXTRA], check=True)
    stamp.write_text(want)
    return py


def build_variant(python, backend, src_root, out):
    env = dict(os.environ)
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    r = run([python, src_root / "scripts" / "build_local.py", "--backend", backend, "--out", out],
            capture_output=True, text=True, env=env)
    if r.returncode:
        log(r.stdout[-3000:], r.stderr[-3000:])
    return r.returncode == 0, (r.stdout + r.stderr)[-2000:]


# ---------------------------------------------------------------------------------------------- 5
def load_variant(python, out, backend):
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "HOME": os.environ.get("HOME", "/root"),
           "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([str(python), "-c", LOAD_CHILD, str(out), backend], capture_output=True, text=True, env=env)
    if r.returncode:
        return {"loaded": False, "error": r.stderr[-2000:]}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["loaded"] = True
    return res


# ---------------------------------------------------------------------------------------------- 6
def abi_check(so):
    import kernel_abi_check as kac

    obj = kac.ObjectFile(str(so))
    abi3 = [repr(v) for v in obj.check_python_abi(ABI3_VERSION)]
    manylinux = sorted({(v.name, v.dep, v.version) for v in obj.check_manylinux(MANYLINUX)})
    dyn = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn)
    return {"so": so.name, "abi3": abi3, "abi3_pass": not abi3,
            "manylinux": [{"symbol": n, "dep": d, "version": v} for n, d, v in manylinux],
            "manylinux_pass": not manylinux, "needed": needed, "kernel_abi_check": kac.__version__}


# ---------------------------------------------------------------------------------------------- report
def snapshot(cache, worktree):
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    if worktree:
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip())
        return ROOT, commit, dirty
    dest = cache / "src" / commit[:12]
    if not (dest / "build.toml").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest, commit, False


def machine():
    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, no GPU" \
        if not Path("/dev/nvidia0").exists() else f"{cpu}, {os.cpu_count()} cores, GPU present"


def markdown(res):
    lines = [f"Commit {res['commit'][:12]}{' (dirty working tree)' if res['dirty'] else ''}; {res['date']}; "
             f"{res['machine']}.", ""]
    if res["toolchains"]:
        lines += ["| toolchain | front end | machine code | arch | megakernel regs (limit %d) | stack | static smem | "
                  "spill bytes (all functions) | math kernels regs (max) | SASS instrs (megakernel) | LDL/STL (megakernel) | "
                  "grid barriers | SASS/PTX audit |" % audit_module().MAX_REGISTERS,
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for tc in res["toolchains"]:
            for arch in tc["archs"]:
                recs = [r for r in tc["records"] if r["arch"] == arch]
                mk = next((r for r in recs if r["source"] == "det_megakernel.cu"), None)
                mth = next((r for r in recs if r["source"] == "det_math_cuda.cu"), None)
                audit_ok = all(r.get("compiled") and not (r.get("sass_violations") or r.get("ptx_violations")
                                                          or r.get("problems")) for r in recs)
                mke = (mk or {}).get("entries") or [{}]
                lines.append(
                    f"| {tc['toolchain']} | {tc['front_end']} | {tc['tool']} {tc['version']} | sm_{arch} | {mke[0].get('registers', '-')} | "
                    f"{mke[0].get('stack', '-')} B | {max((e.get('smem', 0) for r in recs for e in r.get('entries', [])), default=0)} B | "
                    f"{sum(r.get('spill_bytes', 0) for r in recs)} | "
                    f"{max((e['registers'] for e in (mth or {}).get('entries', [])), default='-')} | "
                    f"{(mk or {}).get('sass_instructions', '-')} | {(mk or {}).get('ldl', '-')}/{(mk or {}).get('stl', '-')} | "
                    f"{(mk or {}).get('grid_barriers', '-')} | {'pass' if audit_ok else 'FAIL'} |")
            if tc["unsupported"]:
                lines.append(f"| {tc['toolchain']} | | | {', '.join('sm_' + a for a in tc['unsupported'])} "
                             f"| not offered by this toolchain | | | | | | | | |")
        lines.append("")
    if res["variants"]:
        lines += ["| variant | built | metadata backend | loads (get_local_kernel, no GPU) | exp(1) | CUDA initialized | "
                  "libcuda mapped | abi3 (3.9) | manylinux_2_28 | DT_NEEDED |", "|---|---|---|---|---|---|---|---|---|---|"]
        for v in res["variants"]:
            ld, abi = v.get("load", {}), v.get("abi", [{}])[0] if v.get("abi") else {}
            ml = "pass" if abi.get("manylinux_pass") else ", ".join(
                f"{m['symbol']}@{m['dep']}_{m['version']}" for m in abi.get("manylinux", [])) or "-"
            lines.append(
                f"| {v['name']} | {'yes' if v['built'] else 'NO'} | `{json.dumps(v.get('backend'))}` | "
                f"{'yes, ' + ld.get('torch', '') if ld.get('loaded') else 'NO'} | {ld.get('exp1', '-')} | "
                f"{ld.get('cuda_initialized', '-')} | {ld.get('libcuda_mapped', '-')} | "
                f"{'pass' if abi.get('abi3_pass') else 'FAIL'} | {ml} | {', '.join(abi.get('needed', []))} |")
        lines.append("")
    spilled = [f"{tc['toolchain']} sm_{r['arch']} {r['source']}" for tc in res["toolchains"] for r in tc["records"]
               if r.get("spill_bytes")]
    if spilled:
        lines.append(f"Spills (the project requires none): {', '.join(spilled)}.")
    over = [f"{tc['toolchain']} sm_{r['arch']} {r['source']}" for tc in res["toolchains"] for r in tc["records"]
            if r.get("over_register_limit")]
    if over:
        lines.append(f"Registers above {audit_module().MAX_REGISTERS}: {', '.join(over)}.")
    lines.append(f"Overall: {'PASS' if res['pass'] else 'FAIL'}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=os.environ.get("MATRIX_CACHE", str(Path.home() / ".cache" / "det-infer-matrix")),
                    help="toolchains, the CUDA venv, objects, results (default $MATRIX_CACHE or ~/.cache/det-infer-matrix)")
    ap.add_argument("--out", help="build directory for the variants (default <cache>/build)")
    ap.add_argument("--toolchains", default=",".join([*TOOLCHAINS, SYSTEM]))
    ap.add_argument("--variants", default="cpu,cuda", help="cpu,cuda or none")
    ap.add_argument("--quick", action="store_true",
                    help="what CI covers: the system nvcc for every arch and the CPU variant")
    ap.add_argument("--worktree", action="store_true", help="build the working tree instead of a HEAD snapshot")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="print the tables of earlier runs' results (merged in order), building nothing")
    args = ap.parse_args()
    if args.report:
        runs = [json.loads(Path(p).read_text()) for p in args.report]
        merged = {**runs[0], "toolchains": [t for r in runs for t in r["toolchains"]],
                  "variants": [v for r in runs for v in r["variants"]], "pass": all(r["pass"] for r in runs)}
        print(markdown(merged))
        return 0 if merged["pass"] else 1
    if args.quick:
        args.toolchains, args.variants = SYSTEM, "cpu"

    cache = Path(args.cache).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).resolve() if args.out else cache / "build"
    src_root, commit, dirty = snapshot(cache, args.worktree)
    res = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(),
           "commit": commit, "dirty": dirty, "command": " ".join(sys.argv), "toolchains": [], "variants": []}

    rules = audit_rules()
    archs = target_archs(src_root)
    for name in [t for t in args.toolchains.split(",") if t]:
        if name != SYSTEM and name not in TOOLCHAINS:
            raise SystemExit(f"unknown toolchain {name!r} (known: {', '.join([*TOOLCHAINS, SYSTEM])})")
        res["toolchains"].append(compile_and_audit(name, cache, src_root, archs, args.jobs, rules))

    backends = [b for b in args.variants.split(",") if b and b != "none"]
    if backends:
        out.mkdir(parents=True, exist_ok=True)
    for backend in backends:
        python = Path(sys.executable) if backend == "cpu" else cuda_venv(cache)
        before = {p.name for p in out.iterdir()}
        ok, tail = build_variant(python, backend, src_root, out)
        name = subprocess.run([str(python), "-c", VARIANT_CHILD, str(src_root / "scripts"), backend], capture_output=True,
                              text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}).stdout.strip()
        vdir = out / name
        v = {"name": name, "backend_requested": backend, "built": ok and (vdir / "metadata.json").exists(),
             "python": str(python), "log_tail": tail, "new_dirs": sorted({p.name for p in out.iterdir()} - before)}
        if v["built"]:
            meta = json.loads((vdir / "metadata.json").read_text())
            v["metadata"], v["backend"] = meta, meta["backend"]
            v["load"] = load_variant(python, out, backend)
            v["abi"] = [abi_check(so) for so in sorted(vdir.glob("*.so"))]
        res["variants"].append(v)

    ok_tc = all(r["pass"] for tc in res["toolchains"] for r in tc["records"])
    ok_var = all(v["built"] and v["load"].get("loaded") and not v["load"].get("cuda_initialized")
                 and all(a["abi3_pass"] for a in v["abi"]) for v in res["variants"])
    res["pass"] = ok_tc and ok_var
    results = cache / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (results / f"matrix-{stamp}.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    (results / f"matrix-{stamp}.md").write_text(md + "\n")
    print(md)
    log(f"results: {results / f'matrix-{stamp}.json'}")
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
