"""det-infer: bit-exact LLM inference, the same fp32 logits on every GPU, toolchain and CPU.

Load it as a Hugging Face kernel:

    from kernels import get_kernel
    di = get_kernel("phanerozoic/det-infer", version=1, trust_remote_code=True)

This release carries the arithmetic contract (docs/SPEC.md): the IEEE-only math every executor
shares (`di.contract`) and the exact rope frequency tables (`di.rope`).
"""
from . import contract, rope
from ._ops import add_op_namespace_prefix, ops

CONTRACT_VERSION = contract.CONTRACT_VERSION

__all__ = ["CONTRACT_VERSION", "add_op_namespace_prefix", "contract", "ops", "rope"]
