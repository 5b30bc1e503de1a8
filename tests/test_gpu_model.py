"""benchmarks/gpu_model.py, the GPU cost model: fitted to the measured H200 runs, it must reproduce
every one within 25% (issue 47's bar), read the plan the executors run, and answer one prediction
from the shell. A few seconds on 2 cores."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_model  # noqa: E402


@pytest.fixture(scope="module")
def fitted(di):
    c = gpu_model.card("h200")
    _, runs = gpu_model.load_runs(gpu_model.RUNS / c.runs)
    return c, runs, gpu_model.fit(c, runs)


def test_every_measured_run_within_25_percent(fitted, capsys):
    c, runs, constants = fitted
    assert len(runs) >= 50
    for run in runs:
        terms, measured = gpu_model.run_terms(run, c)
        assert abs(gpu_model.seconds(terms, constants) / measured - 1) <= 0.25, gpu_model.describe(run)
    assert gpu_model.main(["fit"]) == 0
    out = capsys.readouterr().out
    assert "largest error" in out and out.count("\n| ") >= len(runs) + 1


def test_fit_can_fail(fitted, tmp_path):
    """A run the model's terms cannot explain (a step 3x slower than its twin) breaks the bar."""
    c, runs, _ = fitted
    data = json.loads((gpu_model.RUNS / c.runs).read_text())
    data["runs"].append(dict(data["runs"][5], ms=3 * data["runs"][5]["ms"]))
    bad = tmp_path / "runs.json"
    bad.write_text(json.dumps(data))
    assert gpu_model.main(["fit", "--runs", str(bad)]) == 1


def test_plan_is_the_executors(di):
    """The plan comes from MegaModel.layer_plan; a two-layer model's plan is the one-layer plan's
    layer steps repeated, which gpu_model.layer_plan relies on."""
    cfg = gpu_model.shape_config("SmolLM2-135M", layers=2)
    real = [dict(s) for s in gpu_model._plan_of(json.dumps(cfg, sort_keys=True))]
    assert gpu_model.layer_plan(cfg) == real
    kinds = [s["kind"] for s in real]
    assert kinds == ["embed"] + ["qkv", "rope", "attend", "residual", "mlp", "residual"] * 2 + ["head"]
    qkv = real[1]
    assert (qkv["weight_rows"], qkv["k"]) == (576 + 2 * 192, 576)
    assert real[-1]["weight_rows"] == cfg["vocab_size"]


def test_predictions_move_the_right_way(fitted):
    c, _, constants = fitted
    near, _ = gpu_model.predict(c, constants, "SmolLM2-135M", position=50)
    far, _ = gpu_model.predict(c, constants, "SmolLM2-135M", position=4000)
    wide, _ = gpu_model.predict(c, constants, "SmolLM2-135M", batch=16, position=50)
    assert near < wide < 16 * near and far > 5 * near  # today's attention walks the whole context


def test_epilogue_per_lane_counts_an_item_once(fitted):
    """The whatif of the per-lane epilogue: nothing changes at batch 1 (one row an item); at batch
    16 and in a prompt's tiles each item counts once instead of once a row."""
    c, _, constants = fitted
    lane = {"epilogue": "lane"}
    for shape, batch, prompt, faster in (("SmolLM2-135M", 1, 0, False), ("SmolLM2-135M", 16, 0, True),
                                         ("Llama-3.2-1B", 1, 256, True)):
        base, _ = gpu_model.predict(c, constants, shape, batch, 50, prompt)
        new, _ = gpu_model.predict(c, constants, shape, batch, 50, prompt, geometry=lane)
        assert (new < base) if faster else new == base, (shape, batch, prompt)


def test_weights_ahead_halves_the_item_term_only(fitted):
    """The whatif of geometry ahead: the item term (per output row a warp reduces) at half its
    fitted cost, every other term unchanged, at batch 1 and 16 and in a prompt."""
    c, _, constants = fitted
    plan_cfg = gpu_model.shape_config("SmolLM2-135M")
    plan = gpu_model.layer_plan(plan_cfg)
    for batch, prompt in ((1, 0), (16, 0), (1, 256)):
        kw = dict(first_pos=50) if not prompt else {}
        base = gpu_model.launch_terms(plan, plan_cfg, dict(c.geometry), c.sms, batch, prompt, 0 if prompt else 1, **kw)
        new = gpu_model.launch_terms(plan, plan_cfg, dict(c.geometry, ahead=16), c.sms, batch, prompt,
                                     0 if prompt else 1, **kw)
        assert new["item"] == pytest.approx(base["item"] / 2) and base["item"] > 0, (batch, prompt)
        assert {k: v for k, v in new.items() if k != "item"} == {k: v for k, v in base.items() if k != "item"}
    slow, _ = gpu_model.predict(c, constants, "SmolLM2-135M", 1, 50)
    fast, _ = gpu_model.predict(c, constants, "SmolLM2-135M", 1, 50, geometry={"ahead": 16})
    assert fast < slow


def test_outs_divides_the_item_and_row_terms_only(fitted):
    """The whatif of geometry outs: a warp's items and each extra input row at 1 / outs of their
    fitted cost at every batch (det_mk_gemv_outs: 4 rows at once in passes of 16 input rows too),
    every other term unchanged."""
    c, _, constants = fitted
    cfg = gpu_model.shape_config("SmolLM2-135M")
    plan = gpu_model.layer_plan(cfg)
    for batch, outs in ((1, 4), (8, 4), (16, 4), (16, 2)):
        base = gpu_model.launch_terms(plan, cfg, dict(c.geometry), c.sms, batch, 0, 1, first_pos=50)
        new = gpu_model.launch_terms(plan, cfg, dict(c.geometry, outs=outs), c.sms, batch, 0, 1, first_pos=50)
        assert new["item"] == pytest.approx(base["item"] / outs) and base["item"] > 0, batch
        assert new["row"] == pytest.approx(base["row"] / outs), batch
        assert {k: v for k, v in new.items() if k not in ("item", "row")} == \
            {k: v for k, v in base.items() if k not in ("item", "row")}
    slow, _ = gpu_model.predict(c, constants, "SmolLM2-135M", 16, 50)
    fast, _ = gpu_model.predict(c, constants, "SmolLM2-135M", 16, 50, geometry={"outs": 4})
    assert fast < slow


def test_prompt_tiles_count_fewer_phases_and_a_weight_pass_per_16_rows(fitted):
    """Geometry tile_rows 64 on a 1,000-token prompt: 16 tiles' phases instead of 63, each weight row
    streamed once per 16 rows of a tile (so 63 passes' bytes either way, as 64-row tiles take them
    16 at a time), the same rows' work; where 64 rows do not fit a block (Llama-1B), the phase area
    holds the most that do, and a geometry asking for all of them is refused."""
    c, _, constants = fitted
    cfg = gpu_model.shape_config("SmolLM2-135M")
    plan = gpu_model.layer_plan(cfg)
    base = gpu_model.launch_terms(plan, cfg, dict(c.geometry), c.sms, 1, 1000, 0)
    big = gpu_model.launch_terms(plan, cfg, dict(c.geometry, tile_rows=64), c.sms, 1, 1000, 0)
    assert big["phase"] * 63 == pytest.approx(base["phase"] * 16, rel=1e-3)  # the head: the last tile's only
    assert big["bytes"] == pytest.approx(base["bytes"]) and big["row"] == pytest.approx(base["row"])
    assert big["attend"] < base["attend"] / 3
    _, slow = gpu_model.predict(c, constants, "SmolLM2-135M", 1, prompt=1000)
    _, fast = gpu_model.predict(c, constants, "SmolLM2-135M", 1, prompt=1000, geometry={"tile_rows": 64})
    assert fast > 1.5 * slow
    assert gpu_model.area_rows(c, cfg, dict(c.geometry, tile_rows=64)) == 64
    # Llama-1B: 64 rows of hidden 2,048 do not fit a block; the planner's area holds 16 of them, and
    # the weights are streamed once per 16 rows either way.
    llama = gpu_model.shape_config("Llama-3.2-1B")
    assert gpu_model.area_rows(c, llama, dict(c.geometry, tile_rows=64)) == 16
    assert not gpu_model.tile_fits(c, llama, dict(c.geometry, tile_rows=64, area_rows=64))
    assert gpu_model.predict(c, constants, "Llama-3.2-1B", 1, prompt=1000, geometry={"area_rows": 64,
                                                                                      "tile_rows": 64}) is None
    _, l16 = gpu_model.predict(c, constants, "Llama-3.2-1B", 1, prompt=1000)
    _, l64 = gpu_model.predict(c, constants, "Llama-3.2-1B", 1, prompt=1000, geometry={"tile_rows": 64})
    assert l64 > l16
    assert gpu_model.gemv_passes(64, 16) == gpu_model.gemv_passes(64, 0) == 4 and gpu_model.gemv_passes(20, 8) == 3


def test_monotonic_barrier_saves_the_measured_difference_per_phase(fitted):
    """Geometry barrier 1: every phase (each ends at a grid barrier) shorter by the H200's measured
    difference between the two barriers, nothing else changed."""
    c, _, constants = fitted
    cfg = gpu_model.shape_config("SmolLM2-135M")
    terms = gpu_model.launch_terms(gpu_model.layer_plan(cfg), cfg, dict(c.geometry), c.sms, 1, 0, 1, first_pos=50)
    base, _ = gpu_model.predict(c, constants, "SmolLM2-135M", 1, 50)
    new, _ = gpu_model.predict(c, constants, "SmolLM2-135M", 1, 50, geometry={"barrier": 1})
    assert terms["phase"] > 100 and base - new == pytest.approx(terms["phase"] * gpu_model.COUNTER_SAVES_S)


def test_predict_from_the_shell(di):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_model.py"), "predict", "--card", "h200",
                        "--shape", "SmolLM2-135M", "--batch", "1", "--position", "50"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("tok/s") and "predicted" in lines[0]
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_model.py"), "predict", "--card", "l4"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no measurements of card 'l4'" in r.stderr


def test_sizes_table_is_the_predictions(fitted, capsys):
    """`gpu_model.py sizes` (issue 49's prompt lengths and batch sizes): a row per case, each cell
    predict()'s tok/s for the measured design, the landed default and every landed switch on."""
    c, _, constants = fitted
    assert gpu_model.main(["sizes"]) is None
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "prefill" in line
            or line.startswith("| ") and "decode" in line]
    assert len(rows) == len(gpu_model.SIZES) == 16
    for (shape, batch, position, prompt), row in zip(gpu_model.SIZES, rows):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        want = [gpu_model.predict(c, constants, shape, batch, position, prompt, geometry=g)[1]
                for g in ({}, gpu_model.LANDED, gpu_model.SWITCHES)]
        assert [float(x.replace(",", "")) for x in cells[1:4]] == [round(w) for w in want], row
    assert gpu_model.SWITCHES["outs"] == 4 and gpu_model.SWITCHES["tile_rows"] == 64


def test_staged_chunks_take_their_share_of_the_phase_area(fitted):
    """Geometry stage 2 with split attention puts a chunk's keys and values (2 x 128 x head_dim
    floats, 64 KB at 64) in the phase area after the warps' scratch (det_mk_area_floats): on a card
    whose block may hold 99 KB (sm_86's opt-in), SmolLM2's 16-row tile fits without it (37 KB of
    rows) and not with it (80 KB of area beside 16 KB of rings and the tile); the H200 holds both.
    Without split attention the bit stages nothing."""
    c, _, _ = fitted
    cfg = gpu_model.shape_config("SmolLM2-135M")
    small = dataclasses.replace(c, smem_block=99 * 1024)
    geo = dict(c.geometry, attn=32)
    assert gpu_model.tile_fits(small, cfg, geo) and gpu_model.tile_fits(small, cfg, dict(geo, stage=1))
    assert not gpu_model.tile_fits(small, cfg, dict(geo, stage=2))
    assert gpu_model.tile_fits(small, cfg, dict(geo, stage=2, attn=0))
    assert gpu_model.tile_fits(c, cfg, dict(geo, stage=3))


def test_score_tiles_want_the_continuation_rows(fitted, capsys):
    """score_batch's launch (scoring.py): context + continuation - 1 rows a pair in program order, the
    rows from the context's last on through the head, and no pick. Two pairs of 5 fed rows wanting
    positions 3 and 4, in tiles of 4: (0 1 2 3 | 4 0 1 2 | 3 4) want 1, 1 and 2 rows. One pair with
    one continuation token is a prefill of its context without the pick phase of each tile. The
    sizes table's score rows are predict_score's."""
    c, _, constants = fitted
    assert gpu_model.tiles_of([5, 5], 4, wanted_from=[3, 3]) == [([0, 1, 2, 3], 1), ([4, 0, 1, 2], 1), ([3, 4], 2)]
    assert gpu_model.tiles_of([5, 5], 4) == [([0, 1, 2, 3], 0), ([4, 0, 1, 2], 1), ([3, 4], 1)]
    prefill, _ = gpu_model.predict(c, constants, "SmolLM2-135M", prompt=40)
    score, tok_s = gpu_model.predict_score(c, constants, "SmolLM2-135M", 1, 40, 1)
    assert score == pytest.approx(prefill - 3 * constants["phase"], rel=1e-12) and tok_s == pytest.approx(1 / score)
    # More of the same rows wanted costs more (the head), never less
    more, _ = gpu_model.predict_score(c, constants, "SmolLM2-135M", 1, 20, 21)
    assert more > score
    gpu_model.main(["sizes"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "score_batch" in line]
    pairs, context, continuation = gpu_model.SCORE
    assert len(rows) == 2
    for shape, row in zip(("SmolLM2-135M", "Llama-3.2-1B"), rows):
        cells = [float(x.replace(",", "")) for x in row.strip("|").split("|")[1:4]]
        want = [gpu_model.predict_score(c, constants, shape, pairs, context, continuation, geometry=g)[1]
                for g in ({}, gpu_model.LANDED, gpu_model.SWITCHES)]
        assert cells == [round(w) for w in want], row
