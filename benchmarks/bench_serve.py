#!/usr/bin/env python3
"""The server under load (scripts/serve.py, docs/RESULTS.md §12): --clients random requests (prompts,
lengths, sampling settings, streaming, n, arrival times) sent one at a time, then all concurrently
with arrivals spread over --spread seconds; every answer of both runs checked against `generate` on
that request alone (tokens, text, logprobs); throughput and latency percentiles of the two runs side
by side.

    .venv/bin/python benchmarks/bench_serve.py [MODEL] [--clients 64] [--max-tokens 48] [--max-batch 16]

MODEL: a model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompt-len", type=int, default=120)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--spread", type=float, default=2.0, help="seconds over which the concurrent clients arrive")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel
    from det_fixtures import real_models
    from det_fixtures.server import Server, answer_of, expected, post, random_client

    di = get_kernel("phanerozoic/det-infer", version=1)
    model = args.model or real_models.smollm2_checkpoint()
    mm = di.MegaModel.load(str(model), max_context=2048)
    offline = (mm, mm.tokenizer())
    rng = random.Random(args.seed)
    clients = [random_client(rng, mm.config.vocab_size, args.max_tokens, args.prompt_len) for _ in range(args.clients)]
    delays = [rng.random() * args.spread for _ in clients]

    def one(client, delay=0.0):
        path, body = client
        time.sleep(delay)
        t0 = time.perf_counter()
        with post(srv.url, path, body, stream=body["stream"], timeout=3600) as r:
            answer = answer_of(path, body, r)
        return answer, time.perf_counter() - t0  # latency: from its arrival to the answer's last byte

    runs = {}
    with Server(model, "--max-batch", args.max_batch, "--max-context", 2048) as srv:
        one(clients[0])  # warm: weights paged in, threads started
        t = time.perf_counter()
        runs["one at a time"] = ([one(c) for c in clients], time.perf_counter() - t)
        t = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(one, clients, delays))
        runs[f"{args.clients} concurrent"] = (results, time.perf_counter() - t)
    print(f"checking {2 * len(clients)} answers against generate alone ...", flush=True)
    tok = offline[1]
    for i, client in enumerate(clients):
        want = expected(offline, *client)
        for name, (results, _) in runs.items():
            for (text, lps, cert, _), (tokens, logprobs) in zip(results[i][0], want):
                assert cert["tokens"] == tokens, f"{name}: client {i} differs from generate alone"
                assert text == tok.decode(tokens, skip_special_tokens=True), f"{name}: client {i}'s text"
                assert lps is None or lps == logprobs, f"{name}: client {i}'s logprobs"
    print("every answer equals generate on its request alone")
    figures = {}
    for name, (results, wall) in runs.items():
        tokens = sum(len(c[2]["tokens"]) for r in results for c in r[0])
        lat = [r[1] for r in results]
        figures[name] = {"wall_s": wall, "completion_tokens": tokens, "tok_per_s": tokens / wall,
                         "latency_p50_s": statistics.median(lat), "latency_p90_s": percentile(lat, 90),
                         "latency_p99_s": percentile(lat, 99)}
    print(f"{'run':<16} {'wall s':>8} {'tokens':>7} {'tok/s':>7} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7}")
    for name, f in figures.items():
        print(f"{name:<16} {f['wall_s']:8.2f} {f['completion_tokens']:7d} {f['tok_per_s']:7.1f} "
              f"{f['latency_p50_s']:7.2f} {f['latency_p90_s']:7.2f} {f['latency_p99_s']:7.2f}")
    a, b = figures.values()
    print(f"throughput ratio (concurrent / one at a time): {b['tok_per_s'] / a['tok_per_s']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
