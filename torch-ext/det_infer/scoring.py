"""Scoring continuations with the contract's logprobs (docs/SPEC.md §15.1): MegaModel.score and
score_batch. Pairs run together in groups of up to BATCH_MAX sequences, each group's rows in pieces
of at most LOGIT_ROWS wanted rows per native call (any split gives the same bits), so no caller
ever sees a full (length x vocab) block of logits."""
from dataclasses import dataclass

import torch

from ._ops import ops

LOGIT_ROWS = 512  # wanted logit rows per native call: 512 x vocab fp32 (100 MB at vocab 49152)


@dataclass
class Score:
    """Per continuation token: its fp32 logprob, whether it was the greedy choice, its rank (1 =
    the argmax), and with top_k > 0 the k best ids and their logprobs (argmax order)."""
    logprobs: torch.Tensor  # (n,) float32
    greedy: torch.Tensor  # (n,) bool
    ranks: torch.Tensor  # (n,) int64
    top_ids: torch.Tensor  # (n, top_k) int64
    top_logprobs: torch.Tensor  # (n, top_k) float32
    # With sampling={...}: the sampler's kept set per position (ids in rank order, their
    # renormalized logprobs) and each token's logprob in it (-inf when it was not kept).
    kept: list = None
    kept_logprobs: torch.Tensor = None

    @property
    def total(self) -> float:
        """The sum of the logprobs in float64, in token order (lm-eval's HFLM sums in the model's
        dtype; a float64 sum rounds far less, the same way on every machine)."""
        return sum(self.logprobs.tolist(), 0.0)

    @property
    def is_greedy(self) -> bool:
        return bool(self.greedy.all())


def _check_options(vocab, top_k, temperature):
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= vocab:
        raise ValueError(f"det-infer: top_k must be an int in [0, {vocab}], got {top_k!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not 0 < temperature < float("inf"):
        raise ValueError(f"det-infer: temperature must be a finite number > 0, got {temperature!r}")


def _check_sampling(sampling):
    """sampling: None, or a dict of the sampler's filters top_k, top_p, min_p (defaults: off)."""
    if sampling is None:
        return None
    if not isinstance(sampling, dict) or set(sampling) - {"top_k", "top_p", "min_p"}:
        raise ValueError(f"det-infer: sampling must be a dict of top_k, top_p, min_p, got {sampling!r}")
    k, p, m = sampling.get("top_k", 0), sampling.get("top_p", 1.0), sampling.get("min_p", 0.0)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < 2**31:
        raise ValueError(f"det-infer: sampling top_k must be an int >= 0 (0: off), got {k!r}")
    for name, v, ok in (("top_p", p, lambda v: 0 < v <= 1), ("min_p", m, lambda v: 0 <= v <= 1)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
            raise ValueError(f"det-infer: sampling {name} out of range, got {v!r}")
    return int(k), float(p), float(m)


def score_pairs(mm, pairs, top_k=0, temperature=1.0, sampling=None):
    """Scores of (context_ids, continuation_ids) pairs; see MegaModel.score_batch."""
    if not isinstance(pairs, (list, tuple)):
        raise TypeError("det-infer: score_batch takes a list of (context_ids, continuation_ids) pairs")
    vocab = mm.config.vocab_size
    _check_options(vocab, top_k, temperature)
    filters = _check_sampling(sampling)
    seqs = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"det-infer: pair {i} must be (context_ids, continuation_ids)")
        ctx = mm._ids(pair[0], f"context of pair {i} (it needs at least one token to predict from)")
        cont = mm._ids(pair[1], f"continuation of pair {i}")
        mm._check_length(len(ctx) + len(cont) - 1)
        seqs.append((ctx, cont))
    out = [None] * len(seqs)
    B = mm.batch_max()
    for g in range(0, len(seqs), B):
        group = list(range(g, min(g + B, len(seqs))))
        for i, res in zip(group, _score_group(mm, [seqs[i] for i in group], top_k, float(temperature), filters)):
            out[i] = res
    return out


def _score_group(mm, seqs, top_k, temperature, filters):
    """One batch of sequences: each runs context + continuation[:-1]; the rows from the context's
    last token on are wanted, each predicting the next continuation token."""
    feeds = [ctx + cont[:-1] for ctx, cont in seqs]
    first_wanted = [len(ctx) - 1 for ctx, _ in seqs]
    targets_of = [ctx[1:] + cont for ctx, cont in seqs]  # the token after each fed position
    states = [mm._new_kv(len(f)) for f in feeds]
    cursor = [0] * len(seqs)
    parts = [[] for _ in seqs]
    while any(c < len(f) for c, f in zip(cursor, feeds)):
        active = [b for b in range(len(seqs)) if cursor[b] < len(feeds[b])]
        quota = max(1, LOGIT_ROWS // len(active))
        tokens, positions, index, want, targets, owner = [], [], [], [], [], []
        for b in active:
            # All context rows not wanted, then up to `quota` wanted rows.
            end = min(len(feeds[b]), max(cursor[b], first_wanted[b]) + quota)
            for p in range(cursor[b], end):
                w = p >= first_wanted[b]
                tokens.append(feeds[b][p])
                positions.append(p)
                index.append(b)
                want.append(1 if w else 0)
                if w:
                    targets.append(targets_of[b][p])
                    owner.append(b)
            cursor[b] = end
        logits = mm._forward(tokens, positions, states, index, want).cpu()
        n = len(targets)
        lp, rank = torch.empty(n), torch.empty(n, dtype=torch.int64)
        ti, tl = torch.empty((n, top_k), dtype=torch.int64), torch.empty((n, top_k))
        ops.logprob_rows(logits, torch.tensor(targets, dtype=torch.int64), temperature, top_k, lp, rank, ti, tl)
        kept = [ops.logprob_kept(logits[j], temperature, *filters) for j in range(n)] if filters else [None] * n
        for b in active:
            rows = [j for j, o in enumerate(owner) if o == b]
            if rows:
                sel = torch.tensor(rows)
                parts[b].append((lp[sel], rank[sel], ti[sel], tl[sel], [kept[j] for j in rows],
                                 [targets[j] for j in rows]))
        for b in active:
            states[b].length = cursor[b]
    results = []
    for b in range(len(seqs)):
        lp, rank, ti, tl = (torch.cat([p[i] for p in parts[b]]) for i in range(4))
        res = Score(lp, rank == 1, rank, ti, tl)
        if filters:
            res.kept = [k for p in parts[b] for k in p[4]]
            tgt = [t for p in parts[b] for t in p[5]]
            res.kept_logprobs = torch.tensor([_in_kept(k, t) for k, t in zip(res.kept, tgt)], dtype=torch.float32)
        results.append(res)
    return results


def _in_kept(kept, token):
    ids, lp = kept
    hit = (ids == token).nonzero()
    return lp[hit[0, 0]].item() if len(hit) else float("-inf")


def _sampling_of(sample_f, sample_i, b):
    """(temperature, top_k, top_p, min_p) of sequence b, or None when it is greedy."""
    if sample_f.numel() and sample_f[b, 0].item() > 0:
        (t, p, m), (k, _) = sample_f[b].tolist(), sample_i[b].tolist()
        return t, int(k), p, m
    return None


def generated_logprobs(mm, prompts, streams, sample_f, sample_i):
    """chosen_logprobs of each generated stream, from its teacher-forced logits (the same bits as the
    generation's: prefill and decode agree, docs/SPEC.md §13): score_pairs on (prompt, stream),
    grouped by sampling settings, so at most LOGIT_ROWS logit rows exist at a time."""
    groups = {}
    for b in range(len(prompts)):
        groups.setdefault(_sampling_of(sample_f, sample_i, b), []).append(b)
    out = [None] * len(prompts)
    for params, members in groups.items():
        pairs = [(prompts[b], streams[b]) for b in members]
        if params is None:
            scores = score_pairs(mm, pairs)
        else:
            t, k, p, m = params
            scores = score_pairs(mm, pairs, temperature=t, sampling={"top_k": k, "top_p": p, "min_p": m})
        for b, sc in zip(members, scores):
            out[b] = sc.logprobs if params is None else sc.kept_logprobs
    return out


def chosen_logprobs(logits, tokens, sample_f, sample_i, b):
    """(steps,) fp32 logprobs of the generated tokens of sequence b: with sampling (sample_f row b
    at temperature > 0) the kept set's renormalized logprob at that temperature, else the plain
    log-softmax at temperature 1."""
    n = len(tokens)
    params = _sampling_of(sample_f, sample_i, b)
    if params is not None:
        t, k, p, m = params
        return torch.tensor([_in_kept(ops.logprob_kept(logits[j].contiguous(), t, k, p, m), tok)
                             for j, tok in enumerate(tokens)], dtype=torch.float32)
    lp, rank = torch.empty(n), torch.empty(n, dtype=torch.int64)
    ops.logprob_rows(logits.contiguous(), torch.tensor(tokens, dtype=torch.int64), 1.0, 0, lp, rank,
                     torch.empty(0, dtype=torch.int64), torch.empty(0))
    return lp
