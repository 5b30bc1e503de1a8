"""The header of a GGUF file (v2/v3, little-endian): its metadata and its table of tensors, read
with struct in one pass, every length and count checked against the bytes left in the file.

gguf-py's GGUFReader builds a numpy view for every element of every metadata array: 12 s for
Gemma-3's 262,144-token vocabulary, more than the rest of a load. det-infer reads no metadata
array (the tokenizer is transformers' business), so this walk skips their values and keeps only
their element type and count; tensor data is left to the caller (gguf_io.py maps the file).
"""
import os
import struct
from typing import NamedTuple


class GGUFError(ValueError):
    pass


# Metadata value types: struct formats of the scalars; 8 is a string, 9 an array.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                   12: "<d"}
_SCALAR_BYTES = {k: struct.calcsize(f) for k, f in _SCALAR_FORMATS.items()}
_STRING, _ARRAY, _UINT32, _UINT64 = 8, 9, 4, 10
# A tokenizer's arrays are read later by transformers (with gguf-py, one numpy view per element),
# so their lengths are bounded here. Real files stay far below: a 262,144-token vocabulary (Gemma 3)
# has three arrays of that length plus its merges.
MAX_ARRAY_ELEMENTS = 1 << 20
MAX_METADATA_ELEMENTS = 1 << 22
DEFAULT_ALIGNMENT = 32


class MetadataArray(NamedTuple):
    """A metadata array, by its element type and count (its values are not read)."""
    item_type: int
    count: int


class TensorInfo(NamedTuple):
    name: str
    dims: tuple  # innermost first, as GGUF lists them
    ggml_type: int
    offset: int  # from the start of the file


class GGUFHeader(NamedTuple):
    version: int
    fields: dict  # key -> int, float, bool, str or MetadataArray
    tensors: list  # TensorInfo, in file order
    data_offset: int


def read_header(path):
    """The GGUFHeader of the file at path; a GGUFError that says what is wrong for anything malformed
    (a lying length, count or offset, an unknown value type, a duplicated name)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        return _Walk(f, path, size).header()


class _Walk:
    def __init__(self, f, path, size):
        self.f, self.path, self.size = f, path, size

    def fail(self, what):
        raise GGUFError(f"det-infer: {self.path}: {what}")

    def take(self, n, what):
        if n > self.size - self.f.tell():
            self.fail(f"{what} runs past the end of the file ({self.size} bytes)")
        return self.f.read(n)

    def scalar(self, kind, what):
        return struct.unpack(_SCALAR_FORMATS[kind], self.take(_SCALAR_BYTES[kind], what))[0]

    def string_length(self, what):
        n = self.scalar(_UINT64, what)
        if n > self.size - self.f.tell():
            self.fail(f"{what} of {n} bytes runs past the end of the file")
        return n

    def string(self, what):
        n = self.string_length(what)
        try:
            return self.f.read(n).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8")

    def skip_strings(self, count, what):
        for j in range(count):
            self.f.seek(self.string_length(f"string {j} of {what}"), os.SEEK_CUR)

    def header(self):
        head = self.f.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise GGUFError(f"det-infer: {self.path} is not a readable GGUF file (no GGUF magic and header)")
        version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
        if version not in (2, 3):
            raise GGUFError(f"det-infer: {self.path} has GGUF version {version}; supported: 2 and 3")
        # Smallest entries: a key-value is a length-prefixed name, a type and a value (>= 13 bytes); a
        # tensor info is a length-prefixed name, a dimension count, a type and an offset (>= 24 bytes).
        if n_kv * 13 + n_tensors * 24 > self.size:
            raise GGUFError(f"det-infer: {self.path} claims {n_tensors} tensors and {n_kv} metadata entries, "
                            f"more than its {self.size} bytes can hold")
        fields, kinds = self.metadata(n_kv)
        infos = [self.tensor_info(i) for i in range(n_tensors)]
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in fields and (kinds["general.alignment"] != _UINT32 or alignment == 0
                                              or alignment & (alignment - 1)):
            self.fail(f"general.alignment {alignment!r} is not a power of two stored as uint32")
        data_offset = -(-self.f.tell() // alignment) * alignment
        tensors, names = [], set()
        for name, dims, ggml_type, offset in infos:
            if name in names:
                self.fail(f"tensor {name!r} appears twice")
            names.add(name)
            if offset % alignment:
                self.fail(f"tensor {name!r} starts at data offset {offset}, not a multiple of the alignment "
                          f"{alignment}")
            tensors.append(TensorInfo(name, dims, ggml_type, data_offset + offset))
        return GGUFHeader(version, fields, tensors, data_offset)

    def metadata(self, n_kv):
        fields, kinds, elements = {}, {}, 0
        for i in range(n_kv):
            key = self.string(f"metadata key {i}")
            kind = self.scalar(_UINT32, f"the type of metadata entry {i}")
            if kind == _ARRAY:
                item, count = self.scalar(_UINT32, f"metadata array {i}"), self.scalar(_UINT64, f"metadata array {i}")
                elements += count
                if count > MAX_ARRAY_ELEMENTS or elements > MAX_METADATA_ELEMENTS:
                    self.fail(f"metadata array {i} has {count} elements; supported: up to {MAX_ARRAY_ELEMENTS} per "
                              f"array and {MAX_METADATA_ELEMENTS} in all")
                if item == _STRING:
                    if count * 8 > self.size - self.f.tell():
                        self.fail(f"metadata array {i} claims {count} strings, more than the file can hold")
                    self.skip_strings(count, f"metadata array {i}")
                elif item in _SCALAR_BYTES:
                    if count * _SCALAR_BYTES[item] > self.size - self.f.tell():
                        self.fail(f"metadata array {i} claims {count} values, more than the file can hold")
                    self.f.seek(count * _SCALAR_BYTES[item], os.SEEK_CUR)
                else:
                    self.fail(f"metadata array {i} has element type {item}; supported: scalars and strings")
                value = MetadataArray(item, count)
            elif kind == _STRING:
                value = self.string(f"metadata string {i}")
            elif kind in _SCALAR_FORMATS:
                value = self.scalar(kind, f"metadata value {i}")
            else:
                self.fail(f"metadata entry {i} has unknown value type {kind}")
            if key in fields:
                self.fail(f"metadata key {key!r} appears twice")
            fields[key], kinds[key] = value, kind
        return fields, kinds

    def tensor_info(self, i):
        name = self.string(f"the name of tensor {i}")
        n_dims = self.scalar(_UINT32, f"tensor {i}")
        if n_dims > 4:
            self.fail(f"tensor {i} claims {n_dims} dimensions; GGUF has at most 4")
        dims = struct.unpack(f"<{n_dims}Q", self.take(8 * n_dims, f"tensor {i}"))
        ggml_type, offset = struct.unpack("<IQ", self.take(12, f"tensor {i}"))
        return name, dims, ggml_type, offset
