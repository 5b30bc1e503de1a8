"""The release as the hub expects it: nothing generated is committed; build.toml, each variant's
metadata.json and the variant names agree; the built .so passes kernel-abi-check's Python stable ABI
check; CARD.md renders the way kernel-builder renders it; benchmarks/benchmark.py runs under the
`kernels benchmark` runner; docs/RELEASE.md documents the release; the matrix script's parsers and pins
(scripts/build_matrix.py) behave. The full toolchain matrix itself is scripts/build_matrix.sh
(docs/RESULTS.md §10); CI's quick part is tests/test_cuda_compile.py (system nvcc, every
architecture, the audit) and the CPU variant built and checked here and in tests/test_package.py."""
import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = tomllib.loads((ROOT / "build.toml").read_text())
PY_NAME = BUILD["general"]["name"].replace("-", "_")

# What a build leaves behind and must never be committed (kernel-builder generates registration.h
# and _ops.py; build/ and result are build outputs; metadata.json exists only inside variants).
GENERATED = re.compile(r"(^|/)(build|result|__pycache__|\.venv|\.tools|\.whl|\.pytest_cache)(/|$)"
                       r"|(^|/)(registration\.h|_ops\.py|metadata\.json)$"
                       r"|\.(so|o|a|cubin|fatbin|ptx|pyc|whl|egg-info)$")


def generated_files(paths):
    return [p for p in paths if GENERATED.search(p)]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_tree_has_no_generated_files():
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split("\0")
    tracked = [t for t in tracked if t]
    assert "build.toml" in tracked and "CARD.md" in tracked and "benchmarks/benchmark.py" in tracked
    assert generated_files(tracked) == []


def test_generated_file_rule_can_fail():
    bad = ["build/torch213-cxx11-cpu-x86_64-linux/_ops.py", "torch-ext/registration.h", "torch-ext/det_infer/_ops.py",
           "x/_det_infer_cpu_1.abi3.so", "tests/__pycache__/a.pyc", "result", "obj/a.cubin"]
    assert generated_files(bad) == bad
    assert generated_files(["torch-ext/torch_binding.cpp", "scripts/build_local.py", "docs/RESULTS.md",
                            "benchmarks/benchmark.py", "tests/test_package.py"]) == []


# ---- build.toml, metadata.json and the variant names ----------------------------------------
def variant_problems(variant_dir):
    """Every way a variant directory disagrees with build.toml or with its own name."""
    from kernels.variants import parse_variant

    g = BUILD["general"]
    problems = []
    try:
        v = parse_variant(variant_dir.name)
    except ValueError as e:
        return [f"{variant_dir.name}: not a variant name ({e})"]
    meta = json.loads((variant_dir / "metadata.json").read_text())
    backend = v.arch.backend.name
    for key, want in (("name", g["name"]), ("version", g["version"]), ("license", g["license"])):
        if meta.get(key) != want:
            problems.append(f"metadata {key} {meta.get(key)!r} != build.toml {want!r}")
    if backend not in g["backends"]:
        problems.append(f"variant backend {backend} is not in build.toml backends {g['backends']}")
    if meta.get("backend", {}).get("type") != backend:
        problems.append(f"metadata backend {meta.get('backend')} does not match the variant name's {backend}")
    if backend == "cuda":
        caps = set()
        for sec in BUILD["kernel"].values():
            if sec["backend"] == "cuda":
                caps |= set(sec.get("cuda-capabilities", []))
        if set(meta["backend"].get("archs", [])) != caps:
            problems.append(f"metadata archs {meta['backend'].get('archs')} != build.toml {sorted(caps)}")
    if not str(meta.get("id", "")).startswith(f"_{PY_NAME}_{backend}_"):
        problems.append(f"metadata id {meta.get('id')!r} does not name the {backend} backend")
    sos = sorted(p.name for p in variant_dir.glob("*.so"))
    if sos != [f"{meta.get('id')}.abi3.so"]:
        problems.append(f"shared objects {sos} != [{meta.get('id')}.abi3.so]")
    ops = (variant_dir / "_ops.py").read_text() if (variant_dir / "_ops.py").exists() else ""
    if f"torch.ops.{meta.get('id')}" not in ops:
        problems.append("_ops.py does not bind torch.ops.<id>")
    if not (variant_dir / "__init__.py").is_file():
        problems.append("no __init__.py")
    return problems


def _variants(build_dir):
    return sorted(p for p in build_dir.iterdir() if (p / "metadata.json").is_file())


def test_built_variants_agree_with_build_toml(di):
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    import build_local

    variants = _variants(ROOT / "build")
    names = [v.name for v in variants]
    assert build_local.variant_name(torch, "cpu") in names, names
    for v in variants:
        assert variant_problems(v) == [], v.name


def test_release_build_from_the_matrix_agrees():
    """The variants scripts/build_matrix.sh built (CPU and cu130), when its cache is on this machine."""
    cache = Path(os.environ.get("MATRIX_CACHE", Path.home() / ".cache" / "det-infer-matrix")) / "build"
    if not cache.is_dir() or not _variants(cache):
        pytest.skip(f"no matrix build at {cache} (scripts/build_matrix.sh makes it)")
    for v in _variants(cache):
        assert variant_problems(v) == [], v.name


def test_variant_checks_can_fail(di, tmp_path):
    import shutil

    src = next(v for v in _variants(ROOT / "build") if "-cpu-" in v.name)
    # A CPU build placed under a CUDA variant name, with a stale version: both are caught.
    bad = tmp_path / src.name.replace("-cpu-", "-cu130-")
    shutil.copytree(src, bad)
    meta = json.loads((bad / "metadata.json").read_text())
    meta["version"] = 2
    (bad / "metadata.json").write_text(json.dumps(meta))
    problems = " | ".join(variant_problems(bad))
    assert "version 2" in problems and "does not match the variant name's cuda" in problems
    assert variant_problems(tmp_path / "not-a-variant") != []


def unlisted_includes(src):
    """The files that the sources in `src` include (#include "...", transitively) but `src` does not
    list: kernel-builder copies only the listed files, and the local build hashes only them, so an
    unlisted header would be missing from a hub build and would not trigger a rebuild here."""
    listed, seen, todo, missing = set(src), set(), list(src), []
    while todo:
        path = todo.pop()
        if path in seen or not (ROOT / path).is_file():
            continue
        seen.add(path)
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', (ROOT / path).read_text(), re.M):
            target = os.path.normpath(os.path.join(os.path.dirname(path), name))
            if not (ROOT / target).is_file():
                continue  # a generated header (registration.h) or one found on another include path
            if target not in listed and target not in missing:
                missing.append(target)
            todo.append(target)
    return missing


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_build_toml_lists_every_included_file(backend):
    missing = unlisted_includes(BUILD["torch"]["src"] + BUILD["kernel"][f"det_infer_{backend}"]["src"])
    if backend == "cpu":  # the bindings include the CUDA executor's headers only in a CUDA build
        missing = [m for m in missing if not m.startswith("det_infer_cuda/")]
    assert missing == []


def test_unlisted_includes_can_fail():
    src = [s for s in BUILD["kernel"]["det_infer_cpu"]["src"] if s != "contract/det_exp.h"]
    assert "contract/det_exp.h" in unlisted_includes(src)


# ---- ABI ---------------------------------------------------------------------------------------
def test_cpu_variant_is_abi3(di):
    kac = pytest.importorskip("kernel_abi_check")
    so = next(p for v in _variants(ROOT / "build") if "-cpu-" in v.name for p in v.glob("*.so"))
    assert kac.ObjectFile(str(so)).check_python_abi("3.9") == []
    # manylinux_2_28 is reported, not required, here (docs/RESULTS.md §10): the call must work.
    assert isinstance(kac.ObjectFile(str(so)).check_manylinux("manylinux_2_28"), list)


def test_abi3_check_can_fail():
    kac = pytest.importorskip("kernel_abi_check")
    import numpy

    # numpy's core is built against the full C API: the same check reports its non-abi3 symbols.
    ext = next((Path(numpy.__file__).parent / "_core").glob("_multiarray_umath.cpython-*.so"))
    assert any(v.name == "PyBuffer_Release" for v in kac.ObjectFile(str(ext)).check_python_abi("3.9"))


# ---- CARD.md and the README -------------------------------------------------------------------
def _all_names():
    tree = ast.parse((ROOT / "torch-ext" / PY_NAME / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return [e.value for e in node.value.elts]
    return []


def render_card(**overrides):
    """CARD.md rendered with kernel-builder's context (kernel-builder/src/card.rs: repo_id, version,
    functions from __all__, has_benchmark, license lowercased; trim_blocks)."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    ctx = dict(repo_id=BUILD["general"]["hub"]["repo-id"], version=BUILD["general"]["version"],
               functions=[n for n in _all_names() if n != "layers"] or None, layers=None,
               has_benchmark=(ROOT / "benchmarks" / "benchmark.py").exists(), upstream=None, source=None,
               license=BUILD["general"]["license"].lower())
    ctx.update(overrides)
    return env.from_string((ROOT / "CARD.md").read_text()).render(**ctx)


def _front_matter(text):
    import yaml

    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert m, "no front matter"
    return yaml.safe_load(m.group(1))


def test_card_renders_as_the_hub_readme():
    card = render_card()
    fm = _front_matter(card)
    assert fm["library_name"] == "kernels" and fm["license"] == "apache-2.0"
    assert 'get_kernel("phanerozoic/det-infer", version=1, trust_remote_code=True)' in card
    assert "`v1` branch" in card and "kernels benchmark phanerozoic/det-infer --version 1" in card
    for name in _all_names():
        assert f"- `{name}`" in card
    assert "{{" not in card and "{%" not in card
    no_bench = render_card(has_benchmark=False, functions=None)
    assert "No benchmark available yet." in no_bench and "Function list not available." in no_bench


def test_readme_front_matter_and_release_doc():
    readme = (ROOT / "README.md").read_text()
    fm = _front_matter(readme)
    assert fm["library_name"] == "kernels" and fm["license"] == BUILD["general"]["license"].lower()
    assert "docs/RELEASE.md" in readme
    release = (ROOT / "docs" / "RELEASE.md").read_text()
    for needle in ("kernel-builder build-and-upload", "`v1`", "version=1", "trust_remote_code=True",
                   "torch213-cxx11-cpu-x86_64-linux", "cu126", "cu130", "cu132", "scripts/build_matrix.sh"):
        assert needle in release, needle


# ---- the benchmark ------------------------------------------------------------------------------
TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300,
            rope_theta=10000.0, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
            hidden_act="silu", bos_token_id=1, eos_token_id=2)


def test_benchmark_follows_the_hub_convention(di):
    from kernels.cli.benchmark import discover_benchmark_classes, run_benchmark_class

    classes = discover_benchmark_classes(ROOT / "benchmarks" / "benchmark.py", ROOT)
    assert [c.__name__ for c in classes] == ["DecodeBenchmark"]
    cls = classes[0]
    assert {"benchmark_decode_b1", "benchmark_decode_b16", "verify_decode_b1", "verify_decode_b16"} <= set(dir(cls))
    # The same class on a tiny model, run by kernels' own runner on the local build.
    tiny = type("TinyDecode", (cls,), {"config": TINY})
    results, sha = run_benchmark_class(tiny, iterations=2, warmup=1, repo_id=str(ROOT), is_local=True,
                                       revision="local")
    assert set(results) == {"decode_b1", "decode_b16"}
    assert all(r.verified is True and r.iterations == 2 for r in results.values())
    assert sha == json.loads(next(p for p in _variants(ROOT / "build") if "-cpu-" in p.name)
                             .joinpath("metadata.json").read_text())["id"].rsplit("_", 1)[-1]


def test_benchmark_verification_can_fail(di):
    bench = _load(ROOT / "benchmarks" / "benchmark.py", "det_infer_benchmark_module")
    b = type("TinyDecode", (bench.DecodeBenchmark,), {"config": TINY})()
    b.kernel, b.device = di, "cpu"
    b.setup_decode_b16()
    b.benchmark_decode_b16()
    b.verify_decode_b16()
    import torch

    b.out[3, 7] = torch.nextafter(b.out[3, 7], torch.tensor(float("inf")))  # one ulp in one row fails
    with pytest.raises(AssertionError, match="batch-16"):
        b.verify_decode_b16()


# ---- the matrix script ----------------------------------------------------------------------------
PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z13det_mk_kernel13det_mk_params' for 'sm_90'
ptxas info    : Function properties for _Z13det_mk_kernel13det_mk_params
    688 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 252 registers, used 1 barriers, 688 bytes cumulative stack size, 1024 bytes smem
ptxas info    : Function properties for _Z9det_phaseP3ctx
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
"""


def test_matrix_script_parses_ptxas_and_pins_exactly():
    matrix = _load(ROOT / "scripts" / "build_matrix.py", "det_infer_build_matrix")
    entries, spills = matrix.parse_ptxas(PTXAS_LOG)
    assert entries == [{"function": "_Z13det_mk_kernel13det_mk_params", "arch": "90", "registers": 252,
                        "stack": 688, "spill_stores": 0, "spill_loads": 0, "smem": 1024}]
    assert spills == [(0, 0), (8, 4)]  # a spill in a non-entry function is seen
    for name, pins in matrix.TOOLCHAINS.items():
        assert pins and all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", p) for p in pins), name
    assert set(matrix.TOOLCHAINS) == {"cu126", "cu128", "cu130", "cu132"}
    ptx, sass = matrix.audit_rules()
    cuda_compile = _load(ROOT / "tests" / "test_cuda_compile.py", "det_infer_cuda_compile_rules")
    assert (ptx.pattern, sass.pattern) == (cuda_compile.FORBIDDEN_PTX.pattern, cuda_compile.FORBIDDEN_SASS.pattern)
    assert matrix.target_archs(ROOT) == [c.replace(".", "") for c in
                                         BUILD["kernel"]["det_infer_cuda"]["cuda-capabilities"]]
