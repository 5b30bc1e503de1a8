"""Accuracy of the contract functions against independent references (docs/RESULTS.md §1).

References: numpy float64 (exp, tanh, log, sin, cos; silu and gelu-tanh from their float64 formulas),
numpy longdouble for rsqrt (a different precision than the fp64 path under test). Every output
that differs from the reference rounded to fp32 is re-judged with mpmath at 60 digits, so the
"correctly rounded" fraction is exact and no near-midpoint case is misjudged.
"""
import math

import numpy as np

F32 = np.float32
MP_DIGITS = 60


def _specials():
    bits = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x807fffff, 0x00800000,
            0x80800000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
            0x3f800000, 0xbf800000, 0x7f800001]
    return np.array(bits, dtype=np.uint32).view(np.float32)


# Inputs at the edges of each function's range: overflow, the normal/subnormal boundary, the last
# nonzero output, and the switch points of the piecewise evaluations.
_EDGES = {
    "exp": [88.72283, 88.722824, 88.72284, 89.0, -87.33654, -87.33655, -103.97207, -103.97208,
            -103.9721, -104.0, 0.34657359, -0.34657359],
    "tanh": [2.0**-7, -(2.0**-7), 0.0078124995, 9.0, 9.01, 9.1, 9.100001],
    "silu": [-87.0, -88.7, -103.0, -110.0, -119.99, -120.0, -120.01, 120.0],
    "gelu_tanh": [-12.0, -11.99, 12.0, -10.0, -9.5],
    "rsqrt": [1.0, 4.0, 2.0**-149, 2.0**-126, 3.4e38],
    # 1 and its neighbours, sqrt(2) (where m is halved) and sqrt(1/2), the subnormal edge, e, 2
    "log": [1.0, 1.4142135, 1.4142137, 0.70710677, 0.70710683, 2.0**-126, 2.0**-149, 2.718281828,
            2.0, 0.5, 3.4028235e38],
}


def _edges(fn):
    e = np.array(_EDGES[fn], dtype=np.float32)
    with np.errstate(over="ignore"):  # the largest finite input's upper neighbour is inf
        return np.concatenate([e, np.nextafter(e, np.float32(np.inf)), np.nextafter(e, np.float32(-np.inf))])


def _uniform(rng, lo, hi, n):
    return rng.uniform(lo, hi, n).astype(np.float32)


def _log_uniform(rng, lo_exp, hi_exp, n):
    mag = np.exp2(rng.uniform(lo_exp, hi_exp, n))
    sign = rng.choice([-1.0, 1.0], n)
    return (sign * mag).astype(np.float32)


def _random_bits(rng, n):
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def inputs(fn, n, seed=2):
    """n fp32 inputs for fn, spread over its useful range, plus the special values."""
    rng = np.random.default_rng(seed)
    q = n // 8
    if fn == "exp":
        parts = [_uniform(rng, -104.0, 89.0, 4 * q), _uniform(rng, -1.0, 1.0, q),
                 _log_uniform(rng, -40, 0, q), _uniform(rng, -104.0, -87.0, q), _random_bits(rng, q)]
    elif fn == "tanh":
        parts = [_uniform(rng, -10.0, 10.0, 3 * q), _uniform(rng, -0.05, 0.05, 2 * q),
                 _log_uniform(rng, -40, 4, 2 * q), _random_bits(rng, q)]
    elif fn in ("silu", "gelu_tanh"):
        parts = [_uniform(rng, -12.0, 12.0, 3 * q), _uniform(rng, -130.0, 130.0, 2 * q),
                 _log_uniform(rng, -40, 7, 2 * q), _random_bits(rng, q)]
    elif fn == "log":  # every binade, the range around 1 (where log is small), sums of exponentials
        near_one = 1.0 + _log_uniform(rng, -24, -2, 2 * q).astype(np.float64)
        parts = [np.abs(_random_bits(rng, 2 * q)), _uniform(rng, 0.5, 2.0, q), near_one.astype(np.float32),
                 np.abs(_log_uniform(rng, -149, 128, 2 * q)), _uniform(rng, 1.0, 50000.0, q)]
    elif fn == "rsqrt":
        parts = [np.abs(_random_bits(rng, 4 * q)), _uniform(rng, 1e-6, 4.0, 2 * q),
                 np.abs(_log_uniform(rng, -149, 127, 2 * q))]
    else:
        raise ValueError(fn)
    return np.concatenate(parts + [_edges(fn), _specials()])


def angles(n, seed=3):
    """fp64 rope angles: pos * inv_freq for positions up to 1e6 and real rope frequencies, plus
    uniform angles over the whole valid range and small ones."""
    rng = np.random.default_rng(seed)
    q = n // 4
    freqs = 10000.0 ** (-np.arange(0, 64, 2) / 64.0)
    pos = rng.integers(0, 1_000_001, 2 * q).astype(np.float64)
    rope = pos * rng.choice(freqs, 2 * q)
    wide = rng.uniform(-(2.0**22), 2.0**22, q)
    small = rng.uniform(-4.0, 4.0, n - 3 * q)
    return np.concatenate([rope, wide, small, [0.0, -0.0, 2.0**22, -(2.0**22)]])


def reference(fn, x):
    """float64 (longdouble for rsqrt) reference values."""
    with np.errstate(all="ignore"):
        if fn == "rsqrt":
            return 1.0 / np.sqrt(x.astype(np.longdouble))
        d = x.astype(np.float64)
        if fn == "exp":
            return np.exp(d)
        if fn == "tanh":
            return np.tanh(d)
        if fn == "log":
            return np.log(d)
        if fn == "silu":  # limit at -inf: -0
            return np.where(d == -np.inf, -0.0, d / (1.0 + np.exp(-d)))
        if fn == "gelu_tanh":
            # 0.5 x (1 + tanh(v)) == x * sigmoid(2v); the sigmoid form avoids fp64 cancellation.
            v = math.sqrt(2.0 / math.pi) * (d + 0.044715 * d * d * d)
            return np.where(d == -np.inf, -0.0, d / (1.0 + np.exp(-2.0 * v)))
        if fn == "sin":
            return np.sin(d)
        if fn == "cos":
            return np.cos(d)
    raise ValueError(fn)


def _mp_value(fn, x):
    import mpmath

    with mpmath.workdps(MP_DIGITS):
        v = mpmath.mpf(float(x))
        if fn == "exp":
            return mpmath.exp(v)
        if fn == "tanh":
            return mpmath.tanh(v)
        if fn == "log":
            return mpmath.log(v)
        if fn == "silu":
            return v / (1 + mpmath.exp(-v))
        if fn == "gelu_tanh":
            return v / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (v + mpmath.mpf("0.044715") * v**3)))
        if fn == "rsqrt":
            return 1 / mpmath.sqrt(v)
        if fn == "sin":
            return mpmath.sin(v)
        if fn == "cos":
            return mpmath.cos(v)
    raise ValueError(fn)


def _ulp32(v):
    """ulp of the fp32 binade holding |v| (subnormal spacing below 2^-126); v float64 array."""
    a = np.abs(v.astype(np.float64))
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.clip(e, -126, 127)
    return np.exp2(e - 23)


def judge(fn, x, y):
    """Compare outputs y (fp32) for inputs x with the reference.

    Returns dict: n, max_ulp, correctly_rounded (fraction), worst_input, and `special_mismatch`
    (inputs whose reference is NaN/inf/0 where y disagrees in class)."""
    ref = reference(fn, x)
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    finite = np.isfinite(ref32) & np.isfinite(y)
    same = (y == ref32) | (np.isnan(y) & np.isnan(ref32))
    special_bad = ~same & ~finite
    ulp = np.zeros(len(x))
    with np.errstate(all="ignore"):
        ulp[finite] = np.abs(y[finite].astype(np.float64) - ref[finite].astype(np.float64)) / _ulp32(ref[finite])
    # Re-judge every finite disagreement exactly.
    import mpmath

    cr = same.copy()
    for i in np.nonzero(~same & finite)[0]:
        with mpmath.workdps(MP_DIGITS):
            v = _mp_value(fn, x[i])
            yi = float(y[i])
            up = float(np.nextafter(y[i], np.float32(np.inf)))
            dn = float(np.nextafter(y[i], np.float32(-np.inf)))
            err = abs(mpmath.mpf(yi) - v)
            cr[i] = err <= abs(mpmath.mpf(up) - v) and err <= abs(mpmath.mpf(dn) - v)
            ulp[i] = float(err / mpmath.mpf(float(_ulp32(np.array([float(v)]))[0])))
    worst = int(np.argmax(ulp))
    return {
        "n": len(x),
        "max_ulp": float(ulp[worst]),
        "correctly_rounded": float(cr.mean()),
        "worst_input": float(x[worst]),
        "special_mismatch": [float(v) for v in x[special_bad][:10]],
    }
