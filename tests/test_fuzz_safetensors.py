"""Hostile safetensors files: 1,000 seeded mutations of a real checkpoint's bytes (header length,
header JSON, offsets, truncation, appended junk). Every case must load or raise a ValueError /
FileNotFoundError naming the problem: never a crash, a hang or another exception type."""
import json
import random
import struct

import pytest
import synthetic

N_CASES = 1000


def _mutate(rng, blob):
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    kind = rng.randrange(8)
    if kind == 0:  # flip bytes anywhere in the header region
        b = bytearray(blob)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(0, 8 + n)
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 1:  # truncate
        return blob[: rng.randrange(0, len(blob))]
    if kind == 2:  # lie about the header length
        return struct.pack("<Q", rng.choice([0, 1, n - 1, n + 1, len(blob), 2**63, 2**40])) + blob[8:]
    name = rng.choice(sorted(header))
    entry = header[name]
    if kind == 3:  # bad offsets
        entry["data_offsets"] = rng.choice([[0, 2**40], [-1, 4], [8, 4], [0], "x", [len(data), len(data) + 2]])
    elif kind == 4:  # bad shape
        entry["shape"] = rng.choice([[-1], [2**31, 2**31], "big", [0], [3, 0.5], entry["shape"][::-1] + [1]])
    elif kind == 5:  # bad dtype
        entry["dtype"] = rng.choice(["Q4", "", 7, "BF16 ", "F8_E4M3"])
    elif kind == 6:  # not an object / missing fields
        header[name] = rng.choice([None, [], 1, {"dtype": "BF16"}])
    else:  # rename, so one tensor is missing and one unexpected
        header[name + ".renamed"] = header.pop(name)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


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
        (case / "model.safetensors").write_bytes(_mutate(rng, blob))
        try:
            mm = di.MegaModel.from_pretrained(str(case))
            mm.teacher_forced_logits([5, 6, 7])
            outcomes["loaded"] += 1
        except (ValueError, FileNotFoundError) as e:
            assert str(e).startswith("det-infer:"), repr(e)
            outcomes["refused"] += 1
    assert outcomes["refused"] > N_CASES // 2, outcomes
    print(outcomes)
