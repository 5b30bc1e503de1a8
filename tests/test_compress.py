"""Lossless compression (di.compress, scripts/compress.py, docs/SPEC.md §18) on a synthetic model
with a byte-level tokenizer: the frequency rule checked against an independent implementation, the
range coder, and blobs made by the CPU engine that decode to the same bytes with the emulated
megakernel, with 1 or 2 threads, 1 or 16 chunks side by side and in another process; other models,
other contracts, truncation and 1,000 mutated blobs are refused with CompressError."""
import random
import struct
import subprocess
import sys
import zlib

import pytest
import torch
from det_fixtures import synthetic

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
TEXT = (ROOT / "LICENSE").read_bytes()[:900] + "\nnaïve café, ✓ ünïcödé\n".encode() + bytes([0xFF, 0xC3, 0x28, 0]) + \
    b"\nend of the test data\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("compress")
    for name, seed in (("tiny", 0), ("other", 1)):
        synthetic.write_byte_model(root / name, seed=seed)
    return root


@pytest.fixture(scope="module")
def mm(di, tiny):
    return di.MegaModel.from_pretrained(str(tiny / "tiny"), max_context=256)


@pytest.fixture(scope="module")
def blob(di, mm):
    return di.compress.compress(mm, TEXT, chunk_bytes=256, window=40)


def test_frequencies_follow_the_written_rule(di):
    """token_freqs against the rule computed here from torch's IEEE float32 ops and the contract's exp
    and canonical sum: f = 1 + floor(fl(e * fl(2^30 / S))); a non-finite row gives 1 everywhere and
    2^30 more to the argmax."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 5000, generator=g) * torch.tensor([[0.1], [1.0], [4.0], [30.0], [0.0], [8.0]])
    logits[5, 17] = float("nan")
    got = torch.empty(logits.shape, dtype=torch.int32)
    di.ops.token_freqs(logits.contiguous(), got)
    finite = logits[:5]
    e = di.contract.exp(finite - finite.max(dim=1, keepdim=True).values)
    c = torch.tensor(2.0 ** 30, dtype=torch.float32) / di.contract.row_sum(e).reshape(-1, 1)
    assert torch.equal(got[:5], (1 + (e * c).to(torch.int64)).to(torch.int32))
    assert got[4].tolist() == [1 + 2**30 // 5000] * 5000  # equal logits: a uniform split of 2^30
    want = torch.ones(5000, dtype=torch.int32)
    want[17] += 2**30  # the NaN is the argmax (§10)
    assert torch.equal(got[5], want)
    assert (got.to(torch.int64).sum(1) < 2**31).all()


def test_range_coder_round_trips_and_refuses_garbage(di):
    rc, rng = di.range_coder, random.Random(0)
    for trial in range(100):
        total = rng.choice([2, 1000, 2**20, 2**32])
        syms = [(c, rng.randint(1, total - c), total) for c in (rng.randrange(total) for _ in range(rng.randint(1, 200)))]
        enc = rc.Encoder()
        for s in syms:
            enc.encode(*s)
        dec = rc.Decoder(enc.finish())
        for cum, f, t in syms:
            assert cum <= dec.target(t) < cum + f
            dec.consume(cum, f)
        assert dec.exhausted()
    with pytest.raises(rc.CorruptStream):
        rc.Decoder(b"\x00\x01")
    with pytest.raises(ValueError):
        rc.Encoder().encode(5, 0, 10)


def test_engine_blob_decodes_everywhere(di, tiny, mm, blob, tmp_path):
    table = di.compress.read_header(blob)["table"]
    assert {row[0] for row in table} == {di.compress.MODE_TOKENS, di.compress.MODE_BYTES}  # text and bytes
    assert max(row[1] for row in table) > 40  # chunks longer than the window: it slides
    tok = mm.tokenizer()
    for batch in (1, 16):
        assert di.compress.decompress(mm, blob, batch=batch, tokenizer=tok) == TEXT
    emulated = di.MegaModel.from_pretrained(str(tiny / "tiny"), max_context=256, executor="emulated")
    assert di.compress.decompress(emulated, blob, batch=4, tokenizer=tok) == TEXT
    (tmp_path / "in.detz").write_bytes(blob)
    for threads in ("1", "2"):  # another process, another thread count
        out = tmp_path / f"out{threads}"
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compress.py"), "decompress", str(tiny / "tiny"),
                            str(tmp_path / "in.detz"), str(out), "--quiet"], capture_output=True, text=True,
                           timeout=600, env=dict(__import__("os").environ, OMP_NUM_THREADS=threads))
        assert r.returncode == 0 and "bits per byte" in r.stdout, r.stderr
        assert out.read_bytes() == TEXT
    # and the script's own compression is the library's, byte for byte
    (tmp_path / "text").write_bytes(TEXT)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compress.py"), "compress", str(tiny / "tiny"),
                        str(tmp_path / "text"), str(tmp_path / "again"), "--chunk-bytes", "256", "--window", "40",
                        "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again").read_bytes() == blob


HEADER = "<4sBH32s32sIIIQII"


def _with_header(blob, **fields):
    """blob with header fields replaced and its header CRC recomputed (a well-formed blob that lies)."""
    h = list(struct.unpack_from(HEADER, blob))
    names = ["magic", "version", "contract", "sha", "tok_sha", "window", "chunk_bytes", "prefix", "length", "crc",
             "chunks"]
    for k, v in fields.items():
        h[names.index(k)] = v
    end = struct.calcsize(HEADER) + h[-1] * struct.calcsize("<BIII")
    head = struct.pack(HEADER, *h) + blob[struct.calcsize(HEADER):end]
    return head + struct.pack("<I", zlib.crc32(head)) + blob[end + 4:]


def test_other_model_tokenizer_or_contract_is_refused_naming_both(di, tiny, mm, blob):
    other = di.MegaModel.from_pretrained(str(tiny / "other"), max_context=256)
    with pytest.raises(di.compress.CompressError, match="identity hashes to [0-9a-f]{64}; the loaded model's is"):
        di.compress.decompress(other, blob)
    with pytest.raises(di.compress.CompressError, match=f"contract 99; this package implements contract "
                                                          f"{di.CONTRACT_VERSION}"):
        di.compress.decompress(mm, _with_header(blob, contract=99))
    with pytest.raises(di.compress.CompressError, match="not a det-infer compressed blob"):
        di.compress.decompress(mm, b"PK\x03\x04 not ours")
    with pytest.raises(di.compress.CompressError, match="format version 7"):
        di.compress.decompress(mm, _with_header(blob, version=7))
    with pytest.raises(di.compress.CompressError, match="tokenizer whose description hashes to 00"):
        di.compress.decompress(mm, _with_header(blob, tok_sha=bytes(32)))
    with pytest.raises(di.compress.CompressError, match="over max_length=100"):
        di.compress.decompress(mm, blob, max_length=100)
    with pytest.raises(di.compress.CompressError, match="does not match its size"):  # forged, CRC recomputed
        di.compress.decompress(mm, _with_header(blob, length=2**40))
    with pytest.raises(di.compress.CompressError, match="chunk count"):
        di.compress.decompress(mm, _with_header(blob, chunk_bytes=1))


def test_truncated_and_mutated_blobs_never_decode_wrong(di, mm):
    """1,000 mutations (flipped bits, changed, inserted and deleted bytes, truncations) of a small
    blob: each is refused with CompressError or, if it changed nothing that matters, decodes to the
    original; never another exception, a hang or other bytes."""
    data = b"Short text, then bytes \xff\xfe."
    small = di.compress.compress(mm, data, chunk_bytes=12, window=8)
    tok = mm.tokenizer()
    rng = random.Random(7)
    refused = 0
    for i in range(1000):
        b = bytearray(small)
        kind = i % 5
        pos = rng.randrange(len(b))
        if kind == 0:
            b[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            b[pos] = rng.randrange(256)
        elif kind == 2:
            b.insert(pos, rng.randrange(256))
        elif kind == 3:
            del b[pos]
        else:
            b = b[:pos]
        try:
            out = di.compress.decompress(mm, bytes(b), batch=16, tokenizer=tok)
        except di.compress.CompressError:
            refused += 1
            continue
        assert out == data, f"mutation {i} decoded to other bytes"
    assert refused > 950
