"""Lossless compression with the model as the probability model (docs/SPEC.md §18): a blob decodes to
the original bytes on any machine and executor, because the decoder sees the encoder's
probabilities bit for bit (the contract: any batch, any prefill split, any executor).

    blob = di.compress.compress(mm, data)          # bytes -> bytes
    data = di.compress.decompress(mm, blob)        # the same model, any executor or machine

The data is cut into chunks of about chunk_bytes bytes at UTF-8 character boundaries. A chunk
whose text the model's tokenizer round-trips exactly is coded token by token: each token with
integer frequencies from the logits of the tokens before it in its chunk (contract/det_freq.h),
after a one-token prefix, within a sliding window of `window` tokens. Any other chunk (binary
data, invalid UTF-8) is coded byte by byte with an adaptive order-0 byte model. Chunks are
independent: the encoder runs each as one prefill, the decoder runs up to batch chunks side by side,
one token each per batched step. The container records everything the decoder needs (§18.3) and
is refused, naming what differs, for another model, tokenizer or contract, and on any corruption.
"""
import hashlib
import json
import struct
import zlib

import torch

from . import range_coder
from ._ops import ops

MAGIC = b"DETZ"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sBH32s32sIIIQII")  # magic, version, contract, model sha256, tokenizer sha256,
#                                             window, chunk_bytes, prefix id, length, crc32 of the data, chunks
CHUNK = struct.Struct("<BIII")  # mode, symbols, original bytes, coded bytes
MODE_TOKENS, MODE_BYTES = 0, 1
LOGIT_ROWS = 256  # logit rows per native call while encoding
MAX_LENGTH = 1 << 30  # decompress refuses a blob claiming more bytes unless told otherwise


class CompressError(ValueError):
    """A blob this model cannot decode: another format, model or contract, or corrupt data."""


def model_sha256(mm):
    """The sha256 (32 bytes) of the model's identity: certificate.model_sha256."""
    from . import certificate

    try:
        return bytes.fromhex(certificate.model_sha256(mm))
    except certificate.CertificateError as e:
        raise CompressError(f"det-infer: compression needs a model loaded from files: {e}") from None


def tokenizer_sha256(tok):
    """The sha256 of the tokenizer's full description (a fast tokenizer's tokenizer.json as the
    tokenizers library writes it; else its vocabulary): token chunks decode through it."""
    backend = getattr(tok, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    return hashlib.sha256(text.encode()).digest()


def _prefix_id(mm, tok):
    bos = getattr(tok, "bos_token_id", None)
    return bos if bos is not None else mm.config.eos_token_ids[0]


def _split(data, chunk_bytes):
    """n = ceil(len / chunk_bytes) chunks: the cut k at k * ceil(len / n), moved back (at most 3
    bytes) so that no UTF-8 character is split, so that chunks decoded side by side end together."""
    n = -(-len(data) // chunk_bytes)
    size = -(-len(data) // n) if n else 0
    cuts = [0]
    for k in range(1, n):
        c = k * size
        back = c
        while back > c - 3 and back > cuts[-1] + 1 and (data[back] & 0xC0) == 0x80:
            back -= 1
        cuts.append(back if (data[back] & 0xC0) != 0x80 else c)
    cuts.append(len(data))
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


def _tokens_of(tok, chunk):
    """The chunk's token ids when its text round-trips through the tokenizer exactly, else None."""
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError:
        return None
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    if not ids or len(ids) > len(chunk) or _text_of(tok, ids) != text:
        return None  # (at most one token per byte: what the decoder's length check allows)
    return ids


def _text_of(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def window_start(i, window):
    """b(i): the first stream index the model sees when predicting stream[i] (stream[0] = the
    prefix): 0 while i < window, then advancing by window // 2 at a time, so a context holds
    between window // 2 and window - 1 tokens."""
    half = window // 2
    return 0 if i < window else ((i - window) // half + 1) * half


def _freq_rows(logits):
    f = torch.empty(logits.shape, dtype=torch.int32)
    ops.token_freqs(logits.contiguous(), f)
    return f


# ---- the byte model (chunks that are not round-tripping text) -------------------------------------------
class ByteModel:
    """Adaptive order-0 frequencies of the 256 byte values: each starts at 1, grows by 32 when seen,
    and all halve (rounding up) when the total passes 2^16."""

    def __init__(self):
        self.f = [1] * 256
        self.total = 256

    def interval(self, b):
        return sum(self.f[:b]), self.f[b], self.total

    def find(self, v):
        cum = 0
        for b, f in enumerate(self.f):
            if v < cum + f:
                return b, cum, f
            cum += f
        raise range_coder.CorruptStream("det-infer: a byte outside the byte model")

    def update(self, b):
        self.f[b] += 32
        self.total += 32
        if self.total > 1 << 16:
            self.f = [(x + 1) // 2 for x in self.f]
            self.total = sum(self.f)


def _encode_bytes(chunk):
    enc, model = range_coder.Encoder(), ByteModel()
    for b in chunk:
        enc.encode(*model.interval(b))
        model.update(b)
    return enc.finish()


def _decode_bytes(coded, n):
    dec, model, out = range_coder.Decoder(coded), ByteModel(), bytearray()
    for _ in range(n):
        b, cum, f = model.find(dec.target(model.total))
        dec.consume(cum, f)
        model.update(b)
        out.append(b)
    return bytes(out)


# ---- compress ---------------------------------------------------------------------------------------------
def _chunk_logit_rows(mm, stream, window):
    """For i = 1 .. len(stream)-1, the logits predicting stream[i] from stream[b(i):i], in order, in
    pieces of at most LOGIT_ROWS rows: one fresh state per window, prefilled (SPEC §13: the bits
    of the decoder's step-by-step rows)."""
    n = len(stream)
    i = 1
    while i < n:
        b = window_start(i, window)
        end = i
        while end < n and window_start(end, window) == b:  # this window's predictions: [i, end)
            end += 1
        state = mm._new_kv(end - 1 - b)
        if i - 1 > b:  # the context before the first wanted row
            mm._forward(stream[b:i - 1], list(range(0, i - 1 - b)), [state], [0] * (i - 1 - b),
                        [0] * (i - 2 - b) + [1])
        for a in range(i, end, LOGIT_ROWS):
            z = min(end, a + LOGIT_ROWS)
            rows = stream[a - 1:z - 1]
            yield mm._forward(rows, list(range(a - 1 - b, z - 1 - b)), [state], [0] * len(rows), [1] * len(rows)).cpu()
        i = end


def _encode_tokens(mm, stream, window, progress):
    enc = range_coder.Encoder()
    i = 1
    for logits in _chunk_logit_rows(mm, stream, window):
        freqs = _freq_rows(logits).to(torch.int64)
        totals = freqs.sum(1).tolist()
        for r in range(freqs.shape[0]):
            t = stream[i]
            enc.encode(int(freqs[r, :t].sum()), int(freqs[r, t]), totals[r])
            i += 1
        if progress:
            progress(freqs.shape[0])
    return enc.finish()


def compress(mm, data, *, chunk_bytes=2048, window=1024, tokenizer=None, progress=None):
    """data (bytes) as a blob that decompress(mm, blob) turns back into data, bit for bit.
    chunk_bytes: bytes per independent chunk (more: better ratio, less parallel decoding);
    window: the most tokens of context (>= 4; long chunks slide). progress(n), when given, is
    called as n more tokens or bytes are coded."""
    from . import CONTRACT_VERSION

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"det-infer: compress takes bytes, got {type(data).__name__}")
    data = bytes(data)
    for name, v, lo in (("chunk_bytes", chunk_bytes, 1), ("window", window, 4)):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < 2**31:
            raise ValueError(f"det-infer: {name} must be an int >= {lo}, got {v!r}")
    if window > mm.max_context:
        raise ValueError(f"det-infer: window {window} is over the model's max_context {mm.max_context}")
    tok = tokenizer or mm.tokenizer()
    sha = model_sha256(mm)
    prefix = _prefix_id(mm, tok)
    table, payloads = [], []
    for chunk in _split(data, chunk_bytes):
        ids = _tokens_of(tok, chunk)
        if ids is not None:
            coded = _encode_tokens(mm, [prefix] + ids, window, progress)
            table.append((MODE_TOKENS, len(ids), len(chunk), len(coded)))
        else:
            coded = _encode_bytes(chunk)
            table.append((MODE_BYTES, len(chunk), len(chunk), len(coded)))
            if progress:
                progress(len(chunk))
        payloads.append(coded)
    head = HEADER.pack(MAGIC, FORMAT_VERSION, CONTRACT_VERSION, sha, tokenizer_sha256(tok), window, chunk_bytes,
                       prefix, len(data), zlib.crc32(data), len(table))
    head += b"".join(CHUNK.pack(*row) for row in table)
    return head + struct.pack("<I", zlib.crc32(head)) + b"".join(payloads)


# ---- decompress -------------------------------------------------------------------------------------------
def read_header(blob):
    """The container's fields and chunk table; CompressError on anything malformed."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"det-infer: decompress takes bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < HEADER.size + 4 or blob[:4] != MAGIC:
        raise CompressError("det-infer: not a det-infer compressed blob (no DETZ header)")
    magic, version, contract, sha, tok_sha, window, chunk_bytes, prefix, length, crc, n = HEADER.unpack_from(blob)
    if version != FORMAT_VERSION:
        raise CompressError(f"det-infer: blob format version {version}; this package reads version {FORMAT_VERSION}")
    end = HEADER.size + n * CHUNK.size
    if n > len(blob) or len(blob) < end + 4:
        raise CompressError("det-infer: the blob's chunk table is truncated")
    if struct.unpack_from("<I", blob, end)[0] != zlib.crc32(blob[:end]):
        raise CompressError("det-infer: the blob's header is corrupt (CRC-32 mismatch)")
    table = [CHUNK.unpack_from(blob, HEADER.size + k * CHUNK.size) for k in range(n)]
    if sum(row[3] for row in table) != len(blob) - end - 4 or sum(row[2] for row in table) != length:
        raise CompressError("det-infer: the blob's chunk table does not match its size (truncated or corrupt)")
    # the table compress() writes: ceil(length / chunk_bytes) chunks of at most chunk_bytes + 3 bytes
    # (a cut moves back up to 3 bytes), a token chunk with 1..nbytes tokens, a byte chunk nbytes bytes
    if window < 4 or chunk_bytes < 1 or n != -(-length // chunk_bytes):
        raise CompressError("det-infer: the blob's header is corrupt (window, chunk size or chunk count)")
    for mode, syms, nbytes, _ in table:
        if not (1 <= nbytes <= chunk_bytes + 3 and (mode == MODE_TOKENS and 1 <= syms <= nbytes or
                                                    mode == MODE_BYTES and syms == nbytes)):
            raise CompressError("det-infer: the blob's chunk table is corrupt")
    return dict(contract=contract, sha=sha, tokenizer_sha=tok_sha, window=window, chunk_bytes=chunk_bytes,
                prefix=prefix, length=length, crc=crc, table=table, payload=end + 4)


class _TokenChunk:
    """A token chunk being decoded: its range decoder, its stream so far and its KV state."""

    def __init__(self, k, coded, n, prefix):
        self.k, self.n, self.dec = k, n, range_coder.Decoder(coded)
        self.stream = [prefix]
        self.state, self.b = None, -1

    def rows(self, mm, window):
        """(tokens, positions, want) to feed now: the row predicting the next token, after a new
        window's context when the window moves."""
        i = len(self.stream)
        b = window_start(i, window)
        if b != self.b:
            self.state, self.b = mm._new_kv(min(window, i + self.n - len(self.stream) + 1)), b
            feed = self.stream[b:i]
            return feed, list(range(len(feed))), [0] * (len(feed) - 1) + [1]
        return [self.stream[i - 1]], [i - 1 - b], [1]


MAX_BATCH_CPU = 64  # chunks side by side on the CPU executors (the megakernel takes batch_max())


def decompress(mm, blob, *, batch=None, tokenizer=None, progress=None, max_length=MAX_LENGTH):
    """The bytes compress() coded in blob. Chunks decode up to batch at a time, side by side (any
    batch gives the same bytes; default: every chunk, up to 64 on the CPU and batch_max() on the
    megakernel). Raises CompressError for another model, tokenizer or contract (naming both), for
    a blob claiming more than max_length bytes (a bound on the work an untrusted blob can ask
    for), and for any corruption."""
    from . import CONTRACT_VERSION

    h = read_header(blob)
    blob = bytes(blob)
    if h["contract"] != CONTRACT_VERSION:
        raise CompressError(f"det-infer: the blob was made under contract {h['contract']}; this package implements "
                            f"contract {CONTRACT_VERSION}: decode it with a release of that contract")
    sha = model_sha256(mm)
    if h["sha"] != sha:
        raise CompressError(f"det-infer: the blob was made with the model whose identity hashes to {h['sha'].hex()}; "
                            f"the loaded model's is {sha.hex()}")
    most = mm.batch_max() if mm.executor == "megakernel" else MAX_BATCH_CPU
    if batch is None:
        batch = max(1, min(most, len(h["table"])))
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= most:
        raise ValueError(f"det-infer: batch must be an int in [1, {most}] on the {mm.executor}, got {batch!r}")
    if h["window"] > mm.max_context:
        raise CompressError(f"det-infer: the blob's window is {h['window']} tokens; load the model with "
                            f"max_context >= {h['window']}")
    if not 0 <= h["prefix"] < mm.config.vocab_size:
        raise CompressError("det-infer: the blob's prefix token is outside this model's vocabulary")
    if h["length"] > max_length:
        raise CompressError(f"det-infer: the blob claims {h['length']} bytes, over max_length={max_length}; "
                            "pass a larger max_length to decode it")
    tok = tokenizer or mm.tokenizer()
    tok_sha = tokenizer_sha256(tok)
    if h["tokenizer_sha"] != tok_sha:
        raise CompressError(f"det-infer: the blob was made with the tokenizer whose description hashes to "
                            f"{h['tokenizer_sha'].hex()}; this tokenizer's is {tok_sha.hex()} (the same files and "
                            "tokenizers release decode the same text)")
    parts, offset, pending = [None] * len(h["table"]), h["payload"], []
    try:
        for k, (mode, n, nbytes, clen) in enumerate(h["table"]):
            coded = blob[offset:offset + clen]
            offset += clen
            if mode == MODE_BYTES:
                parts[k] = _decode_bytes(coded, n)
                if progress:
                    progress(n)
            else:
                pending.append(_TokenChunk(k, coded, n, h["prefix"]))
        _decode_token_chunks(mm, pending, h["window"], batch, progress)
    except range_coder.CorruptStream as e:
        raise CompressError(f"det-infer: the blob is corrupt: {e}") from None
    for c in pending:
        if not c.dec.exhausted():
            raise CompressError(f"det-infer: the blob is corrupt: chunk {c.k} has bytes its symbols do not use")
        parts[c.k] = _text_of(tok, c.stream[1:]).encode("utf-8")
    out = b"".join(parts)
    if len(out) != h["length"] or zlib.crc32(out) != h["crc"]:
        raise CompressError("det-infer: the blob is corrupt: the decoded data fails its length or CRC-32 check")
    return out


def _decode_token_chunks(mm, chunks, window, batch, progress):
    V = mm.config.vocab_size
    waiting, active = list(chunks), []
    while waiting or active:
        while waiting and len(active) < batch:
            active.append(waiting.pop(0))
        tokens, positions, index, want, ends = [], [], [], [], []
        for s, c in enumerate(active):
            t, p, w = c.rows(mm, window)
            tokens += t
            positions += p
            index += [s] * len(t)
            want += w
            ends.append(p[-1] + 1)  # the state's length once this step has run
        logits = mm._forward(tokens, positions, [c.state for c in active], index, want).cpu()
        freqs = _freq_rows(logits).to(torch.int64)
        cums = torch.cumsum(freqs, 1)
        for s, c in enumerate(active):
            v = c.dec.target(int(cums[s, -1]))
            t = int(torch.searchsorted(cums[s], torch.tensor([v]), right=True)[0])
            if t >= V:
                raise range_coder.CorruptStream("a token outside the vocabulary")
            f = int(freqs[s, t])
            c.dec.consume(int(cums[s, t]) - f, f)
            c.stream.append(t)
            c.state.length = ends[s]
        if progress:
            progress(len(active))
        active = [c for c in active if len(c.stream) - 1 < c.n]
