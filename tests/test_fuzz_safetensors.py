"""Hostile safetensors files: 1,000 seeded mutations of a real checkpoint's bytes (header length,
header JSON, offsets, truncation, appended junk). Every case must load or raise a ValueError /
FileNotFoundError naming the problem: never a crash, a hang or another exception type."""
import random

import pytest
from det_fixtures import synthetic
from det_fixtures.mutations import mutate_safetensors
N_CASES = 1000


def test_mutated_checkpoints_never_crash(di, tmp_path):
    d = synthetic.write_checkpoint("qwen3", str(tmp_path / "base"))
    blob = (tmp_path / "base" / "model.safetensors").read_bytes()
    config = (tmp_path / "base" / "config.json").read_text()
    rng = random.Random(1234)
    outcomes = {"loaded": 0, "refused": 0}
    case = tmp_path / "case"
    case.mkdir()
    (case / "config.json").write_text(config)
    for _ in range(N_CASES):
        (case / "model.safetensors").write_bytes(mutate_safetensors(rng, blob))
        try:
            mm = di.MegaModel.from_pretrained(str(case))
            mm.teacher_forced_logits([5, 6, 7])
            outcomes["loaded"] += 1
        except (ValueError, FileNotFoundError) as e:
            assert str(e).startswith("det-infer:"), repr(e)
            outcomes["refused"] += 1
    assert outcomes["refused"] > N_CASES // 2, outcomes
    print(outcomes)
