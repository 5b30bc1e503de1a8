#!/usr/bin/env python3
"""Offline generation on Ray Data against the number of actors (di.ray_data, docs/RESULTS.md §14):
the same --rows prompts through di.ray_data.generate on a local Ray cluster of this machine's CPUs,
with each actor layout in turn, and once in this process with di.rows.RowGenerator (no Ray) for scale. Every
run's rows are checked against the first (tokens and certificate roots equal, row by row); rows/s
and tokens/s per layout are the median of --repeat runs, each including the actors' start and model
load (what a user waits for).

    .venv/bin/python benchmarks/bench_ray.py [MODEL] [--rows 64] [--max-new 32] [--repeat 3]

MODEL: a model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct).
"""
import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=48, help="prompts of 8 to this many tokens")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from det_fixtures import real_models
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    model = str(args.model or real_models.smollm2_checkpoint())
    mm = di.MegaModel.load(model, max_context=args.prompt_len + args.max_new)
    rng = random.Random(1)
    items = [{"id": i, "prompt_ids": [rng.randrange(3, mm.config.vocab_size) for _ in range(rng.randint(8, args.prompt_len))]}
             for i in range(args.rows)]
    cpus = os.cpu_count()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")

    # (label, actors, CPUs per actor: Ray sets an actor's OMP_NUM_THREADS, the engine's threads, to
    # them). from_items needs no read tasks, so actors may hold every CPU without starving Ray.
    layouts = [("1 actor x 1 thread", 1, 1)]
    if cpus >= 2:
        layouts += [(f"1 actor x {cpus} threads", 1, cpus), (f"{cpus} actors x 1 thread", cpus, 1)]
    figures, reference = [], None

    def check(rows):
        nonlocal reference
        got = {r["id"]: (list(r["tokens"]), r["certificate_root"]) for r in rows}
        assert all(r["error"] is None for r in rows), [r["error"] for r in rows if r["error"]][:1]
        if reference is None:
            reference = got
        assert got == reference, "a layout gave different rows"
        return sum(len(t) for t, _ in got.values())

    for label, actors, num_cpus in layouts:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rows = di.ray_data.generate(ray.data.from_items(items), model, max_new=args.max_new,
                                        max_context=args.prompt_len + args.max_new, concurrency=actors,
                                        num_cpus=num_cpus, batch_size=16).take_all()
            times.append(time.perf_counter() - t0)
            tokens = check(rows)
        figures.append((label, statistics.median(times), tokens))

    # In this process, for scale: RowGenerator (generate_batch per 16 rows), all threads, certificate roots too.
    ray.shutdown()
    gen = di.rows.RowGenerator(mm, max_new=args.max_new)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = gen({"prompt_ids": [r["prompt_ids"] for r in items]})
        times.append(time.perf_counter() - t0)
    check([{"id": r["id"], "tokens": t, "certificate_root": c, "error": e}
           for r, t, c, e in zip(items, out["tokens"], out["certificate_root"], out["error"])])
    figures.append((f"no Ray: RowGenerator in this process, {cpus} threads", statistics.median(times),
                    sum(len(t) for t in out["tokens"])))

    print(f"{args.rows} rows, prompts 8-{args.prompt_len} tokens, max_new {args.max_new}, greedy, "
          f"{os.path.basename(model.rstrip('/'))}; median of {args.repeat}, actors' start and load included")
    print("| layout | seconds | rows/s | tokens/s |\n|---|---|---|---|")
    for label, t, tokens in figures:
        print(f"| {label} | {t:.1f} | {args.rows / t:.2f} | {tokens / t:.1f} |")
    print("every layout's rows identical (tokens and certificate roots, row by row)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"layout": lbl, "seconds": t, "rows": args.rows, "tokens": n} for lbl, t, n in figures], f,
                      indent=1)


if __name__ == "__main__":
    main()
