"""Seeded sampling (docs/SPEC.md §15): the same streams on every executor and under every variation
(single launch, one call per step, inside a batch of 16 whose other sequences use other settings,
the emulated megakernel), pinned digests, the Philox generator's known-answer vector, a chi-square
test that the sampler draws from the filtered distribution computed in float64, and clear errors
for bad parameters."""
import math
import random
import subprocess

import numpy as np
import pytest
from det_fixtures import synthetic
import torch
from det_fixtures.certification import ROOT, generation_digest, model_dir
from det_fixtures.philox import uniform_bits
from det_fixtures.pins import SAMPLED_DIGESTS

N_SAMPLED = 48
SETTINGS = {  # name -> sampling parameters (pinned in pins.SAMPLED_DIGESTS)
    "temperature": dict(temperature=0.8, seed=1),
    "top_k": dict(temperature=1.0, top_k=20, seed=2),
    "top_p": dict(temperature=0.7, top_p=0.9, seed=3),
    "min_p": dict(temperature=1.3, min_p=0.05, seed=4),
    "all": dict(temperature=1.0, top_k=50, top_p=0.8, min_p=0.02, seed=2**64 - 1),
}


@pytest.fixture(scope="module")
def llama(di, tmp_path_factory):
    directory = model_dir("llama", tmp_path_factory.mktemp("sampling"))
    return {"dir": directory, "mm": di.MegaModel.from_pretrained(directory, max_context=512),
            "prompt": synthetic.token_sequence(100, 1000, 12)}


@pytest.mark.parametrize("name", SETTINGS)
def test_sampled_digest_single_launch_and_per_step(llama, name):
    mm, kw = llama["mm"], SETTINGS[name]
    for single in (True, False):
        tokens, logits = mm.generate(llama["prompt"], max_new=N_SAMPLED, single_launch=single, return_logits=True, **kw)
        assert generation_digest(tokens, logits) == SAMPLED_DIGESTS[name], (name, single)


def test_sampled_digest_after_a_split_prefill(di, llama):
    """The prompt fed in three pieces, then one decode_step per token, each pick made with the raw
    sample_token op at the generated token's position: the pinned stream."""
    mm, kw = llama["mm"], SETTINGS["all"]
    state = mm.new_state(len(llama["prompt"]) + N_SAMPLED)
    for a, b in ((0, 30), (30, 31), (31, 100)):
        logits = mm.extend(llama["prompt"][a:b], state)
    seed = kw["seed"] - 2**64 if kw["seed"] >= 2**63 else kw["seed"]
    tokens, rows = [], []
    for step in range(N_SAMPLED):
        tok = di.ops.sample_token(logits, kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"], seed, state.length)
        tokens.append(tok)
        rows.append(logits)
        if step + 1 < N_SAMPLED:
            logits = mm.decode_step(tok, state.length, state)
    assert generation_digest(tokens, torch.stack(rows)) == SAMPLED_DIGESTS["all"]


def test_sampled_streams_inside_a_batch_of_16(llama):
    """Each setting's stream at a random slot of a batch whose other sequences sample with other
    settings (or greedily) equals its solo stream."""
    mm, rng = llama["mm"], random.Random("sampling-batch")
    names = list(SETTINGS)
    prompts = [[rng.randrange(1000) for _ in range(rng.randint(1, 60))] for _ in range(16)]
    slots = rng.sample(range(16), len(names))
    params = {k: [] for k in ("temperature", "top_k", "top_p", "min_p", "seed")}
    for b in range(16):
        kw = SETTINGS[names[slots.index(b)]] if b in slots else dict(temperature=rng.choice([0.0, 0.5, 2.0]),
                                                                      top_k=rng.randrange(5), seed=rng.randrange(99))
        if b in slots:
            prompts[b] = llama["prompt"]
        for k, default in (("temperature", 0.0), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("seed", 0)):
            params[k].append(kw.get(k, default))
    streams, logits = mm.generate_batch(prompts, max_new=N_SAMPLED, return_logits=True, **params)
    for name, slot in zip(names, slots):
        assert generation_digest(streams[slot], logits[slot]) == SAMPLED_DIGESTS[name], name


@pytest.mark.parametrize("g", [(1, 1, 2, 1, 0), (3, 2, 4, 16, 7)], ids=lambda g: "x".join(map(str, g)))
def test_sampled_digests_on_the_emulated_megakernel(di, llama, g):
    mm = di.MegaModel.from_pretrained(llama["dir"], max_context=512, executor="emulated",
                                      geometry=dict(zip(("grid", "warps", "ring", "tile_rows", "seed"), g)))
    for name in ("top_p", "all"):
        tokens, logits = mm.generate(llama["prompt"], max_new=N_SAMPLED, return_logits=True, **SETTINGS[name])
        assert generation_digest(tokens, logits) == SAMPLED_DIGESTS[name], name


def test_sampled_digest_on_one_thread(llama):
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from det_fixtures.certification import generation_digest
from kernels import get_kernel
di = get_kernel('phanerozoic/det-infer', version=1)
mm = di.MegaModel.from_pretrained({str(llama['dir'])!r}, max_context=512)
tokens, logits = mm.generate({llama['prompt']!r}, max_new={N_SAMPLED}, return_logits=True, **{SETTINGS['all']!r})
print(generation_digest(tokens, logits))
"""
    import os
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == SAMPLED_DIGESTS["all"]


def test_temperature_zero_is_greedy(llama):
    mm = llama["mm"]
    assert mm.generate(llama["prompt"], max_new=16, temperature=0.0, top_k=3, seed=5) == \
        mm.generate(llama["prompt"], max_new=16)


def test_philox_known_answer(di):
    """Philox4x32-10 at counter 0, key 0 is Random123's published vector: position 0 with seed 0
    draws its first word 0x6627e8d5, so u = (0x6627e8d5 >> 8) / 2^24."""
    lg = torch.zeros(2, dtype=torch.float32)  # two equal tokens: token 0 iff u * 2 < 1
    u = (0x6627E8D5 >> 8) / 2**24
    assert di.ops.sample_token(lg, 1.0, 0, 1.0, 0.0, 0, 0) == (0 if u * 2 < 1 else 1)


def _filtered_distribution(logits, temperature, top_k, top_p, min_p):
    """The distribution §15 draws from, in float64 (ties ranked by id)."""
    z = logits.astype(np.float64) / temperature
    e = np.exp(z - z.max())
    order = sorted(range(len(e)), key=lambda i: (-e[i], i))
    total, c, kept = e.sum(), 0.0, []
    for j, i in enumerate(order):
        if j >= 1 and min_p > 0 and e[i] < min_p:
            break
        kept.append(i)
        c += e[i]
        if (top_k and len(kept) >= top_k) or (top_p < 1 and c >= top_p * total):
            break
    p = np.zeros(len(e))
    p[kept] = e[kept] / e[kept].sum()
    return p


@pytest.mark.parametrize("params", [(1.0, 0, 1.0, 0.0), (0.7, 40, 1.0, 0.0), (1.2, 0, 0.85, 0.0), (1.0, 0, 1.0, 0.1)])
def test_frequencies_match_the_float64_distribution(di, llama, params):
    """20,000 draws (seeds 0..19999) from one row of real logits: every drawn token is in the
    float64 kept set and a chi-square test at significance 0.001 accepts the frequencies. Seeds are
    fixed, so the outcome is the same on every run."""
    mm = llama["mm"]
    logits = mm.teacher_forced_logits(llama["prompt"][:20])[-1]
    T, k, p, m = params
    expected = _filtered_distribution(logits.numpy(), T, k, p, m)
    n = 20_000
    counts = np.zeros(len(expected))
    for seed in range(n):
        counts[di.ops.sample_token(logits, T, k, p, m, seed, 20)] += 1
    assert counts[expected == 0].sum() == 0, "a token outside the kept set was drawn"
    # Pool the rarest tokens so that every cell expects at least 5 draws.
    idx = np.argsort(-expected)
    idx = idx[expected[idx] > 0]
    cells_e, cells_o, acc_e, acc_o = [], [], 0.0, 0.0
    for i in idx:
        acc_e += expected[i] * n
        acc_o += counts[i]
        if acc_e >= 5:
            cells_e.append(acc_e), cells_o.append(acc_o)
            acc_e = acc_o = 0.0
    if acc_e > 0:
        cells_e[-1] += acc_e
        cells_o[-1] += acc_o
    chi2 = sum((o - e) ** 2 / e for o, e in zip(cells_o, cells_e))
    df = len(cells_e) - 1
    assert df >= 2
    critical = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty, alpha 0.001
    assert chi2 < critical, (chi2, critical, df)


def test_bad_sampling_parameters(llama):
    mm, prompt = llama["mm"], llama["prompt"][:5]
    for kw, match in ((dict(temperature=-0.5), "temperature must be"), (dict(temperature=float("inf")), "temperature"),
                      (dict(temperature=1.0, top_p=0.0), "top_p must be in"), (dict(temperature=1.0, top_p=1.5), "top_p"),
                      (dict(temperature=1.0, top_k=-1), "top_k must be"), (dict(temperature=1.0, min_p=2.0), "min_p"),
                      (dict(temperature=1.0, seed=-1), "seed must be"), (dict(temperature=1.0, seed=2**64), "seed")):
        with pytest.raises(ValueError, match=match):
            mm.generate(prompt, max_new=2, **kw)
    with pytest.raises(ValueError, match="temperature has 1 values for 2 prompts"):
        mm.generate_batch([prompt, prompt], max_new=2, temperature=[1.0])


@pytest.mark.parametrize("V", [1, 7, 1000, 49152])
def test_engine_ranking_keeps_the_contracts_heap_set(di, V):
    """The CPU engine ranks by a radix sort (det_infer_cpu/det_sample_cpu.cpp), the contract by a heap:
    the same kept ids in the same order and the same running sum, bit for bit, with many exact ties,
    zeros and the maximum 1.0 among the weights, under every filter; and a NaN weight (a temperature
    so small that z overflows) takes the heap's own path."""
    g = torch.Generator().manual_seed(V)
    e = torch.randint(0, 64, (V,), generator=g).float() / 64  # ties everywhere, zeros included
    e[torch.randint(0, V, (1,), generator=g)] = 1.0
    e[: V // 3] = torch.rand(V // 3, generator=g) ** 8  # and distinct tiny weights
    cases = [e.contiguous()]
    if V > 1:
        nan = e.clone()
        nan[V // 2] = float("nan")
        cases.append(nan)
    for w in cases:
        S = float(w[~w.isnan()].sum())
        for k, p, m in [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05), (40, 0.95, 0.02), (0, 0.3, 0.5)]:
            ref_ids, ref_c = di.ops._test_sample_keep(w, S, k, p, m, True)
            ids, c = di.ops._test_sample_keep(w, S, k, p, m, False)
            assert torch.equal(ids, ref_ids) and (c == ref_c or math.isnan(c) and math.isnan(ref_c)), (V, k, p, m)


def test_engine_draw_is_the_contracts_where_weights_straddle_the_candidates_bound(di):
    """sample_token ranks only the candidates (weights of at least 2^-24, det_sample_cpu.cpp); the
    contract's heap walk ranks every id. One logit at 0 and 16,383 at -(23.8 +- 1.2) ln 2: weights
    spread over [2^-25, 2^-22.6], a quarter or more of them in [2^-24, 2^-23), each of which still
    moves the running sum while it is below 2. Seeds whose u lies near 1 draw deep among them, where
    a bound that dropped a weight it must keep changes the token."""
    V, position = 16384, 9
    g = torch.Generator().manual_seed(3)
    logits = (-(23.8 + torch.empty(V, dtype=torch.float64).uniform_(-1.2, 1.2, generator=g)) * math.log(2)).float()
    logits[0] = 0.0
    w = torch.exp(logits.double())
    assert int(((w >= 2.0**-24) & (w < 2.0**-23)).sum()) > V // 4
    bits = uniform_bits(np.arange(1 << 17, dtype=np.uint64), position)
    seeds = [int(s) for s in np.flatnonzero(bits > int((1 - 1.5e-3) * 2**24))[:40]] + list(range(10))
    drawn = set()
    for top_k, top_p, min_p in ((0, 1.0, 0.0), (V // 2, 1.0, 0.0), (0, 0.99995, 0.0), (0, 1.0, 1e-9)):
        for seed in seeds:
            args = (logits, 1.0, top_k, top_p, min_p, seed, position)
            want = di.ops._test_sample_token_reference(*args)
            assert di.ops.sample_token(*args) == want, (top_k, top_p, min_p, seed)
            drawn.add(want)
    assert len(drawn) > 20  # the draws spread over the tail, not only rank 0
