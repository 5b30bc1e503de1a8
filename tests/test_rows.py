"""di.rows: a batch of rows generated or scored, each row's output the one MegaModel.generate /
score gives it alone, whatever the batch, its order or its grouping; a bad row fails alone."""
import json
import random

import pytest
import torch
from det_fixtures import synthetic

MAX_NEW = 5


@pytest.fixture(scope="module")
def mm(di, tmp_path_factory):
    d = synthetic.write_checkpoint("llama", tmp_path_factory.mktemp("rows") / "llama", seed=11)
    return di.MegaModel.from_pretrained(d, max_context=64)


def _rows(vocab):
    """Prompts of several lengths; some sampled, some with their own max_new."""
    rows = [{"prompt_ids": synthetic.token_sequence(2 + (i * 5) % 11, vocab, 40 + i)} for i in range(9)]
    rows[2].update(temperature=0.9, seed=5)
    rows[4].update(temperature=1.3, top_k=20, top_p=0.9, seed=2**63 + 9)
    rows[6].update(max_new=2)
    rows[7].update(max_new=9, temperature=0.7, min_p=0.05, seed=1)
    return rows


def _columns(rows):
    names = sorted({k for r in rows for k in r})
    return {k: [r.get(k) for r in rows] for k in names}


def _alone(di, mm, row, stop_ids=()):
    """What generate and certificate.make give the row alone."""
    sampling = {k: row[k] for k in di.certificate.SAMPLING_FIELDS if k in row}
    max_new = row.get("max_new", MAX_NEW)
    tokens, logprobs = mm.generate(row["prompt_ids"], max_new, stop_ids=list(stop_ids), return_logprobs=True,
                                   **sampling)
    cert = di.certificate.make(mm, row["prompt_ids"], max_new, stop_ids=list(stop_ids), **sampling)
    assert cert["tokens"] == tokens
    return tokens, logprobs, cert["merkle_root"]


def test_each_row_is_what_it_gives_alone_in_any_batch_and_order(di, mm):
    rows = _rows(mm.config.vocab_size)
    want = [_alone(di, mm, r) for r in rows]
    gen = di.rows.RowGenerator(mm, max_new=MAX_NEW)
    order = list(range(len(rows)))
    for size in (len(rows), 4, 1):
        random.Random(size).shuffle(order)
        for start in range(0, len(order), size):
            part = order[start:start + size]
            out = gen(_columns([rows[i] for i in part]))
            assert set(out) == {"tokens", "logprobs", "finish_reason", "certificate_root", "model_sha256",
                                "contract_version", "error"}
            for j, i in enumerate(part):
                tokens, logprobs, root = want[i]
                assert out["error"][j] is None
                assert out["tokens"][j] == tokens and out["certificate_root"][j] == root
                assert torch.equal(torch.tensor(out["logprobs"][j], dtype=torch.float32), logprobs)
                assert out["finish_reason"][j] == "length"
                assert out["model_sha256"][j] == di.certificate.model_sha256(mm)
                assert out["contract_version"][j] == di.CONTRACT_VERSION


def test_stop_ids_end_a_row_and_its_certificate_binds_them(di, mm):
    row = _rows(mm.config.vocab_size)[0]
    free = _alone(di, mm, row)[0]
    stop = free[1]  # a token the free run produces: the row ends at its first occurrence
    cut = free[:free.index(stop) + 1]
    assert len(cut) < MAX_NEW
    tokens, _, root = _alone(di, mm, row, stop_ids=[stop])
    out = di.rows.RowGenerator(mm, max_new=MAX_NEW, stop_ids=[stop], certificates=True)(_columns([row]))
    assert out["tokens"][0] == tokens == cut and out["finish_reason"][0] == "stop"
    cert = json.loads(out["certificate"][0])
    assert cert["merkle_root"] == out["certificate_root"][0] == root
    assert di.certificate.verify(mm, cert)["match"]


@pytest.mark.parametrize("bad,message", [
    ({"prompt_ids": [10**6]}, "outside the vocabulary"),
    ({"prompt_ids": [3, 2.5]}, "integer token ids"),
    ({"prompt_ids": []}, "is empty"),
    ({"prompt_ids": "hello"}, "not a string"),
    ({"prompt_ids": [5] * 62}, "exceed max_context 64"),
    ({"prompt_ids": [5], "max_new": 0}, "max_new must be a positive int"),
    ({"prompt_ids": [5], "temperature": -1.0}, "temperature must be"),
    ({"prompt_ids": [5], "seed": -3}, "seed must be"),
])
def test_a_bad_row_gets_its_error_and_the_others_complete(di, mm, bad, message):
    rows = _rows(mm.config.vocab_size)[:3]
    want = [_alone(di, mm, r) for r in rows]
    out = di.rows.RowGenerator(mm, max_new=MAX_NEW)(_columns(rows[:2] + [bad] + rows[2:]))
    assert message in out["error"][2]
    assert out["tokens"][2] is None and out["certificate_root"][2] is None
    for j, i in ((0, 0), (1, 1), (3, 2)):
        assert out["error"][j] is None and out["tokens"][j] == want[i][0] and out["certificate_root"][j] == want[i][2]


def test_a_failure_inside_a_batch_is_traced_to_its_row(di, mm, monkeypatch):
    rows = _rows(mm.config.vocab_size)[:4]
    want = [_alone(di, mm, r)[0] for r in rows]
    generate_batch = mm.generate_batch

    def failing(prompts, *args, **kwargs):  # a fault only rows[1] triggers, seen after the checks
        if rows[1]["prompt_ids"] in prompts:
            raise RuntimeError("injected fault")
        return generate_batch(prompts, *args, **kwargs)

    monkeypatch.setattr(mm, "generate_batch", failing)
    out = di.rows.RowGenerator(mm, max_new=MAX_NEW)(_columns(rows))
    assert out["error"] == [None, "RuntimeError: injected fault", None, None]
    assert out["tokens"] == [want[0], None, want[2], want[3]]


def test_call_level_settings_are_checked_at_construction(di, mm):
    with pytest.raises(ValueError, match="max_new must be a positive int"):
        di.rows.RowGenerator(mm, max_new=0)
    with pytest.raises(ValueError, match="top_p"):
        di.rows.RowGenerator(mm, max_new=4, temperature=1.0, top_p=0.0)
    with pytest.raises(TypeError, match="stop_ids must be integer token ids, got 2.5"):
        di.rows.RowGenerator(mm, max_new=4, stop_ids=[3, 2.5])
    with pytest.raises(TypeError, match="unknown sampling keyword"):
        di.rows.RowGenerator(mm, max_new=4, temprature=1.0)
    with pytest.raises(ValueError, match="no column 'prompt_ids'"):
        di.rows.RowGenerator(mm, max_new=4)({"prompt": [[1, 2]]})
    with pytest.raises(ValueError, match="top_k must be"):
        di.rows.RowScorer(mm, top_k=-1)


def test_scoring_rows_is_score_alone(di, mm):
    V = mm.config.vocab_size
    pairs = [(synthetic.token_sequence(1 + i % 5, V, 70 + i), synthetic.token_sequence(1 + (3 * i) % 7, V, 90 + i))
             for i in range(7)]
    scorer = di.rows.RowScorer(mm, top_k=3, sampling={"top_k": 50})
    bad = {"context_ids": [[], [V]], "continuation_ids": [[4], [4]]}
    cols = {"context_ids": [c for c, _ in pairs] + bad["context_ids"],
            "continuation_ids": [x for _, x in pairs] + bad["continuation_ids"]}
    out = scorer(cols)
    assert "is empty" in out["error"][7] and "outside the vocabulary" in out["error"][8]
    for i, (ctx, cont) in enumerate(pairs):
        s = mm.score(ctx, cont, top_k=3, sampling={"top_k": 50})
        assert out["error"][i] is None
        assert torch.equal(torch.tensor(out["logprobs"][i], dtype=torch.float32), s.logprobs)
        assert torch.equal(torch.tensor(out["kept_logprobs"][i], dtype=torch.float32), s.kept_logprobs)
        assert out["ranks"][i] == s.ranks.tolist() and out["greedy"][i] == s.greedy.tolist()
        assert out["top_ids"][i] == s.top_ids.tolist() and out["is_greedy"][i] == s.is_greedy
        assert out["total"][i] == s.total


def test_gaps_and_whole_floats_in_setting_columns_mean_what_pandas_meant(di, mm):
    """pandas keeps an int column with a gap as float64 (NaN for the gap): a gap is the call's value,
    a whole float its int."""
    pd = pytest.importorskip("pandas")
    rows = _rows(mm.config.vocab_size)[:3]
    frame = pd.DataFrame({"prompt_ids": [r["prompt_ids"] for r in rows], "max_new": [3, None, 2],
                          "temperature": [0.9, float("nan"), None], "seed": [5, None, None]})
    assert frame["max_new"].dtype == "float64"
    out = di.rows.RowGenerator(mm, max_new=MAX_NEW)(frame)
    want = [_alone(di, mm, {"prompt_ids": rows[0]["prompt_ids"], "max_new": 3, "temperature": 0.9, "seed": 5}),
            _alone(di, mm, {"prompt_ids": rows[1]["prompt_ids"]}),
            _alone(di, mm, {"prompt_ids": rows[2]["prompt_ids"], "max_new": 2})]
    assert out["error"] == [None, None, None]
    assert out["tokens"] == [w[0] for w in want] and out["certificate_root"] == [w[2] for w in want]


def test_a_generator_follows_update_weights(di, tmp_path):
    """After update_weights the files no longer identify the model: no model_sha256, no certificate
    roots (and certificates=True refuses), and the tokens are the new weights'."""
    d = synthetic.write_checkpoint("llama", tmp_path / "m", seed=4)
    mm = di.MegaModel.from_pretrained(d, max_context=64)
    gen = di.rows.RowGenerator(mm, max_new=3)
    sure = di.rows.RowGenerator(mm, max_new=3, certificates=True)
    batch = {"prompt_ids": [[5, 6, 7]]}
    assert gen(batch)["model_sha256"] == [di.certificate.model_sha256(mm)]
    mm.update_weights({"lm_head.weight": synthetic.state_dict("llama", seed=9)["lm_head.weight"]})
    out = gen(batch)
    assert out["model_sha256"] == [None] and out["certificate_root"] == [None]
    assert out["tokens"] == [mm.generate([5, 6, 7], 3)]
    with pytest.raises(ValueError, match="certificates need a model loaded from files"):
        sure(batch)
