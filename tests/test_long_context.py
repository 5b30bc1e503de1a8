"""Long contexts on a tiny synthetic model (2 layers, width 64, GQA 4/2, head 16; sized for CI): at the
far end of an 8,192-position context one prefill, token by token and splits at random points and at
chunk boundaries give the same bits; a sequence batched with co-prompts of very different lengths
gives its bits alone; a 1,500-token generation is pinned on the CPU engine and the emulated
megakernel; near the 1M rope bound (positions 999,990..999,999, rope angles near 10^6 radians)
the logits match transformers in float64; and both executors lay the cache out as SPEC §13.8 says."""
import random

import hf_reference
import pytest
import torch
from det_fixtures import synthetic
from det_fixtures.certification import generation_digest
from det_fixtures.pins import LONG_GENERATION_DIGEST

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=300, max_position_embeddings=1 << 20,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
N = 8192
CHUNK = 128


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synthetic.write_checkpoint("llama", str(tmp_path_factory.mktemp("long") / "tiny"), **TINY)


@pytest.fixture(scope="module")
def long_run(di, tiny):
    mm = di.MegaModel.from_pretrained(tiny, max_context=N)
    ids = synthetic.token_sequence(N, 300, 5)
    return mm, ids, mm.teacher_forced_logits(ids)


def _bits(t):
    return t.contiguous().view(torch.int32)


def test_long_prefill_matches_float64(long_run, tiny):
    """The first 2,048 positions (16 chunks) against transformers in float64: the model the long
    tests and the pinned generation run is the contract's."""
    mm, ids, full = long_run
    ref = hf_reference.logits_float64(hf_reference.load_float64(tiny, mm._inv_freq), ids[:2048])
    dev = (full[:2048].double() - ref).abs()
    print(f"2048 positions: max {dev.max():.3g} mean {dev.mean():.3g}")
    assert dev.max() < 1e-4 and dev.mean() < 1e-5
    assert (full[:2048].argmax(-1) == ref.argmax(-1)).float().mean() > 0.99


def test_token_by_token_at_the_far_end_equals_one_prefill(long_run):
    mm, ids, full = long_run
    state = mm.new_state(N)
    mm.prefill(ids[: N - 40], state)
    for i in range(N - 40, N):
        assert torch.equal(_bits(mm.decode_step(ids[i], i, state)), _bits(full[i])), i


@pytest.mark.parametrize("cuts", ["chunk boundaries", "random"])
def test_splits_equal_one_prefill(long_run, cuts):
    """Pieces ending at chunk boundaries (63 x 128, then inside the last chunk), or at seeded random
    points: every piece's logits are the rows of the one prefill."""
    mm, ids, full = long_run
    if cuts == "chunk boundaries":
        ends = [63 * CHUNK, 63 * CHUNK + 1, 64 * CHUNK - 1, N]
    else:
        rng = random.Random(51)
        ends = sorted(rng.sample(range(1, N), 5)) + [N]
    state, start = mm.new_state(N), 0
    for end in ends:
        got = mm.extend(ids[start:end], state, logits="all")
        assert torch.equal(_bits(got), _bits(full[start:end])), (start, end)
        start = end


def test_batch_with_co_prompts_of_very_different_lengths(long_run):
    mm, ids, _ = long_run
    prompts = [ids[:3], ids[: N - 200], ids[700:1200], ids[5:6]]
    batch, logits = mm.generate_batch(prompts, max_new=6, return_logits=True)
    for p, got, got_logits in zip(prompts, batch, logits):
        alone, alone_logits = mm.generate(p, max_new=6, return_logits=True)
        assert got == alone
        assert torch.equal(_bits(got_logits), _bits(alone_logits))


@pytest.mark.parametrize("executor,geometry", [
    ("engine", None), ("emulated", {"grid": 2, "warps": 4, "tile_rows": 16, "attn": 4})])
def test_long_generation_digest(di, tiny, executor, geometry):
    """1,500 greedy tokens after a 100-token prompt (positions to 1,599, 13 chunks): the tokens and
    every step's logits, pinned (det_fixtures/pins.py)."""
    mm = di.MegaModel.from_pretrained(tiny, max_context=2048, executor=executor, geometry=geometry)
    tokens, logits = mm.generate(synthetic.token_sequence(100, 300, 9), max_new=1500, return_logits=True)
    assert len(tokens) == 1500
    assert generation_digest(tokens, logits) == LONG_GENERATION_DIGEST


def test_near_the_1m_rope_bound_matches_float64(di, tiny):
    """Positions 999,990..999,999 (the last ones a 1M-position state holds; rope angles up to 10^6
    radians, the contract's reduction is exact to 2^22) after 999,990 positions of zero keys and
    values (a state whose length is set without filling it: its cache is zeros). transformers in
    float64 gets the same zero past through past_key_values."""
    from transformers import DynamicCache

    P0, n = 999_990, 10
    mm = di.MegaModel.from_pretrained(tiny, max_context=1_000_000)
    state = mm.new_state(1_000_000)
    state.length = P0
    ids = synthetic.token_sequence(n, 300, 13)
    ours = mm.extend(ids, state, logits="all").double()

    ref_model = hf_reference.load_float64(tiny, mm._inv_freq)
    cfg = ref_model.config
    past = DynamicCache(config=cfg)
    zeros = torch.zeros((1, cfg.num_key_value_heads, P0, cfg.head_dim), dtype=torch.float64)
    for layer in range(cfg.num_hidden_layers):
        past.update(zeros, zeros, layer)
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids]), position_ids=torch.arange(P0, P0 + n)[None], past_key_values=past,
                        use_cache=True).logits[0]
    dev = (ours - ref).abs()
    print(f"near 1M: max {dev.max():.3g} mean {dev.mean():.3g}")
    assert dev.max() < 1e-4 and dev.mean() < 1e-5
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    with pytest.raises(ValueError, match="beyond the state's capacity 1000000"):
        mm.decode_step(ids[0], 1_000_000, state)
    with pytest.raises(ValueError, match="exceed max_context 1000000"):
        mm.new_state(1_000_001)


def _spec_cache(cache, capacity, layers, kv_heads, D, length):
    """(layers, kv_heads, length, D) keys and values read from a state's cache by docs/SPEC.md §13.8
    (written here from the text): head g of layer l starts at (l * kv_heads + g) * D * capacity;
    values are rows; keys lie in panels of 16 positions, element d of position p at
    p0 * D + d * min(16, capacity - p0) + p - p0."""
    k, v = cache[0].reshape(-1), cache[1].reshape(-1)
    keys, values = torch.empty(layers, kv_heads, length, D), torch.empty(layers, kv_heads, length, D)
    for l in range(layers):
        for g in range(kv_heads):
            head = (l * kv_heads + g) * D * capacity
            for p in range(length):
                p0 = p - p % 16
                w = min(16, capacity - p0)
                keys[l, g, p] = k[head + p0 * D + torch.arange(D) * w + (p - p0)]
                values[l, g, p] = v[head + p * D: head + (p + 1) * D]
    return keys, values


def test_cache_layout_is_the_spec(di, tiny):
    """Both executors store K and V where §13.8 says: a cache whose capacity ends inside a key panel
    (45 = 2 x 16 + 13 positions, all filled), read back by the SPEC's formula, holds transformers'
    float64 keys (after rope) and values; and the engine's and the emulated megakernel's caches are
    the same bits."""
    capacity, ids = 45, synthetic.token_sequence(45, 300, 9)
    L, G, D = TINY["num_hidden_layers"], TINY["num_key_value_heads"], TINY["head_dim"]
    caches = []
    for executor in ("engine", "emulated"):
        mm = di.MegaModel.from_pretrained(tiny, max_context=64, executor=executor)
        state = mm.new_state(capacity)
        mm.prefill(ids, state)
        caches.append(state.cache.clone())
    assert torch.equal(_bits(caches[0]), _bits(caches[1]))
    keys, values = _spec_cache(caches[0], capacity, L, G, D, capacity)
    ref = hf_reference.load_float64(tiny, mm._inv_freq)
    with torch.no_grad():
        past = ref(torch.tensor([ids]), use_cache=True).past_key_values
    for l in range(L):
        want_k, want_v = past.layers[l].keys[0], past.layers[l].values[0]  # (kv_heads, positions, D)
        assert (keys[l].double() - want_k).abs().max() < 1e-5 * (1 + want_k.abs().max()), l
        assert (values[l].double() - want_v).abs().max() < 1e-5 * (1 + want_v.abs().max()), l
