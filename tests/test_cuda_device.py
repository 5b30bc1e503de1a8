"""The contract on a real GPU (run by scripts/device_check.sh on a lent GPU; skipped elsewhere):
the CUDA executor's elementwise functions reproduce the CPU-pinned digest bit for bit, and the
megakernel reproduces the CPU-pinned certificate digests of every synthetic model (the real SmolLM2
checkpoint is not carried to the device machine) across geometries, batch composition and launch
granularity."""

from det_fixtures import contract_inputs
import nf4_checkpoints
import pytest
import torch
from det_fixtures.certification import (N_GEN, SYNTHETIC, batch_with_target, generation_digest, inputs_for, logits_digest,
                           model_dir)
from det_fixtures.pins import CONTRACT_MATH_DIGEST, MODEL_DIGESTS, SAMPLED_DIGESTS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_cuda_contract_digest(di):
    assert contract_inputs.digest_through_ops(di, device="cuda") == CONTRACT_MATH_DIGEST


def test_cuda_equals_cpu_on_wide_inputs(di):
    bits = torch.randint(0, 2**32, (4_000_000,), dtype=torch.int64, generator=torch.Generator().manual_seed(1))
    x = bits.to(torch.int32).view(torch.float32)
    for fn in ("exp", "tanh", "silu", "gelu_tanh", "rsqrt", "bf16_round", "log"):
        cpu = di.contract.unary(x, fn)
        gpu = di.contract.unary(x.cuda(), fn).cpu()
        assert torch.equal(cpu.view(torch.int32), gpu.view(torch.int32)), fn
    theta = torch.empty(2_000_000, dtype=torch.float64).uniform_(-(2.0**22), 2.0**22)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(di.contract.sincos(theta), di.contract.sincos(theta.cuda())))


# ---- the megakernel -------------------------------------------------------------------------------
# (grid, warps, ring, tile_rows[, attn[, ahead[, barrier[, outs[, stage[, area_rows]]]]]]); 0 = the launcher's choice
# (every SM, 8 warps, ring 4, 16 rows at most; 64 and 128: prompt tiles, asked for); attn > 0: split
# attention, that many chunks a pass; ahead > 0: weights ahead of their inputs, that many KB per warp
# into L2; barrier 1: the monotonic counter
GPU_GEOMETRIES = [(0, 0, 0, 0), (1, 1, 2, 1), (2, 4, 4, 4, 1, 0, 1, 4, 1), (7, 8, 2, 16, 0, 4, 0, 2),
                  (13, 2, 4, 8, 32, 16, 1, 4, 1), (0, 0, 0, 0, 32), (0, 0, 0, 0, 32, 16, 1),
                  (0, 0, 0, 0, 0, 0, 0, 4, 1), (0, 0, 0, 64, 32, 16, 0, 2), (0, 0, 0, 128),  # prompt tiles
                  (0, 0, 0, 64, 32, 16, 0, 4, 1, 8)]  # a tile taken 8 rows at a time (area_rows)


@pytest.fixture(scope="module", params=SYNTHETIC)
def gpu_case(request, di, tmp_path_factory):
    name = request.param
    directory = model_dir(name, tmp_path_factory.mktemp("gpu_models"))

    def load(g=(0, 0, 0, 0)):
        geo = dict(zip(("grid", "warps", "ring", "tile_rows", "attn", "ahead", "barrier", "outs", "stage", "area_rows"), g))
        return di.MegaModel.from_pretrained(directory, device="cuda", max_context=512, geometry=geo)

    mm = load()
    teacher, prompt = inputs_for(name, directory, mm.config.vocab_size)
    engine = di.MegaModel.from_pretrained(directory, max_context=512)
    return {"name": name, "mm": mm, "load": load, "teacher": teacher, "prompt": prompt, "pins": MODEL_DIGESTS[name],
            "engine": engine}


def test_megakernel_teacher_forced_digest(gpu_case):
    assert logits_digest(gpu_case["mm"].teacher_forced_logits(gpu_case["teacher"])) == \
        gpu_case["pins"]["teacher_forced"]


def test_megakernel_generation_single_launch_and_per_step(gpu_case):
    mm = gpu_case["mm"]
    for single in (True, False):
        tokens, logits = mm.generate(gpu_case["prompt"], max_new=N_GEN, single_launch=single, return_logits=True)
        assert generation_digest(tokens, logits) == gpu_case["pins"]["generation"], single


@pytest.mark.parametrize("g", GPU_GEOMETRIES[1:], ids=lambda g: "x".join(map(str, g)))
def test_megakernel_geometry_sweep(gpu_case, g):
    mm = gpu_case["load"](g)
    assert logits_digest(mm.teacher_forced_logits(gpu_case["teacher"])) == gpu_case["pins"]["teacher_forced"]
    tokens, logits = mm.generate(gpu_case["prompt"], max_new=N_GEN, return_logits=True)
    assert generation_digest(tokens, logits) == gpu_case["pins"]["generation"]


def test_megakernel_batch_of_16(gpu_case):
    mm = gpu_case["mm"]
    prompts, slot, _ = batch_with_target(f"gpu-co-prompts:{gpu_case['name']}", gpu_case["prompt"],
                                         mm.config.vocab_size, 150)
    streams, logits = mm.generate_batch(prompts, max_new=N_GEN, return_logits=True)
    assert generation_digest(streams[slot], logits[slot]) == gpu_case["pins"]["generation"]


def test_megakernel_decode_step_timed_and_bad_input(gpu_case):
    mm = gpu_case["mm"]
    state = mm.new_state(8)
    logits, seconds = mm.decode_step_timed(5, 0, state)
    assert logits.is_cuda and logits.shape == (mm.config.vocab_size,) and seconds > 0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        mm.decode_step(mm.config.vocab_size, 1, state)
    with pytest.raises(ValueError, match="grid exceeds|shared memory"):
        gpu_case["load"]((100000 % 65535, 8, 4, 16)).teacher_forced_logits([5, 6])


def test_megakernel_sampled_digests(gpu_case):
    """Seeded sampling inside the GPU launch reproduces the CPU-pinned sampled streams (llama)."""
    if gpu_case["name"] != "llama":
        pytest.skip("sampled digests are pinned for the llama model")
    from test_sampling import N_SAMPLED, SETTINGS

    for name, kw in SETTINGS.items():
        tokens, logits = gpu_case["mm"].generate(gpu_case["prompt"], max_new=N_SAMPLED, return_logits=True, **kw)
        assert generation_digest(tokens, logits) == SAMPLED_DIGESTS[name], name


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_megakernel_nf4_equals_cpu_engine(di, tmp_path, family):
    """nf4 projections decoded on the GPU (4-byte cp.async, per-lane decode) give the CPU engine's bits."""
    d = nf4_checkpoints.write_packed(family, str(tmp_path / family), di.ops.nf4_codebook(), blocksize=64)
    cpu = di.MegaModel.from_pretrained(d, max_context=512)
    gpu = di.MegaModel.from_pretrained(d, device="cuda", max_context=512)
    teacher, prompt = inputs_for(family, d, cpu.config.vocab_size)
    assert logits_digest(gpu.teacher_forced_logits(teacher)) == logits_digest(cpu.teacher_forced_logits(teacher))
    tokens, logits = gpu.generate(prompt, max_new=N_GEN, return_logits=True)
    want_tokens, want_logits = cpu.generate(prompt, max_new=N_GEN, return_logits=True)
    assert generation_digest(tokens, logits) == generation_digest(want_tokens, want_logits)
    assert gpu.generate_batch([prompt, teacher[:30]], max_new=8) == cpu.generate_batch([prompt, teacher[:30]], max_new=8)


def test_kv_cache_that_does_not_fit_the_gpu_is_refused(di):
    """Checked against torch.cuda.mem_get_info before anything is allocated on the device."""
    from det_fixtures import synthetic
    cfg = dict(synthetic.CONFIGS["llama"], num_hidden_layers=64, num_attention_heads=8, num_key_value_heads=8,
               head_dim=128, max_position_embeddings=1 << 20)
    with pytest.raises(MemoryError, match=r"needs 500000\.0 MiB, but only .* MiB of memory is available"):
        di.KVState(di.ModelConfig.from_dict(cfg), 1_000_000, device="cuda")


@pytest.mark.parametrize("attn", [1, 32])
def test_split_attention_past_several_chunks(gpu_case, attn):
    """Split attention (geometry attn) on the GPU: 300 positions, three chunks, in a pass per chunk
    and in one pass, the CPU engine's bits (tests/test_attention_split.py does this under emulation)."""
    from det_fixtures import synthetic

    mm = gpu_case["load"]((0, 0, 0, 0, attn))
    ids = synthetic.token_sequence(300, mm.config.vocab_size, 7)
    engine = gpu_case["engine"]
    want = engine.teacher_forced_logits(ids)
    got = mm.teacher_forced_logits(ids).cpu()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_update_weights_on_the_gpu(di, tmp_path):
    """update_weights with CPU and with CUDA tensors (the trainer's, which the model must copy, not
    alias): the GPU model then gives a fresh CPU load's bits of the new weights."""
    from det_fixtures import synthetic

    d = synthetic.write_checkpoint("qwen2", str(tmp_path / "q"))
    gpu = di.MegaModel.from_pretrained(d, device="cuda", max_context=128)
    new = synthetic.state_dict("qwen2", seed=1)
    d1 = synthetic.write_checkpoint("qwen2", str(tmp_path / "q1"), seed=1)
    trainer = {n: t.cuda() for n, t in new.items() if "layers" in n}
    gpu.update_weights({n: t for n, t in new.items() if "layers" not in n})
    gpu.update_weights(trainer)
    for t in trainer.values():
        t.add_(1.0)  # the optimizer's next step must not reach the model
    ids = synthetic.token_sequence(40, 1000, 3)
    want = di.MegaModel.from_pretrained(d1, max_context=128).teacher_forced_logits(ids)
    assert torch.equal(gpu.teacher_forced_logits(ids).cpu().view(torch.int32), want.view(torch.int32))
