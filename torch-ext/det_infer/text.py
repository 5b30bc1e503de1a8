"""Generation that stops on strings (MegaModel.generate_text, di.lm_eval's generate_until).

A model stops on token ids; a stop string can span several tokens and only shows in decoded text.
So tokens are generated in chunks of a fixed schedule (16, 32, 64, ... up to max_new) and a
sequence stops after the first chunk whose decoded text contains a stop string; its text is cut
before the earliest one. Each chunk is a fresh generate_batch on prompt + tokens so far: prefill
and token-by-token give the same logits, and the sampler's draw depends only on the seed and the
position (docs/SPEC.md §15), so the tokens are those of one long generation, whatever the batch.
"""

FIRST_CHUNK = 16
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}  # generate_batch's
SAMPLING_KEYS = tuple(SAMPLING_DEFAULTS)


def chunk_schedule(max_new):
    """Chunk lengths 16, 32, 64, ... summing to max_new (the last one cut short)."""
    sizes, size = [], FIRST_CHUNK
    while sum(sizes) < max_new:
        sizes.append(min(size, max_new - sum(sizes)))
        size *= 2
    return sizes


def cut_at_stops(text, stops):
    """text before the earliest of the stop strings it contains (all of it when none)."""
    return text[:min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))]


def check_stops(stop):
    """A stop argument (None, a string, or a list of strings) as a list of non-empty strings."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError(f"det-infer: stop must be a non-empty string or a list of them, got {stop!r}")
    return stops


def generate_until(mm, prompts, max_new, decode, stops, *, stop_on_eos=True, **sampling):
    """[(tokens, text)] for each prompt (token id lists, at most mm.batch_max()): tokens up to the
    end of the chunk where a stop string appeared, EOS, or max_new; text = decode(tokens) cut before
    the first stop string. sampling: generate_batch's temperature, top_k, top_p, min_p, seed, each
    one value or a list with one per prompt."""
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise ValueError(f"det-infer: max_new must be a positive int, got {max_new!r}")
    unknown = set(sampling) - set(SAMPLING_KEYS)
    if unknown:
        raise TypeError(f"det-infer: unknown sampling argument(s) {sorted(unknown)}; "
                        f"supported: {', '.join(SAMPLING_KEYS)}")
    n = len(prompts)
    per_prompt = {k: (list(v) if isinstance(v, (list, tuple)) else [v] * n) for k, v in sampling.items()}
    mm._sampling(n, **{**SAMPLING_DEFAULTS, **sampling})  # every check up front, not a chunk later
    prompts = [mm._ids(p, f"prompt {i}") for i, p in enumerate(prompts)]
    for p in prompts:
        mm._check_length(len(p) + max_new)
    eos = set(mm.config.eos_token_ids) if stop_on_eos else set()
    tokens = [[] for _ in range(n)]
    texts = [None] * n
    active = list(range(n))
    for size in (chunk_schedule(max_new) if stops else [max_new]):
        if not active:
            break
        streams = mm.generate_batch([list(prompts[i]) + tokens[i] for i in active], size, stop_on_eos=stop_on_eos,
                                    **{k: [v[i] for i in active] for k, v in per_prompt.items()})
        still = []
        for i, stream in zip(active, streams):
            tokens[i] += stream
            text = decode(tokens[i])
            cut = cut_at_stops(text, stops)
            ended = len(stream) < size or stream[-1] in eos  # EOS, possibly the chunk's last token
            if len(cut) < len(text) or ended or len(tokens[i]) >= max_new:
                texts[i] = cut
            else:
                still.append(i)
        active = still
    return list(zip(tokens, texts))
