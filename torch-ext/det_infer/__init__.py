"""det-infer: bit-exact LLM inference, the same fp32 logits on every CPU and toolchain tested. The
CUDA megakernel gave the same bits on an H200 (sm_90, the one GPU run so far); it is compiled and
audited for sm_75 to sm_120, the other architectures not run (docs/RESULTS.md §9).

Load it as a Hugging Face kernel:

    from kernels import get_kernel
    di = get_kernel("phanerozoic/det-infer", version=1, trust_remote_code=True)
    mm = di.MegaModel.from_pretrained("path/to/SmolLM2-135M")
    tokens = mm.generate(prompt_ids, max_new=128)

`di.contract` exposes the IEEE-only math every executor shares, `di.rope` the exact rope frequency
tables (docs/SPEC.md), `di.certificate` makes and verifies replayable generation certificates,
`di.lm_eval.DetInferLM` is the lm-evaluation-harness model (needs lm-eval), `di.serving` batches
requests continuously with every answer the bits of the request alone (`di.openai_protocol` is its
OpenAI-compatible HTTP protocol; the repository's scripts/serve.py serves it), and `di.compress`
is lossless compression with the model as the probability model. `di.ray_data` runs generation
and scoring as a Ray Data stage (needs ray[data]; `di.rows` is its per-batch work, without Ray),
each row the bits it has alone on any actor or machine. `di.ops` holds the
native ops these call; it is not part of the v1 surface, and ops named `_test_*` exist only for
the test suite and benchmarks.
"""
from . import certificate, compress, contract, lm_eval, openai_protocol, rope, rows, serving, text
from ._ops import add_op_namespace_prefix, ops
from .config import ModelConfig
from .model import KVState, MegaModel

CONTRACT_VERSION = contract.CONTRACT_VERSION

# The v1 surface (the hub card lists it).
__all__ = ["CONTRACT_VERSION", "KVState", "MegaModel", "ModelConfig", "certificate", "compress", "contract", "lm_eval",
           "openai_protocol", "rope", "rows", "serving", "text"]  # and ray_data, loaded on first use (it needs Ray)


def __getattr__(name):
    """di.ray_data imports Ray, so it is imported on first use (PEP 562), not with the package."""
    if name == "ray_data":
        import importlib

        try:
            return importlib.import_module(f"{__name__}.ray_data")
        except ImportError as e:  # an AttributeError, so that hasattr(di, "ray_data") answers False
            raise AttributeError(str(e)) from e
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
