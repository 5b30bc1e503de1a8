"""Generation and scoring over a batch of rows, each row's answer its own: the work one Ray Data
batch does (ray_data.py), here without Ray.

A batch is a mapping of columns (lists, numpy arrays or pandas columns of equal length). Each row is
checked alone: a row that cannot run (ids outside the vocabulary, too long for max_context, a bad
sampling value) gets its message in the "error" column and no result; the others run together. How
rows are grouped into native calls never changes a bit (a sequence's logits do not depend on its
batch: docs/SPEC.md §13), so a row's output is the same on any worker, in any batch, in any order.

RowGenerator's columns: tokens, logprobs (fp32, of each token under the distribution it was drawn
from: SPEC §15.1), finish_reason ("stop" or "length"), certificate_root (the merkle_root of the
certificate certificate.make would give the row), certificate (the whole certificate as JSON, with
certificates=True), model_sha256, contract_version, error.
RowScorer's columns: logprobs, greedy, ranks, total (float64), is_greedy, top_ids and top_logprobs
(top_k > 0), kept_logprobs (sampling=...), model_sha256, contract_version, error.
"""
import itertools
import json

from . import certificate, scoring
from .contract import CONTRACT_VERSION
from .model import check_max_new

LOGITS_BUDGET = 256 << 20  # bytes of step logits (kept for the certificate chain) per native call


def _py(value):
    """A numpy / torch / pyarrow value as plain Python (lists of ints, ints, floats, None)."""
    return value.tolist() if hasattr(value, "tolist") else value


def columns_of(batch, required, optional=()):
    """({name: list of plain values}, row count) of the required and optional columns of a batch (a
    mapping of columns, a pandas DataFrame or a pyarrow Table); other columns are not read."""
    names = list(batch.column_names) if hasattr(batch, "column_names") else list(batch.keys())
    missing = [c for c in required if c not in names]
    if missing:
        raise ValueError(f"det-infer: the batch has no column {missing[0]!r} (columns: {names}); "
                         f"each row needs {', '.join(required)}")
    wanted = [c for c in list(required) + list(optional) if c in names]
    if hasattr(batch, "column_names"):  # pyarrow
        cols = {c: batch.column(c).to_pylist() for c in wanted}
    else:
        cols = {c: [_py(v) for v in batch[c]] for c in wanted}
    lengths = {len(v) for v in cols.values()}
    if len(lengths) > 1:
        raise ValueError(f"det-infer: the batch's columns have different lengths {sorted(lengths)}")
    return cols, lengths.pop()


_INT_SETTINGS = ("max_new", "top_k", "seed")


def _setting(name, value):
    """A per-row setting as a row holds it: None for a missing value (None, NaN, pandas' NA, which a
    column of numbers with a gap holds), an int for a whole float in an int setting (pandas keeps
    such a column as float64)."""
    if value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and value != value):
        return None
    if name in _INT_SETTINGS and isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _identity(mm):
    try:
        return certificate.model_identity(mm), certificate.model_sha256(mm)
    except certificate.CertificateError:
        return None, None  # a model not loaded from files: no certificate roots, no model_sha256


def _run_rows(out, run, jobs):
    """run(jobs) (jobs are (row index, ...); run returns one {column: value} per job) as one call,
    written into the out columns. If the call raises, each job runs alone, so that a failing row
    fails alone, with its message in out["error"]."""
    try:
        results = [(r, None) for r in run(jobs)]
    except Exception:  # noqa: BLE001 - the row that caused it is found below and named
        results = []
        for job in jobs:
            try:
                results.append((run([job])[0], None))
            except Exception as e:  # noqa: BLE001 - a row's failure is that row's error column
                results.append((None, str(e) if str(e).startswith("det-infer") else f"{type(e).__name__}: {e}"))
    for (i, *_), (res, err) in zip(jobs, results):
        out["error"][i] = err
        for name, value in (res or {}).items():
            out[name][i] = value


def _finish(out, n, model_sha256):
    out["model_sha256"] = [model_sha256] * n
    out["contract_version"] = [CONTRACT_VERSION] * n
    return out


class RowGenerator:
    """Generation for batches of rows with a `prompt_ids` column: greedy by default, or seeded
    sampling; max_new and each sampling field may also come per row from a column of that name
    (a gap there, None, NaN or pandas' NA, means the call's value). stop_on_eos adds the model's end-of-sequence ids to
    stop_ids. Calling it on a batch returns the output columns (module docstring)."""

    def __init__(self, mm, *, max_new, stop_ids=None, stop_on_eos=False, certificates=False, **sampling):
        unknown = set(sampling) - set(certificate.SAMPLING_FIELDS)
        if unknown:
            raise TypeError(f"det-infer: unknown sampling keyword(s) {sorted(unknown)}; known: "
                            f"{certificate.SAMPLING_FIELDS}")
        self.mm = mm
        self.defaults = {"max_new": max_new, **certificate.SAMPLING_DEFAULTS, **sampling}
        self._settings(self.defaults)  # a bad call-level value is the caller's error, not a row's
        self.stop_ids = mm._stop_ids(stop_on_eos, stop_ids).tolist()
        self.certificates = certificates
        self._check_identity()

    def _check_identity(self):
        """The model's identity now (update_weights ends it; the file digests are cached)."""
        self.identity, self.model_sha256 = _identity(self.mm)
        if self.certificates and self.identity is None:
            raise ValueError("det-infer: certificates need a model loaded from files (from_pretrained or from_gguf) "
                             "whose weights were not replaced by update_weights")

    def _settings(self, row):
        """(max_new, sampling dict) of a row's settings, checked."""
        max_new = row["max_new"]
        check_max_new(max_new)
        sampling = {k: row[k] for k in certificate.SAMPLING_FIELDS}
        self.mm._sampling(1, **sampling)  # raises on a value out of range
        return max_new, sampling

    def __call__(self, batch):
        cols, n = columns_of(batch, ["prompt_ids"], self.defaults)
        self._check_identity()
        out = {name: [None] * n for name in ("tokens", "logprobs", "finish_reason", "certificate_root", "error")}
        if self.certificates:
            out["certificate"] = [None] * n
        jobs = []
        for i in range(n):
            try:
                row = dict(self.defaults)
                row.update({k: v for k in self.defaults if k in cols
                            for v in [_setting(k, cols[k][i])] if v is not None})
                max_new, sampling = self._settings(row)
                ids = self.mm._ids(cols["prompt_ids"][i], "prompt_ids")
                self.mm._check_length(len(ids) + max_new)
                jobs.append((i, ids, max_new, sampling))
            except (TypeError, ValueError) as e:
                out["error"][i] = str(e)
        # One native call per max_new, as many rows as the step logits' budget allows.
        vocab = self.mm.config.vocab_size
        for max_new, group in itertools.groupby(sorted(jobs, key=lambda j: j[2]), key=lambda j: j[2]):
            group = list(group)
            per_call = max(1, min(self.mm.batch_max(), LOGITS_BUDGET // (max_new * vocab * 4)))
            for start in range(0, len(group), per_call):
                _run_rows(out, self._generate, group[start:start + per_call])
        return _finish(out, n, self.model_sha256)

    def _generate(self, jobs):
        """One generate_batch call for jobs of one max_new: each row's output columns."""
        max_new = jobs[0][2]
        sampling = {k: [j[3][k] for j in jobs] for k in certificate.SAMPLING_FIELDS}
        streams, logits, logprobs = self.mm.generate_batch(
            [j[1] for j in jobs], max_new, stop_ids=self.stop_ids, return_logits=True, return_logprobs=True,
            **sampling)
        results = []
        for (_, ids, _, row_sampling), tokens, lg, lp in zip(jobs, streams, logits, logprobs):
            res = {"tokens": tokens, "logprobs": lp.tolist(),
                   "finish_reason": "stop" if tokens[-1] in self.stop_ids else "length"}
            if self.identity is not None:
                cert = certificate.header(self.identity, ids, max_new, self.stop_ids, row_sampling)
                chain = certificate.step_chain(certificate.header_digest(cert["binding"]), tokens, lg)
                res["certificate_root"] = certificate.merkle_root(chain)
                if self.certificates:
                    res["certificate"] = json.dumps(certificate.seal(cert, tokens, chain, self.mm))
            results.append(res)
        return results


class RowScorer:
    """Scoring for batches of rows with `context_ids` and `continuation_ids` columns: each row is
    MegaModel.score(context_ids, continuation_ids, top_k=..., temperature=..., sampling=...).
    Calling it on a batch returns the output columns (module docstring)."""

    def __init__(self, mm, *, top_k=0, temperature=1.0, sampling=None):
        scoring._check_options(mm.config.vocab_size, top_k, temperature)
        scoring._check_sampling(sampling)
        self.mm, self.top_k, self.temperature, self.sampling = mm, top_k, temperature, sampling

    def __call__(self, batch):
        cols, n = columns_of(batch, ["context_ids", "continuation_ids"])
        self.model_sha256 = _identity(self.mm)[1]
        names = ["logprobs", "greedy", "ranks", "total", "is_greedy", "error"]
        names += ["top_ids", "top_logprobs"] if self.top_k else []
        names += ["kept_logprobs"] if self.sampling is not None else []
        out = {name: [None] * n for name in names}
        jobs = []
        for i in range(n):
            try:
                ctx = self.mm._ids(cols["context_ids"][i], "context_ids")
                cont = self.mm._ids(cols["continuation_ids"][i], "continuation_ids")
                self.mm._check_length(len(ctx) + len(cont) - 1)
                jobs.append((i, ctx, cont))
            except (TypeError, ValueError) as e:
                out["error"][i] = str(e)
        _run_rows(out, self._score, jobs)
        return _finish(out, n, self.model_sha256)

    def _score(self, jobs):
        scores = self.mm.score_batch([(ctx, cont) for _, ctx, cont in jobs], top_k=self.top_k,
                                     temperature=self.temperature, sampling=self.sampling)
        results = []
        for s in scores:
            res = {"logprobs": s.logprobs.tolist(), "greedy": s.greedy.tolist(), "ranks": s.ranks.tolist(),
                   "total": s.total, "is_greedy": s.is_greedy}
            if self.top_k:
                res.update(top_ids=s.top_ids.tolist(), top_logprobs=s.top_logprobs.tolist())
            if self.sampling is not None:
                res["kept_logprobs"] = s.kept_logprobs.tolist()
            results.append(res)
        return results
