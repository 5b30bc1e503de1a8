#!/usr/bin/env python3
"""The main job, for now: load det-infer as users do and certify its arithmetic contract on this
machine. Every contract function runs over the fixed input set of the test suite; the SHA-256 of
all outputs must equal the digest pinned for CONTRACT_VERSION 1, which gcc, clang, x86-64 and
aarch64 builds and (in the GPU check) CUDA devices reproduce. Model generation with its certificate
joins this demo with the CPU engine.

    bash scripts/demo.sh            # set up, then run this
    .venv/bin/python scripts/demo.py [--device cpu|cuda]
"""
import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    import torch
    from kernels import get_kernel

    import contract_inputs
    from pins import CONTRACT_MATH_DIGEST

    di = get_kernel("phanerozoic/det-infer", version=1)
    print(f"det-infer contract v{di.CONTRACT_VERSION} | {cpu_name()} ({os.cpu_count()} cores) | "
          f"torch {torch.__version__} | kernel {di.__name__}")
    x = torch.tensor([-1.0, 0.5, 2.0])
    print(f"  exp{x.tolist()} = {di.contract.exp(x).tolist()}")
    print(f"  silu{x.tolist()} = {di.contract.silu(x).tolist()}")
    freqs = di.rope.inv_freq(64, {"rope_type": "default", "rope_theta": 100000.0})
    s, c = di.contract.sincos(1_000_000 * freqs[:2])
    print(f"  rope at position 1e6, first two frequencies: sin {s.tolist()}, cos {c.tolist()}")
    t = time.perf_counter()
    digest = contract_inputs.digest_through_ops(di, device=args.device)
    dt = time.perf_counter() - t
    n = len(contract_inputs.UNARY_FUNCTIONS) * contract_inputs.UNARY_N + 2 * contract_inputs.ANGLE_N
    print(f"contract digest over {n:,} function values + reductions + argmax ({args.device}, {dt:.2f} s):")
    print(f"  {digest}")
    verdict = "MATCH" if digest == CONTRACT_MATH_DIGEST else "MISMATCH"
    print(f"  pinned {CONTRACT_MATH_DIGEST}  -> {verdict}")
    return 0 if verdict == "MATCH" else 1


if __name__ == "__main__":
    sys.exit(main())
