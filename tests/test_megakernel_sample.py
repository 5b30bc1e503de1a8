"""The megakernel's sampled pick (megakernel/det_mk_sample.cuh) under emulation draws the CPU
engine's tokens (whose radix ranking test_sampling.py checks against the contract's heap): the
block's radix ranking keeps equal weights in id order across warps, chunks and the 32-pair steps,
the walk keeps the contract's filters and ends where the weights no longer change the sum, only
the candidates (weights of at least 2^-24) are ranked, and a weight outside [+0, 1] (a temperature
so small that z overflows) takes the heap's own order."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from det_fixtures import synthetic
from det_fixtures.philox import uniform_bits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_gpu import random_weights  # noqa: E402

PROMPT = [3, 17, 42, 59, 5, 25, 11]
SETTINGS = [  # temperature only walks every rank; each filter stops the walk in its own way
    dict(temperature=1.0, seed=1),
    dict(temperature=0.7, top_k=9, seed=2),
    dict(temperature=1.3, top_p=0.8, seed=3),
    dict(temperature=1.0, min_p=0.3, seed=4),
    dict(temperature=2.0, top_k=40, top_p=0.95, min_p=0.01, seed=5),
    # weights below half an ulp of the running sum (the walk's early end), past them top_k and min_p
    dict(temperature=0.4, seed=6),
    dict(temperature=0.5, top_k=600, min_p=1e-12, seed=7),
]


def tied_model(di, vocab):
    """A head whose rows are 4 vectors, each repeated over ids spread across the vocabulary, and one
    far below the rest: every step's logits take 5 values, each shared by hundreds of ids, so a
    draw lands inside a run of equal weights (where only the id order decides) and the lowest
    weights are exact zeros."""
    cfg = di.ModelConfig.from_dict(dict(synthetic.CONFIGS["llama"], vocab_size=vocab))
    weights = random_weights(di, cfg, "cpu")
    head = weights["lm_head.weight"].float()
    g = torch.Generator().manual_seed(vocab)
    vecs = torch.randn(4, head.shape[1], generator=g) * 0.3
    kind = torch.randint(0, 4, (vocab,), generator=g)
    head = vecs[kind]
    head[torch.randperm(vocab, generator=g)[: vocab // 10]] = -40 * vecs[0]
    weights["lm_head.weight"] = head.to(torch.bfloat16)
    return cfg, weights


@pytest.mark.parametrize("vocab,warps", [(1000, 3), (1001, 2), (97, 4)])
def test_sampled_pick_draws_the_engines_tokens(di, vocab, warps):
    cfg, weights = tied_model(di, vocab)
    cpu = di.MegaModel(cfg, weights, max_context=64)
    emu = di.MegaModel(cfg, weights, max_context=64, executor="emulated", geometry=dict(grid=2, warps=warps))
    for kw in SETTINGS:
        want, logits = cpu.generate(PROMPT, max_new=6, return_logits=True, **kw)
        assert len(set(logits[0].tolist())) <= 5  # the ties are there
        assert emu.generate(PROMPT, max_new=6, **kw) == want, kw


def spread_model(di, vocab):
    """Random weights with the head scaled 30 times: logits with a standard deviation near 9, so that
    at temperatures 0.5 to 2 between 1% and 75% of the ids are candidates (weight >= 2^-24)."""
    cfg = di.ModelConfig.from_dict(dict(synthetic.CONFIGS["llama"], vocab_size=vocab))
    weights = random_weights(di, cfg, "cpu")
    weights["lm_head.weight"] = (weights["lm_head.weight"].float() * 30).to(torch.bfloat16)
    return cfg, weights


@pytest.mark.parametrize("vocab,warps", [(1000, 3), (1001, 2)])
def test_only_candidates_are_ranked(di, vocab, warps):
    """Ids below 2^-24 are left out of the ranking; the walk runs out of candidates where the
    contract's would go on through weights that no longer change its sum (temperature only, a top_k
    past the candidates, a min_p below every weight, a top_p near 1)."""
    cfg, weights = spread_model(di, vocab)
    cpu = di.MegaModel(cfg, weights, max_context=64)
    emu = di.MegaModel(cfg, weights, max_context=64, executor="emulated", geometry=dict(grid=2, warps=warps))
    for kw in (dict(temperature=0.5, seed=11), dict(temperature=1.0, top_k=vocab, seed=12),
               dict(temperature=2.0, min_p=1e-30, seed=13), dict(temperature=1.0, top_p=0.99999, seed=14)):
        want, logits = cpu.generate(PROMPT, max_new=6, return_logits=True, **kw)
        for lg in logits:  # weights as the contract computes them (§15), up to an ulp: a fraction
            z = lg.double() / kw["temperature"]
            kept = int((torch.exp(z - z.max()) >= 2.0**-24).sum())
            assert 5 <= kept <= vocab * 0.8, (kw, kept)
        assert emu.generate(PROMPT, max_new=6, **kw) == want, kw


def test_overflowing_temperature_takes_the_heaps_order(di):
    """At a temperature that sends the top logits' z to +inf, their weights are NaN (inf - inf): the
    ranking is refused and thread 0 walks the contract's heap, as the engine does."""
    cfg, weights = tied_model(di, 1000)
    cpu = di.MegaModel(cfg, weights, max_context=64)
    want, logits = cpu.generate(PROMPT, max_new=4, return_logits=True, temperature=1e-38, seed=6)
    assert all(float(lg.max()) / 1e-38 > 3.4e38 for lg in logits)  # z overflows at every step
    emu = di.MegaModel(cfg, weights, max_context=64, executor="emulated", geometry=dict(grid=2, warps=2))
    assert emu.generate(PROMPT, max_new=4, temperature=1e-38, seed=6) == want


def test_a_draw_exactly_on_a_running_sum_goes_to_the_next_rank(di):
    """4,096 equal logits: every weight is 1, the running sums are 1, 2, ..., 4,096 and r = u * 4,096.
    At a seed whose u is a multiple of 2^-12, r equals the sum after rank r - 1 exactly, and the
    contract draws the first rank whose sum *exceeds* r: rank r, token r (ids in rank order)."""
    assert uniform_bits(0, 0) == 0x6627E8D5 >> 8  # Random123's known answer
    position = len(PROMPT)  # the first new token's
    seed = int(np.flatnonzero(uniform_bits(np.arange(1 << 20, dtype=np.uint64), position) % 4096 == 0)[0])
    r = uniform_bits(seed, position) // 4096
    cfg = di.ModelConfig.from_dict(dict(synthetic.CONFIGS["llama"], vocab_size=4096))
    weights = random_weights(di, cfg, "cpu")
    weights["lm_head.weight"] = torch.zeros_like(weights["lm_head.weight"])
    want = di.MegaModel(cfg, weights, max_context=64).generate(PROMPT, max_new=2, temperature=1.0, seed=seed)
    assert want[0] == r
    emu = di.MegaModel(cfg, weights, max_context=64, executor="emulated", geometry=dict(grid=2, warps=3))
    assert emu.generate(PROMPT, max_new=2, temperature=1.0, seed=seed) == want


def test_a_draw_among_the_least_candidates(di):
    """One logit far above 4,095 equal ones, at a temperature that puts their weights near 2^-23.8,
    between 2^-24 and 2^-23 (each a candidate, and each add moves the running sum c by an ulp, as c
    stays below 2): a seed whose u exceeds 1 / c draws past rank 0, among the least candidates (ids
    in rank order). A ranking that dropped weights it should keep (a bound of 2^-23) would draw id 0."""
    vocab = 4096
    cfg = di.ModelConfig.from_dict(dict(synthetic.CONFIGS["llama"], vocab_size=vocab))
    weights = random_weights(di, cfg, "cpu")
    head = torch.zeros_like(weights["lm_head.weight"])
    head[0] = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(5)).to(head.dtype)
    weights["lm_head.weight"] = head
    cpu = di.MegaModel(cfg, weights, max_context=64)
    l0 = float(cpu.generate(PROMPT, max_new=1, return_logits=True)[1][0][0])
    if l0 < 0:
        weights["lm_head.weight"] = -head
        l0 = -l0
    cpu = di.MegaModel(cfg, weights, max_context=64)
    temperature = l0 / (23.8 * math.log(2))  # z_0 - z_i = 23.8 ln 2: weights near 2^-23.8
    w = torch.tensor(math.exp(-l0 / temperature), dtype=torch.float32)
    assert 2.0**-24 < float(w) < 2.0**-23
    c = torch.tensor(1.0, dtype=torch.float32)
    for _ in range(vocab - 1):  # the running sum as fp32 adds make it (within an ulp of each weight)
        c = c + w
    c = float(c)
    position = len(PROMPT)
    lo, hi = int(2**24 / c * (1 + 0.2 * (c - 1))), int(2**24 / c * (1 + 0.8 * (c - 1)))
    bits = uniform_bits(np.arange(1 << 22, dtype=np.uint64), position)
    seed = int(np.flatnonzero((lo < bits) & (bits < hi))[0])
    want = cpu.generate(PROMPT, max_new=1, temperature=temperature, seed=seed)
    assert 100 < want[0] < vocab - 100  # drawn among the tail (ties: rank order is id order)
    emu = di.MegaModel(cfg, weights, max_context=64, executor="emulated", geometry=dict(grid=2, warps=3))
    assert emu.generate(PROMPT, max_new=1, temperature=temperature, seed=seed) == want
