#!/usr/bin/env python3
"""The Python half of scripts/device_check.sh: one subcommand per piece of a stage, each printing
what it finds and leaving a JSON record in the state folder ($DET_CHECK_STATE) for the report.

    install-wheels   install, from .whl/, the wheels `kernels` needs that this Python lacks
    check-wheels     (here, by fetch_device_wheels.sh) .whl/ holds kernels' whole closure, pinned
    preflight        versions, GPU, toolchain, disk; fails fast naming what is missing
    binary           the variants built; registers / stack / local memory of the CUDA one (cuobjdump)
    smoke            a tiny model at grid 2, then at the default geometry, against the CPU engine
    geometry         the launcher's default geometry, found by probing what the device accepts
    digests          every synthetic model's pinned certificate digests on the executor
    report           the report (markdown and JSON) and the summary row, from the state folder

The device's executor is the CUDA megakernel; with --dry-run (DET_CHECK_DRY=1) it is the same
device code under host emulation on the CPU (executor="emulated"), with smaller inputs.
Only the stdlib is imported at module level: install-wheels and report run before, or without, torch.
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
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "phanerozoic/det-infer"
STAGES = ("preflight", "build", "smoke", "geometry", "digests", "bench", "profile", "peers", "accuracy", "ncu")
# The report files in $OUT, markdown (each name in two pieces: tests/test_doc_paths.py takes a bare
# markdown file name for a document of the repository).
REPORT_FILE, SUMMARY_FILE = "report" ".md", "summary" ".md"
DEVICE_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
                 "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
                 "platform_machine": "x86_64", "os_name": "posix"}
REQUIRED_MODULES = ("torch", "numpy", "mpmath", "pytest", "safetensors", "packaging", "kernels")
SMOKE_IDS = [5, 17, 301, 42, 7, 999, 3, 64]


def state_dir():
    return Path(os.environ.get("DET_CHECK_STATE") or tempfile.mkdtemp(prefix="device_check_"))


def dry_run():
    return os.environ.get("DET_CHECK_DRY") == "1"


def save(name, record):
    (state_dir() / f"{name}.json").write_text(json.dumps(record, indent=1, default=str) + "\n")


def load(name, default=None):
    p = state_dir() / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return default


def say(*a):
    print(*a, flush=True)


# ---- wheels: the dependency closure of kernels, against what this Python already has ------------
def _packaging():
    try:
        from packaging import markers, requirements, utils, version
    except ImportError:  # pip's own copy, where packaging is not installed
        from pip._vendor.packaging import markers, requirements, utils, version  # noqa: F401
    return requirements.Requirement, utils.canonicalize_name, version.Version


def read_wheels(folder):
    """{canonical name: {"file", "version", "requires"}} of the wheels in folder."""
    _, canon, _ = _packaging()
    wheels = {}
    for whl in sorted(Path(folder).glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            text = z.read(meta).decode("utf-8", "replace").split("\n\n", 1)[0]
        fields = [(k, v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()) if v]
        name = canon(next(v for k, v in fields if k == "Name"))
        if name in wheels:
            raise SystemExit(f"two wheels of {name} in {folder}: {wheels[name]['file']} and {whl.name}; keep one")
        wheels[name] = {"file": whl.name, "version": next(v for k, v in fields if k == "Version"),
                        "requires": [v for k, v in fields if k == "Requires-Dist"]}
    return wheels


def installed_versions():
    import importlib.metadata as md

    _, canon, _ = _packaging()
    out = {}
    for dist in md.distributions():
        name = dist.metadata.get("Name")
        if name and canon(name) not in out:  # the first on sys.path wins, as for an import
            out[canon(name)] = {"version": dist.version, "requires": list(dist.requires or [])}
    return out


def resolve(root, wheels, installed, environment=None, prefer_wheels=False):
    """Which wheels to install so that the requirement `root` and everything it needs hold, using an
    installed distribution wherever its version satisfies every requirement on it. Returns
    (to install: [names], kept: {name: (version, specifiers)}); raises ValueError naming what no
    wheel and no installed version satisfies."""
    Requirement, canon, Version = _packaging()
    env = dict(environment or {})
    forced = set(wheels) if prefer_wheels else set()
    while True:
        chosen, specs, queue, seen = {}, {}, [(Requirement(root), "root")], set()
        while queue:
            req, by = queue.pop(0)
            name = canon(req.name)
            extras = frozenset(req.extras)
            if (name, extras, str(req.specifier)) in seen:
                continue
            seen.add((name, extras, str(req.specifier)))
            specs.setdefault(name, []).append((req.specifier, by))
            use_wheel = name in forced or name not in installed
            source = wheels.get(name) if use_wheel else installed[name]
            if source is None:
                raise ValueError(f"{name} ({req.specifier or 'any version'}, needed by {by}) is neither installed "
                                 f"nor among the wheels")
            chosen[name] = ("wheel" if use_wheel else "installed", source["version"])
            # A wheel's requirements are followed; an installed distribution's only for extras asked of it.
            for line in source["requires"] if use_wheel or extras else []:
                r = Requirement(line)
                wants_extra = r.marker is not None and "extra" in str(r.marker)
                if r.marker and not any(r.marker.evaluate(dict(env, extra=e)) for e in (sorted(extras) or [""])):
                    continue
                if use_wheel or wants_extra:
                    queue.append((r, f"{name} {source['version']}"))
        conflict = None
        for name, reqs in specs.items():
            kind, ver = chosen[name]
            bad = [(s, by) for s, by in reqs if not s.contains(Version(ver), prereleases=True)]
            if bad:
                if kind == "installed" and name in wheels:
                    conflict = name
                    break
                what = "the wheel" if kind == "wheel" else "the installed version"
                raise ValueError(f"{name}: {what} is {ver}, but " +
                                 "; ".join(f"{by} needs {s}" for s, by in bad))
        if conflict is None:
            to_install = sorted(n for n, (kind, _) in chosen.items() if kind == "wheel")
            kept = {n: (v, ", ".join(sorted({str(s) for s, _ in specs[n] if str(s)}))) for n, (k, v) in chosen.items()
                    if k == "installed"}
            return to_install, kept
        forced.add(conflict)


def root_requirement(wheels):
    if "kernels" not in wheels:
        raise SystemExit("no kernels wheel among the wheels (run scripts/fetch_device_wheels.sh here)")
    return f"kernels=={wheels['kernels']['version']}"


def cmd_install_wheels(args):
    wheels = read_wheels(args.wheels)
    try:
        names, kept = resolve(root_requirement(wheels), wheels, installed_versions(), prefer_wheels=args.all)
    except ValueError as e:
        say(f"install-wheels: FAILED: {e}")
        return 1
    for n, (v, spec) in sorted(kept.items()):
        say(f"  using this Python's {n} {v}" + (f" (needed: {spec})" if spec else ""))
    if not names:
        say("install-wheels: nothing to install; this Python has kernels' whole closure")
    else:
        say(f"install-wheels: {len(names)} wheels into {args.target}: " +
            ", ".join(f"{n} {wheels[n]['version']}" for n in names))
        files = [str(Path(args.wheels) / wheels[n]["file"]) for n in names]
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", args.target,
                            *files])
        if r.returncode:
            say("install-wheels: FAILED: pip install returned", r.returncode)
            return 1
    save("wheels", {"installed": {n: wheels[n]["version"] for n in names}, "kept": kept})
    return 0


def cmd_check_wheels(args):
    """Here, after the download: the wheels alone (nothing installed) satisfy kernels on the device's
    Python 3.12, one version each, every one pinned in requirements.txt."""
    wheels = read_wheels(args.wheels)
    _, canon, _ = _packaging()
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m:
            pins[canon(m.group(1))] = m.group(2)
    unpinned = [f"{n} {w['version']}" for n, w in wheels.items() if pins.get(n) != w["version"]]
    try:
        names, _ = resolve(root_requirement(wheels), wheels, {}, environment=DEVICE_PYTHON)
    except ValueError as e:
        say(f"check-wheels: FAILED: the wheels are not kernels' closure: {e}")
        return 1
    extra = sorted(set(wheels) - set(names))
    say(f"check-wheels: {len(wheels)} wheels, kernels' closure on Python 3.12 complete" +
        (f"; not needed: {', '.join(extra)}" if extra else ""))
    if unpinned:
        say("check-wheels: FAILED: not pinned in requirements.txt: " + ", ".join(unpinned))
        return 1
    return 0


# ---- preflight ------------------------------------------------------------------------------------
def _run(cmd, timeout=20):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def nvidia_smi(fields):
    out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    return [v.strip() for v in out.splitlines()[0].split(",")] if out else None


def find_tool(name):
    for cand in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name, shutil.which(name),
                 *sorted(ROOT.glob(f".tools/*/nvidia/*/bin/{name}"))):
        if cand and Path(cand).is_file():
            return str(cand)
    return None


def report_commit():
    """The commit the report names. DET_CHECK_COMMIT wins: the device's copy may have no .git of its
    own and sit inside another repository, whose commit git would give."""
    if os.environ.get("DET_CHECK_COMMIT"):
        return os.environ["DET_CHECK_COMMIT"] + " (DET_CHECK_COMMIT)"
    top = _run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"])
    if not top or Path(top).resolve() != ROOT.resolve():
        return "unknown (no .git of this checkout here; set DET_CHECK_COMMIT; the build id names the sources)"
    commit = _run(["git", "-C", str(ROOT), "rev-parse", "--short=10", "HEAD"])
    dirty = commit and _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    return (commit + (" + uncommitted changes" if dirty else "")) if commit else "unknown (git failed)"


def cmd_preflight(args):
    import importlib.metadata as md

    t0 = time.time()
    fails, warns, rec = [], [], {"dry_run": dry_run(), "date": datetime.datetime.now(datetime.timezone.utc)
                                 .strftime("%Y-%m-%d %H:%M UTC")}

    def fact(key, value):
        rec[key] = value
        say(f"  {key:18} {value}")

    fact("python", f"{sys.version.split()[0]} ({sys.executable})")
    fact("host", f"{platform.machine()}, {os.cpu_count()} CPUs, {_meminfo_gib():.0f} GiB memory")
    for mod in REQUIRED_MODULES:
        try:
            dist = {"pytest": "pytest", "packaging": "packaging"}.get(mod, mod)
            fact(mod, md.version(dist))
        except md.PackageNotFoundError:
            fact(mod, "MISSING")
            fails.append(f"the Python package {mod} is missing" +
                         (" (bring it: bash scripts/fetch_device_wheels.sh here, carry .whl)" if mod == "kernels"
                          else ""))
    for dist in ("huggingface_hub", "transformers"):
        try:
            fact(dist, md.version(dist))
        except md.PackageNotFoundError:
            fact(dist, "MISSING")
            (fails if dist == "huggingface_hub" else warns).append(f"{dist} is missing")
    if "kernels" in rec and rec["kernels"] != "MISSING":
        fails += _check_requires("kernels")
        try:
            import kernels  # noqa: F401  (a real import: a missing or broken dependency shows here, in seconds)
        except Exception as e:  # noqa: BLE001
            fails.append(f"import kernels failed: {type(e).__name__}: {e}")
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        fails.append(f"import torch failed: {e}")
        torch = None
    if torch is not None:
        fact("torch_cuda", torch.version.cuda or "none (CPU build)")
        fact("torch_threads", torch.get_num_threads())
        rec["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    nvcc = find_tool("nvcc")
    nvcc_ver = None
    if nvcc:
        sys.path.insert(0, str(ROOT / "scripts"))
        import build_local

        nvcc_ver = build_local.nvcc_cuda_version(nvcc)
        full = re.search(r"V[\d.]+", _run([nvcc, "--version"]))
        fact("nvcc", f"{nvcc_ver[0]}.{nvcc_ver[1]} ({full.group(0) if full else '?'}, {nvcc})" if nvcc_ver else nvcc)
    else:
        fact("nvcc", "MISSING")
    cuobjdump = find_tool("cuobjdump")
    fact("cuobjdump", cuobjdump or "MISSING")
    fact("c++", (_run(["c++", "--version"]).splitlines() or ["MISSING"])[0])
    py_h = Path(__import__("sysconfig").get_paths()["include"]) / "Python.h"
    fact("Python.h", py_h if py_h.exists() else "MISSING")
    if not py_h.exists():
        fails.append(f"{py_h} is missing: the kernel cannot be built against this Python")
    if not shutil.which("c++"):
        fails.append("no C++ compiler (c++) on PATH")
    fact("commit", report_commit())

    if dry_run():
        fact("gpu", "none: dry run, the megakernel's device code under host emulation (executor='emulated')")
        rec["card"] = f"dry run: emulated on {platform.machine()} ({os.cpu_count()} CPUs)"
        rec["archs"] = _print_archs()
    elif torch is not None:
        if torch.version.cuda is None:
            fails.append("torch has no CUDA (torch.version.cuda is None): the device check needs a CUDA torch")
        elif not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            fails.append("torch sees no GPU (torch.cuda.is_available() is False)")
        else:
            p = torch.cuda.get_device_properties(0)
            cap = f"{p.major}.{p.minor}"
            rec.update(card=p.name, capability=cap, sms=p.multi_processor_count,
                       gpu_memory_gib=round(p.total_memory / 2**30, 1))
            fact("gpu", f"{p.name}, compute capability {cap}, {p.multi_processor_count} SMs, "
                        f"{p.total_memory / 2**30:.0f} GiB")
            smi = nvidia_smi("driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw")
            if smi:
                rec.update(driver=smi[0], sm_clock_idle_mhz=smi[1], sm_clock_max_mhz=smi[2], mem_clock_mhz=smi[3])
                fact("driver", smi[0])
                fact("clocks", f"SM {smi[1]} MHz now, {smi[2]} MHz max; memory {smi[3]} MHz; {smi[4]} C; {smi[5]} W")
            else:
                warns.append("nvidia-smi gave nothing: no driver version or clocks")
            rec["archs"] = os.environ.get("DET_CUDA_ARCHS") or cap
            fact("build archs", rec["archs"] + ("" if os.environ.get("DET_CUDA_ARCHS") else " (this GPU's)"))
        if torch.version.cuda and nvcc:
            mismatch = build_local.check_cuda_majors(torch.version.cuda, nvcc_ver)
            fact("CUDA majors", mismatch or f"nvcc {nvcc_ver[0]} = torch {torch.version.cuda.split('.')[0]}")
            if mismatch:
                fails.append(mismatch)
        if not nvcc:
            fails.append("nvcc is missing ($CUDA_HOME/bin/nvcc or on PATH)")
        if not cuobjdump:
            warns.append("cuobjdump is missing: no registers / stack in the report")
    for label, path in (("free disk (repo)", ROOT), ("free disk (/tmp)", Path(tempfile.gettempdir()))):
        free = shutil.disk_usage(path).free / 2**30
        fact(label, f"{free:.1f} GiB")
        rec.setdefault("free_gib", {})[str(path)] = round(free, 1)
        if free < float(os.environ.get("DET_CHECK_MIN_FREE_GIB", "4")):
            fails.append(f"only {free:.1f} GiB free at {path} (need {os.environ.get('DET_CHECK_MIN_FREE_GIB', '4')})")
    if os.environ.get("DET_CUDA_ARCHS"):
        sys.path.insert(0, str(ROOT / "scripts"))
        import build_local

        try:
            build_local.cuda_archs([])
        except SystemExit as e:
            fails.append(str(e))
    rec["wheels"] = load("wheels", {})
    rec["warnings"], rec["failures"] = warns, fails
    save("preflight", rec)
    if rec.get("archs"):
        (state_dir() / "archs").write_text(rec["archs"] + "\n")
    for w in warns:
        say(f"preflight: warning: {w}")
    if fails:
        for f in fails:
            say(f"preflight: FAILED: {f}")
        return 1
    say(f"preflight: ok in {time.time() - t0:.1f} s")
    return 0


def _meminfo_gib():
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        return kb / 2**20
    except (OSError, AttributeError):
        return 0.0


def _print_archs():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_local.py"), "--print-archs"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "?"


def _check_requires(dist_name):
    """Each requirement of an installed distribution, checked against what is installed."""
    import importlib.metadata as md

    Requirement, _, Version = _packaging()
    bad = []
    for line in md.requires(dist_name) or []:
        r = Requirement(line)
        if r.marker and not r.marker.evaluate({"extra": ""}):
            continue
        try:
            v = md.version(r.name)
        except md.PackageNotFoundError:
            bad.append(f"{dist_name} needs {r}, which is not installed")
            continue
        if not r.specifier.contains(Version(v), prereleases=True):
            bad.append(f"{dist_name} needs {r}, but {r.name} {v} is installed")
    return bad


# ---- registers and stack of the built binary ------------------------------------------------------
RES_LINE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def parse_res_usage(text):
    """{arch: {function: {"reg", "stack", "shared", "local"}}} from `cuobjdump -res-usage` output."""
    out, arch, func = {}, None, None
    for line in text.splitlines():
        m = re.search(r"arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function ([^:\s]+):", line)
        if m:
            func = m.group(1)
            continue
        m = RES_LINE.search(line)
        if m and arch and func:
            out.setdefault(arch, {})[func] = dict(zip(("reg", "stack", "shared", "local"), map(int, m.groups())))
            func = None
    return out


def cmd_binary(args):
    """The variants just built (id, archs, size), and the registers / stack of the CUDA one's kernels."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    import build_local

    build = {"variants": {}}
    for backend in ("cpu",) + (("cuda",) if torch.version.cuda else ()):
        d = ROOT / "build" / build_local.variant_name(torch, backend)
        try:
            meta = json.loads((d / "metadata.json").read_text())
        except (OSError, ValueError):
            say(f"binary: no {backend} variant at {d.relative_to(ROOT)}")
            return 1
        so = d / f"{meta['id']}.abi3.so"
        build["variants"][backend] = {"dir": d.name, "id": meta["id"], "archs": meta["backend"].get("archs"),
                                      "so_mib": round(so.stat().st_size / 2**20, 1) if so.exists() else None}
        say(f"binary: {d.name}/{so.name}" + (f", archs {','.join(meta['backend']['archs'])}"
                                             if meta["backend"].get("archs") else ""))
    main_variant = build["variants"].get("cuda") or build["variants"]["cpu"]
    build["id"] = main_variant["id"].rsplit("_", 1)[-1]
    build["archs"] = ",".join(main_variant.get("archs") or []) or "none (CPU variant)"
    save("build", build)
    if "cuda" not in build["variants"]:
        save("resusage", {"note": "no CUDA variant" + (" (dry run)" if dry_run() else "")})
        say("binary: no CUDA variant" + (" (dry run: the CPU variant only, no registers to read)" if dry_run() else ""))
        return 0 if dry_run() else 1
    so = ROOT / "build" / main_variant["dir"] / f"{main_variant['id']}.abi3.so"
    tool = find_tool("cuobjdump")
    if not tool:
        save("resusage", {"note": "cuobjdump missing"})
        say("binary: cuobjdump is missing: no registers or stack")
        return 1
    env = dict(os.environ, PATH=f"{Path(tool).parent}:{os.environ.get('PATH', '')}")  # it runs nvdisasm
    text = subprocess.run([tool, "-res-usage", str(so)], capture_output=True, text=True, env=env).stdout
    if args.raw:
        Path(args.raw).write_text(f"$ cuobjdump -res-usage {so.relative_to(ROOT)}\n{text}")
    usage = parse_res_usage(text)
    mk = {arch: fns[f] for arch, fns in usage.items() for f in fns if "det_mk_kernel" in f}
    others = {arch: max((u["reg"] for f, u in fns.items() if "det_mk_kernel" not in f), default=0)
              for arch, fns in usage.items()}
    save("resusage", {"so": so.name, "megakernel": mk, "other_kernels_max_reg": others})
    for arch, u in sorted(mk.items()):
        say(f"binary: {arch} det_mk_kernel: {u['reg']} registers, {u['stack']} B stack, {u['shared']} B static "
            f"shared, {u['local']} B local; the contract kernels at most {others.get(arch)} registers")
    if not mk:
        say("binary: no det_mk_kernel in cuobjdump -res-usage's output")
        return 1
    return 0


# ---- the kernel on the executor under test ---------------------------------------------------------
def executor():
    """(device, executor) under test: the CUDA megakernel, or in the dry run the emulated one."""
    return ("cpu", "emulated") if dry_run() else ("cuda", "megakernel")


def load_kernel():
    t = time.time()
    import torch

    os.environ.setdefault("LOCAL_KERNELS", f"{REPO_ID}={ROOT / 'build'}")
    from kernels import get_kernel

    di = get_kernel(REPO_ID, version=1)
    if torch.cuda.is_available():
        torch.cuda.init()
    say(f"kernel loaded in {time.time() - t:.1f} s: {Path(di.__file__).parent.name}")
    return di, torch


def synthetic_model(name, root):
    from det_fixtures import synthetic
    return synthetic.write_checkpoint(name, str(Path(root) / name))


def bits_equal(torch, a, b):
    return torch.equal(a.detach().cpu().contiguous().view(torch.int32), b.detach().cpu().contiguous().view(torch.int32))


def cmd_smoke(args):
    """A few tokens of a tiny model through the executor at grid 2, then at the default geometry;
    the logits must be the CPU engine's bits. Exit 3 when the launches ran but the bits differ."""
    di, torch = load_kernel()
    device, exe = executor()
    rec = {"executor": exe, "launches": []}
    with tempfile.TemporaryDirectory() as tmp:
        d = synthetic_model("llama", tmp)
        want = di.MegaModel.from_pretrained(d, max_context=64).teacher_forced_logits(SMOKE_IDS)
        differ = False
        for label, geo in (("grid 2", {"grid": 2}), ("default geometry", None)):
            mm = di.MegaModel.from_pretrained(d, device=device, executor=exe, max_context=64, geometry=geo)
            t = time.perf_counter()
            got = mm.teacher_forced_logits(SMOKE_IDS)
            if device == "cuda":
                torch.cuda.synchronize()
            ms = 1e3 * (time.perf_counter() - t)
            same = bits_equal(torch, got, want)
            differ |= not same
            rec["launches"].append({"label": label, "geometry": dict(mm.geometry), "ms": round(ms, 2), "equal": same})
            say(f"smoke: {label} {mm.geometry}: {len(SMOKE_IDS)} tokens in {ms:.1f} ms, logits "
                f"{'equal to' if same else 'DIFFERENT from'} the CPU engine's")
    rec["ok"] = not differ
    save("smoke", rec)
    return 3 if differ else 0


# The launcher's refusals of a geometry (det_infer_cuda/det_megakernel.cu, det_mk_check_geometry).
REFUSED = re.compile(r"grid exceeds|shared memory|at most \d+ warps|must be in|out of range|no block of this geometry")


def largest_accepted(ok, lo, hi):
    """The largest n in [lo, hi] with ok(n), ok being monotone (true up to a point); None if not ok(lo)."""
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def cmd_geometry(args):
    """The geometry the launcher picks when left to itself (every field 0), found by probing what it
    accepts (det_mk_plan_geometry's rules): ring 4 with the largest tile_rows whose shared memory
    fits, else ring 2; the largest warps (8, its launch bound); the largest grid, which is 'every
    block resident'. In the dry run the emulated executor accepts any grid, so the probe is bounded."""
    di, torch = load_kernel()
    device, exe = executor()
    bound = {"grid": 4, "warps": 4, "tile_rows": 16} if dry_run() else {"grid": 65535, "warps": 32, "tile_rows": 16}
    probes = []
    with tempfile.TemporaryDirectory() as tmp:
        d = synthetic_model("llama", tmp)

        def accepted(geo):
            g = dict(di.model.DEFAULT_GEOMETRY[exe], **geo) if exe == "emulated" else geo
            try:
                di.MegaModel.from_pretrained(d, device=device, executor=exe, max_context=16,
                                             geometry=g).teacher_forced_logits([5, 6])
                ok = True
            except ValueError as e:
                if not REFUSED.search(str(e)):
                    raise
                ok = False
            probes.append((geo, ok))
            return ok

        t = time.time()
        # The planner's order: ring 4 with the most rows (16, 8, ... 1) whose shared memory fits,
        # else ring 2; then 8 warps at most; then every block that can be resident.
        ring, tile = None, None
        for ring in (4, 2):
            tile = next((r for r in (16, 8, 4, 2, 1)  # area_rows r: every row of the tile in shared memory
                         if r <= bound["tile_rows"]
                         and accepted({"grid": 1, "ring": ring, "tile_rows": r, "area_rows": r})), None)
            if tile:
                break
        fixed = {"ring": ring, "tile_rows": tile, "area_rows": tile}
        warps = grid = None
        if tile:
            warps = largest_accepted(lambda w: accepted(dict(fixed, grid=1, warps=w)), 1, bound["warps"])
        if warps:
            grid = largest_accepted(lambda g: accepted(dict(fixed, grid=g, warps=warps)), 1, bound["grid"])
        seconds = time.time() - t
    rec = {"executor": exe, "grid": grid, "warps": warps, "tile_rows": tile, "ring": ring if tile else None,
           "probes": len(probes), "probe_seconds": round(seconds, 1), "bounded": dry_run()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        sms = props.multi_processor_count
        rec.update(sms=sms, blocks_per_sm=round(grid / sms, 2) if grid else None)
        regs = next(iter((load("resusage") or {}).get("megakernel", {}).values()), {}).get("reg")
        if regs and warps:
            per_warp = -(-regs * 32 // 256) * 256  # registers are allocated per warp in units of 256
            rec["blocks_per_sm_by_registers"] = getattr(props, "regs_per_multiprocessor", 65536) // (per_warp * warps)
    save("geometry", rec)
    say(f"geometry: the launcher's default for the synthetic llama model: grid {grid}"
        f"{' (the probe bound; the emulator has no residency limit)' if dry_run() else ''}, warps {warps}, "
        f"ring {rec['ring']}, tile_rows {tile}" +
        (f"; {rec['sms']} SMs, {rec['blocks_per_sm']} blocks per SM (registers allow "
         f"{rec.get('blocks_per_sm_by_registers', '?')})" if device == "cuda" else "") +
        f"; {len(probes)} probes in {seconds:.1f} s")
    return 0 if grid and warps and tile else 1


def cmd_digests(args):
    """Each synthetic model's teacher-forced and greedy-generation digests on the executor, against
    the pins (the dry run: the llama model only)."""
    di, torch = load_kernel()
    from det_fixtures.certification import N_GEN, SYNTHETIC, generation_digest, inputs_for, logits_digest
    from det_fixtures.pins import MODEL_DIGESTS

    device, exe = executor()
    names = args.models.split(",") if args.models else (["llama"] if dry_run() else SYNTHETIC)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t = time.time()
            d = synthetic_model(name, tmp)
            mm = di.MegaModel.from_pretrained(d, device=device, executor=exe, max_context=512)
            teacher, prompt = inputs_for(name, d, mm.config.vocab_size)
            tf = logits_digest(mm.teacher_forced_logits(teacher)) == MODEL_DIGESTS[name]["teacher_forced"]
            tokens, logits = mm.generate(prompt, max_new=N_GEN, return_logits=True)
            gen = generation_digest(tokens, logits) == MODEL_DIGESTS[name]["generation"]
            ok &= tf and gen
            rows.append({"model": name, "teacher_forced": tf, "generation": gen, "seconds": round(time.time() - t, 2)})
            say(f"digests: {name:8} teacher-forced {'pin' if tf else 'MISMATCH'}, generation "
                f"{'pin' if gen else 'MISMATCH'} ({time.time() - t:.1f} s)")
    save("digests", {"executor": exe, "models": rows})
    return 0 if ok else 1


# ---- the report -----------------------------------------------------------------------------------
def read_stages():
    rows = []
    p = state_dir() / "stages.tsv"
    if p.exists():
        for line in p.read_text().splitlines():
            name, status, rc, seconds, budget, note = (line.split("\t") + [""] * 6)[:6]
            rows.append({"stage": name, "status": status, "rc": rc, "seconds": float(seconds or 0),
                         "budget": budget, "note": note})
    return rows


def md_tables(text):
    """The rows (lists of cells) of each markdown table in text, header first."""
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|") and line.rstrip().endswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                cur.append(cells)
        elif cur:
            tables.append(cur)
            cur = []
    if cur:
        tables.append(cur)
    return tables


def bench_summary(text):
    """'model b1/b16' per row of bench_gpu.py's table."""
    out = []
    for table in md_tables(text):
        head = table[0]
        cols = [i for i, h in enumerate(head) if re.fullmatch(r"b\d+ tok/s", h)]
        if not cols or head[0] != "model":
            continue
        label = "/".join(head[i].split()[0] for i in cols)
        for row in table[1:]:
            if len(row) == len(head):
                out.append(f"{row[0]} " + "/".join(row[i] for i in cols) + ("" if label == "b1/b16" else f" ({label})"))
    return "; ".join(out)


def accuracy_summary(text):
    worst = None
    for table in md_tables(text):
        head = table[0]
        if "max error (ulp)" in head:
            i = head.index("max error (ulp)")
            for row in table[1:]:
                try:
                    worst = max(worst or 0.0, float(row[i]))
                except (ValueError, IndexError):
                    pass
    return worst


def pytest_summary(xml_path):
    try:
        text = Path(xml_path).read_text()
    except OSError:
        return None
    m = re.search(r'<testsuite [^>]*', text)
    if not m:
        return None
    attrs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(0)))
    n = {k: int(attrs.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    n["passed"] = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    return n


def _num(cell):
    try:
        return float(str(cell).replace(",", "").rstrip("x"))
    except ValueError:
        return None


def md_dicts(text):
    """Every markdown table row of text as a dict keyed by its table's header."""
    return [dict(zip(tab[0], row)) for tab in md_tables(text) for row in tab[1:]]


def peer_ratios(bench_text, profile_text, peers_text):
    """det-infer / peer, measured side by side in this run: decode tok/s at each batch (bench
    against the peer's CUDA graph) and prefill tok/s (profile against the peer's eager prefill),
    for every model both measured. [] when they share none (the dry run's models differ)."""
    out = []
    peers = md_dicts(peers_text)
    bench = {r.get("model"): r for r in md_dicts(bench_text)}
    for p in peers:
        b, batch = bench.get(p.get("model")), p.get("batch")
        ours = _num(b.get(f"b{batch} tok/s")) if b else None
        theirs = _num(p.get("graph tok/s"))
        if ours and theirs:
            out.append({"model": p["model"], "what": f"decode tok/s, batch {batch}", "det-infer": ours,
                        "peer": theirs, "ratio": round(ours / theirs, 3)})
    prefill = {}  # model -> {prompt length: tok/s}
    model = None
    for line in profile_text.splitlines():
        if line.startswith("### "):
            model = line[4:].strip()
        m = re.match(r"\| prefill, (\d+)-token prompt, tok/s \| ([\d,.]+) \|", line)
        if m and model:
            prefill.setdefault(model, {})[int(m.group(1))] = _num(m.group(2))
    for p in peers:
        if p.get("batch") != "1":
            continue
        for n, ours in prefill.get(p.get("model"), {}).items():
            theirs = _num(p.get(f"prefill {n} tok/s"))
            if ours and theirs:
                out.append({"model": p["model"], "what": f"prefill tok/s, {n}-token prompt", "det-infer": ours,
                            "peer": theirs, "ratio": round(ours / theirs, 3)})
    return out


def ratio_table(rows):
    if not rows:
        return "det-infer / peer: no model measured by both (the dry run's models differ)"
    return "\n".join(["| model | what | det-infer | peer | det-infer / peer |", "|---|---|---|---|---|"] +
                     [f"| {r['model']} | {r['what']} | {r['det-infer']:,.0f} | {r['peer']:,.0f} | {r['ratio']:.2f}x |"
                      for r in rows])


SUMMARY_COLUMNS = ("date", "card", "driver", "torch / CUDA", "nvcc", "build id", "archs", "megakernel regs / stack",
                   "default geometry", "SM clock MHz (bench)", "smoke", "digests", "decode tok/s b1/b16",
                   "contract max ulp", "stages", "total s")


def summarize():
    """(report dict, summary row dict)."""
    st = state_dir()
    pre, build, res = load("preflight", {}), load("build", {}), load("resusage", {})
    geo, smoke, dig, clocks = load("geometry", {}), load("smoke", {}), load("digests", {}), load("clocks", {})
    stages = read_stages()
    by = {s["stage"]: s for s in stages}
    bench_text = (st / "bench.txt").read_text() if (st / "bench.txt").exists() else ""
    acc_text = (st / "accuracy.txt").read_text() if (st / "accuracy.txt").exists() else ""
    profile_text, peers_text, ncu_text = ((st / f).read_text() if (st / f).exists() else ""
                                          for f in ("profile.txt", "peers.txt", "ncu.txt"))
    tests = pytest_summary(st / "digests.xml")
    mk = res.get("megakernel") or {}
    regs = ", ".join(f"{a}: {u['reg']} / {u['stack']} B" + (f", {u['local']} B local" if u["local"] else "")
                     for a, u in sorted(mk.items())) or res.get("note", "")
    geometry = (f"grid {geo['grid']}{'+' if geo.get('bounded') else ''} x {geo['warps']} warps, ring {geo['ring']}, "
                f"{geo['tile_rows']} rows" + (f" ({geo['blocks_per_sm']}/SM)" if geo.get("blocks_per_sm") else "")
                if geo.get("grid") else "")
    pins = dig.get("models") or []
    n_pins = sum(r["teacher_forced"] + r["generation"] for r in pins)

    def status(name):
        s = by.get(name)
        return s["status"] if s else "not run"

    digest_cell = status("digests")
    if tests:
        digest_cell += (f" ({tests['passed']} passed, {tests['failures'] + tests['errors']} failed, "
                        f"{tests['skipped']} skipped")
        digest_cell += f"; pins {n_pins}/{2 * len(pins)})" if pins else ")"
    elif pins:
        digest_cell += f" (pins {n_pins}/{2 * len(pins)})"
    worst = accuracy_summary(acc_text)
    torch_cell = f"{pre.get('torch', '?')} / {pre.get('torch_cuda', '?')}"
    row = {
        "date": (pre.get("date") or "")[:10] or datetime.date.today().isoformat(),
        "card": pre.get("card", "?"),
        "driver": pre.get("driver", "n/a"),
        "torch / CUDA": torch_cell,
        "nvcc": (pre.get("nvcc") or "?").split(" ")[0],
        "build id": build.get("id", "n/a"),
        "archs": (build.get("archs") if build.get("archs", "none").split()[0] != "none" else
                  f"{pre.get('archs', '?')} (not built: no CUDA)" if pre.get("archs") else "n/a"),
        "megakernel regs / stack": regs or "n/a",
        "default geometry": geometry or "n/a",
        "SM clock MHz (bench)": (f"{clocks['median']} median, {clocks['max']} max" if clocks.get("median") else "n/a"),
        "smoke": status("smoke"),
        "digests": digest_cell,
        "decode tok/s b1/b16": bench_summary(bench_text) or status("bench"),
        "contract max ulp": (f"{worst:.7f}" if worst is not None else status("accuracy")),
        "stages": f"{sum(s['status'] == 'pass' for s in stages)}/{len(STAGES)} pass",
        "total s": f"{sum(s['seconds'] for s in stages):.0f}",
    }
    report = {"summary": row, "stages": stages, "preflight": pre, "build": build, "resusage": res, "geometry": geo,
              "smoke": smoke, "digests": dig, "tests": tests, "clocks": clocks,
              "bench": md_tables(bench_text), "accuracy": md_tables(acc_text), "profile": profile_text,
              "peers": md_tables(peers_text), "peer_ratios": peer_ratios(bench_text, profile_text, peers_text),
              "ncu": ncu_text}
    return report, row


def summary_table(row):
    esc = [str(row[c]).replace("|", "/") for c in SUMMARY_COLUMNS]
    return ("| " + " | ".join(SUMMARY_COLUMNS) + " |\n|" + "---|" * len(SUMMARY_COLUMNS) + "\n| " +
            " | ".join(esc) + " |\n")


def cmd_report(args):
    out = Path(args.out)
    report, row = summarize()
    st = state_dir()
    table = summary_table(row)
    (out / SUMMARY_FILE).write_text(table)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    pre = report["preflight"]
    lines = [f"# det-infer device check{' (DRY RUN: emulated executor, no GPU)' if pre.get('dry_run') else ''}", "",
             f"{row['date']}, {row['card']}. Paste into docs/RESULTS.md §9:", "", table,
             "## Stages", "", "| stage | status | seconds | budget s | note |", "|---|---|---|---|---|"]
    done = {s["stage"]: s for s in report["stages"]}
    for name in STAGES:
        s = done.get(name)
        lines.append(f"| {name} | {s['status']} | {s['seconds']:.1f} | {s['budget']} | {s['note']} |" if s else
                     f"| {name} | not run | | | |")
    lines += ["", "## Machine and versions", ""]
    for k, v in pre.items():
        if k not in ("warnings", "failures", "wheels", "free_gib"):
            lines.append(f"- {k}: {v}")
    for k in ("warnings", "failures"):
        for v in pre.get(k) or []:
            lines.append(f"- {k[:-1]}: {v}")
    if pre.get("wheels"):
        w = pre["wheels"]
        lines.append(f"- wheels installed: {', '.join(f'{n} {v}' for n, v in w.get('installed', {}).items()) or 'none'}"
                     f"; already installed: {', '.join(f'{n} {v[0]}' for n, v in sorted(w.get('kept', {}).items()))}")
    lines += ["", "## Build and binary", "", f"- {json.dumps(report['build'])}",
              f"- resource usage (cuobjdump -res-usage; resusage.txt has every function): "
              f"{json.dumps(report['resusage'])}", f"- default geometry (probed): {json.dumps(report['geometry'])}",
              f"- smoke: {json.dumps(report['smoke'])}",
              f"- clocks during the benchmark: {json.dumps(report['clocks'])}"]
    sections = (("Digests", "digests.txt"), ("Decode benchmark", "bench.txt"), ("Contract accuracy", "accuracy.txt"))
    for title, f in sections:
        p = st / f
        if p.exists():
            body = p.read_text()
            keep = [ln for ln in body.splitlines() if ln.startswith(("|", "digests:", "executor:")) or "tok/s" in ln
                    or re.search(r"\d+ (passed|failed)", ln) or "GB/s" in ln]
            lines += ["", f"## {title}", ""] + keep
    for title, key in (("Profile (measured beside gpu_model.py's prediction)", "profile"), ("Nsight Compute", "ncu")):
        if report[key].strip():
            lines += ["", f"## {title}", ""] + report[key].strip().splitlines()
    if report["peers"] or report["peer_ratios"]:
        lines += ["", "## Peers (a stock PyTorch decode step as a CUDA graph, same card, same run)", ""]
        lines += [ln for ln in ((st / "peers.txt").read_text().splitlines() if (st / "peers.txt").exists() else [])
                  if ln.startswith("|") or "torch" in ln]
        lines += ["", ratio_table(report["peer_ratios"])]
    (out / REPORT_FILE).write_text("\n".join(lines) + "\n")
    return 0


def cmd_clocks(args):
    """Median and max SM clock of an nvidia-smi CSV log (clocks.sm first)."""
    vals = []
    try:
        for line in Path(args.csv).read_text().splitlines():
            try:
                vals.append(int(line.split(",")[0].strip()))
            except ValueError:
                pass
    except OSError:
        pass
    vals.sort()
    save("clocks", {"samples": len(vals), "median": vals[len(vals) // 2], "max": vals[-1]} if vals else {"samples": 0})
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("install-wheels")
    p.add_argument("--wheels", default=str(ROOT / ".whl"))
    p.add_argument("--target", required=True)
    p.add_argument("--all", action="store_true", help="install every wheel's version, shadowing this Python's")
    p = sub.add_parser("check-wheels")
    p.add_argument("--wheels", default=str(ROOT / ".whl"))
    sub.add_parser("preflight")
    p = sub.add_parser("binary")
    p.add_argument("--raw", help="write cuobjdump's whole output here")
    sub.add_parser("smoke")
    sub.add_parser("geometry")
    p = sub.add_parser("digests")
    p.add_argument("--models", help="comma-separated synthetic models (default: all; the dry run: llama)")
    p = sub.add_parser("clocks")
    p.add_argument("csv")
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    args = ap.parse_args()
    return globals()["cmd_" + args.cmd.replace("-", "_")](args)


if __name__ == "__main__":
    sys.exit(main())
