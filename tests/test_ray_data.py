"""di.ray_data on a local Ray cluster started here (2 CPUs, 127.0.0.1 only): every row's output is
what MegaModel.generate / score and certificate.make give it alone in this process, whatever the
number of actors, the batch size, the input order or the partitioning; a bad row fails alone."""
import os
import random

import pytest
import torch
from det_fixtures import synthetic

ray = pytest.importorskip("ray", reason="ray[data] is not installed (requirements.txt pins it)")

MAX_NEW = 4


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(synthetic.write_checkpoint("llama", tmp_path_factory.mktemp("ray") / "llama", seed=12))


@pytest.fixture(scope="module")
def mm(di, model_dir):
    return di.MegaModel.from_pretrained(model_dir, max_context=32)


@pytest.fixture(scope="module")
def rows(mm):
    V = mm.config.vocab_size
    rows = [{"id": i, "prompt_ids": synthetic.token_sequence(2 + (i * 3) % 9, V, 200 + i), "temperature": None,
             "seed": None, "max_new": None} for i in range(12)]
    rows[1].update(temperature=0.8, seed=2**62 + 1)
    rows[6].update(temperature=1.1, seed=6, max_new=7)
    rows[9].update(max_new=2)
    rows[4]["prompt_ids"] = [3, V]  # outside the vocabulary
    rows[10]["prompt_ids"] = [5] * 30  # 30 + 4 positions exceed max_context 32
    return rows


@pytest.fixture(scope="module")
def expected(di, mm, rows):
    want = {}
    for r in rows:
        if r["id"] in (4, 10):
            continue
        sampling = {k: r[k] for k in ("temperature", "seed") if r[k] is not None}
        max_new = r["max_new"] or MAX_NEW
        tokens, logprobs = mm.generate(r["prompt_ids"], max_new, return_logprobs=True, **sampling)
        want[r["id"]] = (tokens, logprobs, di.certificate.make(mm, r["prompt_ids"], max_new, **sampling)["merkle_root"])
    return want


@pytest.mark.parametrize("concurrency,batch_size,num_cpus,arrange", [
    (1, 16, 1, "as given"),
    (2, 5, 0.5, "shuffled, 3 blocks"),  # 0.5 CPU an actor leaves Ray's shuffle tasks a CPU
    (2, 1, 0.5, "random_shuffle"),
])
def test_generation_does_not_depend_on_placement(di, cluster, model_dir, mm, rows, expected, concurrency, batch_size,
                                                  num_cpus, arrange):
    if arrange == "shuffled, 3 blocks":
        shuffled = list(rows)
        random.Random(batch_size).shuffle(shuffled)
        ds = ray.data.from_items(shuffled).repartition(3)
    elif arrange == "random_shuffle":
        ds = ray.data.from_items(rows).random_shuffle(seed=7)
    else:
        ds = ray.data.from_items(rows)
    out = di.ray_data.generate(ds, model_dir, max_new=MAX_NEW, max_context=32, batch_size=batch_size,
                               concurrency=concurrency, num_cpus=num_cpus).take_all()
    assert sorted(r["id"] for r in out) == list(range(12))
    sha = di.certificate.model_sha256(mm)
    for r in out:
        assert r["model_sha256"] == sha and r["contract_version"] == di.CONTRACT_VERSION
        assert r["prompt_ids"] is not None  # the input columns are kept
        if r["id"] == 4:
            assert "outside the vocabulary" in r["error"] and r["tokens"] is None
            continue
        if r["id"] == 10:
            assert "exceed max_context 32" in r["error"] and r["certificate_root"] is None
            continue
        tokens, logprobs, root = expected[r["id"]]
        assert r["error"] is None
        assert list(r["tokens"]) == tokens and r["certificate_root"] == root
        assert torch.equal(torch.tensor(list(r["logprobs"]), dtype=torch.float32), logprobs)


def test_scoring_does_not_depend_on_placement(di, cluster, model_dir, mm):
    V = mm.config.vocab_size
    items = [{"id": i, "context_ids": synthetic.token_sequence(1 + i % 6, V, 300 + i),
              "continuation_ids": synthetic.token_sequence(1 + (5 * i) % 8, V, 400 + i)} for i in range(11)]
    items[3]["continuation_ids"] = [V + 2]
    random.Random(1).shuffle(items)
    out = di.ray_data.score(ray.data.from_items(items).repartition(2), model_dir, top_k=2, max_context=32,
                            batch_size=5, concurrency=2, num_cpus=0.5).take_all()
    assert sorted(r["id"] for r in out) == list(range(11))
    for r in out:
        if r["id"] == 3:
            assert "continuation_ids is outside the vocabulary" in r["error"] and r["logprobs"] is None
            continue
        s = mm.score(r["context_ids"], r["continuation_ids"], top_k=2)
        assert r["error"] is None
        assert torch.equal(torch.tensor(list(r["logprobs"]), dtype=torch.float32), s.logprobs)
        assert list(r["ranks"]) == s.ranks.tolist() and [list(t) for t in r["top_ids"]] == s.top_ids.tolist()
        assert r["total"] == s.total and r["is_greedy"] == s.is_greedy


def test_bad_calls_fail_before_any_actor_starts(di, model_dir):
    ds = ray.data.from_items([{"prompt_ids": [1, 2]}])  # lazy: nothing runs, no cluster needed
    for call, exc, message in [
        (lambda: di.ray_data.generate(ds, model_dir, max_new=0), ValueError, "max_new must be a positive int"),
        (lambda: di.ray_data.generate(ds, model_dir, max_new=4, temperature=-1.0), ValueError, "temperature"),
        (lambda: di.ray_data.generate(ds, model_dir, max_new=4, tempreature=1.0), TypeError, "unknown keyword"),
        (lambda: di.ray_data.generate(ds, model_dir, max_new=4, concurrency=0), ValueError, "concurrency must be"),
        (lambda: di.ray_data.generate(ds, model_dir, max_new=4, batch_size=0), ValueError, "batch_size must be"),
        (lambda: di.ray_data.generate(ds, model_dir, max_new=4, stop_ids=[2.5]), TypeError, "stop_ids must be"),
        (lambda: di.ray_data.score(ds, model_dir, top_k=-1), ValueError, "top_k must be"),
        (lambda: di.ray_data.score(ds, model_dir, temperature=0), ValueError, "temperature must be"),
        (lambda: di.ray_data.score(ds, model_dir, sampling={"top_q": 1}), ValueError, "sampling must be"),
    ]:
        with pytest.raises(exc, match=message):
            call()


_WORKER = r"""
import json, sys
from ray import cloudpickle
cls = cloudpickle.loads(sys.stdin.buffer.read())
if sys.argv[1] == "hub":  # a node without the driver's directory: the package comes from get_kernel
    cls.__init__.__globals__["_package"].__globals__["_PACKAGE_DIR"] = "/nonexistent/det-infer"
predictor = cls(sys.argv[2], max_new=3)
table = predictor({"prompt_ids": [[5, 6, 7]]})
print(json.dumps({"tokens": table.column("tokens").to_pylist()[0], "kernels": "kernels" in sys.modules,
                  "modules": [m for m in sys.modules if m.endswith(".ray_data")]}))
"""


@pytest.mark.parametrize("source", ["directory", "hub"])
def test_the_predictor_travels_by_value_to_a_fresh_process(di, model_dir, mm, tmp_path, source):
    """What a Ray worker does with the class: unpickle it where the package's build-specific module
    name cannot be imported, and load the package from the driver's directory or with get_kernel
    (and the model from a directory or, here with the hub, a GGUF file)."""
    import json
    import subprocess
    import sys

    from det_fixtures.gguf_files import write_gguf
    from ray import cloudpickle

    if source == "hub":
        model, _ = write_gguf("llama", "Q8_0", str(tmp_path))
        want = di.MegaModel.from_gguf(model).generate([5, 6, 7], 3)
    else:
        model, want = model_dir, mm.generate([5, 6, 7], 3)
    blob = cloudpickle.dumps(di.ray_data.DetInferPredictor)
    run = subprocess.run([sys.executable, "-c", _WORKER, source, model], input=blob, capture_output=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    got = json.loads(run.stdout.decode().strip().splitlines()[-1])
    assert got["tokens"] == want
    assert got["modules"] == [f"{di.__name__}.ray_data"] and got["kernels"] == (source == "hub")
