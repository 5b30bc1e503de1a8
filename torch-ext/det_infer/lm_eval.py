"""det-infer as an lm-evaluation-harness model: DetInferLM, registered under the name "det-infer".

    import lm_eval
    from kernels import get_kernel
    di = get_kernel("phanerozoic/det-infer", version=1)
    lm = di.lm_eval.DetInferLM(pretrained="path/to/model-or.gguf", batch_size=16)
    lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])

or from the shell, scripts/eval.py with lm-eval's own arguments. Every score is bit-identical at
every batch_size, on every executor and in every process: loglikelihood is MegaModel.score_batch
(the contract's logprobs, docs/SPEC.md §15.1) and generate_until is generate_batch with string
stops (text.py). The kernel imports only stdlib and torch at module level, so lm-eval is imported
when DetInferLM is first looked up; the class is built then, from lm-eval's TemplateLM.
"""
import collections
import logging

from . import text
from .geometry import GEOMETRY_FIELDS
from .model import BATCH_MAX, MAX_POSITIONS, MegaModel

MODEL_NAME = "det-infer"
MODEL_ARGS = ("pretrained", "batch_size", "max_batch_size", "device", "executor", "geometry", "max_length",
              "max_gen_toks", "seed", "add_bos_token", "trust_remote_code")
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p", "min_p", "seed")
_CLASS = None


def __getattr__(name):
    if name == "DetInferLM":
        return lm_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _refuse_unknown(names):
    if names:
        hint = ("; geometry fields go inside geometry=, separated by ';' in model_args (lm-eval splits on "
                "commas): geometry=tile_rows=64;attn=32") if set(names) & set(GEOMETRY_FIELDS) else ""
        raise TypeError(f"det-infer: DetInferLM got unknown argument(s) {', '.join(sorted(names))}; "
                        f"supported: {', '.join(MODEL_ARGS)}{hint}")


def check_model_args(model_args):
    """Refuses a --model_args string ("pretrained=PATH,batch_size=4", split on commas as lm-eval
    splits it) that names an argument DetInferLM does not take: scripts/eval.py says so before
    lm-eval indexes its task files (about 10 s)."""
    names = {item.split("=", 1)[0].strip() for item in model_args.split(",") if item.strip()}
    _refuse_unknown(names - set(MODEL_ARGS))


def lm_class():
    """DetInferLM, built on lm-eval's TemplateLM and registered as "det-infer" on first use."""
    global _CLASS
    if _CLASS is None:
        try:
            from lm_eval.api.model import TemplateLM
            from lm_eval.api.registry import register_model
        except ImportError:
            raise ImportError("det-infer: di.lm_eval needs lm-eval (pip install lm-eval==0.4.13)") from None
        cls = type("DetInferLM", (_DetInferMethods, TemplateLM), {"__module__": __name__,
                                                                  "__doc__": _DetInferMethods.__doc__})
        try:
            register_model(MODEL_NAME)(cls)
        except ValueError:  # another copy of the kernel registered its own DetInferLM first
            pass
        _CLASS = cls
    return _CLASS


def parse_batch_size(batch_size, max_batch_size=None):
    """lm-eval's batch_size (an int, "N", "auto" or "auto:N") as the sequences per native call. The
    results are the same at every batch size, so "auto" takes the largest, batch_max()."""
    cap = BATCH_MAX if max_batch_size is None else max_batch_size
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"det-infer: max_batch_size must be a positive int, got {max_batch_size!r}")
    if isinstance(batch_size, str) and batch_size.startswith("auto"):
        return min(cap, BATCH_MAX)
    if isinstance(batch_size, str) and batch_size.isdigit():
        batch_size = int(batch_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= BATCH_MAX:
        raise ValueError(f"det-infer: batch_size must be 1..{BATCH_MAX} or 'auto', got {batch_size!r} (scores are "
                         "the same at every batch size)")
    return min(batch_size, cap)


def repeat_indices(requests):
    """k for each generate_until request: the number of identical (context, generation arguments)
    requests before it in the list. A sampled request draws with seed + k, so lm-eval's repeats
    give different samples while every seed depends only on the request list, never on batching."""
    seen = collections.Counter()
    out = []
    for context, gen_kwargs in requests:
        key = (context, repr(sorted(gen_kwargs.items())) if isinstance(gen_kwargs, dict) else repr(gen_kwargs))
        out.append(seen[key])
        seen[key] += 1
    return out


class _DetInferMethods:
    """An lm-eval model running det-infer (name "det-infer"). pretrained: a Hugging Face model
    directory or a .gguf file; batch_size: sequences per native call, 1..16 or "auto" (scores do
    not depend on it); device "cpu" or "cuda"; executor None (the device's default), "engine",
    "emulated" or "megakernel"; geometry: the megakernel's launch shape, a dict or its text form
    "tile_rows=64;attn=32" (model_args split on commas; scores do not depend on it; prompt tiles of
    64 rows take loglikelihood's prompts 64 rows a pass); max_length: the context limit (default: the model's); max_gen_toks:
    generate_until's default length; seed: the base seed of sampled generation; add_bos_token as in
    lm-eval's HFLM."""

    def __init__(self, pretrained=None, batch_size=1, max_batch_size=None, device=None, executor=None,
                 geometry=None, max_length=None, max_gen_toks=256, seed=0, add_bos_token=None,
                 trust_remote_code=None, **unknown):
        _refuse_unknown(unknown)
        super().__init__()
        if not pretrained:
            raise ValueError("det-infer: DetInferLM needs pretrained=PATH (a model directory or a .gguf file)")
        for name, v in (("max_length", max_length), ("max_gen_toks", max_gen_toks)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"det-infer: {name} must be a positive int, got {v!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"det-infer: seed must be an int in [0, 2**64), got {seed!r}")
        self.batch_size = parse_batch_size(batch_size, max_batch_size)
        path = str(pretrained)
        self.mm = MegaModel.load(path, device=device or "cpu", executor=executor, geometry=geometry,
                                 max_context=MAX_POSITIONS if max_length is None else max_length)
        self._device = self.mm.device
        self.tokenizer = self.mm.tokenizer()
        self.pretrained = path
        self.max_gen_toks = max_gen_toks
        self.seed = seed
        self.add_bos_token = add_bos_token

    # ---- what lm-eval asks of a model ---------------------------------------------------------
    @property
    def eot_token_id(self):
        eos = self.tokenizer.eos_token_id
        return eos if eos is not None else self.mm.config.eos_token_ids[0]

    @property
    def prefix_token_id(self):
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self):
        return self.mm.max_context

    @property
    def tokenizer_name(self):
        return self.pretrained.replace("/", "__")

    def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
        """The tokenizer's ids for string (lm-eval HFLM's rules: add_bos_token when set, and no
        second BOS when the string already starts with one), the last left_truncate_len of them."""
        bos = self.tokenizer.bos_token
        if add_special_tokens is None and bos and string.startswith(bos):
            add_special_tokens = False
        elif add_special_tokens is None and self.add_bos_token is not None:
            add_special_tokens = self.add_bos_token
        kw = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        ids = self.tokenizer.encode(string, **kw)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens, skip_special_tokens=True):
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history, add_generation_prompt=True):
        import jinja2

        def render(history):
            return self.tokenizer.apply_chat_template(history, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      continue_final_message=not add_generation_prompt)
        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:  # templates without a system role (as HFLM does)
            return render([m for m in chat_history if m["role"] != "system"])

    @property
    def eos_text(self):
        return self.tok_decode([self.eot_token_id], skip_special_tokens=False)

    def _warn_truncated(self, count, what, limit):
        if count:
            logging.getLogger("det_infer").warning("det-infer: %d %s were cut on the left to fit %s (%d)",
                                                   count, what, limit, self.max_length)

    # ---- loglikelihood ----------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """(sum of logprobs, is_greedy) per (cache key, context ids, continuation ids), the context
        cut on the left to fit max_length as HFLM does; score_batch in batches of batch_size."""
        from tqdm import tqdm

        pairs, truncated = [], 0
        for key, ctx, cont in requests:
            if not cont:
                raise ValueError(f"det-infer: request {key!r} has an empty continuation: nothing to score")
            if len(cont) > self.max_length:
                raise ValueError(f"det-infer: a continuation of {len(cont)} tokens exceeds max_length "
                                 f"{self.max_length}")
            whole = list(ctx) + list(cont)
            truncated += len(whole) > self.max_length + 1
            whole = whole[-(self.max_length + 1):]
            pairs.append((whole[: len(whole) - len(cont)], cont))
        self._warn_truncated(truncated, "loglikelihood contexts", "max_length")
        results = []
        with tqdm(total=len(pairs), disable=disable_tqdm, desc="det-infer loglikelihood") as bar:
            for i in range(0, len(pairs), self.batch_size):
                batch = slice(i, i + self.batch_size)
                for (key, _, _), score in zip(requests[batch], self.mm.score_batch(pairs[batch])):
                    answer = (score.total, score.is_greedy)
                    if key is not None:
                        self.cache_hook.add_partial("loglikelihood", key, answer)
                    results.append(answer)
                    bar.update(1)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """The whole text's logprob, in lm-eval's disjoint rolling windows of max_length."""
        from lm_eval import utils

        windows, counts = [], []
        for (string,) in [r.args for r in requests]:
            rolling = utils.get_rolling_token_windows(token_list=self.tok_encode(string),
                                                      prefix_token=self.prefix_token_id,
                                                      max_seq_len=self.max_length, context_len=1)
            pieces = [utils.make_disjoint_window(w) for w in rolling]
            windows += [(None, ctx, cont) for ctx, cont in pieces]
            counts.append(len(pieces))
        scores = iter(self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm))
        totals = []
        for r, n in zip(requests, counts):
            total = sum((next(scores)[0] for _ in range(n)), 0.0)
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
            totals.append(total)
        return totals

    # ---- generation -----------------------------------------------------------------------------
    def _generation_job(self, i, context, gen_kwargs, k):
        """(ids, max_new, stop strings, sampling, whether the context was cut) of generate_until
        request i, checked in full before anything runs; k from repeat_indices."""
        try:
            return self._parse_generation(context, gen_kwargs, k)
        except (TypeError, ValueError) as e:
            msg = str(e).removeprefix("det-infer: ")
            raise type(e)(f"det-infer: generate_until request {i} ({gen_kwargs!r}): {msg}") from None

    def _parse_generation(self, context, gen_kwargs, k):
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        if not isinstance(gen_kwargs, dict):
            raise TypeError(f"generation arguments must be a dict, got {type(gen_kwargs).__name__}")
        if not isinstance(context, str):
            raise TypeError(f"the context must be a string, got {type(context).__name__}")
        until = gen_kwargs.get("until")
        if until is not None and not isinstance(until, (str, list)):
            raise TypeError(f"until must be a string or a list of strings, got {until!r}")
        kw = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        stops = text.check_stops([s for s in handle_stop_sequences(kw.pop("until", None), eos=self.eos_text) if s])
        max_new = kw.pop("max_gen_toks")
        if not 1 <= max_new < self.max_length:
            raise ValueError(f"max_gen_toks {max_new} must be in [1, max_length {self.max_length})")
        do_sample, temperature = kw.pop("do_sample"), float(kw.pop("temperature", 0.0))
        if do_sample and not temperature > 0:
            raise ValueError(f"do_sample=True needs a temperature > 0, got {temperature!r}")
        seed = kw.pop("seed", self.seed)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        sampling = {"temperature": temperature if do_sample else 0.0, "top_k": kw.pop("top_k", 0),
                    "top_p": kw.pop("top_p", 1.0), "min_p": kw.pop("min_p", 0.0), "seed": (seed + k) % 2**64}
        if kw:
            raise ValueError(f"unsupported generation argument(s) {', '.join(sorted(kw))}; supported: "
                             f"{', '.join(GEN_KWARGS)} (and lm-eval's aliases of max_gen_toks)")
        self.mm._sampling(1, **sampling)  # the sampler's own range checks
        ids = self.tok_encode(context)
        room = self.max_length - max_new
        return ids[-room:] or [self.prefix_token_id], max_new, stops, sampling, len(ids) > room

    def generate_until(self, requests, disable_tqdm=False):
        """Each request's continuation, cut before its first stop string: greedy, or seeded
        sampling with do_sample=True (seed + k, repeat_indices); batches of batch_size sharing
        max_gen_toks and stop strings."""
        from tqdm import tqdm

        args = [r.args for r in requests]
        jobs = [self._generation_job(i, c, g, k) for i, ((c, g), k) in enumerate(zip(args, repeat_indices(args)))]
        self._warn_truncated(sum(j[4] for j in jobs), "generate_until contexts", "max_length - max_gen_toks")
        groups = collections.defaultdict(list)
        for i, (_, max_new, stops, _, _) in enumerate(jobs):
            groups[(max_new, tuple(stops))].append(i)
        out = [None] * len(jobs)
        with tqdm(total=len(jobs), disable=disable_tqdm, desc="det-infer generate_until") as bar:
            for (max_new, stops), members in groups.items():
                for b in range(0, len(members), self.batch_size):
                    batch = members[b: b + self.batch_size]
                    sampling = {k: [jobs[i][3][k] for i in batch] for k in text.SAMPLING_KEYS}
                    done = text.generate_until(self.mm, [jobs[i][0] for i in batch], max_new, self.tok_decode,
                                               list(stops), stop_on_eos=True, **sampling)
                    for i, (_, reply) in zip(batch, done):
                        out[i] = reply
                        self.cache_hook.add_partial("generate_until", args[i], reply)
                    bar.update(len(batch))
        return out
