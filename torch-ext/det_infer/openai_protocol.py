"""The OpenAI-compatible HTTP protocol of scripts/serve.py, without the web framework: a request body
(a parsed JSON object) becomes a Job, a list of serving.Requests in choice order, and each choice's
events become the response's JSON (whole, or streamed as chunks). Every rule a client can break
raises ApiError with the HTTP status, a message that says what is wrong and what is supported, and
the offending parameter.

Completions (/v1/completions) follow OpenAI's legacy API as lm-eval's local-completions uses it:
prompt as text, token ids or a list of either; echo with logprobs scores the prompt; choice
index = prompt index * n + sample index. Chat (/v1/chat/completions) applies the model's chat
template. Sampling is det-infer's (docs/SPEC.md §15): temperature (default 1, as OpenAI), top_p,
top_k, min_p and seed (default 0: the same request gets the same answer; choice j of n draws with
seed + j). Each choice carries its certificate (scripts/verify.py checks it).
"""
import threading
import time
import uuid

from . import serving
from .text import cut_at_stops

MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOPS = 16
UNSUPPORTED_ZERO = ("presence_penalty", "frequency_penalty", "repetition_penalty")  # accepted only when 0 (or 1)
COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n",
          "stream", "stream_options", "user", "ignore_eos", "logit_bias", *UNSUPPORTED_ZERO)
COMPLETION_FIELDS = COMMON + ("prompt", "echo", "logprobs", "best_of", "suffix")
CHAT_FIELDS = COMMON + ("messages", "logprobs", "top_logprobs", "max_completion_tokens", "response_format")


class ApiError(Exception):
    def __init__(self, status, message, param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self):
        kind = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error",
                503: "service_unavailable"}.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def bad(message, param=None, code=None):
    return ApiError(400, message, param, code)


class Served:
    """The served model as the protocol sees it: its name, tokenizer (one lock: the scheduler's
    thread and the event loop both decode), limits and fingerprint."""

    def __init__(self, mm, tokenizer, name, max_tokens_default=256):
        from . import CONTRACT_VERSION, certificate

        self.mm, self.tok, self.name = mm, tokenizer, name
        self.max_tokens_default = max_tokens_default
        self.created = int(time.time())
        self._lock = threading.Lock()
        try:
            self.model_sha256 = certificate.model_sha256(mm)
        except certificate.CertificateError:
            self.model_sha256 = None
        self.fingerprint = f"det-infer/contract-{CONTRACT_VERSION}/model-sha256-{self.model_sha256 or 'none'}"

    @property
    def max_context(self):
        return self.mm.max_context

    def encode(self, text, add_special_tokens=True):
        with self._lock:
            return list(self.tok(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids, skip_special_tokens=True):
        with self._lock:
            return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, i):
        return self.decode([i], skip_special_tokens=False)

    def chat_ids(self, messages):
        if not getattr(self.tok, "chat_template", None):
            raise bad(f"model {self.name} has no chat template; use /v1/completions", "messages")
        with self._lock:
            try:
                return list(self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                         return_dict=False))
            except Exception as e:  # a template that rejects these messages (roles, order)
                raise bad(f"the chat template cannot render these messages: {e}", "messages") from None

    def stop_checker(self, stops):
        """stop_text for serving.Request: whether the text of the last tokens contains a stop
        string (a stop string first shows within the tail the newest token completes)."""
        if not stops:
            return None
        window = 4 * max(len(s) for s in stops) + 8

        def check(tokens):
            tail = self.decode(tokens[-window:])
            return any(s in tail for s in stops)
        return check


# ---- field checks ---------------------------------------------------------------------------------
def _int(body, name, default, lo, hi, what=None):
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(f"{name} must be an integer in [{lo}, {hi}]{what or ''}, got {v!r}", name)
    return v


def _num(body, name, default, ok, rule):
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
        raise bad(f"{name} must be {rule}, got {v!r}", name)
    return float(v)


def _bool(body, name, default=False):
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"{name} must be true or false, got {v!r}", name)
    return v


def _check_fields(body, allowed, endpoint):
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)} for {endpoint}; supported: {', '.join(sorted(allowed))}",
                  unknown[0])
    for name in UNSUPPORTED_ZERO:
        neutral = 1.0 if name == "repetition_penalty" else 0.0
        if body.get(name) not in (None, neutral, int(neutral)):
            raise bad(f"{name} is not supported (only {neutral:g}): it would change the contract's distribution", name)
    if body.get("logit_bias"):
        raise bad("logit_bias is not supported", "logit_bias")


def _model(body, served):
    name = body.get("model")
    if name is not None and name != served.name:
        raise ApiError(404, f"model {name!r} is not served here; this server serves {served.name!r}", "model",
                       "model_not_found")


def _stops(body):
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise bad(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them, got {stop!r}", "stop")
    return stops


def _ids(v, served, param):
    V = served.mm.config.vocab_size
    if not isinstance(v, list) or not v or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise bad(f"{param} must be a non-empty list of token ids", param)
    bad_ids = [t for t in v if not 0 <= t < V]
    if bad_ids:
        raise bad(f"token id {bad_ids[0]} in {param} is outside the vocabulary [0, {V})", param)
    return list(v)


class Job:
    """A parsed request: its prompts (ids, and the text echo returns), n, the serving.Requests in
    choice order, and how to render the answer."""

    def __init__(self, kind, served, body, prompts, prompt_texts, max_new):
        self.kind, self.served = kind, served
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.prompts, self.prompt_texts = prompts, prompt_texts
        self.n = _int(body, "n", 1, 1, MAX_N)
        self.stream = _bool(body, "stream")
        opts = body.get("stream_options")
        if opts is not None and (not self.stream or not isinstance(opts, dict) or set(opts) - {"include_usage"}):
            raise bad('stream_options must be {"include_usage": bool} and needs stream: true', "stream_options")
        self.include_usage = bool((opts or {}).get("include_usage", False))
        self.stops = _stops(body)
        self.echo = kind == "completion" and _bool(body, "echo")
        if kind == "completion":
            lp = body.get("logprobs")
            self.logprobs = None if lp is None or lp is False else _int(body, "logprobs", 0, 0, MAX_LOGPROBS)
            if body.get("best_of") not in (None, self.n):
                raise bad("best_of is not supported (only equal to n)", "best_of")
            if body.get("suffix") is not None:
                raise bad("suffix is not supported", "suffix")
        else:
            self.logprobs = _int(body, "top_logprobs", 0, 0, MAX_LOGPROBS) if _bool(body, "logprobs") else None
            if body.get("top_logprobs") is not None and self.logprobs is None:
                raise bad("top_logprobs needs logprobs: true", "top_logprobs")
            fmt = body.get("response_format")
            if fmt is not None and fmt != {"type": "text"}:
                raise bad('response_format is not supported (only {"type": "text"})', "response_format")
        temperature = _num(body, "temperature", 1.0, lambda v: 0 <= v <= 100, "a number in [0, 100]")
        top_p = _num(body, "top_p", 1.0, lambda v: 0 < v <= 1, "in (0, 1]")
        min_p = _num(body, "min_p", 0.0, lambda v: 0 <= v <= 1, "in [0, 1]")
        top_k = _int(body, "top_k", 0, -1, 2**31 - 1, " (0 or -1: off)")
        seed = _int(body, "seed", 0, 0, 2**64 - 1)
        stop_ids = _ids(body["stop_token_ids"], served, "stop_token_ids") if body.get("stop_token_ids") else ()
        stop_on_eos = not _bool(body, "ignore_eos")
        for p in prompts:
            if len(p) + max_new > served.max_context:
                raise bad(f"the prompt ({len(p)} tokens) and max_tokens ({max_new}) exceed the served context of "
                          f"{served.max_context} positions", "max_tokens" if len(p) < served.max_context else
                          "prompt", "context_length_exceeded")
        self.max_new = max_new
        want_prompt = self.logprobs if self.echo else None
        self.requests = []
        for prompt in prompts:
            for j in range(self.n):
                self.requests.append(serving.Request(
                    prompt=prompt, max_new=max_new, temperature=temperature, top_k=max(top_k, 0), top_p=top_p,
                    min_p=min_p, seed=(seed + j) % 2**64, stop_on_eos=stop_on_eos, stop_ids=tuple(stop_ids),
                    logprobs=self.logprobs, prompt_logprobs=want_prompt, stop_text=served.stop_checker(self.stops)))

    def prompt_of(self, choice):
        return choice // self.n


def parse_completion(body, served):
    _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    _model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or len(prompt) > MAX_N:
        raise bad(f"prompt must be a string, a list of token ids, or a list of 1..{MAX_N} of either", "prompt")
    ids, texts = [], []
    for p in prompt:
        if isinstance(p, str):
            if not p:
                raise bad("prompt must not be empty", "prompt")
            ids.append(served.encode(p))
            texts.append(p)
            if not ids[-1]:
                raise bad("the prompt tokenizes to no tokens", "prompt")
        else:
            ids.append(_ids(p, served, "prompt"))
            texts.append(None)
    max_new = _int(body, "max_tokens", 16, 0, served.max_context, " (at most the served context)")
    job = Job("completion", served, body, ids, texts, max_new)
    if max_new == 0 and not job.echo:
        raise bad("max_tokens 0 needs echo: true (it returns the prompt and, with logprobs, its scores)", "max_tokens")
    if len(prompt) * job.n > MAX_N:
        raise bad(f"{len(prompt)} prompts x n={job.n} is over {MAX_N} choices per request", "n")
    return job


def _message_text(m, i):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or set(m) - {"role", "content", "name"}:
        raise bad(f"messages[{i}] must be {{\"role\": str, \"content\": str}}", "messages")
    content = m.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise bad(f"messages[{i}].content: only text parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
    return {"role": m["role"], "content": content}


def parse_chat(body, served):
    _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    _model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {\"role\", \"content\"}", "messages")
    ids = served.chat_ids([_message_text(m, i) for i, m in enumerate(messages)])
    _ids(ids, served, "messages")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise bad("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    default = max(1, min(served.max_tokens_default, served.max_context - len(ids)))
    max_new = _int(body, name, default, 1, served.max_context, " (at most the served context)")
    return Job("chat", served, body, [ids], [None], max_new)


# ---- answers ----------------------------------------------------------------------------------------
class Choice:
    """One choice's events, gathered: its tokens, logprobs, text so far, and the stream's deltas."""

    def __init__(self, job, index):
        self.job, self.index = job, index
        self.prompt = job.prompts[job.prompt_of(index)]
        self.tokens, self.lps, self.tops = [], [], []
        self.prompt_lps = self.prompt_tops = None
        self.finish_reason = self.certificate = self.error = None
        self.sent = 0  # characters of text already streamed
        self.sent_tokens = 0
        self.offset = 0  # text_offset of the next streamed logprobs entry

    @property
    def done(self):
        return self.finish_reason is not None or self.error is not None

    def add(self, event):
        kind = event["type"]
        if kind == "prompt":
            self.prompt_lps, self.prompt_tops = event["logprobs"], event["top"]
        elif kind == "token":
            self.tokens.append(event["token"])
            self.lps.append(event["logprob"])
            self.tops.append(event["top"])
        elif kind == "done":
            self.finish_reason, self.certificate = event["finish_reason"], event["certificate"]
        else:
            self.error = event["message"]

    def text(self):
        """The completion's text: the tokens decoded (special tokens skipped), cut before the first
        stop string."""
        return cut_at_stops(self.job.served.decode(self.tokens), self.job.stops)

    def safe_text(self):
        """What can be streamed now: the text so far, less what a later token may still change (a
        partial UTF-8 character, trailing whitespace) or turn into a stop string."""
        if self.done:
            return self.text()
        full = self.job.served.decode(self.tokens)
        cut = cut_at_stops(full, self.job.stops)
        if len(cut) < len(full):
            return cut
        hold = max((len(s) - 1 for s in self.job.stops), default=0)
        safe = full[:len(full) - hold] if hold else full
        return safe.rstrip("\ufffd").rstrip()

    def usage(self):
        return len(self.prompt), len(self.tokens)

    # OpenAI's legacy logprobs object: tokens, token_logprobs, top_logprobs, text_offset.
    def completion_logprobs(self, start=0, with_prompt=False, running=False):
        served, job = self.job.served, self.job
        if job.logprobs is None:
            return None
        rows = []
        if with_prompt:
            rows.append((self.prompt[0], None, None))
            for t, lp, top in zip(self.prompt[1:], self.prompt_lps or [], self.prompt_tops or []):
                rows.append((t, lp, top))
        rows += list(zip(self.tokens, self.lps, self.tops))[start:]
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = self.offset if running else 0  # streamed: offsets continue across chunks
        for t, lp, top in rows:
            s = served.token_text(t)
            out["tokens"].append(s)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(None if top is None else {served.token_text(i): v for i, v in top})
            out["text_offset"].append(offset)
            offset += len(s)
        if running:
            self.offset = offset
        return out

    def chat_logprobs(self, start=0):
        served = self.job.served
        if self.job.logprobs is None:
            return None

        def entry(t, lp):
            s = served.token_text(t)
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}
        return {"content": [dict(entry(t, lp), top_logprobs=[entry(i, v) for i, v in top])
                            for t, lp, top in list(zip(self.tokens, self.lps, self.tops))[start:]]}


def _usage(choices):
    seen, prompt_tokens = set(), 0
    for c in choices:
        p = c.job.prompt_of(c.index)
        if p not in seen:
            seen.add(p)
            prompt_tokens += len(c.prompt)
    completion = sum(len(c.tokens) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _head(job, obj):
    return {"id": job.id, "object": obj, "created": job.created, "model": job.served.name,
            "system_fingerprint": job.served.fingerprint}


def response(job, choices):
    """The whole (non-streamed) answer."""
    if job.kind == "completion":
        out = _head(job, "text_completion")
        out["choices"] = []
        for c in choices:
            prompt_text = ""
            if job.echo:
                p = job.prompt_of(c.index)
                prompt_text = job.prompt_texts[p] if job.prompt_texts[p] is not None else job.served.decode(c.prompt)
            out["choices"].append({"index": c.index, "text": prompt_text + c.text(),
                                   "logprobs": c.completion_logprobs(with_prompt=job.echo),
                                   "finish_reason": c.finish_reason, "certificate": c.certificate})
    else:
        out = _head(job, "chat.completion")
        out["choices"] = [{"index": c.index, "message": {"role": "assistant", "content": c.text()},
                           "logprobs": c.chat_logprobs(), "finish_reason": c.finish_reason,
                           "certificate": c.certificate} for c in choices]
    out["usage"] = _usage(choices)
    return out


def stream_chunks(job, c, first=False):
    """The chunks to send for choice c now, as JSON-ready dicts: on its first call the role (chat)
    or the echoed prompt (completions), then the new text and the new tokens' logprobs, and at its
    end the finish reason and the certificate."""
    text = c.safe_text()
    delta, c.sent = text[c.sent:], max(c.sent, len(text))
    chat = job.kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    if chat and first:
        chunks.append(dict(_head(job, obj), choices=[{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                                     "logprobs": None, "finish_reason": None}]))
    echo = first and job.echo
    if not (delta or echo or c.done or (job.logprobs is not None and len(c.tokens) > c.sent_tokens)):
        return chunks
    lp = None
    if job.logprobs is not None:
        lp = c.chat_logprobs(c.sent_tokens) if chat else c.completion_logprobs(c.sent_tokens, with_prompt=echo,
                                                                                running=True)
        c.sent_tokens = len(c.tokens)
    if chat:
        choice = {"index": c.index, "delta": {"content": delta} if delta else {}, "logprobs": lp}
    else:
        prefix = ""
        if echo:
            p = job.prompt_of(c.index)
            prefix = job.prompt_texts[p] if job.prompt_texts[p] is not None else job.served.decode(c.prompt)
        choice = {"index": c.index, "text": prefix + delta, "logprobs": lp}
    choice["finish_reason"] = c.finish_reason if c.done else None
    if c.done:
        choice["certificate"] = c.certificate
    chunks.append(dict(_head(job, obj), choices=[choice]))
    return chunks


def usage_chunk(job, choices):
    obj = "text_completion" if job.kind == "completion" else "chat.completion.chunk"
    return dict(_head(job, obj), choices=[], usage=_usage(choices))
