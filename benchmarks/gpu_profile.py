#!/usr/bin/env python3
"""Where the megakernel's time goes on a GPU: the profile stage of scripts/device_check.sh.

Models of bench_gpu.py's shapes with random bf16 weights made on the device. Per-step times are
differences of two launches, (generate_batch of n steps - of 1 step) / (n - 1), so the launch and
the prompt cancel; medians of --reps. Printed as markdown tables, each measured figure beside
benchmarks/gpu_model.py's prediction for the card its constants were fitted to (H200):
  layers    per-step ms against the layer count (1, 2, 4, 8, 16, all), batch 1
  context   per-step ms at positions ~50, ~1,000 and ~4,000, batch 1 (the steps start there: the
            cache before them holds zeros, which costs the attention the same as real keys), with
            geometry attn 0 (a warp per query head) and 32 (split over the grid)
  ahead     per-step ms at batch 1 and 16, and the long prompt's prefill, with geometry ahead 16
            (each GEMV phase's weights requested before its barrier) beside ahead 0
  barrier   per-step ms at batch 1 and 16 with geometry barrier 1 (the monotonic counter)
  outs      per-step ms at batch 1 and 16, and the long prompt's prefill, with geometry outs 4 (a
            warp streams 4 weight rows at once)
  stage     per-step ms at batch 1 and 16 with geometry stage 1 (the output projections' inputs
            copied to shared memory once per block; gpu_model has no term for it)
  tiles     the long prompt's prefill with geometry tile_rows 64 (prompt tiles; refused where 64
            rows do not fit a block's shared memory)
  all       every switch above on at once: per-step ms at batch 1, 4, 8 and 16, and the long
            prompt's prefill (gpu_model.py sizes' last column)
  batch     per-step ms of the whole model at batch 16
  score     score_batch of 16 pairs of 96 context + 32 continuation tokens (one call: continuation
            tokens/s) at the default geometry and with every switch, beside the CPU engine on this
            machine's cores with the same weights (shapes under 1 GB of weights): issue 49's "10x the
            CPU engine's"
  sampled   per-step ms of seeded sampling (temperature 1; with top_k 50; with top_p 0.9; temperature
            0.1, where the random logits spread as a trained model's) at batch 1 and 16 beside
            greedy, 4 steps, one repetition (--quick: batch 1, temperature 1): the block ranks the
            candidates by a radix sort
  prefill   tokens/s of a 16- and a 1,000-token prompt (one launch, prompt and first pick)
  timeline  one launch with the phase timeline on (det_infer.profiling): per kind of phase, its
            median length; from a block's own start, when its inputs were staged and its fastest
            and slowest warps were done (medians over blocks: the phase's anatomy, issue 50's
            unexplained fixed cost); how long the fastest block waited for the slowest; the
            barrier's release; under emulation also the work profile: busy warps, the busiest warp
            against the mean
--ncu-target runs only what Nsight Compute profiles (a prompt, then 4 decode steps of the first
shape, one launch each; device_check's ncu stage picks the 5th launch: one decode step);
--ncu-prefill N one prefill of N tokens with attn 32 and tile_rows 64 (the stage's prompt profile).

    LOCAL_KERNELS=phanerozoic/det-infer=$PWD/build python3 benchmarks/gpu_profile.py [--models ...]
    ... --executor emulated --models synthetic-llama --quick    (the dry run: emulated, tiny, CI)
"""
import argparse
import importlib
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_gpu import PROMPT_LEN, SHAPES, _shape, config, random_weights, sync  # noqa: E402
import gpu_model  # noqa: E402  (stdlib at import; the kernel only when it predicts)


GREEDY = (0.0, 0, 1.0, 0.0, 0)  # generate's temperature, top_k, top_p, min_p, seed


class Bench:
    """One shape on one executor: models by layer count, timed launches."""

    def __init__(self, di, name, device, executor, reps, max_context, geometry=None):
        self.di, self.name, self.device, self.executor, self.reps = di, name, device, executor, reps
        self.geometry = geometry
        self.max_context = max_context
        self.models = {}

    def model(self, layers=None, attn=0):
        cfg = config(self.name)
        layers = layers or cfg["num_hidden_layers"]
        if (layers, attn) not in self.models:
            self.models.clear()  # one model on the device at a time
            cfg["num_hidden_layers"] = layers
            cfg["max_position_embeddings"] = max(cfg.get("max_position_embeddings", 0), self.max_context)
            mc = self.di.ModelConfig.from_dict(cfg)
            geometry = dict(self.geometry or {}, attn=attn) if attn else self.geometry
            self.models[(layers, attn)] = self.di.MegaModel(mc, random_weights(self.di, mc, self.device),
                                                            device=self.device, max_context=self.max_context,
                                                            executor=self.executor, geometry=geometry)
        return self.models[(layers, attn)]

    def launch(self, mm, batch, prompt_len, max_new, start=0, geo=None, sampling=GREEDY):
        """Seconds of one generate launch: batch prompts of prompt_len tokens at positions
        start.., then max_new - 1 decode steps; geo: geometry fields set for this launch only;
        sampling: (temperature, top_k, top_p, min_p, seed)."""
        di_ops = self.di.ops
        vocab = mm.config.vocab_size
        prompts = [[(31 * b + 7 * i) % (vocab - 3) + 3 for i in range(prompt_len)] for b in range(batch)]
        _, args, _, _ = mm._generate_args(prompts, max_new, False, None, False, *sampling)
        args = list(args)
        if start:
            args[3] = torch.full((batch,), start, dtype=torch.int64)
            args[4] = [mm._new_kv(start + prompt_len + max_new).cache for _ in range(batch)]
        sync(self.device)
        t = time.perf_counter()
        geometry = mm._geometry_list()
        for key, value in (geo or {}).items():
            geometry[list(mm.geometry).index(key)] = value
        di_ops.mega_generate(*args, geometry)
        sync(self.device)
        return time.perf_counter() - t

    def median(self, f):
        f()  # warm-up
        return statistics.median(f() for _ in range(self.reps))

    def step_ms(self, layers=None, batch=1, start=0, steps=64, attn=0, sampling=GREEDY, **geo):
        mm = self.model(layers, attn)
        long = self.median(lambda: self.launch(mm, batch, PROMPT_LEN, steps, start, geo, sampling))
        one = self.median(lambda: self.launch(mm, batch, PROMPT_LEN, 1, start, geo, sampling))
        return 1e3 * (long - one) / (steps - 1)

    def prefill_tok_s(self, prompt_len, attn=0, **geo):
        mm = self.model(attn=attn)
        return prompt_len / self.median(lambda: self.launch(mm, 1, prompt_len, 1, geo=geo))


def predictor(card):
    """Three functions (shape, **what) -> predicted ms or tok/s from gpu_model, or None where it
    cannot say: a decode step's ms, a prefill's tok/s, score_batch's continuation tok/s."""
    c, constants = gpu_model.fitted(card)

    # The kernel measured is the landed one (gpu_model.LANDED: each row's output on its own lane).
    def step(shape, layers=None, batch=1, position=PROMPT_LEN + 31, attn=0, **geo):
        if shape not in SHAPES:
            return None
        overrides = {"num_hidden_layers": layers} if layers else None
        got = gpu_model.predict(c, constants, shape, batch, position, geometry=dict(gpu_model.LANDED, **geo, attn=attn),
                                overrides=overrides)
        return got and 1e3 * got[0]

    def prefill(shape, prompt, attn=0, **geo):
        if shape not in SHAPES:
            return None
        got = gpu_model.predict(c, constants, shape, 1, prompt=prompt, geometry=dict(gpu_model.LANDED, **geo, attn=attn))
        return got and got[1]

    def score(shape, pairs, context, continuation, **geo):
        if shape not in SHAPES:
            return None
        got = gpu_model.predict_score(c, constants, shape, pairs, context, continuation,
                                      geometry=dict(gpu_model.LANDED, **geo))
        return got and got[1]

    return step, prefill, score


ATTN = (0, 32)  # the attention's geometry: a warp per query head, and split over the grid (issue 48)
AHEAD = 16  # KB a warp requests ahead of a GEMV phase, measured beside 0 (issue 50)
OUTS = 4  # weight rows a warp streams at once, measured beside 1 (issue 49)
TILE = 64  # rows of a prompt tile, measured beside the planner's (issue 49)
# The geometry switches measured beside the defaults: (label, geometry, batches of its per-step
# rows, whether the long prompt's prefill (attn 32) too, whether gpu_model has a term for it).
SWITCHES = (
    (f"ahead {AHEAD}", {"ahead": AHEAD}, (1, 16), True, True),  # issue 50
    ("barrier 1", {"barrier": 1}, (1, 16), False, True),  # issue 50
    (f"outs {OUTS}", {"outs": OUTS}, (1, 16), True, True),  # issue 49
    ("stage 1", {"stage": 1}, (1, 16), False, False),  # issue 49: the model has no term for input reads
    (f"tile_rows {TILE}", {"tile_rows": TILE}, (), True, True),  # issue 49: prompt tiles
    # issues 48/49: each chunk's keys and values copied once per block for a prompt tile's rows
    (f"tile_rows {TILE}, stage 2", {"tile_rows": TILE, "stage": 2}, (), True, False),
    # Every switch on at once, split attention too: the geometry of gpu_model.py sizes' last column
    # (which has no term for stage; its steps are at position 50, its prompt 1,024 tokens).
    ("all switches", {"attn": 32, "ahead": AHEAD, "barrier": 1, "outs": OUTS, "stage": 3, "tile_rows": TILE},
     (1, 4, 8, 16), True, True),
)


def fmt(x, digits=3):
    return "n/a" if x is None else f"{x:,.{digits}f}"


def refused(f, digits):
    """f()'s value formatted, or why the launcher refused the geometry (a tile whose rows do not fit a
    block) instead of ending the stage."""
    try:
        return f"{f():,.{digits}f}"
    except ValueError as e:
        return f"refused ({str(e).splitlines()[0][:80]})"


def switch_rows(b, name, long_prompt, steps, pred_step, pred_prefill):
    """The SWITCHES' rows of one shape: per-step ms and the long prompt's prefill (attn 32 unless the
    switch sets it), each beside its prediction."""
    for label, geo, batches, prefill, modelled in SWITCHES:
        for batch in batches:
            pred = fmt(pred_step(name, batch=batch, **(geo if modelled else {})))
            ms = refused(lambda: b.step_ms(batch=batch, steps=steps, **geo), 3)
            print(f"| per step, batch {batch}, {label}, ms | {ms} | {pred}{'' if modelled else ' (no term)'} |",
                  flush=True)
        if prefill:
            long_geo = dict(geo, attn=geo.get("attn", 32))
            measured = refused(lambda: b.prefill_tok_s(long_prompt, **long_geo), 0)
            print(f"| prefill, {long_prompt}-token prompt, attn 32, {label}, tok/s | {measured} | "
                  f"{fmt(pred_prefill(name, long_prompt, **long_geo), 0)}{'' if modelled else ' (no term)'} |",
                  flush=True)


ENGINE_MAX_GB = 1.0  # the CPU engine scores beside the GPU for shapes of at most this many GB of weights


def score_rows(b, name, quick, pred_score):
    """score_batch's continuation tokens/s: the megakernel (b's executor) at its geometry and with
    every switch, then the CPU engine with the same weights on this machine's cores, and the ratio."""
    pairs, context, continuation = (4, 12, 4) if quick else gpu_model.SCORE
    mm = b.model()
    top = mm.config.vocab_size - 3
    work = [([(31 * p + 7 * i) % top + 3 for i in range(context)],
             [(17 * p + 5 * i) % top + 3 for i in range(continuation)]) for p in range(pairs)]
    what = f"score_batch, {pairs} pairs of {context} + {continuation} tokens"

    def rate(model, geo=None):
        plain = model.geometry
        if geo:  # this call only: the launcher checks the fields (a refusal is printed, not fatal)
            model.geometry = dict(plain, **geo)
        try:
            return pairs * continuation / b.median(lambda: timed(model, work, b.device))
        finally:
            model.geometry = plain

    all_geo = SWITCHES[-1][1]
    gpu = {}
    for label, geo in (("", None), (", all switches", all_geo)):
        cell = refused(lambda: rate(mm, geo), 0)
        gpu[label] = cell
        print(f"| {what}, {b.executor}{label}, continuation tok/s | {cell} | "
              f"{fmt(pred_score(name, pairs, context, continuation, **(geo or {})), 0)} |", flush=True)
    cfg = mm.config
    gb = 2 * sum(math.prod(_shape(cfg, n)) for n in b.di.names.llama_tensor_names(cfg)) / 1e9  # bf16
    if gb > ENGINE_MAX_GB:
        print(f"| {what}, CPU engine | not run ({gb:.1f} GB of weights) | |", flush=True)
        return
    engine = b.di.MegaModel(cfg, random_weights(b.di, cfg, "cpu"), device="cpu", max_context=b.max_context,
                            executor="engine")
    cpu = rate(engine)
    print(f"| {what}, CPU engine ({torch.get_num_threads()} threads), continuation tok/s | {cpu:,.0f} | |", flush=True)
    for label, cell in gpu.items():
        ratio = f"{float(cell.replace(',', '')) / cpu:.3g}x" if not cell.startswith("refused") else "n/a"
        print(f"| {what}, {b.executor}{label} / CPU engine | {ratio} | |", flush=True)


# Seeded sampling inside the launch (docs/SPEC.md §15): the block's threads compute z, m and e and
# rank the candidates (weights of at least 2^-24) by a radix sort, then warp 0 walks the ranks
# (megakernel/det_mk_sample.cuh). At temperature 1 the random weights' logits are flat: every id is
# a candidate and the walk takes every rank when no filter stops it (the worst case). At 0.1 they
# spread as a trained model's do at 1 (1,400-4,600 of SmolLM2's 49,152 ids are candidates, counted
# on the CPU engine; a real model's median is 7,228: bench_sampling.py --candidates). Measured per
# step beside greedy, a few steps and one repetition.
SAMPLED = (("temperature 1", (1.0, 0, 1.0, 0.0, 7)), ("temperature 1, top_k 50", (1.0, 50, 1.0, 0.0, 7)),
           ("temperature 1, top_p 0.9", (1.0, 0, 0.9, 0.0, 7)), ("temperature 0.1", (0.1, 0, 1.0, 0.0, 7)))
SAMPLED_STEPS = 4
SAMPLED_MAX_S = 8.0  # the rows stop once one takes longer than this


def sampled_rows(b, quick):
    """Per-step ms of seeded sampling at batch 1 and 16 beside greedy (the same few steps)."""
    reps, b.reps = b.reps, 1
    try:
        for batch in (1,) if quick else (1, 16):
            print(f"| per step, batch {batch}, greedy ({SAMPLED_STEPS} steps), ms | "
                  f"{b.step_ms(batch=batch, steps=SAMPLED_STEPS):.3f} | |", flush=True)
            for label, sampling in SAMPLED[:1] if quick else SAMPLED:
                t = time.perf_counter()
                ms = b.step_ms(batch=batch, steps=SAMPLED_STEPS, sampling=sampling)
                print(f"| per step, batch {batch}, sampled, {label}, ms | {ms:.3f} | |", flush=True)
                if time.perf_counter() - t > SAMPLED_MAX_S:
                    print(f"| sampled rows stopped: that row took over {SAMPLED_MAX_S:.0f} s | | |", flush=True)
                    return
    finally:
        b.reps = reps


def timed(model, work, device):
    sync(device)
    t = time.perf_counter()
    model.score_batch(work)
    sync(device)
    return time.perf_counter() - t


def profile(di, names, device, executor, reps, quick, card):
    pred_step, pred_prefill, pred_score = predictor(card)
    layer_counts = (1, 2) if quick else (1, 2, 4, 8, 16, None)
    positions = (50, 200) if quick else (50, 1000, 4000)
    long_prompt = 40 if quick else 1000
    steps = 4 if quick else 64
    print(f"predicted: benchmarks/gpu_model.py, constants fitted to the {card.upper()}'s measurements")
    for name in names:
        b = Bench(di, name, device, executor, reps, max_context=max(positions) + PROMPT_LEN + steps + 8)
        full = config(name)["num_hidden_layers"]
        print(f"\n### {name}\n\n| what | measured | predicted |\n|---|---|---|")
        for layers in layer_counts:
            if layers and layers >= full:
                continue
            n = layers or full
            print(f"| per step, {n} layers, batch 1, ms | {b.step_ms(layers, steps=steps):.3f} | "
                  f"{fmt(pred_step(name, layers=n))} |", flush=True)
        ctx_steps = min(steps, 16)  # a step at 4,000 positions takes ~0.1 s today
        for attn in ATTN:
            for pos in positions:
                start = max(pos - PROMPT_LEN - ctx_steps // 2, 0)
                print(f"| per step at position ~{pos:,}, batch 1, attn {attn}, ms | "
                      f"{b.step_ms(start=start, steps=ctx_steps, attn=attn):.3f} | "
                      f"{fmt(pred_step(name, position=start + PROMPT_LEN + ctx_steps // 2, attn=attn))} |", flush=True)
        print(f"| per step, batch 16, ms | {b.step_ms(batch=16, steps=steps):.3f} | "
              f"{fmt(pred_step(name, batch=16))} |", flush=True)
        for n in (PROMPT_LEN, long_prompt):
            print(f"| prefill, {n}-token prompt, tok/s | {b.prefill_tok_s(n):,.0f} | "
                  f"{fmt(pred_prefill(name, n), 0)} |", flush=True)
        print(f"| prefill, {long_prompt}-token prompt, attn 32, tok/s | {b.prefill_tok_s(long_prompt, attn=32):,.0f} | "
              f"{fmt(pred_prefill(name, long_prompt, attn=32), 0)} |", flush=True)
        switch_rows(b, name, long_prompt, steps, pred_step, pred_prefill)
        timeline(di, b.model(), steps=4 if quick else 8)
        print("\n| what | measured | predicted |\n|---|---|---|")
        score_rows(b, name, quick, pred_score)  # after the timeline, which a cut-short stage should keep
        sampled_rows(b, quick)
        b.models.clear()


def timeline(di, mm, steps):
    """The phase table of the decode steps of one launch (the prompt's tiles left out)."""
    prof = importlib.import_module(di.__name__ + ".profiling")
    tl = prof.phase_timeline(mm, [[3 + i for i in range(PROMPT_LEN)]], steps, capacity=4096)
    rows = prof.phases(tl, mm.layer_plan())
    first_pick = tl["tags"].index(-1) if -1 in tl["tags"] else len(rows)
    decode = rows[first_pick + 1:]
    if not decode:
        print("\ntimeline: no decode step recorded")
        return
    per_step = sum(r["phase_us"] for r in decode) / max(1, sum(r["kind"] == "pick" for r in decode))
    print(f"\nPhase timeline: {steps - 1} decode steps, batch 1, grid {tl['grid']}: {per_step:,.1f} us a step in "
          "phases\n")
    print(prof.phase_table(decode), flush=True)
    if mm.executor == "emulated":  # what each warp did, counted by the emulation (no GPU needed)
        wp = prof.work_profile(mm, [[3 + i for i in range(PROMPT_LEN)]], steps, capacity=4096)
        work = prof.work_rows(wp, mm.layer_plan())
        print(f"\nWork profile (emulated, grid {wp['grid']} x {mm.geometry['warps']} warps): per decode phase\n")
        print(prof.work_table(work[wp["tags"].index(-1) + 1:]), flush=True)


def ncu_target(di, name, device, executor):
    """What device_check's ncu stage profiles (--launch-skip 4 --launch-count 1): launch 1 fills a
    prompt, launches 2-5 are single decode steps; the 5th launch is one decode step at position 19."""
    b = Bench(di, name, device, executor, 1, max_context=PROMPT_LEN + 8)
    mm = b.model()
    state = mm.new_state(PROMPT_LEN + 8)
    mm.prefill([3 + i for i in range(PROMPT_LEN)], state)
    for i in range(4):
        mm.decode_step(5, PROMPT_LEN + i, state)
    sync(device)
    print("ncu target: a prompt, then 4 decode steps (5 launches) done")


NCU_PREFILL_GEOMETRY = {"attn": 32, "tile_rows": TILE}  # split attention, prompt tiles (issues 48, 49)


def ncu_prefill_target(di, name, device, executor, prompt_len):
    """What device_check's ncu stage profiles for a prompt (--launch-count 1, its first launch): one
    prefill of prompt_len tokens with split attention and prompt tiles, so that Nsight Compute shows
    whether the prompt rows' attention units wait on L2 bandwidth or on latency."""
    b = Bench(di, name, device, executor, 1, max_context=prompt_len + 8, geometry=NCU_PREFILL_GEOMETRY)
    mm = b.model()
    mm.prefill([3 + (7 * i) % 200 for i in range(prompt_len)], mm.new_state(prompt_len + 8))
    sync(device)
    print(f"ncu target: one prefill of {prompt_len} tokens, geometry {NCU_PREFILL_GEOMETRY}, done")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SHAPES),
                    help=f"comma-separated: {', '.join(SHAPES)}, or synthetic-<det_fixtures/synthetic.py family>")
    ap.add_argument("--executor", choices=["megakernel", "emulated"], default="megakernel")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="few points, short prompts (the dry run)")
    ap.add_argument("--card", default="h200", help="the card whose fitted constants predict")
    ap.add_argument("--ncu-target", action="store_true", help="only the launches the ncu stage profiles")
    ap.add_argument("--ncu-prefill", type=int, metavar="N", help="only one prefill of N tokens with attn 32 and "
                    "tile_rows 64 (the ncu stage's prompt profile)")
    args = ap.parse_args()
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    device = "cuda" if args.executor == "megakernel" else "cpu"
    names = args.models.split(",")
    if args.ncu_target:
        return ncu_target(di, names[0], device, args.executor)
    if args.ncu_prefill is not None:
        if args.ncu_prefill < 1:
            ap.error("--ncu-prefill must be a positive number of tokens")
        return ncu_prefill_target(di, names[0], device, args.executor, args.ncu_prefill)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU, emulated executor (dry run)"
    print(f"{where}: profile; per-step = (n steps - 1 step) / (n - 1), medians of {args.reps}")
    profile(di, names, device, args.executor, args.reps, args.quick, args.card)


if __name__ == "__main__":
    main()
