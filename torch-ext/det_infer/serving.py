"""Continuous batching (scripts/serve.py's engine): requests join and leave the running batch at any
step, prompts are consumed while other sequences decode, and a finished request frees its slot at
once. Each step is one native forward over every active sequence's rows (a piece of a prompt, or the
one token it decodes), so the answer to a request is the bits `generate` gives it alone, whatever
else runs: a row's logits depend only on its own sequence (docs/SPEC.md §13), and a token's draw
only on its logits, the sampling parameters and its position (§15).

    sched = Scheduler(mm, max_batch=16, max_waiting=256).start()
    handle = sched.submit(Request(prompt=ids, max_new=64, temperature=0.7, seed=1, logprobs=2))
    result = handle.result()      # or: for event in handle.events(): ...
    sched.stop()

Every model call runs on the scheduler's one thread. A handle receives events (dicts): "prompt"
(the prompt's logprobs, when asked), "token" (one per generated token) and then one "done" (with
the finish reason and the certificate) or one "error".
"""
import collections
import dataclasses
import queue
import threading

import torch

from . import certificate
from ._ops import ops


class QueueFull(RuntimeError):
    """The waiting queue is at its bound: try again later (an HTTP server answers 429)."""


class SchedulerStopped(RuntimeError):
    """The scheduler is shutting down and takes no new requests (an HTTP server answers 503)."""


@dataclasses.dataclass
class Request:
    """One sequence to generate. logprobs / prompt_logprobs: None for none, k >= 0 for each token's
    logprob plus the k best alternatives. stop_text(tokens) -> bool, when given, is asked after each
    token (a server's stop strings); True ends the sequence there with finish_reason "stop"."""
    prompt: list
    max_new: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    stop_on_eos: bool = True
    stop_ids: tuple = ()
    logprobs: int = None
    prompt_logprobs: int = None
    stop_text: object = None
    certify: bool = True

    def sampling(self):
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
                "seed": self.seed}


class Handle:
    """A submitted request: its events, in order. notify(event), when given, is called from the
    scheduler's thread instead of queueing (an asyncio server passes loop.call_soon_threadsafe)."""

    def __init__(self, request, notify=None):
        self.request = request
        self._notify = notify
        self._events = queue.Queue()
        self._cancel = threading.Event()

    def cancel(self):
        """Stop generating (the client went away): the sequence leaves at the next step, no event."""
        self._cancel.set()

    @property
    def cancelled(self):
        return self._cancel.is_set()

    def _emit(self, event):
        if self._notify is None:
            self._events.put(event)
            return
        try:
            self._notify(event)
        except RuntimeError:  # the receiver is gone (an event loop closed at shutdown): nobody to tell
            self.cancel()

    def events(self, timeout=None):
        """The events as they come, through the final "done" or "error" (queue mode only)."""
        while True:
            event = self._events.get(timeout=timeout)
            yield event
            if event["type"] in ("done", "error"):
                return

    def result(self, timeout=None):
        """Wait for the end: {"tokens", "logprobs", "top_logprobs", "prompt_logprobs",
        "prompt_top_logprobs", "finish_reason", "certificate"}; an "error" event raises RuntimeError."""
        out = {"tokens": [], "logprobs": [], "top_logprobs": [], "prompt_logprobs": None, "prompt_top_logprobs": None}
        for event in self.events(timeout):
            if event["type"] == "prompt":
                out["prompt_logprobs"], out["prompt_top_logprobs"] = event["logprobs"], event["top"]
            elif event["type"] == "token":
                out["tokens"].append(event["token"])
                out["logprobs"].append(event["logprob"])
                out["top_logprobs"].append(event["top"])
            elif event["type"] == "error":
                raise RuntimeError(event["message"])
            else:
                out.update(finish_reason=event["finish_reason"], certificate=event["certificate"])
        return out


class _Seq:
    """An admitted request: its KV state, how much of the prompt is fed, its tokens and chain."""

    def __init__(self, handle, state, sample_params, stops, seed_digest):
        self.handle, self.req, self.state = handle, handle.request, state
        self.params = sample_params  # (temperature, top_p, min_p), (top_k, seed) as the sampler takes them
        self.stops = stops
        self.fed = 0
        self.tokens = []
        self.chain = []
        self.prev = seed_digest
        self.prompt_lp, self.prompt_top = [], []
        self.leader = None    # the sequence whose prefill this one takes a copy of (same prompt), or None
        self.followers = []   # the sequences waiting for this one's prefill

    @property
    def prefilling(self):
        return self.fed < len(self.req.prompt)


class Scheduler:
    """Runs requests on mm, up to max_batch at once; at most max_waiting wait for a slot (submit
    raises QueueFull beyond). A step feeds at most step_tokens rows: every decoding sequence's one
    token first, then prompt pieces in arrival order."""

    def __init__(self, mm, max_batch=None, max_waiting=256, step_tokens=256):
        max_batch = mm.batch_max() if max_batch is None else max_batch
        for name, v, lo in (("max_batch", max_batch, 1), ("max_waiting", max_waiting, 0),
                            ("step_tokens", step_tokens, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"det-infer: {name} must be an int >= {lo}, got {v!r}")
        if step_tokens < max_batch:
            raise ValueError(f"det-infer: step_tokens ({step_tokens}) must be at least max_batch ({max_batch}): "
                             "every decoding sequence feeds one row per step")
        self.mm, self.max_batch, self.max_waiting, self.step_tokens = mm, max_batch, max_waiting, step_tokens
        try:
            self.identity = certificate.model_identity(mm)
        except certificate.CertificateError as e:
            self.identity, self.no_certificate = None, str(e)
        self._waiting = collections.deque()
        self._active = []
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = None
        self.steps = 0
        self.prompt_rows = 0  # prompt tokens fed (a request that copies another's prefill feeds none)

    # ---- the caller's side --------------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._run, name="det-infer-scheduler", daemon=True)
        self._thread.start()
        return self

    def check(self, req):
        """Raise ValueError saying what is wrong with a request (token ids, lengths, sampling)."""
        mm = self.mm
        if not isinstance(req, Request):
            raise TypeError("det-infer: submit takes a serving.Request")
        req.prompt = mm._ids(req.prompt)
        if isinstance(req.max_new, bool) or not isinstance(req.max_new, int) or req.max_new < 0:
            raise ValueError(f"det-infer: max_new must be an int >= 0, got {req.max_new!r}")
        if req.max_new == 0 and req.prompt_logprobs is None:
            raise ValueError("det-infer: a request with max_new 0 must ask for the prompt's logprobs")
        mm._check_length(len(req.prompt) + req.max_new)
        mm._sampling(1, **req.sampling())
        req.stop_ids = tuple(mm._ids(list(req.stop_ids), "stop_ids")) if req.stop_ids else ()
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(req, name)
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= mm.config.vocab_size):
                raise ValueError(f"det-infer: {name} must be None or an int in [0, {mm.config.vocab_size}], got {k!r}")

    def submit(self, req, notify=None):
        """Queue a request; returns its Handle. Raises ValueError (a bad request), QueueFull or
        SchedulerStopped."""
        return self.submit_many([req], [notify])[0]

    def submit_many(self, reqs, notifies=None):
        """Queue requests together (the choices of one HTTP request): all of them or, when the
        queue has no room for all, none (QueueFull). Returns their Handles."""
        for req in reqs:
            self.check(req)
        handles = [Handle(r, n) for r, n in zip(reqs, notifies or [None] * len(reqs))]
        with self._cv:
            if self._stopping or self._thread is None:
                raise SchedulerStopped("det-infer: the scheduler is not running (shutting down or not started)")
            if any(h.cancelled for h in self._waiting):  # gone clients hold no place
                self._waiting = collections.deque(h for h in self._waiting if not h.cancelled)
            if len(self._waiting) + len(handles) > self.max_waiting:
                raise QueueFull(f"det-infer: {len(self._waiting)} requests are already waiting (the bound is "
                                f"{self.max_waiting}); retry later")
            self._waiting.extend(handles)
            self._cv.notify()
        return handles

    def load(self):
        """(active sequences, waiting requests)."""
        with self._cv:
            return len(self._active), len(self._waiting)

    def stop(self, timeout=30.0):
        """Take no new requests, let the running and waiting ones finish for up to timeout seconds,
        then end the rest with an "error" event saying the server shut down."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is None:
            return
        self._thread.join(timeout)
        with self._cv:
            self._abort = True
            self._cv.notify()
        self._thread.join()

    # ---- the scheduler's thread ---------------------------------------------------------------
    _abort = False

    def _run(self):
        while True:
            with self._cv:
                while not (self._active or self._waiting or self._stopping or self._abort):
                    self._cv.wait()
                if self._abort or (self._stopping and not self._active and not self._waiting):
                    left = list(self._waiting) + [s.handle for s in self._active]
                    self._waiting.clear()
                    self._active.clear()
                    break
                self._admit()
            try:
                self._step()
            except Exception as e:  # a bug here must not leave every client waiting forever
                for seq in list(self._active):
                    self._finish_error(seq, f"det-infer: the scheduler failed: {type(e).__name__}: {e}")
        for h in left:
            h._emit({"type": "error", "message": "det-infer: the server shut down before this request finished"})

    def _admit(self):
        while self._waiting and len(self._active) < self.max_batch:
            h = self._waiting.popleft()
            if h.cancelled:
                continue
            req = h.request
            try:
                state = self.mm._new_kv(len(req.prompt) + max(req.max_new, 1))
                sample_f, sample_i = self.mm._sampling(1, **req.sampling())
            except Exception as e:  # no memory for its KV cache, or a request check missed
                h._emit({"type": "error", "message": f"det-infer: {e}"})
                continue
            params = (sample_f[0].tolist(), sample_i[0].tolist()) if sample_f.numel() else None
            stops = list(dict.fromkeys(list(req.stop_ids) + (list(self.mm.config.eos_token_ids)
                                                              if req.stop_on_eos else [])))
            seed = None
            if req.certify and self.identity is not None and req.max_new > 0:
                seed = certificate.header_digest(self._header(req, req.max_new, stops)["binding"])
            s = _Seq(h, state, params, stops, seed)
            if req.prompt_logprobs is not None and len(req.prompt) == 1:  # no token to predict in the prompt
                h._emit({"type": "prompt", "logprobs": [], "top": []})
                if req.max_new == 0:
                    h._emit({"type": "done", "finish_reason": "length", "tokens": [], "certificate": None})
                    continue
            self._follow(s)
            self._active.append(s)

    def _follow(self, s):
        """Make s a follower of _leader_for(s), or its own leader when there is none."""
        s.leader = self._leader_for(s)
        if s.leader is not None:
            s.leader.followers.append(s)

    def _leader_for(self, s):
        """An active sequence whose prefill s can copy instead of feeding its own prompt (the n choices
        of one request, or any request with the same prompt arriving before that prefill starts): the
        same prompt, capacity and wanted rows, not started. Its KV state and logits rows are the bits
        s's own prefill would give (a row depends only on its sequence: docs/SPEC.md §13)."""
        for x in self._active:
            if (x is not s and x.leader is None and x.fed == 0 and x.req.prompt == s.req.prompt
                    and x.state.capacity == s.state.capacity and not x.handle.cancelled
                    and (x.req.prompt_logprobs is None) == (s.req.prompt_logprobs is None)
                    and (x.req.max_new > 0) == (s.req.max_new > 0)):
                return x
        return None

    def _header(self, req, max_new, stops):
        return certificate.header(self.identity, req.prompt, max_new, stops,
                                  req.sampling() if req.temperature > 0 else {})

    def _step(self):
        """One forward over every active sequence's rows, then each wanted row's token or logprobs."""
        self._active = [s for s in self._active if not s.handle.cancelled]
        active = set(map(id, self._active))
        for s in self._active:  # a follower whose leader is gone: the first feeds its prompt, the rest follow it
            if s.leader is not None and id(s.leader) not in active:
                s.prompt_lp, s.prompt_top = [], []
                self._follow(s)
        rows, fed, budget = [], [], self.step_tokens  # rows: (seq, token, position, kind or None)
        for s in self._active:  # decoding sequences first: one row each
            if s.leader is not None:  # waits for its leader's prefill
                continue
            if not s.prefilling:
                rows.append((s, s.tokens[-1], len(s.req.prompt) + len(s.tokens) - 1, "next"))
                budget -= 1
        for s in self._active:  # then prompt pieces, in arrival order, while the budget lasts
            if s.leader is None and s.prefilling and budget > 0:
                P, end = len(s.req.prompt), min(len(s.req.prompt), s.fed + budget)
                for p in range(s.fed, end):
                    kind = "next" if p == P - 1 and s.req.max_new > 0 else \
                        "prompt" if p < P - 1 and s.req.prompt_logprobs is not None else None
                    rows.append((s, s.req.prompt[p], p, kind))
                fed.append((s, end))
                budget -= end - s.fed
        if not rows:
            return
        if all(r[3] is None for r in rows):  # the ops need one wanted row; its logits are not used
            rows[-1] = rows[-1][:3] + ("unused",)
        states = list({id(r[0]): r[0] for r in rows}.values())
        slot = {id(s): i for i, s in enumerate(states)}
        try:
            with self.mm._lock:
                logits = self.mm._forward([r[1] for r in rows], [r[2] for r in rows], [s.state for s in states],
                                          [slot[id(r[0])] for r in rows], [int(r[3] is not None) for r in rows]).cpu()
        except Exception as e:  # a native error ends these sequences, not the server
            for s in states:
                self._finish_error(s, f"det-infer: the forward step failed: {e}")
            return
        self.steps += 1
        for s, _, p, _ in rows:
            s.state.length = max(s.state.length, p + 1)
        self.prompt_rows += sum(end - s.fed for s, end in fed)
        for s, end in fed:
            s.fed = end
        wanted = [(s, p, kind) for s, _, p, kind in rows if kind is not None]
        for s in states:
            mine = [(j, p) for j, (x, p, kind) in enumerate(wanted) if x is s and kind == "prompt"]
            nxt = [j for j, (x, _, kind) in enumerate(wanted) if x is s and kind == "next"]
            done = not s.prefilling and s.followers  # the leader's prompt is in its state now
            for x in [s] + [f for f in s.followers if not f.handle.cancelled]:
                if x is not s and done:  # a follower takes the prompt's positions from its leader
                    x.state.cache.copy_(s.state.cache)
                    x.state.length, x.state.weights_version = s.state.length, s.state.weights_version
                    x.fed, x.leader = s.fed, None
                try:
                    if mine:
                        self._prompt_logprobs(x, logits, mine)
                    if nxt:
                        self._next_token(x, logits[nxt[0]])
                except Exception as e:  # e.g. a stop_text callback that raised: this sequence only
                    self._finish_error(x, f"det-infer: {type(e).__name__}: {e}")
            if done:
                s.followers = []

    def _prompt_logprobs(self, s, logits, rows):
        k = s.req.prompt_logprobs
        sel = torch.tensor([r for r, _ in rows])
        targets = torch.tensor([s.req.prompt[p + 1] for _, p in rows], dtype=torch.int64)
        n = len(rows)
        lp, rank = torch.empty(n), torch.empty(n, dtype=torch.int64)
        ti, tl = torch.empty((n, k), dtype=torch.int64), torch.empty((n, k))
        ops.logprob_rows(logits[sel].contiguous(), targets, 1.0, k, lp, rank, ti, tl)
        s.prompt_lp += lp.tolist()
        s.prompt_top += [list(zip(i, v)) for i, v in zip(ti.tolist(), tl.tolist())]
        if len(s.prompt_lp) == len(s.req.prompt) - 1:
            s.handle._emit({"type": "prompt", "logprobs": s.prompt_lp, "top": s.prompt_top})
            if s.req.max_new == 0:
                self._finish(s, "length")

    def _next_token(self, s, row):
        """Draw the next token from its logits row exactly as generate does, emit it, and end the
        sequence at a stop id, max_new or a stop string."""
        P, step = len(s.req.prompt), len(s.tokens)
        if s.params is None:
            tok = int(ops.argmax_f32(row))
        else:
            (t, p, m), (k, sd) = s.params
            tok = int(ops.sample_token(row, t, k, p, m, sd, P + step))
        s.tokens.append(tok)
        if s.prev is not None:
            s.prev = certificate.chain_next(s.prev, tok, certificate.f32_bytes(row))
            s.chain.append(s.prev.hex())
        event = {"type": "token", "token": tok, "logprob": None, "top": None}
        if s.req.logprobs is not None:
            event["logprob"], event["top"] = self._token_logprobs(s, row, tok)
        s.handle._emit(event)
        more = ops.decode_continues(tok, step, s.req.max_new, torch.tensor(s.stops, dtype=torch.int32))
        if not more and tok in s.stops:
            self._finish(s, "stop")
        elif s.req.stop_text is not None and s.req.stop_text(s.tokens):  # even at max_new: the reason is "stop"
            self._finish(s, "stop", cut=len(s.tokens) < s.req.max_new)
        elif not more:
            self._finish(s, "length")

    def _token_logprobs(self, s, row, tok):
        """The chosen token's logprob under the distribution it was drawn from (the kept set at the
        sampling temperature, or the plain log-softmax when greedy: SPEC §15.1) and the k best of it."""
        k = s.req.logprobs
        if s.params is None:
            lp, rank = torch.empty(1), torch.empty(1, dtype=torch.int64)
            ti, tl = torch.empty((1, k), dtype=torch.int64), torch.empty((1, k))
            ops.logprob_rows(row.reshape(1, -1).contiguous(), torch.tensor([tok]), 1.0, k, lp, rank, ti, tl)
            return lp.item(), list(zip(ti[0].tolist(), tl[0].tolist()))
        (t, p, m), (topk, _) = s.params
        ids, lps = ops.logprob_kept(row.contiguous(), t, int(topk), p, m)
        hit = (ids == tok).nonzero()
        chosen = lps[hit[0, 0]].item() if len(hit) else float("-inf")
        return chosen, list(zip(ids[:k].tolist(), lps[:k].tolist()))

    def _finish(self, s, reason, cut=False):
        """End a sequence: its certificate (when it has a chain) and the "done" event."""
        cert = None
        if s.prev is not None:
            if cut:  # a stop string ended it before max_new: certify generating exactly these tokens
                self._rechain(s)
            cert = certificate.seal(self._header(s.req, len(s.tokens) if cut else s.req.max_new, s.stops),
                                    s.tokens, s.chain, self.mm)
        self._active = [x for x in self._active if x is not s]
        s.handle._emit({"type": "done", "finish_reason": reason, "tokens": list(s.tokens), "certificate": cert})

    def _rechain(self, s):
        """The chain of a generation cut short by a stop string, for max_new = the tokens produced:
        its seed differs, so the step logits are computed again (teacher-forced over the KV state the
        sequence already holds: the same bits, SPEC §13) and hashed from the new seed."""
        P, n = len(s.req.prompt), len(s.tokens)
        feed = [s.req.prompt[-1]] + s.tokens[:-1]
        prev = certificate.header_digest(self._header(s.req, n, s.stops)["binding"])
        chain = []
        for a in range(0, n, self.step_tokens):
            part = feed[a:a + self.step_tokens]
            with self.mm._lock:
                logits = self.mm._forward(part, list(range(P - 1 + a, P - 1 + a + len(part))), [s.state],
                                          [0] * len(part), [1] * len(part)).cpu()
            for j, tok in enumerate(s.tokens[a:a + len(part)]):
                prev = certificate.chain_next(prev, tok, certificate.f32_bytes(logits[j]))
                chain.append(prev.hex())
        s.chain = chain

    def _finish_error(self, s, message):
        self._active = [x for x in self._active if x is not s]
        s.handle._emit({"type": "error", "message": message})
