"""Certificates: a generation certified here replays to MATCH, and any change to the model, the
prompt, a token or a step digest is caught at the step it affects; malformed files get clear errors."""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import synthetic
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup(di, tmp_path_factory):
    d = synthetic.write_checkpoint("qwen3", str(tmp_path_factory.mktemp("c") / "qwen3"))
    mm = di.MegaModel.from_pretrained(d, max_context=256)
    prompt = synthetic.token_sequence(30, 1000, 4)
    return d, mm, prompt, di.certificate.make(mm, prompt, 24)


def test_certificate_replays_to_match(di, setup):
    d, mm, prompt, cert = setup
    assert len(cert["chain"]) == len(cert["tokens"]) == 24
    assert cert["model"]["format"] == "safetensors" and set(cert["model"]["files"]) == {"config.json",
                                                                                         "model.safetensors"}
    fresh = di.MegaModel.from_pretrained(d)  # another instance, another state
    assert di.certificate.verify(fresh, json.loads(json.dumps(cert)))["match"]


def test_tampered_certificates_are_caught_at_the_right_step(di, setup):
    _, mm, prompt, cert = setup
    bad = copy.deepcopy(cert)
    bad["chain"][9] = "0" * 64
    r = di.certificate.verify(mm, bad)
    assert not r["match"] and r["first_divergence"] == 9 and "logits differ" in r["detail"]
    bad = copy.deepcopy(cert)
    bad["tokens"][5] = (bad["tokens"][5] + 1) % 1000
    bad["chain"][5] = "1" * 64
    r = di.certificate.verify(mm, bad)
    assert r["first_divergence"] == 5 and "token differ" in r["detail"]
    bad = copy.deepcopy(cert)
    bad["prompt_ids"][-1] = (bad["prompt_ids"][-1] + 1) % 1000
    assert di.certificate.verify(mm, bad)["first_divergence"] == 0
    bad = copy.deepcopy(cert)
    bad["contract_version"] = 999
    assert "contract version" in di.certificate.verify(mm, bad)["detail"]


def test_a_different_model_is_refused(di, setup, tmp_path):
    _, _, prompt, cert = setup
    other = di.MegaModel.from_pretrained(synthetic.write_checkpoint("qwen3", str(tmp_path / "q"), seed=1))
    r = di.certificate.verify(other, cert)
    assert not r["match"] and "not the certified one" in r["detail"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("not json", "not valid JSON"),
        ('{"format": "something-else"}', "not a det-infer-certificate"),
        ('{"format": "det-infer-certificate", "format_version": 7}', "format_version 7"),
        ('{"format": "det-infer-certificate", "format_version": 1}', "lacks 'prompt_ids'"),
    ],
)
def test_malformed_certificates(di, text, message):
    with pytest.raises(ValueError, match=message):
        di.certificate.load(text)


def test_verify_command(setup, tmp_path):
    d, _, _, cert = setup
    good = tmp_path / "good.json"
    good.write_text(json.dumps(cert))
    bad = copy.deepcopy(cert)
    bad["chain"][3] = "f" * 64
    badf = tmp_path / "bad.json"
    badf.write_text(json.dumps(bad))
    env = dict(os.environ, LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "scripts" / "verify.py"), *a], env=env,
                                    capture_output=True, text=True)
    r = run(str(good), "--model", str(d))
    assert r.returncode == 0 and r.stdout.startswith("MATCH"), r.stdout + r.stderr
    r = run(str(good), "--model", str(d), "--executor", "emulated")  # the megakernel's code replays it too
    assert r.returncode == 0 and r.stdout.startswith("MATCH"), r.stdout + r.stderr
    r = run(str(badf), "--model", str(d))
    assert r.returncode == 1 and "MISMATCH: step 3" in r.stdout
    (tmp_path / "junk.json").write_text("{")
    r = run(str(tmp_path / "junk.json"), "--model", str(d))
    assert r.returncode == 2 and "ERROR" in r.stdout


def test_sampled_certificate_replays_and_a_changed_seed_is_caught(di, setup):
    d, mm, prompt, _ = setup
    cert = di.certificate.make(mm, prompt, 24, temperature=0.9, top_k=40, seed=123)
    assert cert["generation"]["mode"] == "sampled" and cert["generation"]["seed"] == 123
    emulated = di.MegaModel.from_pretrained(d, max_context=256, executor="emulated")
    assert di.certificate.verify(emulated, json.loads(json.dumps(cert)))["match"]  # another executor replays it
    bad = copy.deepcopy(cert)
    bad["generation"]["seed"] = 124
    r = di.certificate.verify(mm, bad)
    assert not r["match"] and "token" in r["detail"]
    bad["generation"].pop("seed")
    with pytest.raises(ValueError, match="sampled certificate needs"):
        di.certificate.verify(mm, bad)
