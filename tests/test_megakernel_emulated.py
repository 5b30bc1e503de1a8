"""The megakernel's device code, run on the host under SIMT emulation (megakernel/det_simt.h, one
fiber per CUDA thread), reproduces the CPU engine's pinned digests bit for bit: across grid
geometries (1, 2, 3 and 5 blocks; 1, 2 and 4 warps; ring depths 2 and 4; tiles of 1 to 64 rows;
weights requested ahead of their phase or not; the generation barrier or the monotonic counter), randomized fiber schedules, batch 1 and 16, single launch and one launch per step. Bad programs are
refused before launch, and a kernel with a missing barrier is caught by the schedules."""
import subprocess

import pytest
from det_fixtures import synthetic
import torch
from det_fixtures.certification import (N_GEN, N_TEACHER, ROOT, SYNTHETIC, batch_with_target, generation_digest, inputs_for,
                           logits_digest, model_dir)
from det_fixtures.pins import MODEL_DIGESTS

# (grid, warps, ring, tile_rows, schedule seed[, attn: 0 a warp per query head, C split attention[,
# ahead: KB of weights requested before a GEMV phase's barrier[, barrier: 1 the monotonic counter[,
# outs: weight rows a warp streams at once[, stage: bits 1 RESIDUAL's and PLE_GATE's inputs, 2 split
# attention's chunks, copied to shared memory[, area_rows: the rows the normalizing phases hold in shared memory at once]]]]]])
# Tiles of 64 and 32 rows (prompt tiles) take the 64-token teacher and the 100-token prompt in chunks
# of 16 rows per weight row, the last one partial; the 32-row tile 8 rows at a time (area_rows), its
# split attention on each block's copy of a chunk (stage 3).
GEOMETRIES = [(1, 1, 2, 1, 0), (2, 2, 4, 2, 11, 1, 0, 1, 4, 1), (3, 1, 4, 64, 12, 0, 4, 0, 2),
              (5, 2, 2, 4, 13, 0, 1, 1, 2, 1), (2, 4, 2, 32, 14, 32, 16, 0, 4, 3, 8)]


def geometry(g):
    return dict(zip(("grid", "warps", "ring", "tile_rows", "seed", "attn", "ahead", "barrier", "outs", "stage",
                     "area_rows"), g))


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return tmp_path_factory.mktemp("emu_models")


@pytest.fixture(scope="module", params=SYNTHETIC)
def case(request, di, tmp_root):
    name = request.param
    directory = model_dir(name, tmp_root)
    engine = di.MegaModel.from_pretrained(directory, max_context=512)
    teacher, prompt = inputs_for(name, directory, engine.config.vocab_size)
    return {"name": name, "dir": directory, "teacher": teacher, "prompt": prompt, "pins": MODEL_DIGESTS[name],
            "emulated": lambda g: di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                                               geometry=geometry(g))}


@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_teacher_forced_digest(case, g):
    assert logits_digest(case["emulated"](g).teacher_forced_logits(case["teacher"])) == case["pins"]["teacher_forced"]


# One block of one warp (GEOMETRIES[0]) does a launch's work in turn: the slowest emulation (8-26 s
# a model's generation on the CI's 2 cores, against 2-9 s in the other geometries). CI generates
# with it on llama, qwen2 and gemma3 (dense, attention biases, Gemma's switches; every model's
# teacher-forced digest above takes it too); `pytest -m slow` on every model.
ONE_WARP_IN_CI = ("llama", "qwen2", "gemma3")


@pytest.mark.parametrize("g", GEOMETRIES[:3], ids=lambda g: "x".join(map(str, g)))
def test_generation_digest_single_launch(case, g):
    if g == GEOMETRIES[0] and case["name"] not in ONE_WARP_IN_CI:
        pytest.skip("one warp alone: llama, qwen2 and gemma3 in CI, every model in -m slow")
    tokens, logits = case["emulated"](g).generate(case["prompt"], max_new=N_GEN, return_logits=True)
    assert generation_digest(tokens, logits) == case["pins"]["generation"]


@pytest.mark.slow
def test_generation_digest_single_launch_one_warp(case):
    tokens, logits = case["emulated"](GEOMETRIES[0]).generate(case["prompt"], max_new=N_GEN, return_logits=True)
    assert generation_digest(tokens, logits) == case["pins"]["generation"]


def test_generation_digest_per_step(case):
    mm = case["emulated"]((3, 2, 2, 1, 21))
    tokens, logits = mm.generate(case["prompt"], max_new=N_GEN, single_launch=False, return_logits=True)
    assert generation_digest(tokens, logits) == case["pins"]["generation"]


def test_token_by_token_and_decode_batch(case):
    mm = case["emulated"]((2, 1, 4, 4, 22, 0, 2))
    n, V = 24, mm.config.vocab_size
    ids = case["teacher"][:n]
    solo = mm.teacher_forced_logits(ids)
    state = mm.new_state(n)
    assert torch.equal(torch.stack([mm.decode_step(t, p, state) for p, t in enumerate(ids)]), solo)
    seqs = [synthetic.token_sequence(n, V, 200), ids, synthetic.token_sequence(n, V, 201)]
    states = [mm.new_state(n) for _ in seqs]
    rows = [mm.decode_batch([s[p] for s in seqs], [p] * 3, states)[1] for p in range(n)]
    assert torch.equal(torch.stack(rows), solo)


def test_batch_of_16_with_random_co_prompts(case):
    # llama's decode steps split into four tiles of 4 rows; the others ride in one tile of 16, each
    # warp streaming 4 weight rows at once against the 16 rows (geometry outs 4: 64 accumulators).
    tile_rows = 4 if case["name"] == "llama" else 16
    mm = case["emulated"]((3, 2, 4, tile_rows, 30 + tile_rows, 0, 8, 0, 4))
    prompts, slot, _ = batch_with_target(f"emu-co-prompts:{case['name']}", case["prompt"], mm.config.vocab_size, 40)
    streams, logits = mm.generate_batch(prompts, max_new=N_GEN, return_logits=True)
    assert generation_digest(streams[slot], logits[slot]) == case["pins"]["generation"]


def test_stop_ids_and_lengths(case, di):
    """A stop id ends one sequence early; the others go on; every stream equals the CPU engine's."""
    engine = di.MegaModel.from_pretrained(case["dir"], max_context=512)
    mm = case["emulated"]((2, 2, 2, 16, 40))
    prompts = [case["prompt"][:10], case["prompt"][:17], case["prompt"][:5]]
    free = engine.generate_batch(prompts, max_new=12)
    stop = free[1][3]  # the 4th token of the second stream
    want = engine.generate_batch(prompts, max_new=12, stop_ids=[stop])
    got = mm.generate_batch(prompts, max_new=12, stop_ids=[stop])
    assert got == want and len(got[1]) <= 4 and got[1][-1] == stop


# ---- the real models -----------------------------------------------------------------------------
# Gemma-3-270M's (a minute on two cores) is opt-in, `pytest -m slow`, to keep CI under 40 minutes:
# its switches run in every geometry on the synthetic gemma3 model above.
@pytest.mark.parametrize("name", ["smollm2", pytest.param("gemma3-270m", marks=pytest.mark.slow), "qwen2.5-coder-0.5b"])
def test_real_model_teacher_forced_digest(di, tmp_root, name):
    directory = model_dir(name, tmp_root)
    mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                      geometry=geometry((4, 4, 4, 16, 5, 0, 4)))
    teacher, _ = inputs_for(name, directory, mm.config.vocab_size)
    assert logits_digest(mm.teacher_forced_logits(teacher[:N_TEACHER])) == MODEL_DIGESTS[name]["teacher_forced"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3-270m", "qwen2.5-coder-0.5b"])
def test_real_model_generation_digest(di, tmp_root, name):
    """The real models' 64-step generation digests under emulation: minutes each on two cores, so
    opt-in (`pytest -m slow`); CI runs their teacher-forced digests above."""
    directory = model_dir(name, tmp_root)
    mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                      geometry=geometry((3, 2, 4, 16, 99)))
    _, prompt = inputs_for(name, directory, mm.config.vocab_size)
    tokens, logits = mm.generate(prompt, max_new=N_GEN, return_logits=True)
    assert generation_digest(tokens, logits) == MODEL_DIGESTS[name]["generation"]


# ---- bad input -----------------------------------------------------------------------------------
def test_bad_geometry_and_executor(di, tmp_root):
    directory = model_dir("llama", tmp_root)
    with pytest.raises(ValueError, match="ring 2 or 4"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"ring": 3})
    with pytest.raises(ValueError, match="unknown geometry field"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"blocks": 3})
    with pytest.raises(ValueError, match=r"ahead must be 0 .* or 1\.\.256"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"ahead": 257})
    with pytest.raises(ValueError, match=r"barrier must be 0 .* or 1"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"barrier": 2})
    with pytest.raises(ValueError, match=r"outs must be 0 or 1 .* 2 or 4"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"outs": 8})
    with pytest.raises(ValueError, match=r"stage must be 0 .* 1 .* 2 .* or 3"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"stage": 4})
    with pytest.raises(ValueError, match=r"area_rows must be 0 .* or one of 1, 2, 4, 8, 16, 32, 64, 128"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"area_rows": 12})
    with pytest.raises(ValueError, match=r"tile_rows 1, 2, 4, 8, 16, 32, 64 or 128"):
        di.MegaModel.from_pretrained(directory, executor="emulated", geometry={"tile_rows": 48})
    # The text form (command lines, lm-eval's model_args): the same fields, the same checks.
    mm = di.MegaModel.from_pretrained(directory, executor="emulated", geometry="tile_rows = 32; outs:4,attn=2;")
    assert (mm.geometry["tile_rows"], mm.geometry["outs"], mm.geometry["attn"], mm.geometry["grid"]) == (32, 4, 2, 2)
    for text, says in (("tile_rows=48", "tile_rows 1, 2, 4"), ("tile_rows", "is not name=value"),
                       ("tile_rows=-1", "is not name=value"), ("outs=4;outs=2", "sets outs twice"),
                       ("blocks=3", "unknown geometry field"), ("tile_rows=64 attn=32", "is not name=value"),
                       ("grid=2147483648", r"int value in 0\.\.2147483647")):
        with pytest.raises(ValueError, match=says):
            di.MegaModel.from_pretrained(directory, executor="emulated", geometry=text)
    for bad in ([("outs", 4)], {"grid": 2**31}):
        with pytest.raises(ValueError, match="a dict of fields or their text form|int in 0..2147483647"):
            di.MegaModel.from_pretrained(directory, executor="emulated", geometry=bad)
    assert di.MegaModel.from_pretrained(directory, geometry=" ; ").geometry is None  # the engine: no fields given
    with pytest.raises(ValueError, match="does not run on cpu"):
        di.MegaModel.from_pretrained(directory, executor="megakernel")
    with pytest.raises(ValueError, match="applies to the megakernel"):
        di.MegaModel.from_pretrained(directory, geometry={"grid": 2})
    with pytest.raises(ValueError, match="not supported"):
        di.MegaModel.from_pretrained(directory, device="meta")


def test_raw_op_refuses_bad_programs(di, tmp_root):
    directory = model_dir("llama", tmp_root)
    mm = di.MegaModel.from_pretrained(directory, max_context=64, executor="emulated")
    state = mm.new_state(8)
    V = mm.config.vocab_size
    geo = [2, 2, 2, 16, 0, 0, 0, 0, 0, 0, 0]

    def forward(tokens, positions, want=None, geo=geo):
        n = len(tokens)
        want = want or [1] * n
        out = torch.empty((sum(want), V), dtype=torch.float32)
        di.ops.mega_forward(mm._native, torch.tensor(tokens, dtype=torch.int32), torch.tensor(positions, dtype=torch.int64),
                            [state.cache], torch.zeros(n, dtype=torch.int64), torch.tensor(want, dtype=torch.uint8),
                            out, geo)
        return out

    with pytest.raises(ValueError, match="outside the vocabulary"):
        forward([V], [0])
    with pytest.raises(ValueError, match="outside its KV cache"):
        forward([5], [8])
    with pytest.raises(ValueError, match="increasing position order"):
        forward([5, 6], [3, 3])
    with pytest.raises(ValueError, match="tile_rows must be"):
        forward([5], [0], geo=[2, 2, 2, 3, 0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"tile_rows must be 1, 2, 4, 8, 16, 32, 64 or 128"):
        forward([5], [0], geo=[2, 2, 2, 256, 0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="warps must be"):
        forward([5], [0], geo=[2, 0, 2, 16, 0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="attn must be"):
        forward([5], [0], geo=[2, 2, 2, 16, 0, 33, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="ahead must be 0"):
        forward([5], [0], geo=[2, 2, 2, 16, 0, 0, 257, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="barrier must be 0"):
        forward([5], [0], geo=[2, 2, 2, 16, 0, 0, 0, 2, 0, 0, 0])
    with pytest.raises(ValueError, match="outs must be 0 or 1"):
        forward([5], [0], geo=[2, 2, 2, 16, 0, 0, 0, 0, 3, 0, 0])
    with pytest.raises(ValueError, match="stage must be 0"):
        forward([5], [0], geo=[2, 2, 2, 16, 0, 0, 0, 0, 0, 4, 0])
    with pytest.raises(ValueError, match="area_rows must be 0"):
        forward([5], [0], geo=[2, 2, 2, 16, 0, 0, 0, 0, 0, 0, 12])
    with pytest.raises(ValueError, match=r"geometry is \[grid, warps, ring, tile_rows, seed, attn, ahead, barrier, "
                                         r"outs, stage, area_rows\], got 10"):
        forward([5], [0], geo=[2, 2, 2, 16, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("head_dim,message", [(20, "multiples of 8"), (520, "head_dim up to 512")])
def test_shapes_the_megakernel_cannot_take(di, tmp_path, head_dim, message):
    """The CPU engine runs these; the megakernel refuses them before launch, with a sentence."""
    directory = synthetic.write_checkpoint("llama", str(tmp_path / "odd"), head_dim=head_dim)
    assert di.MegaModel.from_pretrained(directory, max_context=8).teacher_forced_logits([5, 6]).isfinite().all()
    mm = di.MegaModel.from_pretrained(directory, max_context=8, executor="emulated")
    with pytest.raises(ValueError, match=message):
        mm.teacher_forced_logits([5, 6])


# ---- the emulator itself -------------------------------------------------------------------------
def test_emulator_catches_a_missing_barrier(tmp_path):
    """tests/native/simt_selftest.cpp runs a two-phase kernel through the fiber runtime: with its
    barrier the result is one value under every schedule; without it, some schedules read data not
    yet written and the results differ, so a missing barrier in the megakernel would show as a
    digest mismatch."""
    exe = tmp_path / "simt_selftest"
    subprocess.run(["c++", "-std=c++20", "-O2", "-ffp-contract=off", f"-I{ROOT}", str(ROOT / "tests/native/simt_selftest.cpp"),
                    str(ROOT / "megakernel/host/det_simt_host.cpp"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    with_barrier, without_barrier, deadlock = out
    assert with_barrier == "1"      # distinct results over 8 schedules
    assert int(without_barrier) > 1
    assert deadlock == "deadlock"
