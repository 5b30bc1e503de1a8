"""scripts/serve.py, the OpenAI-compatible server, started by each test on 127.0.0.1 with a synthetic
model: 64 concurrent clients with random prompts, lengths, sampling settings, streaming and arrival
times each get the bits the model gives their request alone; the fault cases (malformed JSON,
unknown fields, over-long prompts, limits, a full queue, a client that vanishes mid-stream, SIGTERM)
get clear errors and leave the server serving; lm-eval's local-completions through the server gives
the in-process DetInferLM's results."""
import json
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from det_fixtures import synthetic
from det_fixtures.server import ROOT, Server, answer_of, expected, post, random_client, sse

MAX_CONTEXT = 160


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("serve") / "tiny"
    return synthetic.write_byte_model(directory)


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    """The same model with a 32,768-position context: requests long enough to still run while a test
    acts (30,000 tokens take tens of seconds here)."""
    directory = tmp_path_factory.mktemp("serve") / "tiny-long"
    return synthetic.write_byte_model(directory, max_position_embeddings=32768)


@pytest.fixture(scope="module")
def offline(di, tiny_dir):
    mm = di.MegaModel.from_pretrained(str(tiny_dir), max_context=MAX_CONTEXT)
    return mm, mm.tokenizer()


@pytest.fixture(scope="module")
def server(tiny_dir):
    srv = Server(tiny_dir, "--max-context", MAX_CONTEXT, "--max-batch", 8, "--step-tokens", 64)
    yield srv
    assert srv.stop() == 0, srv.output()[-3000:]


def test_64_concurrent_clients_get_their_solo_bits(di, server, offline):
    mm, tok = offline
    rng = random.Random(11)
    clients = [(random_client(rng, mm.config.vocab_size), rng.random() * 1.5) for _ in range(64)]

    def run(client):
        (path, body), delay = client
        time.sleep(delay)  # arrivals spread over the run: some join a busy batch, some an idle one
        with post(server.url, path, body, stream=body["stream"]) as r:
            return answer_of(path, body, r)

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(run, clients))
    certified = 0
    for ((path, body), _), answer in zip(clients, answers):
        want = expected(offline, path, body)
        assert len(answer) == body["n"]
        for (text, lps, cert, finish), (tokens, logprobs) in zip(answer, want):
            assert cert["tokens"] == tokens, (path, body)
            assert text == tok.decode(tokens, skip_special_tokens=True)
            assert finish == ("stop" if tokens[-1] in mm.config.eos_token_ids and not body.get("ignore_eos")
                              else "length")
            wants_lp = body.get("logprobs") is not None and body.get("logprobs") is not False
            if wants_lp:
                assert lps == logprobs  # fp32 values, exactly, through JSON
            if certified < 8:  # a sample of certificates replayed end to end
                assert di.certificate.verify(mm, cert)["match"]
                certified += 1
    assert requests.get(server.url + "/health").json()["active"] == 0


def test_echo_scores_prompt_tokens_like_score(server, offline):
    mm, _ = offline
    prompt = list(range(20, 50))
    r = post(server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1,
                                             "temperature": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == mm.score(prompt[:1], prompt[1:]).logprobs.tolist()
    assert len(lp["top_logprobs"]) == len(prompt) and all(len(t) == 1 for t in lp["top_logprobs"][1:])


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 9, "echo": True, "logprobs": 2, "n": 2,
                         "temperature": 0.9, "seed": 7, "stop": ["zz"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 9, "logprobs": True,
                              "top_logprobs": 3, "temperature": 0}),
])
def test_a_streamed_answer_is_the_whole_answer_in_pieces(server, path, body):
    """The same request whole and streamed: the streamed text, logprobs, finish reasons and certificates
    put together equal the whole answer's (echo's prompt and scores included); usage comes last."""
    def flat(choices, chat):
        return [(c["message"]["content"] if chat else c["text"],
                 c["logprobs"]["content"] if chat else
                 {k: c["logprobs"][k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")},
                 c["finish_reason"], c["certificate"]) for c in sorted(choices, key=lambda c: c["index"])]
    chat = path == "/v1/chat/completions"
    whole = post(server.url, path, body).json()
    with post(server.url, path, dict(body, stream=True, stream_options={"include_usage": True}), stream=True) as r:
        chunks = sse(r)
    assert chunks[-1]["usage"] == whole["usage"] and chunks[-1]["choices"] == []
    parts = {}
    for chunk in chunks[:-1]:
        for c in chunk["choices"]:
            p = parts.setdefault(c["index"], {"index": c["index"], "text": "", "message": {"content": ""},
                                              "logprobs": {"content": [], "tokens": [], "token_logprobs": [],
                                                           "top_logprobs": [], "text_offset": []}})
            if chat:
                p["message"]["content"] += c["delta"].get("content", "")
            else:
                p["text"] += c["text"]
            for k, v in (c["logprobs"] or {}).items():
                p["logprobs"][k] += v
            if c["finish_reason"] is not None:
                p["finish_reason"], p["certificate"] = c["finish_reason"], c["certificate"]
    assert flat(list(parts.values()), chat) == flat(whole["choices"], chat)


def test_stop_strings_cut_text_and_certify_what_ran(di, server, offline, tiny_dir, tmp_path):
    mm, tok = offline
    prompt = list(range(40, 70))
    full = mm.generate(prompt, 30, stop_on_eos=False)
    text = tok.decode(full, skip_special_tokens=True)
    stop = text[6:8]  # two characters the greedy text contains
    r = post(server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 30, "temperature": 0, "stop": [stop],
                                             "ignore_eos": True}).json()
    c = r["choices"][0]
    assert c["finish_reason"] == "stop" and c["text"] == text[:text.find(stop)]
    n = len(c["certificate"]["tokens"])
    assert c["certificate"]["tokens"] == full[:n] and c["certificate"]["generation"]["max_new"] == n < 30
    assert di.certificate.verify(mm, c["certificate"])["match"]
    path = tmp_path / "cert.json"  # as a client checks it: scripts/verify.py against the model's files
    path.write_text(json.dumps(c["certificate"]))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "verify.py"), str(path), "--model", str(tiny_dir)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "MATCH" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("body,status,says", [
    (b"{not json", 400, "not valid JSON"),
    ([1, 2], 400, "JSON object"),
    ({"prompt": "hi", "bogus": 1}, 400, "unknown field(s) bogus"),
    ({"prompt": [1, 2, 99999]}, 400, "outside the vocabulary"),
    ({"prompt": "x" * (MAX_CONTEXT + 5)}, 400, "exceed the served context"),
    ({"prompt": "hi", "max_tokens": MAX_CONTEXT}, 400, "exceed the served context"),
    ({"prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens must be an integer"),
    ({"prompt": "hi", "n": 17}, 400, "n must be an integer in [1, 16]"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature must be"),
    ({"prompt": "hi", "frequency_penalty": 0.5}, 400, "frequency_penalty is not supported"),
    ({"prompt": "hi", "model": "gpt-9"}, 404, "is not served here"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "needs echo"),
    ({"prompt": "hi", "stop": [""]}, 400, "stop must be"),
    ({"prompt": ""}, 400, "must not be empty"),
    ({"prompt": [3.5]}, 400, "list of token ids"),
    ({"prompt": "hi", "stop_token_ids": 7}, 400, "stop_token_ids must be"),
])
def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server, body, status, says):
    r = post(server.url, "/v1/completions", body)
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    r = post(server.url, "/v1/chat/completions", {"messages": [{"role": "user"}]})
    assert r.status_code == 400 and "messages[0]" in r.json()["error"]["message"]
    assert requests.get(server.url + "/v1/completions").status_code == 405
    assert post(server.url, "/v1/completions", {"prompt": "ok", "max_tokens": 2}).status_code == 200


def test_tokenize_detokenize_models_health(server, offline):
    _, tok = offline
    r = post(server.url, "/tokenize", {"prompt": "hello there", "add_special_tokens": False}).json()
    assert r["tokens"] == tok("hello there", add_special_tokens=False)["input_ids"] and r["count"] == len(r["tokens"])
    assert post(server.url, "/detokenize", {"tokens": r["tokens"]}).json()["prompt"] == "hello there"
    assert post(server.url, "/tokenize", {"text": "x"}).status_code == 400
    models = requests.get(server.url + "/v1/models").json()["data"]
    assert models[0]["id"] == "tiny" and models[0]["max_model_len"] == MAX_CONTEXT
    assert requests.get(server.url + "/tokenizer_info").json()["eos_token"] == tok.eos_token
    health = requests.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["system_fingerprint"].startswith("det-infer/contract-")


def wait_for(url, pred, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        h = requests.get(url + "/health").json()
        if pred(h):
            return h
        time.sleep(0.02)
    raise AssertionError(f"the server never reached the state: {h}")


LONG = {"prompt": [5, 6, 7], "max_tokens": 30000, "ignore_eos": True, "temperature": 0, "stream": True}


def test_full_queue_429_and_a_vanished_client_frees_its_slot(long_dir):
    with Server(long_dir, "--max-context", 32768, "--max-batch", 1, "--max-waiting", 1) as srv:
        first = post(srv.url, "/v1/completions", LONG, stream=True)
        assert first.status_code == 200
        lines = first.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)  # it is running
        waiting = {}
        t = threading.Thread(target=lambda: waiting.update(r=post(srv.url, "/v1/completions",
                                                                  {"prompt": "hi", "max_tokens": 3})))
        t.start()
        wait_for(srv.url, lambda h: h["waiting"] == 1)
        r = post(srv.url, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 429 and "already waiting" in r.json()["error"]["message"]
        first.close()  # the client goes away mid-stream: its slot frees and the waiting request runs
        t.join(60)
        assert waiting["r"].status_code == 200
        wait_for(srv.url, lambda h: h["active"] == 0 and h["waiting"] == 0)
        assert post(srv.url, "/v1/completions", {"prompt": "ok", "max_tokens": 2}).status_code == 200


def test_sigterm_finishes_running_requests_then_exits(tiny_dir, long_dir, offline):
    mm, _ = offline
    body = {"prompt": [9, 10, 11], "max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": True}
    srv = Server(tiny_dir, "--grace", 60)
    r = post(srv.url, "/v1/completions", body, stream=True)
    assert r.status_code == 200
    lines = r.iter_lines(decode_unicode=True)
    next(lines)
    srv.proc.send_signal(15)
    wait_for(srv.url, lambda h: h["status"] == "stopping")
    assert post(srv.url, "/v1/completions", {"prompt": "late", "max_tokens": 2}).status_code == 503
    rest = [json.loads(x[6:]) for x in lines if x and x != "data: [DONE]"]
    cert = rest[-1]["choices"][0]["certificate"]
    assert rest[-1]["choices"][0]["finish_reason"] == "length" and len(cert["tokens"]) == 2000
    assert cert["tokens"][:100] == mm.generate(body["prompt"], 100, stop_on_eos=False)  # greedy: a prefix
    # Told once: it exits by itself. (stop() signals again if it has not exited yet, and a second
    # SIGTERM ends a server at once: on a loaded machine the test then saw -15.)
    assert srv.proc.wait(120) == 0
    assert srv.stop() == 0 and "stopped" in srv.output()
    # With no grace left, a running request ends with an error event, and the server still exits cleanly.
    srv = Server(long_dir, "--max-context", 32768, "--grace", 0.2)
    r = post(srv.url, "/v1/completions", LONG, stream=True)
    assert r.status_code == 200
    lines = r.iter_lines(decode_unicode=True)
    next(lines)
    srv.proc.send_signal(15)
    rest = [json.loads(x[6:]) for x in lines if x and x != "data: [DONE]"]
    assert "shut down" in rest[-1]["error"]["message"]
    assert srv.stop() == 0


def test_lm_eval_local_completions_through_the_server_equals_in_process(di, server, tiny_dir):
    """lm-eval's own OpenAI client (local-completions, remote tokenizer, 8 concurrent requests) on
    the local multiple-choice and greedy generation tasks: the same responses and metrics as
    di.lm_eval.DetInferLM in this process."""
    from test_lm_eval import TASKS_DIR, evaluate

    tasks = ["det_capitals", "det_arithmetic"]
    remote = evaluate("local-completions", tasks, model_args=(
        f"base_url={server.url}/v1/completions,model=tiny,tokenizer_backend=remote,num_concurrent=8,"
        "max_retries=1,tokenized_requests=True"))
    local = evaluate(di.lm_eval.DetInferLM(pretrained=str(tiny_dir), batch_size=4), tasks)
    assert TASKS_DIR.is_dir() and set(remote[0]) == set(tasks) and all(remote[0][t] for t in tasks)
    assert remote[0] == local[0]
    for t in tasks:
        assert {k: v for k, v in remote[1][t].items() if k != "alias"} == \
            {k: v for k, v in local[1][t].items() if k != "alias"}


def test_a_bad_geometry_is_refused_with_its_reason(tiny_dir):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py"), str(tiny_dir), "--executor", "emulated",
                        "--geometry", "tile_rows=48", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "serve: det-infer: emulated geometry" in r.stderr and "tile_rows 1, 2" in r.stderr, \
        r.stderr[-2000:]
