"""Seeded mutations of checkpoint files for the loader fuzzers (tests/test_fuzz_safetensors.py,
tests/test_fuzz_gguf.py, scripts/fuzz_loaders.py): every mutated file must load or be refused with
a clear error, never crash."""
import json
import struct


def mutate_safetensors(rng, blob):
    """blob (a safetensors file) with one seeded corruption of its header or length."""
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


EXTREME_U64 = [0, 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
EXTREME_U32 = [0, 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 30, 41, 1000]


def mutate_gguf(rng, blob, header_len):
    b = bytearray(blob)
    kind = rng.randrange(6)
    if kind == 0:  # flip bits in the header
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(header_len)
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncate anywhere
        return bytes(b[: rng.randrange(len(b))])
    elif kind == 2:  # version
        b[4:8] = struct.pack("<I", rng.choice([0, 1, 2, 4, 2**31, 2**32 - 1]))
    elif kind == 3:  # tensor count or key-value count
        off = rng.choice([8, 16])
        b[off : off + 8] = struct.pack("<Q", rng.choice(EXTREME_U64))
    elif kind == 4:  # a 64-bit field somewhere in the header (lengths, dims, offsets)
        off = rng.randrange(24, header_len - 8)
        b[off : off + 8] = struct.pack("<Q", rng.choice(EXTREME_U64))
    else:  # a 32-bit field somewhere in the header (types, n_dims, value types)
        off = rng.randrange(24, header_len - 4)
        b[off : off + 4] = struct.pack("<I", rng.choice(EXTREME_U32))
    return bytes(b)
