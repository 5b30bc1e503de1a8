"""The engine's optimized kernels compute exactly the contract's reference: the ISA GEMV against
the literal loops of contract 2 (det_reduce.h), over shapes that hit every tile, tail and remainder."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from det_fixtures.host import cpu_has

ROOT = Path(__file__).resolve().parent.parent


def _reference(di, w, x):
    return torch.stack([di.contract.gemv(w, x[b]) for b in range(x.shape[0])])


AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq")


def _expected_impl(isa, K, B, dense_ok=True):
    """The version det_gemv_rows picks at a capped ISA level (see det_kernels_cpu.h)."""
    if not dense_ok or K % 16:
        return "ref"
    if isa == 0:
        return "ref"
    if isa == 2 and cpu_has(*AVX512):
        return "avx512"
    return "avx2"


@pytest.fixture
def isa(di, request):
    """Caps the engine at an ISA level for one test (0 ref, 1 avx2, 2 avx512: batch-1 GEMV, bf16
    tiles of 2 or more inputs, nf4 decode, exp and the activations), then uncaps it."""
    di.ops._test_isa_cap(request.param)
    yield request.param
    di.ops._test_isa_cap(2)


@pytest.mark.parametrize("isa", [0, 1, 2], indirect=True, ids=["ref", "avx2", "avx512"])
@pytest.mark.parametrize("K", [8, 16, 64, 256, 272, 576, 1000, 1536, 2064])
@pytest.mark.parametrize("B", [1, 2, 3, 4, 5, 7, 16])
def test_engine_gemv_equals_reference(di, isa, K, B):
    rng = np.random.default_rng(K * 31 + B)
    N = 37  # not a multiple of any row tile
    w = torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)).to(torch.bfloat16)
    x = torch.from_numpy((rng.standard_normal((B, K)) * 10.0 ** rng.uniform(-2, 2, (B, K))).astype(np.float32))
    out = torch.empty((B, N), dtype=torch.float32)
    impl = di.ops._test_gemv_engine(out, w, x)
    assert impl == _expected_impl(isa, K, B)
    assert torch.equal(out.view(torch.int32), _reference(di, w, x).view(torch.int32)), impl


@pytest.mark.parametrize("isa", [1, 2], indirect=True, ids=["avx2", "avx512"])
@pytest.mark.parametrize("K", [16, 96, 576, 784, 1536])
@pytest.mark.parametrize("B", [1, 3, 7])
def test_engine_gemv_keeps_negative_zero_accumulators(di, isa, K, B):
    """Products that round to -0 leave accumulators at -0; the kernels' padding of a short last block
    (and their skipped halves or quarters) must leave them so (+0 padding would make them +0): a row
    of -2^-133 against inputs of 2^-20 is -0 once every accumulator took a term (K >= 256; a +0
    accumulator makes it +0), as the reference says, beside ordinary rows. Four rows and 3 or 7
    inputs take the AVX2 register tiles (3 rows x 3 inputs) and their leftovers too."""
    w = torch.full((4, K), -2.0 ** -133, dtype=torch.float32).to(torch.bfloat16)
    w[1] = torch.linspace(-1, 1, K)
    w[3] = torch.linspace(1, -1, K)
    x = torch.full((B, K), 2.0 ** -20)
    out = torch.empty((B, 4), dtype=torch.float32)
    di.ops._test_gemv_engine(out, w, x)
    want = _reference(di, w, x)
    assert str(want[0, 0].item()) == ("-0.0" if K >= 256 else "0.0")
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))


def _nf4_case(rng, N, K, block, codebook):
    """Random nf4 codes and absmax (with a zero, a subnormal and a huge block scale), and the dense
    bf16 matrix bitsandbytes' reference dequantization makes of them (tests/nf4_checkpoints.py)."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

    codes = torch.from_numpy(rng.integers(0, 256, N * K // 2, dtype=np.uint8))
    absmax = torch.from_numpy(rng.uniform(0.01, 2.0, -(-N * K // block)).astype(np.float32))
    special = torch.tensor([0.0, 1e-40, 3e38])[: absmax.numel()]
    absmax[: len(special)] = special
    dense = _dequantize_4bit_compute(codes, absmax, codebook, block, (N, K), torch.bfloat16)
    return codes.reshape(N, K // 2), absmax, dense


@pytest.mark.parametrize("isa", [0, 1, 2], indirect=True, ids=["ref", "avx2", "avx512"])
@pytest.mark.parametrize("K,block", [(352, 64), (352, 8), (576, 16), (576, 128), (40, 32), (64, 4096), (2064, 256)])
@pytest.mark.parametrize("B", [1, 2, 5, 16])
def test_engine_gemv_nf4_equals_dense(di, isa, K, block, B):
    """nf4 decoded in the GEMV's loop gives exactly the dense GEMV over bitsandbytes' own
    dequantization of the same codes: every block size, blocks crossing rows, both ISA paths."""
    pytest.importorskip("bitsandbytes")
    rng = np.random.default_rng(K * 7 + block + B)
    N = 37
    codes, absmax, dense = _nf4_case(rng, N, K, block, di.ops.nf4_codebook())
    x = torch.from_numpy(rng.standard_normal((B, K)).astype(np.float32))
    want, got = torch.empty((B, N)), torch.empty((B, N))
    di.ops._test_gemv_engine(want, dense, x)
    impl = di.ops._test_gemv_engine(got, codes, x, absmax)
    assert impl == _expected_impl(isa, K, B, "nf4" if block >= 16 else False)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), impl


def test_engine_gemv_nf4_rejects_bad_blocks(di):
    codes = torch.zeros((4, 32), dtype=torch.uint8)
    with pytest.raises(ValueError, match="absmax values for 256 elements"):
        di.ops._test_gemv_engine(torch.empty((1, 4)), codes, torch.ones(1, 64), torch.ones(3))
    with pytest.raises(ValueError, match="even row length"):
        di.ops._test_gemv_engine(torch.empty((1, 4)), codes[:, :16].contiguous(), torch.ones(1, 33), torch.ones(4))


def test_engine_uses_the_isa_paths_here(di):
    """On a CPU with AVX2 the fast paths are really exercised by the test above."""
    if not cpu_has("avx2", "fma"):
        pytest.skip("no AVX2/FMA here")
    impl = lambda K, B: di.ops._test_gemv_engine(torch.empty((B, 1)), torch.ones(1, K, dtype=torch.bfloat16), torch.ones(B, K))
    fast = "avx512" if cpu_has(*AVX512) else "avx2"
    assert impl(576, 1) == fast and impl(576, 2) == fast and impl(576, 4) == fast and impl(584, 1) == "ref"


@pytest.mark.parametrize("level", ["ref", "avx2"])
def test_capped_isa_gives_the_pinned_digests(level):
    """DET_INFER_GEMV=ref forces the portable loops in every kernel of the engine, =avx2 caps it below
    the AVX-512 batch-1 GEMV: the same certificate (generation runs the batch-1 path)."""
    env = dict(os.environ, DET_INFER_GEMV=level, LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "test_det_infer.py"), "-k",
                        "(teacher_forced_digest or generation_digest) and (llama or qwen3 or mistral)"],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:]
    assert "6 passed" in r.stdout


@pytest.mark.parametrize("isa", [1, 2], indirect=True, ids=["avx2", "avx512"])
@pytest.mark.parametrize("fn", ["exp", "silu", "gelu_tanh"])
def test_engine_activations_equal_the_contract(di, isa, fn):
    """The vectorized exp / silu / gelu-tanh of the engine against the scalar contract, bit for bit,
    over the 10-million-input accuracy sets (every range, edge and special value) plus raw bit
    patterns."""
    from det_fixtures import accuracy
    x = torch.from_numpy(accuracy.inputs(fn, 10_000_000))
    bits = torch.randint(0, 2**32, (1_000_003,), dtype=torch.int64, generator=torch.Generator().manual_seed(3))
    x = torch.cat([x, bits.to(torch.int32).view(torch.float32)])
    out = torch.empty_like(x)
    di.ops._test_act_engine(out, x, fn)
    assert torch.equal(out.view(torch.int32), di.contract.unary(x, fn).view(torch.int32))


@pytest.mark.parametrize("isa", [1, 2], indirect=True, ids=["avx2", "avx512"])
@pytest.mark.parametrize("fn", ["exp", "silu", "gelu_tanh"])
def test_engine_activations_short_lengths(di, isa, fn):
    """Lengths around the kernel's packs of 32 (AVX2) and 64 (AVX-512) lanes (the last part pack
    goes through a padded copy): every output equals the contract, and nothing past the end of the
    output is written."""
    x = torch.from_numpy(np.random.default_rng(5).standard_normal(200).astype(np.float32) * 30)
    for n in (1, 7, 8, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129):
        out = torch.full((n + 8,), 7.0)
        di.ops._test_act_engine(out[:n], x[:n], fn)
        assert torch.equal(out[:n].view(torch.int32), di.contract.unary(x[:n], fn).view(torch.int32)), n
        assert torch.equal(out[n:], torch.full((8,), 7.0)), n


@pytest.mark.parametrize("K", [1, 7, 8, 255, 256, 257, 511, 1000, 2048, 49152, 49153, 151936])
def test_engine_sum_equals_the_reference(di, K):
    """The engine's canonical sum (det_sum_f32: full blocks transposed and summed in vectors, the
    short last block term by term), which the sampler, log-probabilities and token frequencies use,
    against the literal loop, bit for bit: terms spread over 60 binades and both signs (so the order
    shows in the result), rows of exp weights as the sampler sums, signed zeros, and a row with
    infinities."""
    rng = np.random.default_rng(K)
    spread = rng.standard_normal(K) * 2.0 ** rng.integers(-30, 30, K)
    weights = np.exp(-rng.exponential(8.0, K))
    zeros = np.where(rng.random(K) < 0.5, -0.0, 0.0)
    inf = rng.standard_normal(K)
    inf[K // 3] = np.inf
    inf[-1] = -np.inf if K > 1 else np.inf
    x = torch.from_numpy(np.stack([spread, weights, zeros, -zeros, inf]).astype(np.float32))
    out = torch.empty(x.shape[0])
    di.ops._test_sum_engine(out, x)
    want = torch.empty(x.shape[0])
    di.ops.sum_ref(want, x)
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("isa", [0, 1, 2], indirect=True, ids=["ref", "avx2", "avx512"])
@pytest.mark.parametrize("fn", ["silu", "gelu_tanh"])
def test_engine_activation_times_up(di, isa, fn):
    """The MLP's act(gate) * up as the engine runs it: one fp32 product of the contract's activation
    and up, including zeros, infinities and NaN in either operand."""
    from det_fixtures import accuracy
    gen = torch.Generator().manual_seed(11)
    x = torch.from_numpy(accuracy.inputs(fn, 300_000))
    up = torch.randn(x.shape, generator=gen) * torch.exp2(torch.randint(-30, 30, x.shape, generator=gen).float())
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -3e38])
    up[: 7 * 997 : 997] = special
    x[5 : 5 + 7 * 991 : 991] = special
    out = torch.empty_like(x)
    di.ops._test_act_engine(out, x, fn, up)
    want = di.contract.unary(x, fn) * up
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan].view(torch.int32), want[~nan].view(torch.int32))


@pytest.mark.parametrize("isa", [0, 1], indirect=True, ids=["ref", "avx2"])
@pytest.mark.parametrize("D", [8, 40, 64, 128, 256, 264, 512])
def test_engine_attention_scores_equal_the_contract(di, isa, D):
    """The engine's attention scores (eight keys at a time, +0 leaves skipped) against
    fl(det_dot_f32_ref(k_i, q) * scale), bit for bit: keys in a wider row and adjacent, counts around the
    group of eight, values over 40 decades, a zero key, a key whose products all round to -0 (it
    sums to +0 unless D fills all 256 lanes), and infinities and NaNs."""
    rng = np.random.default_rng(D)
    n = 133
    cache = torch.from_numpy((rng.standard_normal((n, D + 24)) * 10.0 ** rng.uniform(-20, 20, (n, D + 24)))
                             .astype(np.float32))
    q = torch.from_numpy((rng.standard_normal(D) * 10.0 ** rng.uniform(-3, -1, D)).astype(np.float32)).abs()
    k = cache[:, 8:8 + D]
    k[0] = 0.0
    k[1] = -1e-45  # the smallest subnormal: every product with q (all below 0.5) rounds to -0
    k[2, 3] = float("inf")
    k[3, 1], k[3, 2] = float("inf"), float("-inf")
    k[4, 0] = float("nan")
    scale = float(np.float32(D ** -0.5))
    want = (torch.stack([di.contract.gemv(r.contiguous().view(1, D), q)[0] for r in k]) *
            torch.tensor(scale, dtype=torch.float32))
    for keys in (k, k.contiguous()):  # inside a wider row, and adjacent (the engine's cache layout)
        for count in (1, 5, 8, 13, n):
            out = torch.full((count,), 7.0)
            di.ops._test_attn_scores_engine(out, q, keys[:count], scale)
            assert torch.equal(out.view(torch.int32), want[:count].view(torch.int32)), count
    assert want[0].item() == 0.0 and str(want[1].item()) == ("-0.0" if D >= 256 else "0.0")


def _chunk(di, q, k, v, ranges, scale, impl=None):
    stats, o = torch.full((q.shape[0], 2), 7.0), torch.full(q.shape, 7.0)
    ran = di.ops._test_attn_chunk_engine(stats, o, q, k, v, torch.tensor(ranges, dtype=torch.int64), scale)
    assert impl is None or ran == impl, (ran, impl)
    return stats, o


def _chunk_impl(level, D):
    """The version det_attn_chunk runs at a capped ISA level on this CPU (det_attn_cpu.cpp)."""
    if level >= 2 and D % 16 == 0 and cpu_has(*AVX512):
        return "avx512"
    if level >= 1 and D % 8 == 0 and cpu_has("avx2", "fma"):
        return "avx2"
    return "ref"


def _same_bits(a, b):
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


def _fast_and_ref(di, q, k, v, ranges, scale, level=2):
    """_chunk at an ISA level (2: the CPU's own; 1: at most AVX2), then with the ISA capped at ref
    (the contract's loops)."""
    try:
        di.ops._test_isa_cap(level)
        fast = _chunk(di, q, k, v, ranges, scale, _chunk_impl(level, q.shape[1]))
        di.ops._test_isa_cap(0)
        return fast, _chunk(di, q, k, v, ranges, scale, "ref")
    finally:
        di.ops._test_isa_cap(2)


@pytest.mark.parametrize("level", [1, 2], ids=["avx2", "avx512"])
@pytest.mark.parametrize("D", [8, 16, 32, 40, 48, 64, 80, 128, 256, 264, 320, 512])
def test_engine_attention_chunk_equals_the_loops(di, D, level):
    """One chunk's (m, l, o) for several queries at once against the contract's loops one query at a
    time (ISA capped at ref), bit for bit, at each ISA level the CPU has (AVX2: a key per lane, eight
    keys a vector, D % 8 == 0; AVX-512, D % 16 == 0, else as AVX2). AVX-512 has two schedules: a key
    per lane for fewer than 16 queries (a decode's heads), a query per lane from 16 on (a prompt's
    rows and heads: 48 with a causal diagonal, 17 with one query alone in its vector, 33 in a cache
    that ends inside the chunk). Queries with different visible ranges in one call (whole chunk, windows starting and
    ending inside a slot group, one slot); values of one scale (every slot's weight near 1, so an
    order changes bits), values over 30 decades, and infinities and NaNs in K and V."""
    rng = np.random.default_rng(D)

    def rand(*shape, decades=0):
        return torch.from_numpy((rng.standard_normal(shape) * 10.0 ** rng.uniform(-decades, decades, shape))
                                .astype(np.float32))

    scale = float(np.float32(D ** -0.5))
    cases = [(128, [(0, 127)] * 3),  # a decode's query heads
             (128, [(0, 127), (3, 127), (0, 77), (13, 13), (8, 15), (5, 122), (0, 0), (64, 127), (9, 100)]),
             (77, [(0, 76), (20, 76), (76, 76)]),  # the cache's last row is slot 76
             (128, [(0, 8 * r + 7) for r in range(16) for h in range(3)]),  # a prompt's diagonal chunk
             (128, [(0, 127)] * 15 + [(5, 122), (64, 64)]),
             (77, [((7 * i) % 40, 76 - (5 * i) % 30) for i in range(33)]),
             (128, [(0, 127)] * 40 + [(3 * i, 127 - i) for i in range(24)])]  # 64 queries: 4 vectors
    for decades, hostile in ((0, False), (3, False), (3, True)):
        for n, ranges in cases:
            q = rand(len(ranges), D, decades=decades) * 0.3
            k, v = rand(n, D, decades=decades), rand(n, D, decades=5 * decades)
            if hostile:
                k[1, 3], k[5, :2], v[7, 4], v[9, 0] = float("inf"), float("nan"), float("-inf"), float("nan")
                k[2], v[3] = 0.0, -0.0
            fast, ref = _fast_and_ref(di, q, k, v, ranges, scale, level)
            assert all(_same_bits(a, b) for a, b in zip(fast, ref)), (n, ranges, hostile)
            assert torch.isfinite(ref[0]).all() or hostile
    # Signed zeros: every score far below 0 but slot 5's, whose products all round to -0 (its score is
    # -0 when D fills the 32 accumulators, else +0: the tree adds +0 ones), so it is the max and every
    # other weight is below 0.5; and a value column whose products then all round to -0 (o_d is +0:
    # the 32-accumulator tree adds +0 ones).
    q = rand(20, D).abs() * 0.1 + 0.01
    k, v = -(rand(128, D).abs() + 1.0) * 100.0, rand(128, D)
    k[5], v[:, 3], v[5, 3] = -1e-45, -1e-45, -0.0
    for ranges in ([(0, 127)] * 3, [(0, 127)] * 17 + [(5, 5), (0, 9), (5, 100)]):
        fast, ref = _fast_and_ref(di, q[:len(ranges)], k, v, ranges, scale, level)
        assert all(_same_bits(a, b) for a, b in zip(fast, ref)), ranges
        assert str(ref[0][0, 0].item()) == ("-0.0" if D >= 256 else "0.0") and str(ref[1][0, 3].item()) == "0.0"
    # A NaN score after the max in the same vector lane (slot 17 after slot 1, at 8 or 16 keys a
    # vector): a vector max alone would lose slot 1 there; m is the loops' (l and o are NaN).
    q = rand(3, D) * 0.3
    k, v = rand(128, D), rand(128, D)
    k[1], k[17, 0] = q[0] * 100.0, float("nan")
    fast, ref = _fast_and_ref(di, q, k, v, [(0, 127)] * 3, scale, level)
    assert all(_same_bits(a, b) for a, b in zip(fast, ref))
    assert torch.isfinite(ref[0][0, 0]) and torch.isnan(ref[0][0, 1])
    with pytest.raises(ValueError, match="0 <= j0 <= j1 < n"):
        _chunk(di, q[:1], k, v, [(5, 2)], scale)
