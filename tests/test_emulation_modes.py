"""The SIMT emulation's stricter modes (DET_SIMT_MODES, megakernel/host/det_simt_host.cpp;
docs/SPEC.md §14.4) keep every bit of a correct kernel and catch each weakness of the default
emulation in a negative control:
- async: cp.async lands only at the wait_group that covers it, its destination NaN until then (and
  poisoned under AddressSanitizer). A kernel that waits for one group too few gives a mismatch
  (the megakernel itself, built with DET_SIMT_TEST_WAIT_SLACK=1) or a reported use-after-poison.
- smem: shared memory exactly sized and filled with seeded NaN words. One byte read past the end is
  an AddressSanitizer report; a read of unwritten shared memory gives NaN, not zero.
- threads: a thread per block and the GPU's grid barriers (the generation barrier and the monotonic
  counter of geometry barrier 1) and split attention's arrival count in real atomics and fences
  (det_grid_barrier.h), under ThreadSanitizer, plainly, and on aarch64 under qemu-user. A barrier or
  an arrival with any one of its fences left out is a reported data race, in the megakernel and in
  the litmus test (tests/native/grid_barrier_litmus.cpp), which is also stressed over real threads
  on both hosts; a barrier's, in a synthetic kernel too.
The megakernel runs small synthetic layouts (tests/native/emulation_modes.cpp) and must give the
default emulation's digests under every mode, on x86 and on aarch64; the built extension reproduces
the pinned digests under DET_SIMT_MODES=strict."""
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from det_fixtures.certification import N_GEN, ROOT, generation_digest, inputs_for, logits_digest, model_dir
from native_sources import EMULATION
from det_fixtures.pins import MODEL_DIGESTS

IN_CI = os.environ.get("CI") == "true"
MODES_HARNESS = ["tests/native/emulation_modes.cpp", *EMULATION]
SELFTEST = ["tests/native/simt_selftest.cpp", "megakernel/host/det_simt_host.cpp"]
LITMUS = ["tests/native/grid_barrier_litmus.cpp"]
BASE = ["-std=c++20", "-ffp-contract=off", "-fno-fast-math", "-pthread", f"-I{ROOT}", f"-I{ROOT / 'tests/native'}"]
ASAN = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
TSAN = ["-O1", "-g", "-fsanitize=thread", "-DDET_GRID_BARRIER_TEST_DROP=-1"]
A64 = ["-O2", "-static"]
BUILDS = {  # name: (compiler, flags, sources)
    "modes": ("c++", ["-O2"], MODES_HARNESS),
    "modes-slack": ("c++", ["-O2", "-DDET_SIMT_TEST_WAIT_SLACK=1"], MODES_HARNESS),
    "modes-asan": ("c++", ASAN, MODES_HARNESS),
    "modes-tsan": ("c++", TSAN, MODES_HARNESS),
    "modes-a64": ("aarch64-linux-gnu-g++", A64, MODES_HARNESS),
    "selftest": ("c++", ["-O2"], SELFTEST),
    "selftest-asan": ("c++", ASAN, SELFTEST),
    "selftest-tsan": ("c++", TSAN, SELFTEST),
    "litmus": ("c++", ["-O2"], LITMUS),
    "litmus-tsan": ("c++", TSAN, LITMUS),
    "litmus-a64": ("aarch64-linux-gnu-g++", A64, LITMUS),
}
# Megakernel cases of tests/native/emulation_modes.cpp: 0 a dense forward in prompt tiles of 64,
# its split attention a pass per chunk, 1 dense generate (2 blocks, ring 2), 3 nf4 Gemma-3 generate
# (3 blocks x 2 warps, ring 4, tiles of 4), 4 the Gemma-4 layout, 5 and 6 a dense forward whose
# split attention folds across blocks (the arrival count; 6 on each block's copy of the chunk).
ASAN_CASES, TSAN_CASES, A64_CASES = "134", "0356", "356"


def need_aarch64():
    if not have_aarch64():
        reason = "aarch64-linux-gnu-g++ or qemu-aarch64 not installed (scripts/setup.sh installs them)"
        pytest.fail(reason) if IN_CI else pytest.skip(reason)


def have_aarch64():
    return shutil.which("aarch64-linux-gnu-g++") is not None and shutil.which("qemu-aarch64") is not None


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    """Every binary, two compiles at a time (the CI machine has two cores)."""
    out = tmp_path_factory.mktemp("emu_modes")
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    names = [n for n in BUILDS if have_aarch64() or not n.endswith("-a64")]

    def build(name):
        cc, flags, sources = BUILDS[name]
        path = out / name
        r = subprocess.run([cc, *BASE, *flags, *[str(ROOT / s) for s in sources], "-o", str(path)],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{name}:\n{r.stderr[-4000:]}"
        return name, path

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(build, names))


def run(cmd, modes=None, timeout=600, **env):
    e = dict(os.environ, **env)
    e.pop("DET_SIMT_MODES", None)
    if modes:
        e["DET_SIMT_MODES"] = modes
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=e, timeout=timeout)


def digests(r):
    """{(case, modes): digest} from emulation_modes' output; every launch must have succeeded."""
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    found = {}
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"(case\d) (\S+) (-?\d+) ([0-9a-f]{16})", line)
        if m:
            assert m.group(3) == "0", line
            found[m.group(1), m.group(2)] = m.group(4)
    return found


@pytest.fixture(scope="module")
def reference(exe):
    """The default emulation's digests of every case (a plain build on this host)."""
    d = digests(run([exe["modes"], "default"]))
    assert len(d) == 7
    return {case: h for (case, _), h in d.items()}


# ---- a correct kernel: every mode, every build, the same bits -----------------------------------
def test_every_mode_keeps_the_bits(exe, reference):
    d = digests(run([exe["modes"], "async", "smem", "threads", "strict"]))
    assert {k: v for k, v in d.items()} == {(c, m): reference[c] for c in reference
                                             for m in ("async", "smem", "threads", "strict")}


def test_strict_under_address_sanitizer(exe, reference):
    """Deferred copies poisoned in flight, exactly sized shared memory, a thread per block: no
    report, the same bits."""
    d = digests(run([exe["modes-asan"], f"--cases={ASAN_CASES}", "strict"], ASAN_OPTIONS="detect_leaks=1"))
    assert d == {(f"case{c}", "strict"): reference[f"case{c}"] for c in ASAN_CASES}


def test_threads_under_thread_sanitizer(exe, reference):
    """The real grid barrier between OS threads: no data race between blocks, the same bits."""
    r = run([exe["modes-tsan"], f"--cases={TSAN_CASES}", "threads"], TSAN_OPTIONS="halt_on_error=1")
    assert "ThreadSanitizer" not in r.stderr, r.stderr[-6000:]
    assert digests(r) == {(f"case{c}", "threads"): reference[f"case{c}"] for c in TSAN_CASES}


def test_strict_on_aarch64_under_qemu(exe, reference):
    """A weakly ordered target (the guest; qemu-user runs it on this host's ordering), ucontext
    fibers: the same bits as on x86."""
    need_aarch64()
    d = digests(run(["qemu-aarch64", exe["modes-a64"], f"--cases={A64_CASES}", "strict"]))
    assert d == {(f"case{c}", "strict"): reference[f"case{c}"] for c in A64_CASES}


def test_pinned_digests_under_strict_modes(di, tmp_path, monkeypatch):
    """The built extension, modes read at each launch: the synthetic llama's pinned digests."""
    monkeypatch.setenv("DET_SIMT_MODES", "strict")
    directory = model_dir("llama", tmp_path)
    mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                      geometry=dict(grid=3, warps=2, ring=4, tile_rows=16, seed=17))
    teacher, prompt = inputs_for("llama", directory, mm.config.vocab_size)
    assert logits_digest(mm.teacher_forced_logits(teacher)) == MODEL_DIGESTS["llama"]["teacher_forced"]
    tokens, logits = mm.generate(prompt, max_new=N_GEN, return_logits=True)
    assert generation_digest(tokens, logits) == MODEL_DIGESTS["llama"]["generation"]


def test_spread_tree_has_the_plain_trees_bits(exe):
    """det_mk_warp_tree_rows (the GEMV's tree, its rows spread over the lanes) against the plain
    5-shuffle tree for 1..32 rows of hostile values, under the default and the threads mode (ASan).
    Keeping the wrong half of the rows at a split, or a row read from the wrong lane, prints
    "tree mismatch" (checked by hand when the tree landed)."""
    assert run([exe["selftest"], "tree"]).stdout == "tree ok\n"
    assert run([exe["selftest-asan"], "tree"], "threads").stdout == "tree ok\n"


def test_area_layout_reads_in_order_without_bank_conflicts(exe):
    """The phase area's row layout (det_mk_area_at): rows copied into shared memory at several
    starting offsets and read back by the GEMV's loads and the norm's dot give each lane its run's
    elements in order and the plain row's dot (values whose sums depend on the order), and by the
    loader's address rule a quarter warp's 16-byte loads cover all 32 banks; a plain row covers 16
    (2-way conflicts). The control: an area row read as a plain one is caught (its dot alone
    catches it, checked by hand when the layout landed)."""
    want = "area ok banks 32 plain ok banks 16 control caught\n"
    assert run([exe["selftest"], "area"]).stdout == want
    assert run([exe["selftest-asan"], "area"], "threads").stdout == want


# ---- negative controls: each mode catches what the default hides ------------------------------
def test_a_wait_for_one_group_too_few_is_caught(exe, reference):
    # A weight ring as det_mk_gemv streams it, waiting wait_group depth - 1 + 1.
    for depth in (2, 4):
        assert run([exe["selftest"], "ring", depth, 0], "async").stdout == "ring ok\n"
        assert run([exe["selftest"], "ring", depth, 1]).stdout == "ring ok\n"  # the default hides it
        assert run([exe["selftest"], "ring", depth, 1], "async").stdout == "ring mismatch\n"
    r = run([exe["selftest-asan"], "ring", 4, 1], "async")
    assert r.returncode != 0 and "AddressSanitizer: use-after-poison" in r.stderr, r.stderr[-3000:]
    # The megakernel itself, every wait_group one group short: its bits change under async only.
    d = digests(run([exe["modes-slack"], "--cases=1", "default", "async"]))
    assert d["case1", "default"] == reference["case1"]
    assert d["case1", "async"] != reference["case1"]


def test_a_read_past_shared_memory_is_reported(exe):
    assert run([exe["selftest-asan"], "overrun"], ASAN_OPTIONS="detect_leaks=1").stdout == "overrun read\n"
    r = run([exe["selftest-asan"], "overrun"], "smem")
    assert r.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in r.stderr, r.stderr[-3000:]
    assert run([exe["selftest"], "unwritten"]).stdout == "unwritten zero\n"
    assert run([exe["selftest"], "unwritten"], "smem").stdout == "unwritten nan\n"


@pytest.mark.parametrize("drop", [1, 2, 3])
def test_the_grid_barrier_without_a_fence_is_reported(exe, drop):
    """F1 (before the arrival), F2 (before the generation bump), F3 (after the wait): each one's
    absence is a data race under TSan, in a two-phase kernel, the megakernel (case 0's geometry:
    the generation barrier) and the litmus test. F1 and F3 are the monotonic counter's fences too
    (geometry barrier 1: case 1; the litmus test's `counter`), which has no F2."""
    clean = run([exe["selftest-tsan"], "grid", 3], "threads", DET_GRID_BARRIER_TEST_DROP="0")
    assert clean.returncode == 0 and clean.stdout == "grid ok\n" and "ThreadSanitizer" not in clean.stderr
    tsan = dict(DET_GRID_BARRIER_TEST_DROP=str(drop), TSAN_OPTIONS="halt_on_error=1")
    cases = [([exe["selftest-tsan"], "grid", 3], "threads"), ([exe["modes-tsan"], "--cases=0", "threads"], "threads"),
             ([exe["litmus-tsan"], 4, 200, 5], None)]
    if drop != 2:
        cases += [([exe["modes-tsan"], "--cases=1", "threads"], "threads"),
                  ([exe["litmus-tsan"], 4, 200, 5, "counter"], None)]
    for cmd, modes in cases:
        r = run(cmd, modes, **tsan)
        assert r.returncode != 0 and "ThreadSanitizer: data race" in r.stderr, (cmd, r.stdout, r.stderr[-3000:])


@pytest.mark.parametrize("drop", [4, 5])
def test_the_arrival_count_without_a_fence_is_reported(exe, drop):
    """F4 (before the arrival's add) and F5 (after it): split attention's units release their
    partials and the last of a (row, query pair) acquires them before its fold. Without either, a
    data race under TSan in the megakernel (cases 5 and 6: the fold reads a partial another block
    wrote, from the grid's units and from the staged ones; case 3, geometry barrier 1: Gemma-3's
    output norm on the last block reads the projection's outputs every block wrote) and in the
    litmus test's `arrival` rounds."""
    cases = [([exe["modes-tsan"], "--cases=5", "threads"], "threads"),
             ([exe["modes-tsan"], "--cases=6", "threads"], "threads"),
             ([exe["modes-tsan"], "--cases=3", "threads"], "threads"),
             ([exe["litmus-tsan"], 4, 200, 5, "arrival"], None)]
    for cmd, modes in cases:  # clean with every fence: test_threads_under_thread_sanitizer, test_grid_barrier_litmus
        r = run(cmd, modes, DET_GRID_BARRIER_TEST_DROP=str(drop), TSAN_OPTIONS="halt_on_error=1")
        assert r.returncode != 0 and "ThreadSanitizer: data race" in r.stderr, (cmd, r.stdout, r.stderr[-3000:])


def test_grid_barrier_litmus(exe):
    """The barrier as written passes the litmus test under TSan (happens-before) and stressed over
    real threads (as many rounds as 1.5 s allows, up to a million) on x86 and on aarch64 under
    qemu-user; so does the arrival count."""
    for kind in ([], ["counter"], ["arrival"]):  # the generation barrier, the monotonic counter, the arrival
        r = run([exe["litmus-tsan"], 4, 300, 5, *kind], DET_GRID_BARRIER_TEST_DROP="0")
        assert r.returncode == 0 and r.stdout.startswith("litmus ok") and "ThreadSanitizer" not in r.stderr, r.stderr
    hosts = [[exe["litmus"]]] + ([["qemu-aarch64", exe["litmus-a64"]]] if have_aarch64() else [])
    for threads, kind in ((2, []), (4, []), (8, []), (3, ["counter"]), (8, ["counter"]), (2, ["arrival"]),
                          (5, ["arrival"])):
        for cmd in hosts:
            out = run([*cmd, threads, 1000000, 1.5, *kind]).stdout
            m = re.fullmatch(r"litmus ok \d+ threads (\d+) rounds\n", out)
            assert m and int(m.group(1)) >= 100, (cmd, out)
