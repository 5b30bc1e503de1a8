"""The engines under a hostile process: a caller (or another library) that set flush-to-zero,
denormals-are-zero and a directed rounding mode still gets the pinned digests and keeps its own
environment; models used from several Python threads at once give their pinned digests."""
import ctypes
import ctypes.util
import platform
import threading

import pytest
import torch
from det_fixtures.certification import N_GEN, generation_digest, inputs_for, logits_digest, model_dir
from det_fixtures.pins import MODEL_DIGESTS

FE_UPWARD, FE_TONEAREST = 0x800, 0x0  # x86-64 glibc <fenv.h>


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return tmp_path_factory.mktemp("hardening_models")


def _libm():
    name = ctypes.util.find_library("m")
    if not name or platform.machine() != "x86_64":
        pytest.skip("the rounding-mode constants are x86-64 glibc's")
    return ctypes.CDLL(name)


@pytest.mark.parametrize("executor", ["engine", "emulated"])
def test_pinned_digests_under_a_poisoned_fp_environment(di, tmp_root, executor):
    libm = _libm()
    directory = model_dir("llama", tmp_root)
    mm = di.MegaModel.from_pretrained(directory, max_context=512, executor=executor)
    teacher, prompt = inputs_for("llama", directory, mm.config.vocab_size)
    tiny = torch.tensor([1e-39], dtype=torch.float32)
    try:
        torch.set_flush_denormal(True)
        assert libm.fesetround(FE_UPWARD) == 0
        assert (tiny * 1.0).item() == 0.0 and libm.fegetround() == FE_UPWARD  # the poison is active
        teacher_digest = logits_digest(mm.teacher_forced_logits(teacher))
        tokens, logits = mm.generate(prompt, max_new=N_GEN, return_logits=True)
        gen_digest = generation_digest(tokens, logits)
        assert libm.fegetround() == FE_UPWARD and (tiny * 1.0).item() == 0.0  # ... and still the caller's
    finally:
        libm.fesetround(FE_TONEAREST)
        torch.set_flush_denormal(False)
    assert teacher_digest == MODEL_DIGESTS["llama"]["teacher_forced"]
    assert gen_digest == MODEL_DIGESTS["llama"]["generation"]


def _digests(mm, teacher, prompt, out, key):
    try:
        tokens, logits = mm.generate(prompt, max_new=N_GEN, return_logits=True)
        out[key] = (logits_digest(mm.teacher_forced_logits(teacher)), generation_digest(tokens, logits))
    except Exception as e:  # reported by the main thread
        out[key] = e


def test_two_models_in_two_threads(di, tmp_root):
    jobs, out = [], {}
    for name in ("llama", "qwen3"):
        directory = model_dir(name, tmp_root)
        mm = di.MegaModel.from_pretrained(directory, max_context=512)
        teacher, prompt = inputs_for(name, directory, mm.config.vocab_size)
        jobs.append(threading.Thread(target=_digests, args=(mm, teacher, prompt, out, name)))
    for t in jobs:
        t.start()
    for t in jobs:
        t.join()
    for name in ("llama", "qwen3"):
        assert out[name] == (MODEL_DIGESTS[name]["teacher_forced"], MODEL_DIGESTS[name]["generation"]), out[name]


def test_one_model_in_two_threads_is_serialized(di, tmp_root):
    """Calls on one model from two threads run one after the other (a per-model lock), so each
    thread's results are its own: the default state is never advanced by two calls at once."""
    directory = model_dir("mistral", tmp_root)
    mm = di.MegaModel.from_pretrained(directory, max_context=512)
    teacher, prompt = inputs_for("mistral", directory, mm.config.vocab_size)
    out = {}
    jobs = [threading.Thread(target=_digests, args=(mm, teacher, prompt, out, i)) for i in range(2)]
    steps = {}

    def stepper():  # a third thread walking the default state token by token meanwhile
        rows = [mm.decode_step(t, p) for p, t in enumerate(teacher)]
        steps["digest"] = logits_digest(torch.stack(rows))

    jobs.append(threading.Thread(target=stepper))
    for t in jobs:
        t.start()
    for t in jobs:
        t.join()
    pins = MODEL_DIGESTS["mistral"]
    assert out[0] == out[1] == (pins["teacher_forced"], pins["generation"])
    assert steps["digest"] == pins["teacher_forced"]


@pytest.mark.parametrize("field, value, match", [
    ("num_hidden_layers", 2**31 - 1, "above the supported maximum"),
    ("head_dim", 2**30, "above the supported maximum"),
    ("vocab_size", 10**12, "above the supported maximum"),
    ("hidden_size", -4, "must be >= 1"),
    ("num_attention_heads", "8", "must be an integer"),
    ("num_key_value_heads", 3, "not a multiple"),
    ("rms_norm_eps", 0, "positive number"),
    ("num_hidden_layers", 7, "lacks"),  # consistent-looking but not what the tensors hold
])
def test_hostile_config_fields_are_refused_quickly(di, tmp_root, field, value, match):
    """A config.json with a missing, negative, huge or inconsistent field is a clear error, raised
    before anything is sized from the value (no tensor-name list or rope table of that size)."""
    import json
    import shutil
    import time

    src = model_dir("llama", tmp_root)
    case = tmp_root / f"cfg_{field}_{value}"
    shutil.copytree(src, case, dirs_exist_ok=True)
    cfg = json.loads((case / "config.json").read_text())
    cfg[field] = value
    (case / "config.json").write_text(json.dumps(cfg))
    t = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        di.MegaModel.from_pretrained(str(case))
    assert time.perf_counter() - t < 30  # a guard against hanging on a huge value, not a speed check


def test_kv_cache_that_does_not_fit_is_refused_before_allocation(di):
    """The KV cache's size is computed and compared with the available memory first: the error says
    what is needed and what is available (here 64 layers x 8 kv heads x 128 dims x 1M positions,
    500,000 MiB of fp32 K and V)."""
    from det_fixtures import synthetic
    cfg = dict(synthetic.CONFIGS["llama"], num_hidden_layers=64, num_attention_heads=8, num_key_value_heads=8,
               head_dim=128, max_position_embeddings=1 << 20)
    config = di.ModelConfig.from_dict(cfg)
    with pytest.raises(MemoryError, match=r"a KV cache of 1000000 positions needs 500000\.0 MiB, but only .* MiB"):
        di.KVState(config, 1_000_000)
