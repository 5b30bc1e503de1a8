"""The megakernel's phase timeline (det_infer.profiling), run under emulation: stamping the clock at
every grid synchronization changes no bit, the synchronizations follow the layer plan, and the
stamps have a barrier's shape (no block leaves before the last one arrives). A few seconds."""
import importlib

import pytest
import torch
from det_fixtures.certification import model_dir

GEO = dict(grid=3, warps=2, ring=2, tile_rows=4, seed=5)


@pytest.fixture(scope="module")
def prof(di):
    return importlib.import_module(di.__name__ + ".profiling")


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request, di, tmp_path_factory):
    directory = model_dir(request.param, tmp_path_factory.mktemp("profiling"))
    return di.MegaModel.from_pretrained(directory, max_context=64, executor="emulated", geometry=GEO)


def test_timeline_changes_no_bit(model, prof):
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8]]
    tl = prof.phase_timeline(model, prompts, 3)
    assert tl["tokens"] == model.generate_batch(prompts, 3)
    assert tl["grid"] == GEO["grid"]


def test_timeline_follows_the_plan(model, prof):
    """A 6-token prompt in tiles of 4: tile 1 has no wanted row (no head), tile 2 has; then the
    prompt's pick, and per decode step one tile and its pick."""
    plan = model.layer_plan()
    per_tile = [2 * i + half for i, s in enumerate(plan) if s["kind"] != "embed"
                for half in ((0, 1) if s["out_norm"] else (0,))]
    no_head = [t for t in per_tile if plan[t // 2]["kind"] != "head"]
    tl = prof.phase_timeline(model, [[5, 9, 2, 7, 1, 3]], 3)
    assert tl["tags"] == no_head + per_tile + [-1] + (per_tile + [-1]) * 2
    rows = prof.phases(tl, plan)
    kinds = {r["kind"] for r in rows}
    assert {"qkv", "rope", "attend", "mlp", "residual", "head", "pick"} <= kinds
    assert ("out_norm" in kinds) == any(s["out_norm"] for s in plan)
    assert "| qkv |" in prof.phase_table(rows)


def test_output_norms_without_their_phase(di, prof, tmp_path):
    """Geometry barrier 1 (gemma3: an output norm after each attention and MLP projection): the last
    block to finish a projection normalizes its rows, so such a step has one synchronization
    instead of two (no out_norm phase); the tokens and every step's logits are barrier 0's bits."""
    directory = model_dir("gemma3", tmp_path)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8]]
    syncs, outputs = {}, {}
    for barrier in (0, 1):
        mm = di.MegaModel.from_pretrained(directory, max_context=64, executor="emulated",
                                          geometry=dict(GEO, barrier=barrier))
        plan = mm.layer_plan()
        kinds = [r["kind"] for r in prof.phases(prof.phase_timeline(mm, prompts, 3), plan)]
        assert ("out_norm" in kinds) == (barrier == 0)
        syncs[barrier] = kinds.count("residual") + kinds.count("out_norm")
        outputs[barrier] = mm.generate_batch(prompts, 3, return_logits=True)
    assert all(s["out_norm"] for s in plan if s["kind"] == "residual")
    assert syncs[1] > 0 and syncs[0] == 2 * syncs[1]
    (t0, l0), (t1, l1) = outputs[0], outputs[1]
    assert t0 == t1 and all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(l0, l1))


def test_stamps_have_a_barriers_shape(model, prof):
    tl = prof.phase_timeline(model, [[5, 9, 2, 7, 1, 3]], 2)
    arrive, leave = tl["arrive"], tl["leave"]
    assert (arrive > 0).all() and (leave >= arrive).all()
    assert (leave.min(dim=1).values >= arrive.max(dim=1).values).all()  # nobody leaves before the last arrives
    assert (arrive[1:].min(dim=1).values >= leave[:-1].min(dim=1).values).all()
    assert all(r["phase_us"] >= 0 and r["spread_us"] >= 0 for r in prof.phases(tl, model.layer_plan()))


def test_stamps_inside_each_phase(model, prof):
    """Each warp's arrival falls inside its phase (after the last block's arrival at the previous
    synchronization, by its own block's arrival at this one), and the block's inputs-staged stamp
    after the block's departure from the previous synchronization (thread 0 stamps both); the phases that
    normalize rows into the area (qkv, mlp, head) stamp it on every block, attention and rope never,
    and always before thread 0's own warp arrives."""
    tl = prof.phase_timeline(model, [[5, 9, 2, 7, 1, 3]], 2)
    arrive, leave, ready, done = tl["arrive"], tl["leave"], tl["ready"], tl["warp_done"]
    assert done.shape == arrive.shape + (GEO["warps"],) and tl["warps"] == GEO["warps"]
    released = arrive[:-1].max(dim=1).values[:, None, None]  # no warp goes on before the last block arrived
    assert (done[1:] >= released).all() and (done[1:] <= arrive[1:].unsqueeze(2)).all()
    assert (done[0] > 0).all()
    staged = ready[1:] > 0
    assert (ready[1:][staged] >= leave[:-1][staged]).all() and (ready[1:][staged] <= arrive[1:][staged]).all()
    rows = prof.phases(tl, model.layer_plan())
    for j, r in enumerate(rows):
        if r["kind"] in ("qkv", "mlp", "head"):
            assert (ready[j] > 0).all(), (j, r["kind"])
        if r["kind"] in ("attend", "rope", "pick"):
            assert (ready[j] == 0).all(), (j, r["kind"])
    # Thread 0 stamps the inputs staged, then (later in its own program order) warp 0's arrival.
    staged_any = ready > 0
    assert (ready[staged_any] <= done[:, :, 0][staged_any]).all()
    assert rows[0]["first_warp_us"] is None and rows[1]["last_warp_us"] is not None
    table = prof.phase_table(rows)
    assert "| qkv |" in table and "| attend |" in table


def test_staged_residual_inputs_are_stamped(prof, di, tmp_path):
    """With geometry stage 1 the residual projections copy their input rows into the area first
    when they fit: a decode step's single row always does, and its residual phases then stamp
    inputs staged too (without stage 1 they stage nothing)."""
    directory = model_dir("llama", tmp_path)
    for stage in (0, 1):
        mm = di.MegaModel.from_pretrained(directory, max_context=64, executor="emulated",
                                          geometry=dict(GEO, stage=stage))
        tl = prof.phase_timeline(mm, [[5, 9, 2]], 2)
        rows = prof.phases(tl, mm.layer_plan())
        decode = tl["tags"].index(-1)  # the prompt's pick: decode steps follow
        residual = [j for j, r in enumerate(rows) if r["kind"] == "residual" and j > decode]
        assert residual and all(bool((tl["ready"][j] > 0).all()) == bool(stage) for j in residual)
        assert all((rows[j]["ready_us"] is not None) == bool(stage) for j in residual)


def test_capacity_and_refusals(model, prof, di, tmp_path):
    tl = prof.phase_timeline(model, [[5, 9, 2]], 2, capacity=5)
    assert len(tl["tags"]) == 5 and tl["arrive"].shape == (5, GEO["grid"])
    with pytest.raises(ValueError, match="capacity"):
        prof.phase_timeline(model, [[5, 9, 2]], 2, capacity=0)
    engine = di.MegaModel.from_pretrained(model_dir("llama", tmp_path), max_context=64)
    with pytest.raises(ValueError, match="megakernel"):
        prof.phase_timeline(engine, [[5, 9, 2]], 2)


WIDE = dict(grid=2, warps=4, ring=2, tile_rows=4, seed=3)  # 8 warps: more than the 4 query heads


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return model_dir("llama", tmp_path_factory.mktemp("work"))


@pytest.fixture(scope="module")
def llama_wide(di, llama_dir):
    return di.MegaModel.from_pretrained(llama_dir, max_context=64, executor="emulated", geometry=WIDE)


@pytest.mark.parametrize("outs", [0, 4])
def test_work_profile_counts_exactly(llama_wide, llama_dir, prof, di, outs):
    """The counted fmas of the last decode step equal the model's own arithmetic: per GEMV phase
    rows x k per input row (plus every block's RMSNorm of the row where the phase normalizes),
    per attention phase 2 x head_dim per visible slot per query head. With geometry outs 4 a warp's
    last group repeats its last row to fill 4; those repeats are not counted."""
    mm = llama_wide if not outs else di.MegaModel.from_pretrained(
        llama_dir, max_context=64, executor="emulated", geometry=dict(WIDE, outs=outs))
    cfg = mm.config
    prompt = [5, 9, 2, 7, 1, 3]
    tl = prof.work_profile(mm, [prompt], 3)
    assert tl["tokens"] == mm.generate_batch([prompt], 3)
    plan = mm.layer_plan()
    picks = [j for j, t in enumerate(tl["tags"]) if t == -1]
    last = range(picks[-2] + 1, picks[-1])  # the last decode step's phases: position len(prompt) + 1
    pos = len(prompt) + 1
    fmas = tl["work"][:, :, 3].sum(dim=1)
    H, D, grid = cfg.hidden_size, cfg.head_dim, WIDE["grid"]
    for j in last:
        s = plan[tl["tags"][j] // 2]
        want = s["weight_rows"] * s["k"]
        if s["kind"] in ("qkv", "mlp", "head"):
            want += grid * H  # each block normalizes the row (a canonical dot of length H)
        if s["kind"] == "attend":
            want = cfg.num_attention_heads * (pos + 1) * 2 * D
        if s["kind"] == "rope":
            want = 0  # no qk-norm in llama: rotations only
        assert int(fmas[j]) == want, (j, s)


def test_work_profile_counts_a_prompt_tile_exactly(llama_dir, prof, di):
    """A 20-row prompt in one tile of 64, which each GEMV takes 16 rows at a time (16 + 4):
    every phase's counted fmas are the model's own for those rows, once each: rows x weight rows x k
    (plus every block's RMSNorm of each row; the head takes the one wanted row), and per row
    2 x head_dim per visible slot per query head."""
    mm = di.MegaModel.from_pretrained(llama_dir, max_context=64, executor="emulated",
                                      geometry=dict(WIDE, tile_rows=64, outs=4))
    cfg = mm.config
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(20)]
    tl = prof.work_profile(mm, [prompt], 1)
    plan = mm.layer_plan()
    fmas = tl["work"][:, :, 3].sum(dim=1)
    H, D, grid, n = cfg.hidden_size, cfg.head_dim, WIDE["grid"], len(prompt)
    tile = tl["tags"][:tl["tags"].index(-1)]
    assert len(tile) == len([s for s in plan if s["kind"] != "embed"])
    for j, tag in enumerate(tile):
        s = plan[tag // 2]
        rows = 1 if s["kind"] == "head" else n
        want = rows * s["weight_rows"] * s["k"]
        if s["kind"] in ("qkv", "mlp", "head"):
            want += grid * rows * H
        if s["kind"] == "attend":
            want = cfg.num_attention_heads * sum(p + 1 for p in range(n)) * 2 * D
        if s["kind"] == "rope":
            want = 0
        assert int(fmas[j]) == want, (j, s)


def test_work_profile_shows_the_imbalance(llama_wide, prof):
    """At batch 1, attention is one warp per query head (4 busy of 8), and in the QKV phase warp 0
    of each block normalizes the row while the others wait: its fmas stand above the mean."""
    tl = prof.work_profile(llama_wide, [[5, 9, 2, 7, 1, 3]], 3)
    rows = prof.work_rows(tl, llama_wide.layer_plan())
    decode = rows[tl["tags"].index(-1) + 1:]
    attend = [r for r in decode if r["kind"] == "attend"]
    assert attend and all(r["busy"] == llama_wide.config.num_attention_heads and r["warps"] == 8 for r in attend)
    qkv = [r for r in decode if r["kind"] == "qkv"]
    assert qkv and all(r["fmas_max"] > r["fmas_mean"] for r in qkv)
    table = prof.work_table(decode)
    assert "| attend | 4 of 8 |" in table
    with pytest.raises(ValueError, match="emulation only"):
        engine_like = type("M", (), {"executor": "megakernel"})()
        prof.work_profile(engine_like, [[1, 2]], 1)
