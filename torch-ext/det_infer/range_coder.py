"""A range coder over integer frequencies (docs/SPEC.md §18.2): the entropy coder of compress.py. It
sees integers only (a symbol's cumulative frequency, its frequency, the total), so an encoder and a
decoder given the same integers produce and read the same bytes on any machine.

64-bit range, byte-wise renormalization with carry propagation (the scheme of LZMA's range coder,
widened from 32 to 64 bits): range stays in [2^56, 2^64), so a total up to 2^32 loses at most
2^-24 of the range to the integer division. Python's integers hold the 65-bit carry exactly.
"""

TOP = 1 << 64
MASK = TOP - 1
BOTTOM = 1 << 56
MAX_TOTAL = 1 << 32


class CorruptStream(ValueError):
    """The bytes are not a stream this coder wrote (truncated or altered)."""


class Encoder:
    def __init__(self):
        self.low, self.range = 0, MASK
        self.cache, self.cache_size = 0, 1
        self.out = bytearray()

    def encode(self, cum, freq, total):
        """Code the symbol occupying [cum, cum + freq) of [0, total)."""
        if not (0 <= cum and 0 < freq and cum + freq <= total <= MAX_TOTAL):
            raise ValueError(f"range coder: bad interval [{cum}, {cum + freq}) of {total}")
        r = self.range // total
        self.low += r * cum
        self.range = r * freq
        while self.range < BOTTOM:
            self.range <<= 8
            self._shift_low()

    def _shift_low(self):
        if self.low < 0xFF << 56 or self.low >= TOP:  # the top byte is settled (or a carry settles it)
            carry = self.low >> 64
            byte = self.cache
            while True:
                self.out.append((byte + carry) & 0xFF)
                byte = 0xFF
                self.cache_size -= 1
                if not self.cache_size:
                    break
            self.cache = (self.low >> 56) & 0xFF
        self.cache_size += 1
        self.low = (self.low << 8) & MASK

    def finish(self):
        """The coded bytes (the encoder is spent)."""
        for _ in range(9):
            self._shift_low()
        return bytes(self.out)


class Decoder:
    def __init__(self, data):
        self.data, self.pos = data, 0
        self.range, self.code = MASK, 0
        for _ in range(9):
            self.code = (self.code << 8) | self._byte()
        if self.code >= TOP:
            raise CorruptStream("range coder: the stream does not start as one this coder writes")
        self._r = None

    def _byte(self):
        if self.pos >= len(self.data):
            raise CorruptStream("range coder: the stream ends early (truncated?)")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def target(self, total):
        """The value in [0, total) that the next symbol's interval contains."""
        if not 0 < total <= MAX_TOTAL:
            raise ValueError(f"range coder: bad total {total}")
        self._r = self.range // total
        v = self.code // self._r
        if v >= total:
            raise CorruptStream("range coder: a value outside the model's total (corrupt data)")
        return v

    def consume(self, cum, freq):
        """Remove the decoded symbol's interval [cum, cum + freq) (after target)."""
        self.code -= self._r * cum
        self.range = self._r * freq
        while self.range < BOTTOM:
            self.code = (self.code << 8) | self._byte()
            self.range <<= 8

    def exhausted(self):
        """True when every byte was read: a well-formed stream ends exactly there."""
        return self.pos == len(self.data)
