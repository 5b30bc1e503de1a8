#!/usr/bin/env python3
"""lm-evaluation-harness on det-infer: lm-eval's own command line, with the model "det-infer"
registered (di.lm_eval.DetInferLM) and taken by default.

    .venv/bin/python scripts/eval.py --model_args pretrained=PATH[,max_length=N,executor=emulated,geometry=tile_rows=32;outs=4] \\
        --tasks hellaswag --batch_size 16 [any other lm-eval run argument]
    .venv/bin/python scripts/eval.py --model_args pretrained=build/models/smollm2-135m-instruct-bf16 \\
        --tasks det_capitals --include_path tests/lm_eval_tasks      # a local task, no Hub needed

PATH is a Hugging Face model directory or a .gguf file; --device defaults to cuda where torch has a GPU,
else cpu. Scores do not depend on --batch_size
(1..16 or auto), the executor or the process.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        sys.exit("scripts/eval.py needs lm-eval: run bash scripts/setup.sh (it pins lm-eval==0.4.13)")
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    di.lm_eval.lm_class()  # registers "det-infer"
    argv = sys.argv[1:]
    if argv and argv[0] not in ("run", "ls", "validate", "-h", "--help"):
        argv = ["run"] + argv
    if argv and argv[0] == "run" and not any(a == "--model" or a.startswith("--model=") for a in argv):
        argv[1:1] = ["--model", "det-infer"]
    if argv and argv[0] == "run" and not any(a == "--device" or a.startswith("--device=") for a in argv):
        import torch  # lm-eval's own default is cuda:0, which a CPU machine does not have

        argv[1:1] = ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
    sys.argv = [sys.argv[0]] + argv
    try:
        if argv and argv[0] == "run" and _option(argv, "--model") == "det-infer":
            args = _option(argv, "--model_args")
            if args and not args.lstrip().startswith("{"):  # lm-eval also takes a JSON object
                di.lm_eval.check_model_args(args)
        cli_evaluate()
    except (TypeError, ValueError) as e:
        if str(e).startswith("det-infer:"):  # a clear message about the arguments, not a traceback
            sys.exit(str(e))
        raise


def _option(argv, name):
    """The value of --name in argv (as --name VALUE or --name=VALUE), or None."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


if __name__ == "__main__":
    main()
