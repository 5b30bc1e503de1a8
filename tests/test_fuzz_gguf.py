"""Hostile GGUF files: 1,000 seeded mutations of a real GGUF of a synthetic llama model (bit flips in
the header, truncation, lying version, tensor and key counts, and extreme values written over the
header's 32- and 64-bit fields: string lengths, shapes, types, offsets). Every case must load or
raise a ValueError / FileNotFoundError naming the problem (det-infer: ...): never a crash, a hang
or another exception type. scripts/fuzz_loaders.py runs the same mutators for longer."""
import random
import struct

import numpy as np
import pytest
from det_fixtures.mutations import mutate_gguf

N_CASES = 1000
@pytest.fixture(scope="module")
def gguf_blob(tmp_path_factory):
    import gguf
    from det_fixtures.gguf_files import write_gguf

    path, _ = write_gguf("llama", "Q8_0", str(tmp_path_factory.mktemp("fuzz_gguf")))
    with open(path, "rb") as f:
        blob = f.read()
    return blob, gguf.GGUFReader(path).data_offset


def load_outcome(di, path):
    """'ok', or the exception's type name for an accepted clear error; raises on anything else."""
    try:
        di.MegaModel.from_gguf(path, max_context=64)
        return "ok"
    except (ValueError, FileNotFoundError) as e:
        assert str(e).startswith("det-infer:"), f"unclear error: {e!r}"
        return type(e).__name__


def test_mutated_gguf_files_load_or_fail_clearly(di, gguf_blob, tmp_path):
    blob, header_len = gguf_blob
    rng = random.Random(20261129)
    outcomes = {}
    path = tmp_path / "case.gguf"
    for case in range(N_CASES):
        path.write_bytes(mutate_gguf(rng, blob, header_len))
        try:
            outcome = load_outcome(di, str(path))
        except Exception as e:  # noqa: BLE001 - the failure is the point
            raise AssertionError(f"case {case}: {type(e).__name__}: {e}") from e
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert sum(outcomes.values()) == N_CASES
    assert len(outcomes) > 1 and outcomes.get("ok", 0) > 0, outcomes  # some break, some still load
    print(outcomes)


@pytest.mark.parametrize("count", [2**20, 2**40])
def test_lying_string_array_is_refused_before_gguf_py_walks_it(di, tmp_path, count):
    """A string array whose count is far above its strings (the long fuzz run's memory growth: gguf-py
    built one entry per claimed string, gigabytes before reaching the end of the file): refused by
    the header walk, with the array named."""
    import gguf

    path = tmp_path / "strings.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(50)])
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    blob = bytearray(path.read_bytes())
    at = blob.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4  # value type, item type
    assert struct.unpack("<Q", blob[at:at + 8])[0] == 50
    blob[at:at + 8] = struct.pack("<Q", count)
    path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="metadata array 1|runs past the end"):
        di.MegaModel.from_gguf(str(path))


def test_metadata_arrays_are_bounded(di, tmp_path):
    """gguf-py makes one numpy view per array element (~500 bytes each): an honest but huge array is
    refused by the header walk, whatever the file size."""
    import gguf

    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("general.big", [0] * ((1 << 20) + 1))
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="1048577 elements; supported: up to 1048576 per array"):
        di.MegaModel.from_gguf(str(path))
