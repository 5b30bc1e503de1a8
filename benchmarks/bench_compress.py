#!/usr/bin/env python3
"""Lossless compression with SmolLM2-135M-Instruct (di.compress, docs/RESULTS.md §13): bits per byte
beside gzip -9, xz -9 and zstd -19 on the same files, and compression / decompression throughput
(decompression with every chunk side by side, or --batch), the decoder optionally the emulated
megakernel. Every blob is decompressed and compared.

    .venv/bin/python benchmarks/bench_compress.py [FILE ...] [--chunk-bytes 2048] [--window 1024] [--batch N]
    .venv/bin/python benchmarks/bench_compress.py --bytes 2048 --chunk-bytes 256 --decompress-executor emulated

Default files: Debian's common-licenses Apache-2.0 and GPL-3 when present, else this repository's
LICENSE.
"""
import argparse
import gzip
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = [Path("/usr/share/common-licenses/Apache-2.0"), Path("/usr/share/common-licenses/GPL-3")]


def zstd19(data):
    if shutil.which("zstd") is None:
        return None
    return len(subprocess.run(["zstd", "-19", "-c", "-q"], input=data, capture_output=True, check=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--model")
    ap.add_argument("--chunk-bytes", type=int, default=2048)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--batch", type=int, help="chunks decoded side by side (default: all, up to 64)")
    ap.add_argument("--bytes", type=int, help="only the first N bytes of each file")
    ap.add_argument("--decompress-executor", choices=["engine", "emulated"], default="engine",
                    help="emulated: decode with the megakernel's device code on the CPU (slow; a few KB)")
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel
    from det_fixtures import real_models

    di = get_kernel("phanerozoic/det-infer", version=1)
    model = args.model or real_models.smollm2_checkpoint()
    mm = di.MegaModel.load(str(model), max_context=max(args.window, 64))
    tok = mm.tokenizer()
    decoder = mm if args.decompress_executor == "engine" else \
        di.MegaModel.load(str(model), max_context=max(args.window, 64), executor=args.decompress_executor)
    files = [Path(f) for f in args.files] or [f for f in DEFAULT_FILES if f.exists()] or [ROOT / "LICENSE"]
    mm.generate([5, 6, 7], 2)  # warm
    print(f"{'file':<12} {'bytes':>7} {'tokens':>7} {'det-infer':>10} {'gzip -9':>8} {'xz -9':>8} {'zstd -19':>8} "
          f"{'comp tok/s':>10} {'decomp tok/s':>12}")
    for f in files:
        data = f.read_bytes()[:args.bytes]
        counted = [0]
        t = time.perf_counter()
        blob = di.compress.compress(mm, data, chunk_bytes=args.chunk_bytes, window=args.window, tokenizer=tok,
                                    progress=lambda n: counted.__setitem__(0, counted[0] + n))
        t_comp = time.perf_counter() - t
        t = time.perf_counter()
        out = di.compress.decompress(decoder, blob, batch=args.batch, tokenizer=tok)
        t_dec = time.perf_counter() - t
        assert out == data, f"{f}: the round trip differs"
        bpb = lambda n: 8 * n / len(data)  # noqa: E731
        z = zstd19(data)
        print(f"{f.name:<12} {len(data):7d} {counted[0]:7d} {bpb(len(blob)):10.3f} "
              f"{bpb(len(gzip.compress(data, 9))):8.3f} {bpb(len(lzma.compress(data, preset=9))):8.3f} "
              f"{bpb(z) if z else float('nan'):8.3f} {counted[0] / t_comp:10.1f} {counted[0] / t_dec:12.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
