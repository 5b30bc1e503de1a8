"""Read safetensors files as memory-mapped torch tensors (no copy of the weights).

Format: 8 bytes little-endian u64 N, then N bytes of JSON {name: {"dtype", "shape",
"data_offsets": [begin, end]}, optional "__metadata__"}, then the data; offsets are relative to
the end of the header. Every header field is checked against the file before anything is mapped.
A sharded checkpoint has model.safetensors.index.json with {"weight_map": {name: file}}.
"""
import json
import os

import torch

_DTYPES = {
    "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2), "F32": (torch.float32, 4),
    "F64": (torch.float64, 8), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
    "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    pass


def read_header(path):
    """(header dict without __metadata__, data start offset, file size)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"det-infer: {path} is not a safetensors file (shorter than 8 bytes)")
        n = int.from_bytes(raw, "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise SafetensorsError(f"det-infer: {path}: header length {n} is larger than the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"det-infer: {path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"det-infer: {path}: header is not a JSON object")
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    for name, info in header.items():
        if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
            raise SafetensorsError(f"det-infer: {path}: tensor {name!r} has an unknown dtype "
                                   f"{info.get('dtype') if isinstance(info, dict) else info!r}")
        shape, offs = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise SafetensorsError(f"det-infer: {path}: tensor {name!r} has a bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1] <= data_size):
            raise SafetensorsError(f"det-infer: {path}: tensor {name!r} has data_offsets {offs!r} outside the "
                                   f"{data_size}-byte data section")
        numel = 1
        for s in shape:
            numel *= s
        if numel * _DTYPES[info["dtype"]][1] != offs[1] - offs[0]:
            raise SafetensorsError(f"det-infer: {path}: tensor {name!r}: shape {shape} x {info['dtype']} does not "
                                   f"match its {offs[1] - offs[0]} bytes")
    return header, 8 + n, size


def load_file(path):
    """{name: tensor} mapped from one .safetensors file (copy-on-write mapping; a tensor whose data
    is not aligned to its element size is copied instead)."""
    header, start, size = read_header(path)
    if size == 0:
        return {}
    storage = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    out = {}
    for name, info in header.items():
        dtype, size = _DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        raw = storage[start + b : start + e]
        if (start + b) % size:  # a writer that did not align the data: copy this tensor only
            raw = raw.clone()
        out[name] = raw.view(dtype).reshape(info["shape"])
    return out


def load_checkpoint(directory):
    """All tensors of a model directory: model.safetensors, or the shards of its index."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise SafetensorsError(f"det-infer: {index} has no weight_map")
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            part = load_file(os.path.join(directory, shard))
            for name in part:
                if name in tensors:
                    raise SafetensorsError(f"det-infer: tensor {name!r} appears in two shards")
            tensors.update(part)
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise SafetensorsError(f"det-infer: tensors listed in the index but absent from the shards: {missing[:10]}")
        return tensors
    single = os.path.join(directory, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"det-infer: {directory} has neither model.safetensors nor model.safetensors.index.json")
    return load_file(single)


def checkpoint_files(directory):
    """The files load_checkpoint reads: the index and its shards, or model.safetensors."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [index] + [os.path.join(directory, s) for s in shards]
    return [os.path.join(directory, "model.safetensors")]
