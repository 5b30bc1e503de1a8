"""The contract's uniform draw (contract/det_philox.h, docs/SPEC.md §15 step 6) in Python, for tests
that need a seed whose draw lands in a given place: its 24 bits, for one seed or a numpy array."""
import numpy as np

M32 = 0xFFFFFFFF


def uniform_bits(seed, position):
    """det_sample_uniform's 24 bits (u = bits * 2^-24): the first word of Philox4x32-10 with counter
    (position mod 2^32, position div 2^32, 0, 0) and key (seed mod 2^32, seed div 2^32), shifted
    right by 8. seed: an int or a numpy uint64 array (then an array of the same shape)."""
    s = np.asarray(seed, dtype=np.uint64)
    zero = np.zeros(s.shape, dtype=np.uint64)
    c = [zero + (position & M32), zero + (position >> 32), zero, zero]
    k0, k1 = s & M32, s >> 32
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M32, (p0 >> 32) ^ c[3] ^ k1, p0 & M32]
    bits = c[0] >> 8
    return int(bits) if bits.ndim == 0 else bits
