#!/usr/bin/env python3
"""The megakernel's GPU time, predicted from the layer plan and fitted to what a GPU measured.

Until a GPU measures a design change, this is how its effect is stated (docs/RESULTS.md §9). A
launch runs tiles (passes of up to tile_rows rows through the plan); a tile's time is a sum over
the plan's steps of five terms, each a count taken from the plan and the geometry times one
constant fitted to the measured runs (benchmarks/gpu_runs/<date>-<card>.json):

  phase     per phase (every step but EMBED, plus a residual's output norm and generate's pick):
            the fixed latency of a phase's critical path (measured ~15 us on an H200, whatever
            the phase's size; the grid barrier itself is 1.8 us of it)
  bytes     per weight byte streamed, scaled by SMs / SMs in use (the stream is limited per SM)
  row       per weight byte and input row beyond the first (each fma reads its x from shared
            memory: the batch and prompt cost)
  item      per output row a warp reduces, times the input rows (the 5-shuffle tree and the emit:
            until 2026-12-06 lane 0 wrote every input row's output in turn, an activation or a
            residual's load and store each; since then each row's own lane does, unmeasured: the whatif
            "epilogue per lane" counts an item once whatever its rows, the most that can save; with
            geometry ahead > 0 its weights were requested before the barrier, into the ring and L2:
            an item at half the cost, an estimate of an L2 hit against a DRAM round trip)
  attend    per context slot walked by the busiest warp (one warp per (row, query head) walks its
            whole context; units beyond the grid's warps wait for a second wave), x head_dim / 64
and per launch a constant (host call, launch, copies). The fit is non-negative least squares on
relative error over every measured configuration; `fit` prints measured beside predicted.

    python3 benchmarks/gpu_model.py fit [--runs benchmarks/gpu_runs/2026-12-04-h200.json]
    python3 benchmarks/gpu_model.py predict --card h200 --shape SmolLM2-135M --batch 1 --position 50
    python3 benchmarks/gpu_model.py predict --card h200 --shape Llama-3.2-1B --prompt 1024
    python3 benchmarks/gpu_model.py whatif --card h200      (the GPU issues' changes, predicted)

Needs the CPU build of the kernel (LOCAL_KERNELS=phanerozoic/det-infer=$PWD/build, or
scripts/setup.sh's .venv, which finds it): the plan is read from a zero-weight model of each shape.
"""
import argparse
import dataclasses
import functools
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
RUNS = ROOT / "benchmarks" / "gpu_runs"
TERMS = ("phase", "bytes", "row", "item", "attend", "launch")
CHUNK = 128  # attention's chunk of positions (docs/SPEC.md §13.4)
# Geometry barrier 1 (the monotonic counter) against the generation barrier, per grid barrier: 0.99
# against 1.82 us, 132 blocks on the H200 (../shared/gpu/2026-12-04-h200/sync_bench.md, C and A).
COUNTER_SAVES_S = (1.82 - 0.99) * 1e-6


@dataclasses.dataclass(frozen=True)
class Card:
    name: str
    sms: int
    geometry: dict  # the launch planner's default on this card (device_check's geometry stage)
    runs: str       # the measurements its constants are fitted to
    smem_block: int  # dynamic shared memory a block may have (the opt-in maximum)


CARDS = {
    "h200": Card("NVIDIA H200", 132, dict(grid=132, warps=8, ring=4, tile_rows=16), "2026-12-04-h200.json",
                 227 * 1024),
}
GEMV_ROWS = 16  # input rows a GEMV takes per pass over a weight row (DET_MK_GEMV_ROWS)
TILE_BYTES = 4 * 1024  # det_mk_tile in shared memory, about (rows of up to 128)


def area_rows(c, cfg, geo):
    """Rows of a tile the block's phase area holds (geometry area_rows; det_mk_plan_geometry): those
    asked for (the whole tile for 0 or more than the tile), else the most of the tile's rows, a power
    of two, whose shared memory fits a block (det_mk_smem_bytes: the tile, the rings, and the phase
    area: rows x (hidden + 1) floats of normalized rows, or split attention's scratch with, for
    geometry stage bit 2, a chunk's keys and values); 0 when they do not fit."""
    tile = geo["tile_rows"]  # the card's default stands for the planner's own tile, which fits
    rings = geo["warps"] * geo["ring"] * max(geo.get("outs", 0), 1) * 512
    hd = cfg["head_dim"]
    staged = geo.get("attn", 0) > 0 and geo.get("stage", 0) & 2 and hd <= 128  # DET_MK_STAGE_HEAD_DIM_MAX
    scratch = 2 * (128 + hd) + 2 * hd if geo.get("attn", 0) else 2 * 128 + hd  # det_mk_attn_scratch_floats
    attention = geo["warps"] * scratch + (2 * 128 * hd if staged else 0)  # floats

    def fits(rows):
        return TILE_BYTES + rings + max(rows * (cfg["hidden_size"] + 1), attention) * 4 <= c.smem_block

    asked = geo.get("area_rows", 0)
    rows = min(asked, tile) if asked else tile
    while not asked and rows > 1 and not fits(rows):
        rows //= 2
    return rows if fits(rows) else 0


def tile_fits(c, cfg, geo):
    """Whether the geometry's tile runs on the card: at least one of its rows (all of them when
    area_rows asks for them) fits a block's shared memory beside the rings."""
    return area_rows(c, cfg, geo) > 0


def card(name):
    if name.lower() not in CARDS:
        sys.exit(f"gpu_model: no measurements of card {name!r} to fit; measured: {', '.join(CARDS)}")
    return CARDS[name.lower()]


# ---- the plan -------------------------------------------------------------------------------------
def shape_config(shape, overrides=None, layers=None):
    from bench_gpu import SHAPES, config

    if shape not in SHAPES:
        sys.exit(f"gpu_model: unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    cfg = config(shape)
    cfg.update(overrides or {})
    if layers:
        cfg["num_hidden_layers"] = layers
    return cfg


@functools.lru_cache(maxsize=None)
def _plan_of(cfg_json):
    """The layer plan of a zero-weight model of this config (the plan depends on shapes only)."""
    import torch
    from bench_gpu import _shape

    di = kernel()
    cfg = di.ModelConfig.from_dict(json.loads(cfg_json))
    weights = {n: torch.zeros(_shape(cfg, n), dtype=torch.bfloat16) for n in di.names.llama_tensor_names(cfg)}
    return tuple(tuple(sorted(s.items())) for s in di.MegaModel(cfg, weights, device="cpu", max_context=8).layer_plan())


def layer_plan(cfg):
    """The plan of cfg, built from a one-layer model (llama-shaped layers are all alike: the test
    checks a two-layer plan against this) and its layer steps repeated."""
    one = dict(cfg, num_hidden_layers=1)
    steps = [dict(s) for s in _plan_of(json.dumps(one, sort_keys=True))]
    layer = [s for s in steps if s["layer"] == 0]
    head = [s for s in steps if s["layer"] < 0 and s["kind"] != "embed"]
    body = [dict(s, layer=l) for l in range(cfg["num_hidden_layers"]) for s in layer]
    return [s for s in steps if s["kind"] == "embed"] + body + head


@functools.lru_cache(maxsize=None)
def kernel():
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel

    return get_kernel("phanerozoic/det-infer", version=1)


# ---- the terms of one tile ------------------------------------------------------------------------
AREA_KINDS = ("qkv", "mlp", "head", "ple_project")  # the steps whose inputs are in the phase area


def gemv_passes(n_in, area):
    """Passes over a weight row of a GEMV of n_in input rows: one per 16 rows (DET_MK_GEMV_ROWS) of
    each area's worth of rows (area: the rows the phase area holds, or 0 for a GEMV that reads its
    inputs elsewhere), at least one."""
    area = area or n_in or 1
    full, rest = divmod(n_in, area)
    return max(full * math.ceil(area / GEMV_ROWS) + math.ceil(rest / GEMV_ROWS), 1)


def tile_terms(plan, cfg, geo, sms, positions, wanted, pick, distinct=False):
    """The five counts of one tile of rows at `positions` (one per row) with `wanted` rows through
    the head, and generate mode's pick when `pick`. `distinct`: every row is its own sequence (a
    decode step), so with split attention the units do ROPE's work and its phase is skipped. The
    phase area holds geo's area_rows of the rows (0: the whole tile)."""
    t = dict.fromkeys(TERMS, 0.0)
    rows = len(positions)
    nwarps = geo["grid"] * geo["warps"]
    per_sm = sms / min(geo["grid"], sms)
    hd = cfg["head_dim"]
    for s in plan:
        kind = s["kind"]
        if kind == "embed" or (kind == "head" and wanted == 0):
            continue
        if kind == "rope" and distinct and geo.get("attn", 0) > 0:
            continue
        # Gemma's output norm: a phase of its own, or with geometry barrier 1 the last block's work
        t["phase"] += 1 + (s["out_norm"] and not geo.get("barrier", 0))
        if s["weight_rows"]:
            n_in = wanted if kind == "head" else rows
            nbytes = 2 * s["weight_rows"] * s["k"]
            # A tile of more than 16 rows streams each weight row once per 16 (the passes after the
            # first most likely from L2 when the area holds the tile, from DRAM past the L2 when it
            # holds a part: unmeasured): counted as DRAM bytes, an upper bound; each pass's first
            # row rides free.
            in_area = geo.get("area_rows", 0) if kind in AREA_KINDS else 0
            passes = gemv_passes(n_in, in_area)
            t["bytes"] += nbytes * per_sm * passes
            ahead = 0.5 if geo.get("ahead") else 1.0
            outs = gemv_outs(geo)
            t["row"] += nbytes * max(n_in - passes, 0) * per_sm / outs
            t["item"] += math.ceil(s["weight_rows"] / nwarps) * (1 if geo.get("epilogue") == "lane" else n_in) * ahead / outs
        elif kind == "attend":
            attend_terms(t, cfg, geo, nwarps, positions, s.get("window", 0))
    if pick:
        t["phase"] += 1
    return t


def gemv_outs(geo):
    """Weight rows a warp streams at once (geometry outs; det_mk_gemv_outs).
    The whatif counts a warp's items and each input row's extra cost at 1 / outs of their fitted
    cost: each input value a lane loads feeds outs rows, and a group's tree and epilogue are one
    round of shuffles for all of them. An estimate, the most it can save, until a GPU measures it."""
    outs = geo.get("outs", 0)
    return outs if outs > 1 else 1


def attend_terms(t, cfg, geo, nwarps, positions, window):
    """ATTEND's counts. geometry attn 0: one warp per (row, query head) walks its whole context
    (the busiest warp: waves x context slots). attn C > 0 (split): units of (row, KV head, pair of
    its query heads, chunk) over the grid (SPEC §14.2), each walking its chunk's visible slots, C
    chunks a pass, at the same cost per slot (the fit has only attn 0's; the whatif's streamed keys
    scale it); when a row has more than one chunk, the pass's last unit of a (row, query pair)
    folds the pair's heads (side by side) in the same phase, one dependent round (counted as a slot)
    per chunk, and passes after the first add a phase each. Slots scale with head_dim / 64."""
    heads, hd, per = cfg["num_attention_heads"], cfg["head_dim"], geo.get("attn", 0)
    kv = cfg.get("num_key_value_heads", heads)
    pairs = kv * math.ceil(heads // kv / 2)  # units per (row, chunk): DET_MK_ATTN_GROUP = 2
    lo = [max(p - window + 1, 0) if window else 0 for p in positions]
    if per == 0:
        waves = math.ceil(len(positions) * heads / nwarps)
        t["attend"] += waves * (max(p - l for p, l in zip(positions, lo)) + 1) * hd / 64
        return
    chunks = [p // CHUNK - l // CHUNK + 1 for p, l in zip(positions, lo)]
    passes = math.ceil(max(chunks) / per)
    for pass_ in range(passes):
        units = []  # visible slots of each unit of this pass
        for p, l, n in zip(positions, lo, chunks):
            for j in range(pass_ * per, min(n, (pass_ + 1) * per)):
                base = (l // CHUNK + j) * CHUNK
                units += [min(p, base + CHUNK - 1) - max(l, base) + 1] * pairs
        if units:
            t["attend"] += math.ceil(len(units) / nwarps) * max(units) * hd / 64
        if max(chunks) > 1:
            t["phase"] += int(pass_ + 1 < passes)  # the barrier between passes (the fold's state)
            t["attend"] += min(per, max(chunks) - pass_ * per)  # the last unit's fold, its heads side by side


def _add(a, b, k=1.0):
    return {key: a[key] + k * b[key] for key in TERMS}


def tiles_of(prompts, tile_rows, wanted_from=None):
    """The prefill tiles of prompts (lengths): rows in program order, tile_rows at a time; each
    tile's (positions, wanted rows: the prompts' last rows in it, or with wanted_from, each prompt's
    rows from that position on: scoring's teacher-forced rows)."""
    first = [n - 1 for n in prompts] if wanted_from is None else wanted_from
    rows = [(p, p >= f) for n, f in zip(prompts, first) for p in range(n)]
    return [([p for p, _ in rows[i:i + tile_rows]], sum(w for _, w in rows[i:i + tile_rows]))
            for i in range(0, len(rows), tile_rows)]


def launch_terms(plan, cfg, geo, sms, batch, prompt, steps, first_pos=None):
    """Counts of one launch: the prompts' tiles (prompt > 0), then `steps` decode steps of `batch`
    rows from position first_pos (default: prompt)."""
    t = dict.fromkeys(TERMS, 0.0)
    t["launch"] = 1.0
    if prompt:
        for positions, wanted in tiles_of([prompt] * batch, geo["tile_rows"]):
            t = _add(t, tile_terms(plan, cfg, geo, sms, positions, wanted, pick=steps >= 0))
    pos0 = prompt if first_pos is None else first_pos
    for i in range(max(steps, 0)):
        for r0 in range(0, batch, geo["tile_rows"]):
            n = min(geo["tile_rows"], batch - r0)
            t = _add(t, tile_terms(plan, cfg, geo, sms, [pos0 + i] * n, n, pick=True, distinct=True))
    return t


def run_terms(run, c):
    """The counts of a measured run (benchmarks/gpu_runs/*.json) and the seconds it measured."""
    from bench_gpu import PROMPT_LEN

    cfg = shape_config(run["shape"], run.get("config"), run.get("layers"))
    plan = layer_plan(cfg)
    geo = dict(c.geometry, **run.get("geometry", {}))
    geo["area_rows"] = area_rows(c, cfg, geo)  # as predict: the planner's rule
    prompt, b = run.get("prompt", PROMPT_LEN), run["batch"]
    kind = run["kind"]
    if kind == "step":  # (64 steps - 1 step) / 63: 63 steps at positions prompt..prompt+62
        t = launch_terms(plan, cfg, geo, c.sms, b, 0, 63, first_pos=prompt)
        t["launch"] = 0.0
        return {k: v / 63 for k, v in t.items()}, run["ms"] / 1e3
    if kind == "prefill+1":
        return launch_terms(plan, cfg, geo, c.sms, b, prompt, 0), run["ms"] / 1e3
    if kind == "generate":  # 128 tokens: the prompt's pick, then 127 steps
        return launch_terms(plan, cfg, geo, c.sms, b, prompt, 127), b * 128 / run["tok_s"]
    if kind == "decode_step":  # one step, logits out, no pick
        t = tile_terms(plan, cfg, geo, c.sms, [prompt] * b, b, pick=False, distinct=True)
        t["launch"] = 1.0
        return t, run["ms"] / 1e3
    raise ValueError(f"gpu_model: unknown run kind {kind!r}")


# ---- the fit --------------------------------------------------------------------------------------
def load_runs(path):
    data = json.loads(Path(path).read_text())
    return data, data["runs"]


def fit(c, runs):
    """Non-negative least squares on relative error: {term: seconds per count}."""
    import numpy as np
    from scipy.optimize import nnls

    rows, target = [], []
    for run in runs:
        terms, seconds = run_terms(run, c)
        rows.append([terms[k] / seconds for k in TERMS])
        target.append(1.0)
    a = np.array(rows)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, np.array(target))
    return {k: float(v) for k, v in zip(TERMS, coef / scale)}


def fitted(name):
    """(card, constants): the card and the constants fitted to its measured runs."""
    c = card(name)
    return c, fit(c, load_runs(RUNS / c.runs)[1])


def seconds(terms, constants):
    return sum(terms[k] * constants[k] for k in TERMS)


def describe(run):
    what = [run["shape"], f"b{run['batch']}"]
    if "layers" in run:
        what.append(f"{run['layers']} layers")
    for key in ("config", "geometry"):
        if key in run:
            what.append(", ".join(f"{k}={v}" for k, v in run[key].items()))
    if "prompt" in run:
        what.append(f"prompt {run['prompt']}")
    return " ".join(what)


def cmd_fit(args):
    c = card(args.card)
    data, runs = load_runs(args.runs or RUNS / c.runs)
    constants = fit(c, runs)
    print(f"gpu_model: {c.name}, fitted to {len(runs)} runs of {data['date']} (main at {data['commit']})")
    print("constants: " + ", ".join(f"{k} {v * 1e6:.4g} us" if k in ("phase", "launch") else f"{k} {v:.4g} s"
                                    for k, v in constants.items()))
    print("| run | kind | measured | predicted | predicted / measured |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for run in runs:
        terms, measured = run_terms(run, c)
        pred = seconds(terms, constants)
        if run["kind"] == "generate":
            m, p, unit = run["tok_s"], run["batch"] * 128 / pred, "tok/s"
        else:
            m, p, unit = measured * 1e3, pred * 1e3, "ms"
        ratio = pred / measured
        worst = max(worst, abs(ratio - 1))
        print(f"| {describe(run)} | {run['kind']} | {m:,.3f} {unit} | {p:,.3f} {unit} | {ratio:.2f} |")
    print(f"largest error: {100 * worst:.1f}%")
    return 0 if worst <= args.tolerance else 1


# ---- predictions ----------------------------------------------------------------------------------
def _launch_setup(c, constants, shape, geometry=None, overrides=None):
    """(cfg, plan, geo, constants) of a predicted launch: the card's geometry with the given fields,
    the planner's area rows, and with geometry barrier 1 every phase the counter's measured gain
    faster (every phase ends at a grid barrier); None where the tile does not fit the card."""
    cfg = shape_config(shape, overrides)
    plan = layer_plan(cfg)
    geo = dict(c.geometry, **(geometry or {}))
    geo["area_rows"] = area_rows(c, cfg, geo)
    if not geo["area_rows"]:
        return None
    if geo.get("barrier"):
        constants = dict(constants, phase=max(constants["phase"] - COUNTER_SAVES_S, 0.0))
    return cfg, plan, geo, constants


def predict(c, constants, shape, batch=1, position=50, prompt=0, geometry=None, overrides=None):
    """(seconds, tokens/s): one decode step of `batch` rows at `position`, or with `prompt`, the
    prefill of `batch` prompts of that length (tokens/s = prompt tokens per second); None where the
    geometry's tile does not fit the card (tile_fits)."""
    setup = _launch_setup(c, constants, shape, geometry, overrides)
    if setup is None:
        return None
    cfg, plan, geo, constants = setup
    if prompt:
        t = launch_terms(plan, cfg, geo, c.sms, batch, prompt, 0)
        s = seconds(t, constants)
        return s, batch * prompt / s
    t = launch_terms(plan, cfg, geo, c.sms, batch, 0, 1, first_pos=position)
    t["launch"] = 0.0  # a step inside a launch
    s = seconds(t, constants)
    return s, batch / s


def predict_score(c, constants, shape, pairs, context, continuation, geometry=None):
    """(seconds, continuation tokens/s) of MegaModel.score_batch over `pairs` (at most 16, one
    launch) pairs of context + continuation tokens: one forward launch of context + continuation - 1
    rows a pair (scoring.py), the rows from the context's last on through the head, no pick; None
    where the geometry's tile does not fit the card."""
    setup = _launch_setup(c, constants, shape, geometry)
    if setup is None:
        return None
    cfg, plan, geo, constants = setup
    t = dict.fromkeys(TERMS, 0.0)
    t["launch"] = 1.0
    fed = [context + continuation - 1] * pairs
    for positions, wanted in tiles_of(fed, geo["tile_rows"], wanted_from=[context - 1] * pairs):
        t = _add(t, tile_terms(plan, cfg, geo, c.sms, positions, wanted, pick=False))
    s = seconds(t, constants)
    return s, pairs * continuation / s


def cmd_predict(args):
    c, constants = fitted(args.card)
    geometry = {"attn": args.attn, "ahead": args.ahead, "barrier": args.barrier, "outs": args.outs,
                "area_rows": args.area_rows}
    if args.tile_rows:
        geometry["tile_rows"] = args.tile_rows
    got = predict(c, constants, args.shape, args.batch, args.position, args.prompt, geometry=geometry)
    if got is None:
        sys.exit(f"gpu_model: {'the asked area_rows' if args.area_rows else 'not even one row'} of {args.shape} "
                 f"does not fit a block's shared memory on the {c.name}")
    s, tok_s = got
    what = f"prefill of {args.batch} x {args.prompt} tokens" if args.prompt else \
        f"decode step, batch {args.batch}, position {args.position}"
    print(f"{c.name} {args.shape} {what}: {s * 1e3:.3f} ms, predicted {tok_s:,.0f} tok/s")


WHATIF = (
    # (name, what changes: a geometry, constants set or scaled) — each a GPU issue's change
    ("today", "the design measured 2026-12-04", {}),
    ("epilogue per lane (landed)", "each input row's output written by its own lane, the tree spreading the rows "
     "over the warp (since 2026-12-06; lane 0 wrote them in turn): an item counted once whatever its rows, the most "
     "this can save if the fitted per-row item cost is the epilogue", {"geometry": {"epilogue": "lane"}}),
    ("split attention (issue 48, as landed)", "geometry attn 32: (row, KV head, query pair, chunk) units over "
     "every warp, past one chunk the last unit of a (row, pair) folding its heads in the same phase (since "
     "2026-12-07; a fold phase before), at the per-slot cost fitted to attn 0 (the walk that loads one key at a "
     "time)", {"geometry": {"attn": 32}}),
    ("+ streamed keys (issue 48)", "and units that stream their keys (since 2026-12-05: 16-byte panel loads for the "
     "query heads of a KV head, trees in registers): a slot at 1/8 of today's time, an estimate",
     {"geometry": {"attn": 32}, "attend": 1 / 8}),
    ("weights ahead (issue 50)", "geometry ahead 16: each GEMV phase's first ring stages copied, and 16 KB a "
     "warp hinted into L2, before the barrier it waits at: an item at half its fitted cost (an L2 hit against a "
     "DRAM round trip), an estimate", {"geometry": {"ahead": 16}}),
    ("monotonic barrier (issue 50)", "geometry barrier 1: one reduction a block into a 64-bit count that is "
     "never reset; each phase 0.83 us shorter, the difference the H200 measured between the two barriers",
     {"geometry": {"barrier": 1}}),
    ("outs 4 (issue 49)", "geometry outs 4: a warp streams 4 weight rows at once, each "
     "input value it loads feeding all of them: its items and each input row's extra cost at 1 / outs, an estimate",
     {"geometry": {"outs": 4}}),
    ("prompt tiles of 64 (issue 49)", "geometry tile_rows 64: a 1,000-token prompt in 16 tiles' phases and "
     "attention walks, not 63; each weight row streamed once per 16 rows (the passes after the first counted as "
     "DRAM bytes, though SmolLM2's come from L2); Llama-1B's 64 rows of hidden 2,048 do not fit a block, so its "
     "phase area holds 16 at a time (geometry area_rows)", {"geometry": {"tile_rows": 64}}),
    ("phases of 3 us (issue 50)", "each phase's fixed latency from ~15 us to 3 us (the 1.0 us counter wait and "
     "2 us of its own path)", {"phase_us": 3.0}),
    ("rows per weight read (issue 49)", "a register-tiled multi-row GEMV: the per-row cost / 8",
     {"row": 1 / 8, "item": 1 / 8}),
    ("all", "the epilogue per lane, streamed split attention, weights ahead, 3 us phases (the monotonic barrier "
     "among them), rows per weight read",
     {"geometry": {"attn": 32, "epilogue": "lane", "ahead": 16}, "attend": 1 / 8, "phase_us": 3.0, "row": 1 / 8,
      "item": 1 / 8}),
)


def whatif_seconds(c, constants, shape, batch, position, prompt, change):
    """(seconds, tok/s) with the change, or None where its geometry does not fit the card."""
    k = dict(constants)
    if "phase_us" in change:
        k["phase"] = change["phase_us"] * 1e-6
    for term in ("row", "item", "attend"):
        if term in change:
            k[term] *= change[term]
    return predict(c, k, shape, batch, position, prompt, geometry=change.get("geometry"))


def cmd_whatif(args):
    c, constants = fitted(args.card)
    cases = [("SmolLM2-135M", 1, p, 0) for p in (50, 1000, 4000, 16000)] + \
            [("Llama-3.2-1B", 1, p, 0) for p in (50, 1000, 4000, 16000)] + \
            [("SmolLM2-135M", 16, 50, 0), ("Llama-3.2-1B", 16, 50, 0), ("SmolLM2-135M", 1, 0, 1000),
             ("Llama-3.2-1B", 1, 0, 1000)]
    print(f"Predicted, not measured ({c.name}; constants fitted to {c.runs}). tok/s of a decode step "
          "(batch x steps/s), or of a prefill (prompt tokens/s):")
    print("| case | " + " | ".join(name for name, _, _ in WHATIF) + " |")
    print("|---|" + "---|" * len(WHATIF))
    for shape, batch, position, prompt in cases:
        label = f"{shape} b{batch} " + (f"prefill {prompt}" if prompt else f"position {position:,}")
        cells = [f"{r[1]:,.0f}" if (r := whatif_seconds(c, constants, shape, batch, position, prompt, ch)) else "-"
                 for _, _, ch in WHATIF]
        print(f"| {label} | " + " | ".join(cells) + " |")
    for name, what, _ in WHATIF[1:]:
        print(f"- {name}: {what}")


# The default geometry as landed (each input row's output on its own lane), and with every landed
# switch on: split attention, weights ahead, the monotonic barrier, 4 weight rows a warp at once,
# prompt tiles of 64 (the planner's area rows).
LANDED = {"epilogue": "lane"}
SWITCHES = dict(LANDED, attn=32, ahead=16, barrier=1, outs=4, tile_rows=64)
SIZES = [(shape, 1, 0, n) for shape in ("SmolLM2-135M", "Llama-3.2-1B") for n in (16, 256, 1024, 4096)] + \
        [(shape, b, 50, 0) for shape in ("SmolLM2-135M", "Llama-3.2-1B") for b in (1, 4, 8, 16)]
# score_batch's case (issue 49): 16 pairs of 96 context + 32 continuation tokens, as
# benchmarks/bench_scoring.py and gpu_profile.py's score rows run it.
SCORE = (16, 96, 32)


def cmd_sizes(args):
    """Issue 49's prompt lengths and batch sizes: the design measured 2026-12-04, the default geometry
    as landed, and every landed switch on."""
    c, constants = fitted(args.card)
    print(f"Predicted, not measured ({c.name}; constants fitted to {c.runs}). tok/s of a prefill (prompt "
          "tokens/s) or a decode step at position 50 (batch x steps/s):")
    print("| case | measured design | default geometry (landed) | every landed switch on | switches / measured |")
    print("|---|---|---|---|---|")
    for shape, batch, position, prompt in SIZES:
        label = f"{shape} " + (f"prefill {prompt:,}" if prompt else f"decode b{batch}")
        got = [predict(c, constants, shape, batch, position, prompt, geometry=g) for g in ({}, LANDED, SWITCHES)]
        cells = [f"{r[1]:,.0f}" for r in got]
        print(f"| {label} | " + " | ".join(cells) + f" | {got[2][1] / got[0][1]:.1f}x |")
    pairs, context, continuation = SCORE
    for shape in ("SmolLM2-135M", "Llama-3.2-1B"):
        got = [predict_score(c, constants, shape, pairs, context, continuation, geometry=g)
               for g in ({}, LANDED, SWITCHES)]
        cells = [f"{r[1]:,.0f}" for r in got]
        print(f"| {shape} score_batch {pairs} x ({context} + {continuation}), continuation tok/s | "
              + " | ".join(cells) + f" | {got[2][1] / got[0][1]:.1f}x |")
    print("- switches: " + ", ".join(f"{k} {v}" for k, v in SWITCHES.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    f = sub.add_parser("fit", help="fit the constants, print measured beside predicted")
    f.add_argument("--card", default="h200")
    f.add_argument("--runs", help="a benchmarks/gpu_runs/*.json (default: the card's)")
    f.add_argument("--tolerance", type=float, default=0.25, help="exit 1 when a run is predicted further off")
    p = sub.add_parser("predict", help="one prediction")
    p.add_argument("--card", default="h200")
    p.add_argument("--shape", default="SmolLM2-135M")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--position", type=int, default=50, help="decode at this position")
    p.add_argument("--prompt", type=int, default=0, help="instead, the prefill of a prompt of this length")
    p.add_argument("--attn", type=int, default=0, help="geometry attn: 0 a warp per query head, C split attention")
    p.add_argument("--ahead", type=int, default=0, help="geometry ahead: KB of weights a warp requests before a "
                   "GEMV phase's barrier (0 off)")
    p.add_argument("--barrier", type=int, default=0, choices=(0, 1),
                   help="geometry barrier: 0 the generation barrier, 1 the monotonic counter")
    p.add_argument("--outs", type=int, default=0, choices=(0, 1, 2, 4),
                   help="geometry outs: weight rows a warp streams at once (0 or 1: one)")
    p.add_argument("--tile-rows", type=int, default=0, choices=(0, 1, 2, 4, 8, 16, 32, 64, 128),
                   help="geometry tile_rows: rows carried through the layers together (0: the card's default)")
    p.add_argument("--area-rows", type=int, default=0, choices=(0, 1, 2, 4, 8, 16, 32, 64, 128),
                   help="geometry area_rows: rows of the tile a block's shared memory holds at once (0: the most "
                        "that fit)")
    w = sub.add_parser("whatif", help="the GPU issues' changes, predicted")
    w.add_argument("--card", default="h200")
    z = sub.add_parser("sizes", help="prompt lengths and batch sizes: measured design, landed default, switches on")
    z.add_argument("--card", default="h200")
    args = ap.parse_args(argv)
    if args.cmd == "predict":
        if args.batch < 1 or args.batch > 16 or args.position < 0 or args.prompt < 0 or not 0 <= args.attn <= 32 \
                or not 0 <= args.ahead <= 256:
            sys.exit("gpu_model: --batch must be 1..16, --position and --prompt non-negative, --attn 0..32, "
                     "--ahead 0..256")
        return cmd_predict(args)
    if args.cmd == "whatif":
        return cmd_whatif(args)
    if args.cmd == "sizes":
        return cmd_sizes(args)
    if args.cmd is None:
        args = ap.parse_args(["fit"] + (argv or sys.argv[1:]))
    return cmd_fit(args)


if __name__ == "__main__":
    sys.exit(main())
