#!/usr/bin/env python3
"""The loaders' long fuzz run (docs/RESULTS.md records it): the seeded mutators of
tests/test_fuzz_safetensors.py and tests/test_fuzz_gguf.py, many more cases. Every case must load
(and run a forward pass) or raise a ValueError / FileNotFoundError starting with "det-infer:";
anything else is counted as a crash and printed.

    .venv/bin/python scripts/fuzz_loaders.py [--cases 100000] [--format safetensors|gguf|both] [--seed 1]
"""
import argparse
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(di, fmt, cases, seed, work):
    from det_fixtures import synthetic
    rng = random.Random(seed)
    if fmt == "safetensors":
        from det_fixtures.mutations import mutate_safetensors as _mutate

        base = synthetic.write_checkpoint("qwen3", os.path.join(work, "base"))
        blob = Path(base, "model.safetensors").read_bytes()
        case = Path(work, "case")
        case.mkdir(exist_ok=True)
        (case / "config.json").write_text(Path(base, "config.json").read_text())
        target, mutate = case / "model.safetensors", lambda: _mutate(rng, blob)

        def load():
            di.MegaModel.from_pretrained(str(case), max_context=64).teacher_forced_logits([5, 6, 7])
    else:
        import gguf
        from det_fixtures.mutations import mutate_gguf
        from det_fixtures.gguf_files import write_gguf

        path, _ = write_gguf("llama", "Q8_0", work)
        blob, header_len = Path(path).read_bytes(), gguf.GGUFReader(path).data_offset
        target, mutate = Path(work, "case.gguf"), lambda: mutate_gguf(rng, blob, header_len)

        def load():
            di.MegaModel.from_gguf(str(target), max_context=64).teacher_forced_logits([5, 6, 7])
    counts = {"loaded": 0, "refused": 0, "crashed": 0}
    t = time.time()
    for i in range(cases):
        target.write_bytes(mutate())
        try:
            load()
            counts["loaded"] += 1
        except (ValueError, FileNotFoundError) as e:
            if str(e).startswith("det-infer:"):
                counts["refused"] += 1
            else:
                counts["crashed"] += 1
                print(f"{fmt} case {i}: unclear error {e!r}", flush=True)
        except Exception as e:  # noqa: BLE001 - counting them is the point
            counts["crashed"] += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"{fmt} case {i}: {type(e).__name__}: {e} at {where.filename}:{where.lineno}", flush=True)
    print(f"{fmt}: {cases} cases in {time.time() - t:.0f} s: {counts}", flush=True)
    return counts["crashed"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--format", choices=["safetensors", "gguf", "both"], default="both")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    crashes = 0
    for fmt in (["safetensors", "gguf"] if args.format == "both" else [args.format]):
        with tempfile.TemporaryDirectory() as work:
            crashes += run(di, fmt, args.cases, args.seed, work)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
