"""Certificates: a generation's claim with every field bound, verified by one teacher-forced replay.

A certificate is a JSON object, format "det-infer-certificate", format_version 2 (docs/SPEC.md §17).
Bound fields (verify() checks each one; any difference is a MISMATCH that names it):
  contract_version  the arithmetic contract the bits follow: must be this package's
  model             {"format", "files": {name: sha256}} of the weight files and config.json, or of the GGUF
  prompt_ids        the prompt, as token ids
  generation        {"mode": "greedy", "max_new": N, "stop_ids": [...]}, or mode "sampled" with also
                    temperature, top_k, top_p, min_p and seed (docs/SPEC.md §15)
  binding           one digest per field above (per key of generation), so that an edit is named
  tokens            the generated ids: each the token generation derives at its step, and as many as
                    generation produces (max_new, or up to and including the first stop id)
  chain             per-step digests c_i = sha256(c_{i-1} || int32 token_i || fp32 logits_i), where
                    c_{-1} is the header digest (of binding), so the chain commits to the header too
  merkle_root       a Merkle root over the chain: merkle_proof and verify_step check one step alone
Informational, never checked: package, environment.

verify() replays a certificate in one teacher-forced pass (the contract gives prefill and decode the
same bits), deriving each step's token from that step's logits. verify_transcript() checks a bare
transcript (prompt, tokens, sampling parameters: what an API returns) the same way.
"""
import hashlib
import json
import os
import platform
from concurrent.futures import ThreadPoolExecutor

import torch

FORMAT = "det-infer-certificate"
FORMAT_VERSION = 2
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed")
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}
_FLOAT_FIELDS = ("temperature", "top_p", "min_p")
_REQUIRED = ("format", "format_version", "contract_version", "model", "prompt_ids", "generation", "binding", "tokens",
             "chain", "merkle_root")
_INFORMATIONAL = ("package", "environment")
_DOMAIN = b"det-infer/certificate/2/"  # prefixes every digest of this format, so none is reused across formats
_HEX = set("0123456789abcdef")


class CertificateError(ValueError):
    pass


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_identity(mm):
    """{"format", "files": {name: sha256}} of the files a MegaModel was loaded from. The files are
    read whole once per model (the digests are kept on it; update_weights ends the identity)."""
    source = getattr(mm, "source", None)
    if getattr(mm, "weights_updated", False):
        raise CertificateError("det-infer: this model's weights were replaced by update_weights, so the files it "
                               "was loaded from no longer identify it; certify a model loaded from files")
    if not source:
        raise CertificateError("det-infer: this model was not loaded from files (from_pretrained or from_gguf), "
                               "so it has no identity to certify")
    cached = getattr(mm, "_identity", None)
    if cached is None or cached[0] is not source:
        files = {os.path.basename(p): _sha256_file(p) for p in sorted(source["files"])}
        cached = mm._identity = (source, {"format": source["format"], "files": files})
    return json.loads(json.dumps(cached[1]))  # a copy: a caller may edit what it gets


def model_sha256(mm):
    """The model's one-line identity: the sha256 (hex) of model_identity(mm) as canonical JSON, the
    same for every load of the same files (the server's fingerprint, a compressed blob's header and
    Ray rows carry it)."""
    return hashlib.sha256(_canonical(model_identity(mm))).hexdigest()


def f32_bytes(logits):
    """fp32 little-endian bytes of a tensor with every NaN as 0x7fc00000 (docs/SPEC.md §2.4)."""
    t = logits.detach().to(torch.float32).cpu().contiguous()
    nan = torch.isnan(t)
    bits = t.view(torch.int32)
    if nan.any():  # copy only when a NaN must be rewritten: logits are large
        bits = bits.clone()
        bits[nan] = 0x7FC00000
    return bits.numpy().tobytes()


# ---- digests --------------------------------------------------------------------------------------
def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def bound_fields(cert):
    """[(name, value)] of the header fields the binding covers, in the order verify checks them. The
    float parameters are bound as floats, so 1 and 1.0 (the same parameter) bind alike."""
    gen = cert["generation"]
    keys = ("mode", "max_new", "stop_ids") + (SAMPLING_FIELDS if gen["mode"] == "sampled" else ())
    fields = [("contract_version", cert["contract_version"]), ("model", cert["model"]),
              ("prompt_ids", cert["prompt_ids"])]
    return fields + [(f"generation.{k}", float(gen[k]) if k in _FLOAT_FIELDS else gen[k]) for k in keys]


def binding(cert):
    """{name: sha256(domain "field" 0 name 0 canonical JSON of the value)} over bound_fields(cert)."""
    return {name: hashlib.sha256(_DOMAIN + b"field\0" + name.encode() + b"\0" + _canonical(value)).hexdigest()
            for name, value in bound_fields(cert)}


def header_digest(bind):
    """The chain's seed: sha256(domain "header" 0 canonical JSON of the binding)."""
    return hashlib.sha256(_DOMAIN + b"header\0" + _canonical(bind)).digest()


def step_chain(seed, tokens, step_logits):
    """Hex digests c_i = sha256(c_{i-1} || int32le token_i || fp32le logits_i) with c_{-1} = seed."""
    data = memoryview(f32_bytes(step_logits))  # one conversion for all rows; row i is a fixed-size slice
    row = len(data) // max(len(tokens), 1)
    chain, prev = [], seed
    for i, tok in enumerate(tokens):
        prev = chain_next(prev, tok, data[i * row:(i + 1) * row])
        chain.append(prev.hex())
    return chain


def chain_next(prev, token, row_bytes):
    """c_i (raw bytes) from c_{i-1} (raw bytes), token_i and f32_bytes of logits_i."""
    h = hashlib.sha256(prev + int(token).to_bytes(4, "little", signed=True))
    h.update(row_bytes)
    return h.digest()


# Merkle tree over the chain (RFC 6962's domain separation; an odd node is carried up, never doubled).
def _leaf(step, digest_hex):
    return hashlib.sha256(b"\x00" + step.to_bytes(8, "little") + bytes.fromhex(digest_hex)).digest()


def _node(left, right):
    return hashlib.sha256(b"\x01" + left + right).digest()


def _levels(chain):
    level = [_leaf(i, c) for i, c in enumerate(chain)]
    levels = [level]
    while len(level) > 1:
        level = [_node(level[j], level[j + 1]) if j + 1 < len(level) else level[j] for j in range(0, len(level), 2)]
        levels.append(level)
    return levels


def merkle_root(chain):
    """Hex root of the Merkle tree whose leaves are sha256(0x00 || uint64le step || c_step)."""
    if not chain:
        raise CertificateError("det-infer: a Merkle root needs at least one step")
    return _levels(chain)[-1][0].hex()


def merkle_proof(cert, step):
    """The proof that chain[step] is leaf `step` of the certificate's merkle_root: {"steps": n,
    "siblings": [hex, ...]} bottom-up (a level where the node is carried up has no sibling)."""
    chain = cert["chain"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(chain):
        raise CertificateError(f"det-infer: step {step!r} is not in [0, {len(chain)})")
    siblings, i = [], step
    for level in _levels(chain)[:-1]:
        if i ^ 1 < len(level):
            siblings.append(level[i ^ 1].hex())
        i //= 2
    return {"steps": len(chain), "siblings": siblings}


def _is_hex64(s):
    return isinstance(s, str) and len(s) == 64 and set(s) <= _HEX


def verify_step(root, step, step_digest, proof):
    """True when step_digest (the chain entry c_step, hex) is leaf `step` under root, from the proof
    alone. A malformed argument raises CertificateError; a wrong digest or proof returns False."""
    if not isinstance(proof, dict) or set(proof) != {"steps", "siblings"} or not isinstance(proof["siblings"], list):
        raise CertificateError('det-infer: a Merkle proof is {"steps": n, "siblings": [hex, ...]}')
    n = proof["steps"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CertificateError(f"det-infer: proof steps must be a positive int, got {n!r}")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < n:
        raise CertificateError(f"det-infer: step {step!r} is not in [0, {n})")
    if not all(_is_hex64(s) for s in [root, step_digest] + proof["siblings"]):
        raise CertificateError("det-infer: root, step digest and siblings must be 64 lowercase hex digits")
    h, i, width, siblings = _leaf(step, step_digest), step, n, list(proof["siblings"])
    while width > 1:
        if i ^ 1 < width:  # the sides follow from the index: even on the left, odd on the right
            if not siblings:
                return False
            s = bytes.fromhex(siblings.pop(0))
            h = _node(h, s) if i % 2 == 0 else _node(s, h)
        i, width = i // 2, (width + 1) // 2
    return not siblings and h.hex() == root


# ---- making -------------------------------------------------------------------------------------
def make(mm, prompt_ids, max_new, stop_ids=None, **sampling):
    """Generate with mm (greedily, or with the sampling keywords of MegaModel.generate:
    temperature, top_k, top_p, min_p, seed) and return the certificate (a dict; json.dump it)."""
    unknown = set(sampling) - set(SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"det-infer: unknown sampling keyword(s) {sorted(unknown)}; known: {SAMPLING_FIELDS}")
    prompt_ids = mm._ids(prompt_ids)  # a list, tensor or tokenizer output, checked against the vocabulary
    tokens, logits = mm.generate(prompt_ids, max_new=max_new, stop_ids=stop_ids, return_logits=True, **sampling)
    cert = header(model_identity(mm), prompt_ids, max_new, stop_ids, sampling)
    return seal(cert, tokens, step_chain(header_digest(cert["binding"]), tokens, logits), mm)


def header(identity, prompt_ids, max_new, stop_ids, sampling):
    """A certificate's bound fields and their binding, before any token: model_identity(mm), the
    prompt, max_new, the stop ids and the sampling keywords (greedy at temperature 0). The chain's
    seed is header_digest(cert["binding"])."""
    from . import CONTRACT_VERSION

    generation = {"mode": "greedy", "max_new": int(max_new), "stop_ids": [int(s) for s in (stop_ids or [])]}
    if sampling.get("temperature", 0.0) > 0:
        params = {**SAMPLING_DEFAULTS, **sampling}
        generation.update(mode="sampled", **{k: float(v) if k in _FLOAT_FIELDS else int(v) for k, v in params.items()})
    cert = {"format": FORMAT, "format_version": FORMAT_VERSION, "contract_version": CONTRACT_VERSION,
            "model": identity, "prompt_ids": [int(t) for t in prompt_ids], "generation": generation}
    cert["binding"] = binding(cert)
    return cert


def seal(cert, tokens, chain, mm):
    """The certificate: header(...) with the generated tokens, their chain (hex digests), its
    Merkle root and the informational fields of the machine that ran mm."""
    cert["tokens"] = [int(t) for t in tokens]
    cert["chain"] = list(chain)
    cert["merkle_root"] = merkle_root(cert["chain"])
    cert["package"] = "det-infer 1"
    cert["environment"] = {"machine": platform.machine(), "python": platform.python_version(),
                           "torch": torch.__version__, "device": mm.device, "executor": mm.executor}
    return cert


# ---- loading --------------------------------------------------------------------------------------
def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _id_list(v, what, empty_ok=False):
    if not isinstance(v, list) or not all(_is_int(t) for t in v) or (not v and not empty_ok):
        raise CertificateError(f"det-infer: {what} must be a {'' if empty_ok else 'non-empty '}list of ints")
    return v


def _check_sampling(d, where):
    if not all(_is_int(d[k]) for k in ("top_k", "seed")) or not all(_is_number(d[k]) for k in _FLOAT_FIELDS):
        raise CertificateError(f"det-infer: {where} sampling fields have the wrong types (top_k and seed are ints, "
                               "temperature, top_p and min_p numbers)")


def _read_json(path_or_text, what):
    if isinstance(path_or_text, dict):
        return path_or_text
    text = str(path_or_text)
    if os.path.isfile(text):
        with open(text) as f:
            text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CertificateError(f"det-infer: {what} is not valid JSON, nor a file holding it ({e})") from None


def load(path_or_text):
    """Parse and check a certificate's structure (file path, JSON text or dict). Structure only:
    whether the fields agree with each other and with the model is verify's question."""
    cert = _read_json(path_or_text, "certificate")
    if not isinstance(cert, dict) or cert.get("format") != FORMAT:
        raise CertificateError(f"det-infer: not a {FORMAT} (format field missing or different)")
    if cert.get("format_version") != FORMAT_VERSION:
        raise CertificateError(f"det-infer: certificate format_version {cert.get('format_version')!r} is not "
                               f"supported: this package reads format_version {FORMAT_VERSION} only "
                               "(make the certificate again with this package)")
    for key in _REQUIRED:
        if key not in cert:
            raise CertificateError(f"det-infer: certificate lacks {key!r}")
    extra = sorted(set(cert) - set(_REQUIRED) - set(_INFORMATIONAL))
    if extra:  # an unbound field a reader might trust is refused, not ignored
        raise CertificateError(f"det-infer: certificate has unknown field(s) {extra}")
    if not _is_int(cert["contract_version"]):
        raise CertificateError("det-infer: certificate contract_version must be an int")
    model = cert["model"]
    if not isinstance(model, dict) or not isinstance(model.get("format"), str) or \
            not isinstance(model.get("files"), dict) or set(model) != {"format", "files"}:
        raise CertificateError('det-infer: certificate model must be {"format": str, "files": {name: sha256}}')
    _id_list(cert["prompt_ids"], "certificate prompt_ids")
    gen = cert["generation"]
    if not isinstance(gen, dict) or gen.get("mode") not in ("greedy", "sampled"):
        raise CertificateError('det-infer: certificate generation mode must be "greedy" or "sampled"')
    keys = {"mode", "max_new", "stop_ids"} | (set(SAMPLING_FIELDS) if gen["mode"] == "sampled" else set())
    if set(gen) != keys:
        raise CertificateError(f"det-infer: a {gen['mode']} certificate's generation has exactly the fields "
                               f"{sorted(keys)}; it has {sorted(gen)}")
    if not _is_int(gen["max_new"]) or gen["max_new"] < 1:
        raise CertificateError("det-infer: certificate generation max_new must be a positive int")
    _id_list(gen["stop_ids"], "certificate generation stop_ids", empty_ok=True)
    if gen["mode"] == "sampled":
        _check_sampling(gen, "certificate")
        if not gen["temperature"] > 0:
            raise CertificateError("det-infer: a sampled certificate needs temperature > 0")
    if not isinstance(cert["binding"], dict):
        raise CertificateError("det-infer: certificate binding must be an object of digests")
    tokens = _id_list(cert["tokens"], "certificate tokens")
    chain = cert["chain"]
    if not isinstance(chain, list) or len(chain) != len(tokens) or not all(_is_hex64(c) for c in chain):
        raise CertificateError("det-infer: certificate chain must hold one 64-hex-digit digest per token")
    if not _is_hex64(cert["merkle_root"]):
        raise CertificateError("det-infer: certificate merkle_root must be 64 hex digits")
    return cert


TRANSCRIPT_FIELDS = ("prompt_ids", "tokens", "max_new", "stop_ids") + SAMPLING_FIELDS


def load_transcript(path_or_text):
    """Parse a transcript (file path, JSON text or dict): {"prompt_ids": [...], "tokens": [...]} and
    optionally temperature, top_k, top_p, min_p, seed (as generate takes them; defaults greedy),
    stop_ids and max_new. Returns the keyword arguments of verify_transcript (less mm)."""
    t = _read_json(path_or_text, "transcript")
    if not isinstance(t, dict):
        raise CertificateError("det-infer: a transcript is a JSON object")
    extra = sorted(set(t) - set(TRANSCRIPT_FIELDS))
    if extra:
        raise CertificateError(f"det-infer: transcript has unknown field(s) {extra}; known: {list(TRANSCRIPT_FIELDS)}")
    for key in ("prompt_ids", "tokens"):
        if key not in t:
            raise CertificateError(f"det-infer: transcript lacks {key!r}")
    out = {**SAMPLING_DEFAULTS, "stop_ids": None, "max_new": None, **t}
    _id_list(out["prompt_ids"], "transcript prompt_ids")
    _id_list(out["tokens"], "transcript tokens")
    if out["stop_ids"] is not None:
        _id_list(out["stop_ids"], "transcript stop_ids", empty_ok=True)
    if out["max_new"] is not None and (not _is_int(out["max_new"]) or out["max_new"] < 1):
        raise CertificateError("det-infer: transcript max_new must be a positive int")
    _check_sampling(out, "transcript")
    return out


# ---- verifying ------------------------------------------------------------------------------------
def _result(match, steps, first, field, detail):
    return {"match": match, "steps": steps, "first_divergence": first, "field": field,
            "detail": detail if field is None else f"{field}: {detail}"}


def _replay(mm, prompt, tokens, sampling, stop_ids, max_new, seed=None, chain=None):
    """Check tokens (and, given seed, the chain) against generation from prompt; a result dict.

    Step i's logits depend only on prompt + tokens[:i], so while the tokens agree, the logits of one
    teacher-forced pass are generation's logits, bit for bit (the contract: prefill = decode)."""
    from ._ops import ops

    try:
        prompt = mm._ids(prompt, "prompt_ids")
        sample_f, sample_i = mm._sampling(1, *(sampling[k] for k in SAMPLING_FIELDS))
        stops = set(mm._stop_ids(False, stop_ids).tolist())
    except (TypeError, ValueError) as e:
        raise CertificateError(f"det-infer: cannot replay: {e}") from None
    n = len(tokens)
    # How many tokens generation yields, given these as its prefix: through the first stop id, at most max_new.
    ends = [e for e in (next((i + 1 for i, t in enumerate(tokens) if t in stops), None), max_new) if e is not None]
    expect = min(ends) if ends else n  # a transcript without max_new or a stop id may end anywhere
    k = min(n, expect)
    # Feed tokens[:k-1] after the prompt, cut at the first id outside the vocabulary (no step can
    # produce it, so the step it stands at mismatches below).
    bad = next((i for i, t in enumerate(tokens[:k]) if not 0 <= t < mm.config.vocab_size), k)
    k_logits = min(k, bad + 1)
    try:
        state = mm.new_state(len(prompt) + k_logits - 1)
        rows = [mm.prefill(prompt, state).reshape(1, -1)]
        if k_logits > 1:
            rows.append(mm.extend(tokens[:k_logits - 1], state, logits="all"))
    except ValueError as e:
        raise CertificateError(f"det-infer: cannot replay: {e}") from None
    logits = torch.cat(rows).cpu()
    mine = None if chain is None else step_chain(seed, tokens[:k_logits], logits)
    # The parameters as generate hands them to the sampler: fp32-rounded floats, the seed as int64.
    params = (sample_f[0].tolist(), sample_i[0].tolist()) if sample_f.numel() else None

    def derive(i):  # the position is the one the step's token occupies, as generate passes it
        if params is None:
            return int(ops.argmax_f32(logits[i]))
        (t, p, m), (tk, sd) = params
        return int(ops.sample_token(logits[i], t, tk, p, m, sd, len(prompt) + i))

    # Steps are independent given the logits, and the ops release the GIL: derive them in parallel.
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        derived = list(pool.map(derive, range(k_logits)))
    for i, tok in enumerate(derived):
        pos = len(prompt) + i
        if tok != tokens[i]:
            return _result(False, i + 1, i, "tokens", f"step {i} (position {pos}): certified {tokens[i]}, "
                                                      f"replayed {tok}")
        if mine is not None and mine[i] != chain[i]:
            return _result(False, i + 1, i, "chain", f"step {i} (position {pos}): the digest differs "
                                                     "(the certified logits are not these)")
    if n > expect:
        why = f"stop id {tokens[expect - 1]} at step {expect - 1}" if tokens[expect - 1] in stops else \
            f"max_new {max_new}"
        return _result(False, k, expect, "tokens", f"generation ends after {expect} steps ({why}), "
                                                   f"but there are {n} tokens")
    if n < expect:
        return _result(False, k, n, "tokens", f"generation continues after these {n} tokens (no stop id, "
                                              f"max_new {max_new})")
    return _result(True, n, None, None, f"all {n} steps equal")


def verify(mm, cert, check_model=True):
    """Replay a certificate with mm. Returns {"match": bool, "steps": steps replayed, "first_divergence":
    step or None, "field": the first field that differs or None, "detail": text}. The model's files
    must be the certified ones unless check_model=False (the binding still covers the model field)."""
    cert = load(cert)
    from . import CONTRACT_VERSION

    if cert["contract_version"] != CONTRACT_VERSION:
        return _result(False, 0, None, "contract_version", f"the certificate was made under contract "
                       f"{cert['contract_version']}, this package implements contract {CONTRACT_VERSION}: "
                       "the bits are not comparable; verify it with a release of that contract")
    if check_model:
        have = model_identity(mm)
        if have != cert["model"]:
            return _result(False, 0, None, "model", f"the loaded model is not the certified one: {have} != "
                                                    f"{cert['model']}")
    want, have = binding(cert), cert["binding"]
    for name, digest in want.items():
        if have.get(name) != digest:
            return _result(False, 0, None, name, "the value does not match its binding digest" if name in have
                           else "the binding has no digest for it")
    if set(have) - set(want):
        return _result(False, 0, None, "binding", f"unexpected entries {sorted(set(have) - set(want))}")
    gen = cert["generation"]
    sampling = {**SAMPLING_DEFAULTS, **{k: gen[k] for k in SAMPLING_FIELDS if k in gen}}
    result = _replay(mm, cert["prompt_ids"], cert["tokens"], sampling, gen["stop_ids"], gen["max_new"],
                     seed=header_digest(want), chain=cert["chain"])
    if result["match"] and merkle_root(cert["chain"]) != cert["merkle_root"]:
        return _result(False, result["steps"], None, "merkle_root", "it is not the root of the chain")
    return result


def verify_transcript(mm, prompt_ids, tokens, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0,
                      stop_ids=None, max_new=None):
    """Check that tokens are what mm generates from prompt_ids with these parameters (greedy at
    temperature 0): each token the one its step derives, none after the first stop id, and, given
    max_new, exactly as many as generation yields (without it, any length that ends at a stop id or
    before one). Returns verify's result dict; field is "tokens" on a mismatch."""
    ids = lambda v: v.tolist() if isinstance(v, torch.Tensor) else list(v) if isinstance(v, tuple) else v
    from .model import unwrap_encoding

    args = load_transcript({"prompt_ids": ids(unwrap_encoding(prompt_ids)), "tokens": ids(tokens), "stop_ids": ids(stop_ids),
                            "max_new": max_new, "temperature": temperature, "top_k": top_k, "top_p": top_p,
                            "min_p": min_p, "seed": seed})
    sampling = {k: args[k] for k in SAMPLING_FIELDS}
    return _replay(mm, args["prompt_ids"], args["tokens"], sampling, args["stop_ids"], args["max_new"])
