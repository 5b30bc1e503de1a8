"""The contract on a real GPU (run by scripts/device_check.sh on a lent GPU; skipped elsewhere):
the CUDA executor's elementwise functions reproduce the CPU-pinned digest bit for bit."""
import contract_inputs
import pytest
import torch
from pins import CONTRACT_MATH_DIGEST

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_cuda_contract_digest(di):
    assert contract_inputs.digest_through_ops(di, device="cuda") == CONTRACT_MATH_DIGEST


def test_cuda_equals_cpu_on_wide_inputs(di):
    bits = torch.randint(0, 2**32, (4_000_000,), dtype=torch.int64, generator=torch.Generator().manual_seed(1))
    x = bits.to(torch.int32).view(torch.float32)
    for fn in ("exp", "tanh", "silu", "gelu_tanh", "rsqrt", "bf16_round"):
        cpu = di.contract.unary(x, fn)
        gpu = di.contract.unary(x.cuda(), fn).cpu()
        assert torch.equal(cpu.view(torch.int32), gpu.view(torch.int32)), fn
    theta = torch.empty(2_000_000, dtype=torch.float64).uniform_(-(2.0**22), 2.0**22)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(di.contract.sincos(theta), di.contract.sincos(theta.cuda())))
