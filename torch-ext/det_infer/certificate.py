"""Certificates: everything needed to replay a greedy generation exactly, and its verification.

A certificate is a JSON object (format "det-infer-certificate", format_version 1):
  model        sha256 of the weight files and of config.json (or of the GGUF), and the format
  prompt_ids   the prompt, as token ids
  generation   {"mode": "greedy", "max_new": N, "stop_ids": [...]}, or mode "sampled" with
               temperature, top_k, top_p, min_p and seed (docs/SPEC.md §15)
  tokens       the generated ids
  chain        one hex digest per step: chain[i] = sha256(chain[i-1] || int32 token_i ||
               fp32 logits_i), starting from empty bytes (NaNs hashed as 0x7fc00000), so a
               mismatch names the first step whose logits or token differ
  contract_version, package, environment (informational)
verify() replays the generation with the model the caller loaded and compares step by step.
"""
import hashlib
import json
import os
import platform

import torch

FORMAT = "det-infer-certificate"
FORMAT_VERSION = 1


class CertificateError(ValueError):
    pass


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_identity(mm):
    """{"format", "files": {name: sha256}} of the files a MegaModel was loaded from."""
    source = getattr(mm, "source", None)
    if not source:
        raise CertificateError("det-infer: this model was not loaded from files (from_pretrained or from_gguf), "
                               "so it has no identity to certify")
    return {"format": source["format"],
            "files": {os.path.basename(p): _sha256_file(p) for p in sorted(source["files"])}}


def f32_bytes(logits):
    """fp32 little-endian bytes of a tensor with every NaN as 0x7fc00000 (docs/SPEC.md §2.4)."""
    t = logits.detach().to(torch.float32).cpu().contiguous()
    bits = t.view(torch.int32).clone()
    bits[torch.isnan(t)] = 0x7FC00000
    return bits.numpy().tobytes()


def step_chain(tokens, step_logits):
    """The per-step digest chain of a generation."""
    chain, prev = [], b""
    for tok, row in zip(tokens, step_logits):
        h = hashlib.sha256(prev)
        h.update(int(tok).to_bytes(4, "little", signed=True))
        h.update(f32_bytes(row))
        prev = h.digest()
        chain.append(prev.hex())
    return chain


SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed")


def _sampling(gen):
    return {k: gen[k] for k in SAMPLING_FIELDS} if gen.get("mode") == "sampled" else {}


def make(mm, prompt_ids, max_new, stop_ids=None, **sampling):
    """Generate with mm (greedily, or with the sampling keywords of MegaModel.generate:
    temperature, top_k, top_p, min_p, seed) and return the certificate (a dict; json.dump it)."""
    from . import CONTRACT_VERSION

    unknown = set(sampling) - set(SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"det-infer: unknown sampling keyword(s) {sorted(unknown)}; known: {SAMPLING_FIELDS}")
    tokens, logits = mm.generate(prompt_ids, max_new=max_new, stop_ids=stop_ids, return_logits=True, **sampling)
    generation = {"mode": "greedy", "max_new": int(max_new), "stop_ids": [int(s) for s in (stop_ids or [])]}
    if sampling.get("temperature", 0.0) > 0:
        defaults = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}
        generation.update(mode="sampled", **{k: sampling.get(k, defaults[k]) for k in SAMPLING_FIELDS})
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "contract_version": CONTRACT_VERSION,
        "package": "det-infer 1",
        "model": model_identity(mm),
        "prompt_ids": [int(t) for t in prompt_ids],
        "generation": generation,
        "tokens": tokens,
        "chain": step_chain(tokens, logits),
        "environment": {"machine": platform.machine(), "python": platform.python_version(),
                        "torch": torch.__version__, "device": mm.device,
                        "executor": mm.executor},
    }


def _require(cert, key, kind):
    if key not in cert:
        raise CertificateError(f"det-infer: certificate lacks {key!r}")
    if not isinstance(cert[key], kind):
        raise CertificateError(f"det-infer: certificate field {key!r} has the wrong type")
    return cert[key]


def load(path_or_text):
    """Parse and check a certificate's structure (file path, JSON text or dict)."""
    if isinstance(path_or_text, dict):
        cert = path_or_text
    else:
        text = str(path_or_text)
        if os.path.isfile(text):
            with open(text) as f:
                text = f.read()
        try:
            cert = json.loads(text)
        except json.JSONDecodeError as e:
            raise CertificateError(f"det-infer: certificate is not valid JSON, nor a file holding it ({e})") from None
    if not isinstance(cert, dict) or cert.get("format") != FORMAT:
        raise CertificateError(f"det-infer: not a {FORMAT} (format field missing or different)")
    if cert.get("format_version") != FORMAT_VERSION:
        raise CertificateError(f"det-infer: certificate format_version {cert.get('format_version')!r} is not "
                               f"supported (this package reads {FORMAT_VERSION})")
    prompt = _require(cert, "prompt_ids", list)
    gen = _require(cert, "generation", dict)
    tokens = _require(cert, "tokens", list)
    chain = _require(cert, "chain", list)
    _require(cert, "model", dict)
    if gen.get("mode") not in ("greedy", "sampled") or not isinstance(gen.get("max_new"), int) or gen["max_new"] < 1:
        raise CertificateError("det-infer: certificate generation must be greedy or sampled with a positive max_new")
    if gen["mode"] == "sampled":
        if any(k not in gen for k in SAMPLING_FIELDS):
            raise CertificateError(f"det-infer: a sampled certificate needs {', '.join(SAMPLING_FIELDS)}")
        if not all(isinstance(gen[k], int) and not isinstance(gen[k], bool) for k in ("top_k", "seed")) or \
                not all(isinstance(gen[k], (int, float)) and not isinstance(gen[k], bool)
                        for k in ("temperature", "top_p", "min_p")):
            raise CertificateError("det-infer: certificate sampling fields have the wrong types")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt + tokens) or not prompt:
        raise CertificateError("det-infer: certificate prompt_ids and tokens must be non-empty lists of ints")
    if len(chain) != len(tokens) or not all(isinstance(c, str) and len(c) == 64 for c in chain):
        raise CertificateError("det-infer: certificate chain must hold one 64-hex-digit digest per token")
    return cert


def verify(mm, cert, check_model=True):
    """Replay a certificate with mm. Returns {"match": bool, "steps": n, "first_divergence": step or None,
    "detail": text}. The model's files must be the certified ones unless check_model=False."""
    cert = load(cert)
    from . import CONTRACT_VERSION

    if cert.get("contract_version") != CONTRACT_VERSION:
        return {"match": False, "steps": 0, "first_divergence": None,
                "detail": f"contract version {cert.get('contract_version')} differs from this package's "
                          f"{CONTRACT_VERSION}: the bits are not comparable"}
    if check_model:
        have = model_identity(mm)
        if have != cert["model"]:
            return {"match": False, "steps": 0, "first_divergence": None,
                    "detail": f"the loaded model is not the certified one: {have} != {cert['model']}"}
    gen = cert["generation"]
    try:
        tokens, logits = mm.generate(cert["prompt_ids"], max_new=gen["max_new"], stop_ids=gen.get("stop_ids") or None,
                                     return_logits=True, **_sampling(gen))
    except ValueError as e:
        return {"match": False, "steps": 0, "first_divergence": None, "detail": f"cannot replay: {e}"}
    chain = step_chain(tokens, logits)
    n = max(len(chain), len(cert["chain"]))
    for i in range(n):
        mine = chain[i] if i < len(chain) else None
        theirs = cert["chain"][i] if i < len(cert["chain"]) else None
        if mine != theirs:
            tok_mine = tokens[i] if i < len(tokens) else None
            tok_theirs = cert["tokens"][i] if i < len(cert["tokens"]) else None
            what = "token" if tok_mine != tok_theirs else "logits"
            return {"match": False, "steps": n, "first_divergence": i,
                    "detail": f"step {i} (position {len(cert['prompt_ids']) + i}): {what} differ "
                              f"(certified token {tok_theirs}, replayed {tok_mine})"}
    return {"match": True, "steps": n, "first_divergence": None, "detail": f"all {n} steps equal"}
