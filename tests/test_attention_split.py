"""Split attention (geometry attn = C > 0: units of (row, KV head's query heads, 128-position chunk)
over the whole grid, the last unit of each (row, query pair) folding the pair's partials in increasing
chunk order, C chunks per pass) gives
the CPU engine's bits past several chunks: for every family's attention (full, sliding windows that
start inside a chunk, Gemma's local and global layers, Gemma-4's shared K/V), in one pass and in
many, for batch rows at different positions; and it spreads the work: the busiest warp's attention
falls from a whole head's context to one chunk. About a minute on 2 cores."""
import importlib

import pytest
import torch
from det_fixtures import synthetic
from det_fixtures.certification import model_dir

N = 300  # positions: three chunks of 128


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tmp_path_factory.mktemp("attn_split")


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3", "gemma4"])
def test_split_attention_equals_the_engine_past_two_chunks(di, models, family):
    directory = model_dir(family, models)
    engine = di.MegaModel.from_pretrained(directory, max_context=512)
    ids = synthetic.token_sequence(N, engine.config.vocab_size, 7)
    want = engine.teacher_forced_logits(ids)
    for geo in (dict(grid=3, warps=2, ring=2, tile_rows=8, seed=4, attn=1),  # a pass per chunk: the fold's state
                dict(grid=2, warps=4, ring=4, tile_rows=16, seed=9, attn=32)):  # one pass
        mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated", geometry=geo)
        assert same_bits(mm.teacher_forced_logits(ids), want), (family, geo)


# (query heads, KV heads, head_dim): the unit's instantiations (det_mk_phase_attn_chunks, query
# heads in pairs) beyond the synthetic families' (4, 2, 48) and (4, 1, 64): a pair and a padded one;
# one query per KV head with 16 dot accumulators; three pairs of one KV head; 10 accumulators in a
# tree of 16; 32 accumulators; 32 accumulators over two blocks of 256.
GROUP_SHAPES = [(6, 2, 64), (3, 3, 128), (6, 1, 64), (4, 2, 80), (4, 1, 256), (2, 1, 512)]


@pytest.mark.parametrize("heads,kv_heads,head_dim,stage", [(*s, 0) for s in GROUP_SHAPES] +
                         [(*s, 2) for s in GROUP_SHAPES if s[2] <= 128])
def test_split_attention_query_groups(di, tmp_path, heads, kv_heads, head_dim, stage):
    """Every shape of unit gives the engine's bits, read from the cache or (stage 2, head_dim up to
    128: 8 and 16 accumulators) from the block's copy of each chunk; the cache's capacity, 301, ends
    inside a key panel (positions 288..300), which the units read element by element."""
    directory = synthetic.write_checkpoint("llama", str(tmp_path / "m"), seed=3, num_hidden_layers=1,
                                           num_attention_heads=heads, num_key_value_heads=kv_heads,
                                           head_dim=head_dim)
    ids = synthetic.token_sequence(N, 1000, 11)
    engine = di.MegaModel.from_pretrained(directory, max_context=512)
    want = engine.prefill(ids, engine.new_state(301), logits="all")
    mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                      geometry=dict(grid=3, warps=2, ring=2, tile_rows=16, seed=2, attn=2, stage=stage))
    assert same_bits(mm.prefill(ids, mm.new_state(301), logits="all"), want)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "gemma4"])
def test_split_attention_batch_rows_at_different_positions(di, models, family):
    """Decode rows (each its own sequence) take ROPE's work into the units: q and k norms (qwen3,
    gemma), windows, Gemma-4's v norm and shared K/V; the engine's tokens and logits bits."""
    directory = model_dir(family, models)
    engine = di.MegaModel.from_pretrained(directory, max_context=512)
    V = engine.config.vocab_size
    prompts = [synthetic.token_sequence(n, V, 10 + n) for n in (20, 290, 140)]
    tokens, logits = engine.generate_batch(prompts, max_new=3, return_logits=True)
    mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                      geometry=dict(grid=3, warps=2, ring=2, tile_rows=4, seed=5, attn=2))
    got_tokens, got_logits = mm.generate_batch(prompts, max_new=3, return_logits=True)
    assert got_tokens == tokens
    assert all(same_bits(a, b) for a, b in zip(got_logits, logits))


def test_split_attention_spreads_the_work(di, models):
    """Batch 1 at position ~300 (llama: 4 query heads over 2 KV heads, head_dim 48, 16 warps): with
    attn 0 the busiest warp walks the whole context of one head, 2 x 48 fmas per slot; split, a unit
    is one chunk of 128 slots for the 2 query heads of a KV head, and the units spread over 2 KV
    heads x 3 chunks = 6 warps; the last unit of each KV head folds its pair's partials in the same
    phase (one pass: ATTEND has no inner barrier)."""
    prof = importlib.import_module(di.__name__ + ".profiling")
    directory = model_dir("llama", models)
    prompt = synthetic.token_sequence(N - 2, 1000, 3)
    busiest = {}
    for attn in (0, 32):
        mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                          geometry=dict(grid=4, warps=4, ring=2, tile_rows=16, seed=0, attn=attn))
        cfg = mm.config
        assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 48)
        tl = prof.work_profile(mm, [prompt], 2, capacity=4096)
        rows = prof.work_rows(tl, mm.layer_plan())
        decode = rows[tl["tags"].index(-1) + 1:]
        attend = [r for r in decode if r["kind"].startswith("attend")]
        busiest[attn] = max(r["fmas_max"] for r in attend)
        assert len(attend) == mm.config.num_hidden_layers  # a phase a layer: no fold phase
        if attn:
            assert all(r["kind"] == "attend" and r["busy"] == 2 * 3 for r in attend)
    pos = N - 2  # the decode step's position
    assert busiest[0] == (pos + 1) * 2 * 48
    assert busiest[32] <= 128 * 2 * 48 * 2


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3", "gemma4"])
def test_staged_chunks_give_the_engines_bits(di, models, family):
    """Geometry stage 2: a block copies a chunk's keys and values once into shared memory for the
    rows of one sequence it takes, and its warps run the same units on the copy. Teacher-forced
    (prompt tiles of one sequence, windows whose chunk changes inside a tile: mistral, gemma3,
    gemma4's local layers) and a batch's prefill (tiles whose rows are several sequences' runs),
    in one pass and a pass per chunk: the engine's bits."""
    directory = model_dir(family, models)
    engine = di.MegaModel.from_pretrained(directory, max_context=512)
    V = engine.config.vocab_size
    ids = synthetic.token_sequence(N, V, 7)
    want = engine.teacher_forced_logits(ids)
    prompts = [synthetic.token_sequence(n, V, 30 + n) for n in (21, 150, 9)]  # runs end inside a task
    tokens, logits = engine.generate_batch(prompts, max_new=2, return_logits=True)
    for geo in (dict(grid=3, warps=4, ring=2, tile_rows=32, seed=4, attn=1, stage=2),
                dict(grid=2, warps=2, ring=2, tile_rows=16, seed=9, attn=32, stage=3)):
        mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated", geometry=geo)
        assert same_bits(mm.teacher_forced_logits(ids), want), (family, geo)
        got_tokens, got_logits = mm.generate_batch(prompts, max_new=2, return_logits=True)
        assert got_tokens == tokens, (family, geo)
        assert all(same_bits(a, b) for a, b in zip(got_logits, logits)), (family, geo)


def test_staged_chunks_read_each_chunk_once_per_block_task(di, models):
    """A 32-row prompt tile at positions 256..287 (llama: 2 KV heads, a query pair each, head_dim
    48; 4 warps, so a block task takes 4 rows): unstaged, each (row, KV head) unit reads its chunk's
    keys and values from global memory for itself; staged, each block task copies them once for its
    4 rows. The attention phase of that tile reads several times fewer global bytes, and its units'
    fmas are the same."""
    prof = importlib.import_module(di.__name__ + ".profiling")
    directory = model_dir("llama", models)
    prompt = synthetic.token_sequence(288, 1000, 3)
    seen = {}
    for stage in (0, 2):
        mm = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                          geometry=dict(grid=4, warps=4, ring=2, tile_rows=32, seed=0, attn=32,
                                                        stage=stage))
        tl = prof.work_profile(mm, [prompt], 1, capacity=4096)
        rows = prof.work_rows(tl, mm.layer_plan())
        attend = [r for r in rows if r["kind"] == "attend"]  # one pass: units and folds, one phase
        last = attend[-mm.config.num_hidden_layers:]  # the last tile's: positions 256..287, 3 chunks a row
        seen[stage] = (sum(r["global_bytes_mean"] * r["busy"] for r in last),
                       sum(r["fmas_mean"] * r["busy"] for r in last))
    assert seen[2][1] == seen[0][1]
    assert seen[2][0] * 3 < seen[0][0], seen


@pytest.mark.parametrize("bad", [33, -1])
def test_bad_attn_geometry(di, models, bad):
    with pytest.raises(ValueError, match="attn must be"):
        di.MegaModel.from_pretrained(model_dir("llama", models), executor="emulated", geometry=dict(attn=bad))


def test_misaligned_cache_is_refused(di, models):
    """The units read keys 16 bytes at a time: a cache tensor at an odd offset gets a clear error."""
    mm = di.MegaModel.from_pretrained(model_dir("llama", models), max_context=64, executor="emulated",
                                      geometry=dict(attn=2))
    state = mm.new_state(32)
    shifted = torch.zeros(state.cache.numel() + 1)[1:].view(state.cache.shape)
    state.cache = shifted
    with pytest.raises(ValueError, match="16-byte aligned"):
        mm.prefill([1, 2, 3], state)
