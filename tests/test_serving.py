"""The continuous-batching scheduler (di.serving, scripts/serve.py's engine): requests that join and
leave a running batch at random steps, prompts fed in pieces while others decode, each answer the
bits `generate` gives that request alone (tokens, logprobs, certificate), and the queue's bounds,
cancellation and shutdown."""
import random
import threading
import time

import pytest
import torch
from det_fixtures import synthetic

MAX_CONTEXT = 128


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("serving") / "tiny"
    return synthetic.write_byte_model(directory)


@pytest.fixture(scope="module")
def mm(di, tiny_dir):
    return di.MegaModel.from_pretrained(str(tiny_dir), max_context=MAX_CONTEXT)


def random_request(di, rng, vocab):
    sampled = rng.random() < 0.6
    return di.serving.Request(
        prompt=[rng.randrange(3, vocab) for _ in range(rng.randint(1, 60))], max_new=rng.randint(1, 24),
        temperature=rng.choice([0.7, 1.0, 1.3]) if sampled else 0.0, top_k=rng.choice([0, 5, 40]) if sampled else 0,
        top_p=rng.choice([1.0, 0.9]) if sampled else 1.0, min_p=rng.choice([0.0, 0.05]) if sampled else 0.0,
        seed=rng.randrange(2**64), logprobs=rng.choice([None, 0, 3]),
        prompt_logprobs=rng.choice([None, None, 2]))


def alone(mm, req):
    """What generate gives the request by itself: tokens and the chosen tokens' logprobs."""
    return mm.generate(req.prompt, req.max_new, stop_on_eos=req.stop_on_eos, return_logprobs=True, **req.sampling())


def test_requests_joining_at_random_steps_get_their_solo_bits(di, mm):
    rng = random.Random(5)
    sched = di.serving.Scheduler(mm, max_batch=4, max_waiting=64, step_tokens=24).start()
    try:
        reqs, handles = [], []
        for _ in range(20):  # arrivals spread over the run: some join a full batch, some an idle one
            req = random_request(di, rng, mm.config.vocab_size)
            reqs.append(req)
            handles.append(sched.submit(req))
            time.sleep(rng.random() * 0.02)
        results = [h.result(timeout=300) for h in handles]
    finally:
        sched.stop()
    assert sched.steps > 20  # the requests overlapped, in many steps
    for req, res in zip(reqs, results):
        tokens, logprobs = alone(mm, req)
        assert res["tokens"] == tokens
        if req.logprobs is not None:
            assert torch.equal(torch.tensor(res["logprobs"], dtype=torch.float32), logprobs)
            assert all(len(top) == req.logprobs for top in res["top_logprobs"])
            if req.logprobs and req.temperature == 0:  # greedy: the best alternative is the token itself
                assert all(top[0][0] == t for top, t in zip(res["top_logprobs"], tokens))
        if req.prompt_logprobs is not None and len(req.prompt) > 1:
            score = mm.score(req.prompt[:1], req.prompt[1:], top_k=2)
            assert torch.equal(torch.tensor(res["prompt_logprobs"], dtype=torch.float32), score.logprobs)
            assert [[i for i, _ in top] for top in res["prompt_top_logprobs"]] == score.top_ids.tolist()
        cert = res["certificate"]
        assert cert["tokens"] == tokens and res["finish_reason"] in ("stop", "length")
        assert di.certificate.verify(mm, cert)["match"]


def _assert_solo_bits(di, mm, req, res):
    tokens, logprobs = alone(mm, req)
    assert res["tokens"] == tokens
    assert torch.equal(torch.tensor(res["logprobs"], dtype=torch.float32), logprobs)
    score = mm.score(req.prompt[:1], req.prompt[1:], top_k=1)
    assert torch.equal(torch.tensor(res["prompt_logprobs"], dtype=torch.float32), score.logprobs)
    assert di.certificate.verify(mm, res["certificate"])["match"]


def test_choices_of_one_prompt_share_its_prefill(di, mm):
    """Requests with one prompt (an HTTP request's n choices) feed it once: the others take a copy of
    the first one's KV state and last-row logits when its prefill is done, and each still gets its
    solo bits (tokens, logprobs, prompt logprobs, certificate). When that first one is cancelled
    before its prefill ends, the next one feeds the prompt and the rest copy it."""
    prompt = list(range(10, 70))  # 60 tokens: three steps of at most 24 rows
    reqs = [di.serving.Request(prompt=prompt, max_new=8, temperature=0.9, seed=s, logprobs=2, prompt_logprobs=1,
                               stop_on_eos=False) for s in range(4)]
    sched = di.serving.Scheduler(mm, max_batch=4, step_tokens=24).start()
    try:
        results = [h.result(timeout=120) for h in sched.submit_many(reqs[:3])]
    finally:
        sched.stop()
    assert sched.prompt_rows == len(prompt)  # not 3 x 60
    assert len({tuple(r["tokens"]) for r in results}) > 1  # the seeds drew their own tokens
    for req, res in zip(reqs, results):
        _assert_solo_bits(di, mm, req, res)
    # The scheduler's steps driven here (not started): cancel the first after one step of its prefill.
    sched = di.serving.Scheduler(mm, max_batch=4, step_tokens=24)
    for req in reqs:
        sched.check(req)
    handles = [di.serving.Handle(r) for r in reqs]
    sched._waiting.extend(handles)
    sched._admit()
    sched._step()
    handles[0].cancel()
    while sched._active:
        sched._step()
    assert sched.prompt_rows == 24 + len(prompt)
    for req, h in zip(reqs[1:], handles[1:]):
        _assert_solo_bits(di, mm, req, h.result(timeout=5))


def test_echo_only_request_and_a_stop_string_cut(di, mm):
    sched = di.serving.Scheduler(mm, max_batch=2).start()
    try:
        prompt = list(range(10, 40))
        echo = sched.submit(di.serving.Request(prompt=prompt, max_new=0, prompt_logprobs=0)).result(timeout=60)
        assert echo["tokens"] == [] and echo["certificate"] is None and echo["finish_reason"] == "length"
        assert torch.equal(torch.tensor(echo["prompt_logprobs"]), mm.score(prompt[:1], prompt[1:]).logprobs)
        # stop_text ends the sequence after its third token: the certificate is for max_new 3
        cut = sched.submit(di.serving.Request(prompt=prompt, max_new=20, stop_on_eos=False,
                                              stop_text=lambda toks: len(toks) >= 3)).result(timeout=60)
    finally:
        sched.stop()
    assert cut["finish_reason"] == "stop" and cut["tokens"] == mm.generate(prompt, 3)
    assert cut["certificate"]["generation"]["max_new"] == 3
    assert di.certificate.verify(mm, cut["certificate"])["match"]


def test_queue_bound_cancel_and_shutdown(di, mm):
    sched = di.serving.Scheduler(mm, max_batch=1, max_waiting=1).start()
    long = sched.submit(di.serving.Request(prompt=[5, 6, 7], max_new=MAX_CONTEXT - 3, stop_on_eos=False))
    deadline = time.time() + 30
    while sched.load() != (1, 0) and time.time() < deadline:
        time.sleep(0.005)
    waiting = sched.submit(di.serving.Request(prompt=[5, 6], max_new=4, stop_on_eos=False))
    with pytest.raises(di.serving.QueueFull, match="already waiting"):
        sched.submit(di.serving.Request(prompt=[5], max_new=1))
    long.cancel()  # the slot frees at the next step and the waiting request runs
    assert waiting.result(timeout=60)["tokens"] == mm.generate([5, 6], 4)
    # shutdown: a request still running when the drain time is over ends with an "error" event
    # (each token waits 5 ms in its stop_text check: the tiny model alone makes 127 tokens in ~40 ms,
    # which a fast host finished within the 50 ms drain)
    running = sched.submit(di.serving.Request(prompt=[9], max_new=MAX_CONTEXT - 1, stop_on_eos=False,
                                              stop_text=lambda toks: time.sleep(0.005)))
    threading.Thread(target=sched.stop, kwargs={"timeout": 0.05}).start()
    events = list(running.events(timeout=60))
    assert events[-1]["type"] == "error" and "shut down" in events[-1]["message"]
    with pytest.raises(di.serving.SchedulerStopped):
        sched.submit(di.serving.Request(prompt=[5], max_new=1))


@pytest.mark.parametrize("changes,message", [
    (dict(prompt=[1, 2, 10_000]), "vocab"), (dict(max_new=MAX_CONTEXT), "context"),
    (dict(temperature=-1.0), "temperature"), (dict(max_new=0), "prompt's logprobs"),
    (dict(logprobs=-2), "logprobs"), (dict(stop_ids=[999_999]), "vocab"),
])
def test_bad_requests_say_what_is_wrong(di, mm, changes, message):
    sched = di.serving.Scheduler(mm)
    with pytest.raises(ValueError, match=message):
        sched.check(di.serving.Request(**{**dict(prompt=[1, 2, 3], max_new=4), **changes}))


def test_a_failing_client_callback_ends_only_its_own_request(di, mm):
    """A stop_text that raises ends its request with an error event; a receiver that is gone (notify
    raising RuntimeError, as a closed event loop does) cancels its request; the others finish."""
    sched = di.serving.Scheduler(mm, max_batch=4).start()
    try:
        def boom(tokens):
            raise KeyError("no such stop")

        def gone(event):
            raise RuntimeError("Event loop is closed")

        broken = sched.submit(di.serving.Request(prompt=[4, 5, 6], max_new=8, stop_text=boom))
        sched.submit(di.serving.Request(prompt=[4, 5, 6], max_new=8), notify=gone)
        fine = sched.submit(di.serving.Request(prompt=[4, 5, 6], max_new=8, stop_on_eos=False))
        with pytest.raises(RuntimeError, match="KeyError"):
            broken.result(timeout=60)
        assert fine.result(timeout=60)["tokens"] == mm.generate([4, 5, 6], 8)
        deadline = time.time() + 30
        while sched.load() != (0, 0) and time.time() < deadline:
            time.sleep(0.01)
        assert sched.load() == (0, 0)
    finally:
        sched.stop()


def test_submit_many_is_all_or_none_and_gone_clients_hold_no_place(di, mm):
    R = di.serving.Request
    sched = di.serving.Scheduler(mm, max_batch=1, max_waiting=3).start()
    try:
        long = sched.submit(R(prompt=[5, 6, 7], max_new=MAX_CONTEXT - 3, stop_on_eos=False))
        deadline = time.time() + 30
        while sched.load() != (1, 0) and time.time() < deadline:
            time.sleep(0.005)
        a, b = sched.submit_many([R(prompt=[5], max_new=2), R(prompt=[6], max_new=2)])
        with pytest.raises(di.serving.QueueFull):  # two more do not fit: neither is queued
            sched.submit_many([R(prompt=[5], max_new=2), R(prompt=[6], max_new=2)])
        assert sched.load() == (1, 2)
        a.cancel(), b.cancel()  # their clients left: three new ones fit
        handles = sched.submit_many([R(prompt=[7 + i], max_new=2, stop_on_eos=False) for i in range(3)])
        long.cancel()
        assert [h.result(timeout=60)["tokens"] for h in handles] == [mm.generate([7 + i], 2) for i in range(3)]
        # a stop string completed by the token that reaches max_new: the reason is "stop", certified as run
        res = sched.submit(R(prompt=[8, 9], max_new=3, stop_on_eos=False,
                             stop_text=lambda toks: len(toks) >= 3)).result(timeout=60)
        assert res["finish_reason"] == "stop" and di.certificate.verify(mm, res["certificate"])["match"]
    finally:
        sched.stop()
