"""scripts/serve.py as a child process on 127.0.0.1 (tests/test_serve.py, benchmarks/bench_serve.py):
started on a free port, ready when it prints its ready line, stopped with SIGTERM; and the clients
both use: random OpenAI requests, their answers read back (whole or streamed), and what generate
gives each request alone."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"ready on (http://127\.0\.0\.1:\d+)")


class Server:
    def __init__(self, model, *args, timeout=300):
        cmd = [sys.executable, str(ROOT / "scripts" / "serve.py"), str(model), "--host", "127.0.0.1", "--port", "0",
               *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.lines = []
        self.url = None
        deadline = time.time() + timeout
        while self.url is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"serve.py exited before it was ready:\n{''.join(self.lines)[-4000:]}")
            self.lines.append(line)
            m = READY.search(line)
            if m:
                self.url = m.group(1)
            elif time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("serve.py was not ready in time")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self):
        return "".join(self.lines)

    def stop(self, timeout=120):
        """SIGTERM, then the exit status (killed after timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._reader.join(5)
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def post(url, path, body, stream=False, timeout=120):
    return requests.post(url + path, data=body if isinstance(body, (str, bytes)) else json.dumps(body),
                         headers={"Content-Type": "application/json"}, stream=stream, timeout=timeout)


def sse(response):
    """The data objects of a server-sent event stream, through [DONE] (which must come last)."""
    out = []
    for line in response.iter_lines(decode_unicode=True):
        if not line:
            continue
        assert line.startswith("data: "), line
        if line == "data: [DONE]":
            return out
        out.append(json.loads(line[6:]))
    raise AssertionError("the stream ended without [DONE]")


def random_client(rng, vocab, max_tokens=20, prompt_len=40):
    """A random request: (endpoint, body) with its prompt as ids or text (up to prompt_len tokens or
    characters), 1..max_tokens tokens, greedy or sampled, some streamed, some with n=2 or logprobs."""
    sampled = rng.random() < 0.6
    body = {"max_tokens": rng.randint(1, max_tokens), "temperature": rng.choice([0.7, 1.0]) if sampled else 0,
            "seed": rng.randrange(2**64), "n": rng.choice([1, 1, 2]), "stream": rng.random() < 0.4}
    if sampled:
        body.update(top_k=rng.choice([0, 8]), top_p=rng.choice([1.0, 0.9]), min_p=rng.choice([0.0, 0.05]))
    if rng.random() < 0.3:
        body["ignore_eos"] = True
    if rng.random() < 0.25:
        body["messages"] = [{"role": "user", "content": "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, prompt_len)))}]
        if rng.random() < 0.5:
            body.update(logprobs=True, top_logprobs=2)
        return "/v1/chat/completions", body
    if rng.random() < 0.3:
        body["prompt"] = "".join(rng.choice("The quick brown fox ") for _ in range(rng.randint(1, prompt_len)))
    else:
        body["prompt"] = [rng.randrange(3, vocab) for _ in range(rng.randint(1, prompt_len))]
    if rng.random() < 0.5:
        body["logprobs"] = rng.choice([0, 2])
    return "/v1/completions", body


def expected(offline, path, body):
    """Per choice: (tokens, logprobs) from generate on the request alone."""
    mm, tok = offline
    if path == "/v1/chat/completions":
        ids = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
    elif isinstance(body["prompt"], str):
        ids = tok(body["prompt"])["input_ids"]
    else:
        ids = body["prompt"]
    out = []
    for j in range(body["n"]):
        toks, lps = mm.generate(ids, body["max_tokens"], stop_on_eos=not body.get("ignore_eos", False),
                                return_logprobs=True, temperature=body["temperature"], top_k=body.get("top_k", 0),
                                top_p=body.get("top_p", 1.0), min_p=body.get("min_p", 0.0),
                                seed=(body["seed"] + j) % 2**64)
        out.append((toks, lps.tolist()))
    return out


def answer_of(path, body, response):
    """Per choice: (text, logprobs or None, certificate, finish_reason) from a whole or streamed answer."""
    chat = path == "/v1/chat/completions"
    if not body["stream"]:
        assert response.status_code == 200, response.text
        out = []
        for c in sorted(response.json()["choices"], key=lambda c: c["index"]):
            lp = c["logprobs"]
            lps = None if lp is None else [e["logprob"] for e in lp["content"]] if chat else lp["token_logprobs"]
            out.append((c["message"]["content"] if chat else c["text"], lps, c["certificate"], c["finish_reason"]))
        return out
    assert response.status_code == 200
    text, lps, cert, finish = {}, {}, {}, {}
    for chunk in sse(response):
        for c in chunk["choices"]:
            i = c["index"]
            text[i] = text.get(i, "") + (c["delta"].get("content", "") if chat else c["text"])
            if c["logprobs"] is not None:
                new = [e["logprob"] for e in c["logprobs"]["content"]] if chat else c["logprobs"]["token_logprobs"]
                lps[i] = lps.get(i, []) + new
            if c["finish_reason"] is not None:
                cert[i], finish[i] = c["certificate"], c["finish_reason"]
    return [(text[i], lps.get(i), cert[i], finish[i]) for i in sorted(text)]
