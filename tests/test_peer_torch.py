"""benchmarks/peer_torch.py, the naive PyTorch peer of bench_gpu.py: its CPU dry run prints the table and writes
the JSON, and its static-cache decode agrees with a full causal forward (cache, mask and rope plumbing)."""
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "peer_torch.py"


def _module():
    spec = importlib.util.spec_from_file_location("peer_torch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_table_and_json(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny", "--steps", "4", "--reps", "1",
                           "--long-prompt", "40", "--device", "cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("CPU (dry run), torch ")
    assert lines[1] == ("| model | batch | graph ms/step | graph tok/s | eager ms/step | prefill 16 tok/s | "
                        "prefill 40 tok/s |")
    rows = json.loads(out.read_text())
    assert [(r["model"], r["batch"]) for r in rows] == [("tiny", 1), ("tiny", 16)]
    assert len([ln for ln in lines if ln.startswith("| tiny |")]) == 2
    for r in rows:
        assert r["graph_ms_step"] is None and r["graph_tok_s"] is None  # no CUDA graph on the CPU
        for key in ("eager_ms_step", "prefill_16_tok_s", "prefill_40_tok_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r[key])


def test_incremental_decode_matches_full_forward():
    pt = _module()
    n, batch = 12, 2
    m = pt.PeerLlama(pt.shape("tiny"), "cpu", max_len=64)
    # Sharpen attention (q and k x4): at scale 0.02 it is near uniform and a rope or mask slip would hide in it.
    for lw in m.layers:
        lw["q"], lw["k"] = lw["q"] * 4, lw["k"] * 4
    tokens = torch.randint(3, m.V, (batch, n), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = pt.prefill(m, m.new_cache(batch), tokens).float()
        cache = m.new_cache(batch)
        for k, v in cache:  # stale values from an earlier, longer prompt: the mask must hide slots > position
            k.normal_(generator=torch.Generator().manual_seed(2))
            v.normal_(generator=torch.Generator().manual_seed(3))
        pt.prefill(m, cache, tokens[:, :-1])
        step = pt.decode_step(m, cache, tokens[:, -1:], torch.tensor([n - 1])).float()
    assert full.shape == step.shape == (batch, m.V)
    assert torch.equal(full.argmax(-1), step.argmax(-1))
    torch.testing.assert_close(step, full, atol=1e-2, rtol=0)
