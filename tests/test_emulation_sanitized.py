"""The megakernel's device code under host SIMT emulation, and the CPU engine, built with
AddressSanitizer and UndefinedBehaviorSanitizer (tests/native/emulation_harness.cpp, torch-free):
every program (interleaved sequences, a prefill across a 128-position chunk, generation with and
without returned logits and a stop id) on five small models (dense and nf4 projections, Gemma-3's
switches) in four geometries and a Gemma-4 layout (per-layer head sizes up to 264, KV sharing,
per-layer inputs) in two runs clean and equals the engine bit for bit. An out-of-bounds access anywhere on the way
aborts the run. The emulation's stricter modes (deferred cp.async, poisoned exactly sized shared memory, a thread
per block under ThreadSanitizer and on aarch64) are tests/test_emulation_modes.py."""
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from det_fixtures.certification import ROOT
from native_sources import EMULATION, ENGINE, X86

SOURCES = ["tests/native/emulation_harness.cpp", *ENGINE, *X86, *EMULATION]
# -g1: line tables for the sanitizers' reports, without -g's variable tracking (a quarter of the
# compile time of the activation and attention kernels, which inline the contract's functions).
FLAGS = ["-std=c++20", "-O1", "-g1", "-fopenmp", "-ffp-contract=off", "-fno-fast-math", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
# The slowest compiles (about 1 to 4 minutes each under the sanitizers on the CI's 2 cores) start first.
SLOWEST = ["megakernel/host/det_megakernel_emu.cpp", "det_infer_cpu/x86/det_attn_lanes_avx512.cpp",
           "det_infer_cpu/x86/det_act_avx512.cpp", "det_infer_cpu/x86/det_act_avx2.cpp"]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """The harness, its sources compiled a core each at a time (the CI machine has two), then linked."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("sanitized")

    def compile_one(source):
        obj = out / (source.replace("/", "__") + ".o")
        r = subprocess.run(["c++", *FLAGS, f"-I{ROOT}", "-c", str(ROOT / source), "-o", str(obj)],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{source}:\n{r.stderr[-4000:]}"
        return str(obj)

    order = [s for s in SLOWEST if s in SOURCES] + [s for s in SOURCES if s not in SLOWEST]
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, order))
    exe = out / "harness"
    subprocess.run(["c++", *FLAGS, *objects, "-o", str(exe)], check=True)
    return exe


def _run(exe, *args):
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, env={"ASAN_OPTIONS": "detect_leaks=1",
                                                                               "OMP_NUM_THREADS": "2"})
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
    return int(r.stdout.split()[1])  # cases compared


def test_emulation_and_engine_under_sanitizers(harness):
    """Every model in two of the four geometries (every geometry covered), Gemma-4 in one."""
    assert _run(harness, "quick") >= 100


@pytest.mark.slow
def test_emulation_and_engine_under_sanitizers_every_geometry(harness):
    """Every model in every geometry: minutes under the sanitizers, so opt-in (`pytest -m slow`)."""
    assert _run(harness) >= 250
