"""Portability rows: the torch-free engine core (det_infer_cpu/), built on its own by several
compilers and for aarch64 (run under qemu-user), reproduces the pinned certificate digests of the
synthetic models (tests/native/engine_digest.cpp reads the model from a binary dump)."""
import os
import platform
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from det_fixtures.certification import N_GEN, SYNTHETIC, ROOT, generation_digest, inputs_for, logits_digest, model_dir
from native_sources import ENGINE, X86
from det_fixtures.pins import MODEL_DIGESTS

IN_CI = os.environ.get("CI") == "true"
BASE = ["-std=c++17", "-ffp-contract=off", "-fno-fast-math"]
BUILDS = {
    "gcc-O0": ["g++", "-O0", "-fopenmp", *BASE],
    # clang without OpenMP (Debian's clang-16 has no libomp here): the engine runs single-threaded.
    "clang16-O3-x86-64-v3": ["clang++-16", "-O3", "-march=x86-64-v3", *BASE],
    "aarch64-gcc-O2-qemu": ["aarch64-linux-gnu-g++", "-O2", "-static", "-fopenmp", *BASE],
}


def dump(di, name, directory, path):
    mm = di.MegaModel.from_pretrained(directory, max_context=512)
    teacher, prompt = inputs_for(name, directory, mm.config.vocab_size)
    with open(path, "wb") as f:
        ints = mm._cfg_ints
        f.write(b"DETM" + struct.pack(f"<q{len(ints)}q", len(ints), *ints) + struct.pack("<d", mm.config.rms_norm_eps))
        f.write(struct.pack("<q", mm._inv_freq.numel()) + mm._inv_freq.numpy().astype("<f8").tobytes())
        f.write(struct.pack("<q", len(mm._weights)))
        for w in mm._weights:  # bf16 matrices and fp32 norms, as raw little-endian bytes
            raw = w.contiguous().view(torch.uint8).numpy().tobytes()
            f.write(struct.pack("<q", len(raw)) + raw)
        for ids in (teacher, prompt):
            f.write(struct.pack("<q", len(ids)) + np.asarray(ids, dtype="<i4").tobytes())
        f.write(struct.pack("<q", N_GEN))
    return mm.config.vocab_size, len(teacher)


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_engine_core_reproduces_the_pins(di, build, tmp_path):
    cmd = BUILDS[build]
    if shutil.which(cmd[0]) is None or ("aarch64" in build and shutil.which("qemu-aarch64") is None):
        reason = f"{cmd[0]} or qemu-aarch64 not installed (scripts/setup.sh installs them)"
        pytest.fail(reason) if IN_CI else pytest.skip(reason)
    if "x86-64" in build and platform.machine() != "x86_64":
        pytest.skip("x86-64 build on another host")
    sources = ENGINE + ([] if "aarch64" in build else X86)
    exe = tmp_path / "engine_digest"
    subprocess.run([*cmd, f"-I{ROOT}", str(ROOT / "tests/native/engine_digest.cpp"), *[str(ROOT / s) for s in sources],
                    "-o", str(exe)], check=True)
    runner = ["qemu-aarch64"] if "aarch64" in build else []
    for name in SYNTHETIC:
        V, n = dump(di, name, model_dir(name, tmp_path / "models"), tmp_path / f"{name}.bin")
        out = subprocess.run([*runner, str(exe), str(tmp_path / f"{name}.bin")], check=True, capture_output=True,
                             env=dict(os.environ, OMP_NUM_THREADS="2")).stdout
        logits = torch.frombuffer(bytearray(out[: n * V * 4]), dtype=torch.float32).view(n, V)
        rest = out[n * V * 4 :]
        tokens = np.frombuffer(rest[: N_GEN * 4], dtype="<i4").tolist()
        steps = torch.frombuffer(bytearray(rest[N_GEN * 4 :]), dtype=torch.float32).view(N_GEN, V)
        assert logits_digest(logits) == MODEL_DIGESTS[name]["teacher_forced"], (build, name)
        assert generation_digest(tokens, steps) == MODEL_DIGESTS[name]["generation"], (build, name)
