"""Certificates: a greedy or sampled generation certified here replays to MATCH; a change to any
bound field (tokens, prompt, generation parameters, stop ids, model, contract version, chain, Merkle
root) is a MISMATCH naming that field, also when the digests are forged to agree; bare transcripts
are checked the same way; the one-pass replay agrees with generate; a Merkle proof checks one step
alone; malformed and format-1 files get clear errors."""
import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from det_fixtures import synthetic
import torch

ROOT = Path(__file__).resolve().parent.parent
N = 24
SAMPLED = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.02, "seed": 123}


@pytest.fixture(scope="module")
def setup(di, tmp_path_factory):
    d = synthetic.write_checkpoint("qwen3", str(tmp_path_factory.mktemp("c") / "qwen3"))
    mm = di.MegaModel.from_pretrained(d, max_context=256)
    prompt = synthetic.token_sequence(30, 1000, 4)
    certs = {"greedy": di.certificate.make(mm, prompt, N), "sampled": di.certificate.make(mm, prompt, N, **SAMPLED)}
    assert certs["greedy"]["tokens"] != certs["sampled"]["tokens"]  # the sampled case is not greedy in disguise
    return d, mm, prompt, certs


def reforge(di, mm, cert):
    """What a forger holding the model can do: recompute binding, chain and Merkle root so that the
    digests agree with the (edited) fields. Only the replay's derived tokens can catch it."""
    c = di.certificate
    cert["binding"] = c.binding(cert)
    p, t = cert["prompt_ids"], cert["tokens"]
    logits = mm.teacher_forced_logits(p + t[:-1])[len(p) - 1:]
    cert["chain"] = c.step_chain(c.header_digest(cert["binding"]), t, logits)
    cert["merkle_root"] = c.merkle_root(cert["chain"])
    return cert


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_certificate_replays_to_match(di, setup, mode):
    d, mm, prompt, certs = setup
    cert = json.loads(json.dumps(certs[mode]))
    assert cert["format_version"] == 2 and len(cert["chain"]) == len(cert["tokens"]) == N
    assert cert["model"]["format"] == "safetensors" and set(cert["model"]["files"]) == {"config.json",
                                                                                         "model.safetensors"}
    assert set(cert["binding"]) == {"contract_version", "model", "prompt_ids", "generation.mode",
                                    "generation.max_new", "generation.stop_ids"} | (
        {f"generation.{k}" for k in SAMPLED} if mode == "sampled" else set())
    fresh = di.MegaModel.from_pretrained(d)  # another instance, another state
    r = di.certificate.verify(fresh, cert)
    assert r == {"match": True, "steps": N, "first_divergence": None, "field": None, "detail": f"all {N} steps equal"}
    cert["environment"]["machine"] = "elsewhere"  # informational: not bound
    cert["package"] = "det-infer 999"
    assert di.certificate.verify(mm, cert)["match"]
    del cert["environment"], cert["package"]
    assert di.certificate.verify(mm, cert)["match"]


def _set(path, value):
    def edit(cert):
        *parents, last = path.split(".")
        obj = cert
        for p in parents:
            obj = obj[p]
        obj[last] = value(obj[last]) if callable(value) else value
    return edit


def _to_sampled(cert):
    cert["generation"].update(mode="sampled", **SAMPLED)


def _to_greedy(cert):
    for k in SAMPLED:
        del cert["generation"][k]
    cert["generation"]["mode"] = "greedy"


# (edit, field named, first divergence); one table for both modes, sampling fields for sampled only
TAMPERS = {
    "token": (_set("tokens", lambda t: t[:5] + [(t[5] + 1) % 1000] + t[6:]), "tokens", 5),
    "extra token": (lambda c: c.update(tokens=c["tokens"] + [7], chain=c["chain"] + ["0" * 64]), "tokens", N),
    "missing token": (lambda c: c.update(tokens=c["tokens"][:-1], chain=c["chain"][:-1]), "tokens", N - 1),
    "chain": (_set("chain", lambda c: c[:9] + ["0" * 64] + c[10:]), "chain", 9),
    "merkle_root": (_set("merkle_root", "ab" * 32), "merkle_root", None),
    "prompt": (_set("prompt_ids", lambda p: p[:-1] + [(p[-1] + 1) % 1000]), "prompt_ids", None),
    "max_new": (_set("generation.max_new", N + 1), "generation.max_new", None),
    "stop_ids": (_set("generation.stop_ids", [5]), "generation.stop_ids", None),
    "model": (_set("model.files", lambda f: {**f, "model.safetensors": "0" * 64}), "model", None),
    "contract_version": (_set("contract_version", 999), "contract_version", None),
    "binding": (_set("binding.prompt_ids", "1" * 64), "prompt_ids", None),
    "binding entry": (_set("binding.extra", "1" * 64), "binding", None),
    "temperature": (_set("generation.temperature", 0.8), "generation.temperature", None),
    "top_k": (_set("generation.top_k", 41), "generation.top_k", None),
    "top_p": (_set("generation.top_p", 0.9), "generation.top_p", None),
    "min_p": (_set("generation.min_p", 0.0), "generation.min_p", None),
    "seed": (_set("generation.seed", 124), "generation.seed", None),
}
CASES = [(mode, name) for mode in ("greedy", "sampled") for name in list(TAMPERS) + ["mode"]
         if mode == "sampled" or name not in SAMPLED]


@pytest.mark.parametrize("mode,tamper", CASES)
def test_every_bound_field_is_checked_and_named(di, setup, mode, tamper):
    _, mm, _, certs = setup
    bad = copy.deepcopy(certs[mode])
    if tamper == "mode":
        (_to_sampled if mode == "greedy" else _to_greedy)(bad)
        edit, field, step = None, "generation.mode", None
    else:
        edit, field, step = TAMPERS[tamper]
        edit(bad)
    r = di.certificate.verify(mm, bad)
    assert not r["match"] and r["field"] == field and r["first_divergence"] == step, r
    assert r["detail"].startswith(field + ":")
    if field == "model":  # without the file check the binding still covers the field
        r = di.certificate.verify(mm, bad, check_model=False)
        assert not r["match"] and r["field"] == "model"


def test_a_contract_1_certificate_is_refused_naming_both_versions(di, setup):
    """Contract 1's bits are not contract 2's: its certificate is a mismatch of contract_version that
    names both versions, even with every digest recomputed to match."""
    _, mm, _, certs = setup
    old = copy.deepcopy(certs["greedy"])
    old["contract_version"] = 1
    r = di.certificate.verify(mm, old)
    assert di.CONTRACT_VERSION == 2 and not r["match"] and r["field"] == "contract_version"
    assert "contract 1" in r["detail"] and "contract 2" in r["detail"], r["detail"]


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_forged_digests_do_not_hide_an_edit(di, setup, mode):
    _, mm, _, certs = setup
    bad = copy.deepcopy(certs[mode])
    bad["tokens"][5] = (bad["tokens"][5] + 1) % 1000
    r = di.certificate.verify(mm, reforge(di, mm, bad))
    assert not r["match"] and r["field"] == "tokens" and r["first_divergence"] == 5 and "step 5" in r["detail"]
    bad = copy.deepcopy(certs[mode])
    bad["prompt_ids"][-1] = (bad["prompt_ids"][-1] + 1) % 1000
    r = di.certificate.verify(mm, reforge(di, mm, bad))
    assert not r["match"] and r["field"] == "tokens" and r["first_divergence"] is not None
    bad = copy.deepcopy(certs[mode])  # a stop id the stream hits: generation would end there
    stop = next(t for i, t in enumerate(bad["tokens"]) if i >= 3 and t not in bad["tokens"][:i])
    first = bad["tokens"].index(stop)
    bad["generation"]["stop_ids"] = [stop]
    r = di.certificate.verify(mm, reforge(di, mm, bad))
    assert r["field"] == "tokens" and r["first_divergence"] == first + 1 and f"stop id {stop}" in r["detail"]
    reforged = reforge(di, mm, copy.deepcopy(certs[mode]))  # the control: reforging an unedited one changes nothing
    assert reforged == certs[mode] and di.certificate.verify(mm, reforged)["match"]


def test_stop_ids_end_the_certified_stream(di, setup):
    _, mm, prompt, certs = setup
    stream = certs["greedy"]["tokens"]
    stop = next(t for i, t in enumerate(stream) if i >= 3 and t not in stream[:i])
    cert = di.certificate.make(mm, prompt, N, stop_ids=[stop])
    assert cert["tokens"] == stream[: stream.index(stop) + 1]
    assert di.certificate.verify(mm, cert)["match"]
    cert["tokens"] = cert["tokens"][:-1]  # ends before the stop id
    r = di.certificate.verify(mm, reforge(di, mm, cert))
    assert r["field"] == "tokens" and "continues" in r["detail"]


def test_a_different_model_is_refused(di, setup, tmp_path):
    _, _, _, certs = setup
    other = di.MegaModel.from_pretrained(synthetic.write_checkpoint("qwen3", str(tmp_path / "q"), seed=1))
    r = di.certificate.verify(other, certs["greedy"])
    assert not r["match"] and r["field"] == "model" and "not the certified one" in r["detail"]
    r = di.certificate.verify(other, certs["greedy"], check_model=False)  # its logits differ from the first step
    assert not r["match"] and r["first_divergence"] == 0


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_verify_transcript(di, setup, mode):
    _, mm, prompt, certs = setup
    params = SAMPLED if mode == "sampled" else {}
    tokens = certs[mode]["tokens"]
    check = lambda toks, **kw: di.certificate.verify_transcript(mm, prompt, toks, **{**params, **kw})
    assert check(tokens) == {"match": True, "steps": N, "first_divergence": None, "field": None,
                             "detail": f"all {N} steps equal"}
    assert check(torch.tensor(tokens))["match"] and check(tokens, max_new=N)["match"]
    encoded = {"input_ids": prompt, "attention_mask": [1] * len(prompt)}  # a tokenizer's output
    assert di.certificate.verify_transcript(mm, encoded, tokens, **params)["match"]
    assert di.certificate.make(mm, encoded, N, **params)["chain"] == certs[mode]["chain"]
    assert check(tokens[:10])["match"]  # without max_new, a prefix is what a smaller max_new gives
    r = check(tokens[:10], max_new=N)
    assert r["field"] == "tokens" and r["first_divergence"] == 10 and "continues" in r["detail"]
    r = check(tokens[:12] + [(tokens[12] + 1) % 1000] + tokens[13:])
    assert not r["match"] and r["first_divergence"] == 12 and r["detail"].startswith("tokens: step 12")
    r = check(tokens[:3] + [10**6])  # outside the vocabulary: no step can produce it
    assert r["first_divergence"] == 3 and "certified 1000000" in r["detail"]
    stop = next(t for i, t in enumerate(tokens) if i >= 3 and t not in tokens[:i])
    r = check(tokens, stop_ids=[stop])
    assert r["field"] == "tokens" and r["first_divergence"] == tokens.index(stop) + 1
    assert check(tokens[: tokens.index(stop) + 1], stop_ids=[stop], max_new=N)["match"]
    if mode == "sampled":
        for k, v in [("seed", 124), ("temperature", 0.0), ("top_k", 3)]:
            assert not check(tokens, **{k: v})["match"], k
    else:
        assert not check(tokens, temperature=1.0, seed=5)["match"]


@pytest.mark.parametrize("bad,message", [
    ({"prompt_ids": "hello"}, "prompt_ids must be a non-empty list of ints"),
    ({"tokens": []}, "tokens must be a non-empty list of ints"),
    ({"seed": 1.5}, "wrong types"),
    ({"seed": -1}, "seed must be an int in"),
    ({"top_p": 0.0}, "top_p must be in"),
    ({"max_new": 0}, "max_new must be a positive int"),
    ({"prompt_ids": [1, 2, 5000]}, "outside the vocabulary"),
])
def test_verify_transcript_refuses_bad_input(di, setup, bad, message):
    _, mm, prompt, certs = setup
    args = {"prompt_ids": prompt, "tokens": certs["greedy"]["tokens"], **bad}
    with pytest.raises(di.certificate.CertificateError, match=message):
        di.certificate.verify_transcript(mm, **args)


def test_one_pass_replay_agrees_with_generate_for_sampled_streams(di, setup):
    """The replay samples each step from teacher-forced logits at the position the token occupies;
    it must give generate's stream, single launch and per step, for every parameter mix."""
    _, mm, prompt, _ = setup
    from importlib import import_module

    ops = import_module(di.__name__ + "._ops").ops
    mixes = [dict(temperature=0.7, seed=1), dict(temperature=1.5, top_k=5, seed=2**64 - 1),
             dict(temperature=1.0, top_p=0.8, min_p=0.05, seed=99), dict(temperature=2.0, seed=7)]
    for kw in mixes:
        stream = mm.generate(prompt, max_new=16, **kw)
        assert mm.generate(prompt, max_new=16, single_launch=False, **kw) == stream
        assert di.certificate.verify_transcript(mm, prompt, stream, **kw)["match"], kw
    # The position is not a free choice: one position later samples another stream.
    kw = mixes[3]
    stream = mm.generate(prompt, max_new=16, **kw)
    logits = mm.teacher_forced_logits(prompt + stream[:-1])[len(prompt) - 1:]
    shifted = [int(ops.sample_token(logits[i].contiguous(), 2.0, 0, 1.0, 0.0, 7, len(prompt) + i + 1))
               for i in range(16)]
    assert shifted != stream


def _leaf(i, c):
    return hashlib.sha256(b"\x00" + i.to_bytes(8, "little") + bytes.fromhex(c)).digest()


def _node(a, b):
    return hashlib.sha256(b"\x01" + a + b).digest()


def test_merkle_root_and_proofs(di, setup):
    c = di.certificate
    chain = [hashlib.sha256(bytes([i])).hexdigest() for i in range(9)]
    # The definition, written out for 3 and 5 leaves: odd nodes are carried up, not doubled.
    L = [_leaf(i, d) for i, d in enumerate(chain)]
    assert c.merkle_root(chain[:1]) == L[0].hex()
    assert c.merkle_root(chain[:3]) == _node(_node(L[0], L[1]), L[2]).hex()
    assert c.merkle_root(chain[:5]) == _node(_node(_node(L[0], L[1]), _node(L[2], L[3])), L[4]).hex()
    for n in range(1, 10):
        cert = {"chain": chain[:n]}
        root = c.merkle_root(cert["chain"])
        for step in range(n):
            proof = c.merkle_proof(cert, step)
            assert c.verify_step(root, step, chain[step], proof)
            assert not c.verify_step(root, step, chain[(step + 1) % 9], proof)  # another digest
            if n > 1:
                assert not c.verify_step(root, (step + 1) % n, chain[step], proof)  # another step
                bad = copy.deepcopy(proof)
                bad["siblings"][0] = ("0" if bad["siblings"][0][0] != "0" else "1") + bad["siblings"][0][1:]
                assert not c.verify_step(root, step, chain[step], bad)  # a tampered proof
                assert not c.verify_step(root, step, chain[step], {**proof, "siblings": proof["siblings"][:-1]})
            assert not c.verify_step(root, step, chain[step], {**proof, "siblings": proof["siblings"] + ["0" * 64]})
    _, _, _, certs = setup
    cert = certs["sampled"]  # a real certificate: a step proven against its root without the others
    proof = c.merkle_proof(json.loads(json.dumps(cert)), 17)  # levels of 24, 12, 6, 3, 2, 1: carried up at 3
    assert len(proof["siblings"]) == 4 and c.verify_step(cert["merkle_root"], 17, cert["chain"][17], proof)
    with pytest.raises(c.CertificateError, match="not in"):
        c.merkle_proof(cert, N)
    with pytest.raises(c.CertificateError, match="64 lowercase hex"):
        c.verify_step("xyz", 0, cert["chain"][0], proof)
    with pytest.raises(c.CertificateError, match="a Merkle proof is"):
        c.verify_step(cert["merkle_root"], 0, cert["chain"][0], proof["siblings"])


def test_format_1_is_refused(di, setup):
    v1 = {k: v for k, v in setup[3]["greedy"].items() if k not in ("binding", "merkle_root")}
    v1["format_version"] = 1
    with pytest.raises(di.certificate.CertificateError, match="format_version 1 .*format_version 2"):
        di.certificate.load(json.dumps(v1))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: "not json", "not valid JSON"),
        (lambda c: {"format": "something-else"}, "not a det-infer-certificate"),
        (lambda c: {**c, "format_version": 7}, "format_version 7"),
        (lambda c: {k: v for k, v in c.items() if k != "prompt_ids"}, "lacks 'prompt_ids'"),
        (lambda c: {k: v for k, v in c.items() if k != "merkle_root"}, "lacks 'merkle_root'"),
        (lambda c: {**c, "note": "trust me"}, r"unknown field\(s\) \['note'\]"),
        (lambda c: {**c, "generation": {**c["generation"], "temperature": 0.5}}, "exactly the fields"),
        (lambda c: {**c, "generation": {**c["generation"], "mode": "sampled"}}, "exactly the fields"),
        (lambda c: {**c, "generation": {**c["generation"], "max_new": 0}}, "positive int"),
        (lambda c: {**c, "tokens": []}, "tokens must be a non-empty list"),
        (lambda c: {**c, "chain": c["chain"][:-1]}, "one 64-hex-digit digest per token"),
        (lambda c: {**c, "merkle_root": "xy"}, "merkle_root must be 64 hex"),
    ],
)
def test_malformed_certificates(di, setup, edit, message):
    cert = edit(copy.deepcopy(setup[3]["greedy"]))
    with pytest.raises(di.certificate.CertificateError, match=message):
        di.certificate.load(cert if isinstance(cert, str) else json.dumps(cert))


def test_verify_command(setup, tmp_path):
    d, _, prompt, certs = setup

    def write(name, obj):
        (tmp_path / name).write_text(json.dumps(obj))
        return str(tmp_path / name)

    bad = copy.deepcopy(certs["sampled"])
    bad["tokens"][3] = (bad["tokens"][3] + 1) % 1000  # the case: only a token edited
    transcript = {"prompt_ids": prompt, "tokens": certs["sampled"]["tokens"], **SAMPLED}
    env = dict(os.environ, LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "scripts" / "verify.py"), *a, "--model", str(d)],
                                    env=env, capture_output=True, text=True)
    r = run(write("good.json", certs["greedy"]), "--executor", "emulated")  # the megakernel's code replays it too
    assert r.returncode == 0 and r.stdout.startswith("MATCH"), r.stdout + r.stderr
    r = run(write("bad.json", bad))
    assert r.returncode == 1 and r.stdout.startswith("MISMATCH: tokens: step 3"), r.stdout + r.stderr
    r = run("--transcript", write("t.json", transcript))
    assert r.returncode == 0 and r.stdout.startswith("MATCH"), r.stdout + r.stderr
    r = run("--transcript", write("t2.json", {**transcript, "seed": 5}))
    assert r.returncode == 1 and r.stdout.startswith("MISMATCH: tokens: step"), r.stdout + r.stderr
    r = run("--transcript", write("t3.json", {**transcript, "temprature": 1.0}))
    assert r.returncode == 2 and "unknown field(s) ['temprature']" in r.stdout
    (tmp_path / "junk.json").write_text("{")
    r = run(str(tmp_path / "junk.json"))
    assert r.returncode == 2 and "ERROR" in r.stdout
