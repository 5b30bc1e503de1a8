"""The fixed input set of tests/native/contract_digest.cpp, rebuilt in numpy, and the same byte
stream computed through the kernel's torch ops. Keep the two files in step: the build-invariance
test requires their digests to be equal."""
import hashlib

import numpy as np
import torch

UNARY_FUNCTIONS = ("exp", "tanh", "silu", "gelu_tanh", "rsqrt", "bf16_round", "log")  # det_unary_fn order
UNARY_N = 1 << 17
ANGLE_N = 1 << 16
REDUCE_KS = (1, 7, 64, 255, 256, 257, 576, 1000, 1536)
REDUCE_ROWS = 3
UNARY_RANGE = ((-30, 6), (-30, 3), (-30, 7), (-30, 4), (-126, 127), (-126, 127), (-126, 127))
NAN32 = np.uint32(0x7FC00000)


def splitmix64(seed, n):
    """The first n outputs of the splitmix64 stream `seed` (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def f32_from(u, e_lo, e_hi):
    exp = (np.int64(e_lo) + ((u >> np.uint64(40)) & np.uint64(0xFFFF)).astype(np.int64) % (e_hi - e_lo + 1) + 127)
    bits = ((u >> np.uint64(63)) << np.uint64(31)) | (exp.astype(np.uint64) << np.uint64(23)) | (u & np.uint64(0x7FFFFF))
    raw = (u >> np.uint64(32))
    bits = np.where((u & np.uint64(7)) == 0, raw, bits)
    return bits.astype(np.uint32).view(np.float32)


def f64_from(u):
    exp = (-30 + ((u >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) % 52 + 1023).astype(np.uint64)
    bits = ((u >> np.uint64(63)) << np.uint64(63)) | (exp << np.uint64(52)) | (u & np.uint64((1 << 52) - 1))
    return bits.view(np.float64)


def bf16_from(u):
    exp = (-10 + ((u >> np.uint64(40)) & np.uint64(0xFFFF)).astype(np.int64) % 14 + 127).astype(np.uint64)
    bits = ((u >> np.uint64(63)) << np.uint64(15)) | (exp << np.uint64(7)) | (u & np.uint64(0x7F))
    return bits.astype(np.uint16)


def _canonical(a):
    bits = a.astype(np.float32).view(np.uint32).copy()
    bits[np.isnan(a)] = NAN32
    return bits.tobytes()


def digest_through_ops(di, device="cpu"):
    """SHA-256 of the contract_digest.cpp byte stream, computed with the kernel's ops; the
    elementwise functions run on `device` (the reductions and argmax are CPU references)."""
    h = hashlib.sha256()
    for fn_index, fn in enumerate(UNARY_FUNCTIONS):
        x = f32_from(splitmix64(1000 + fn_index, UNARY_N), *UNARY_RANGE[fn_index])
        y = di.contract.unary(torch.from_numpy(x).to(device), fn)
        h.update(_canonical(y.cpu().numpy()))
    theta = torch.from_numpy(f64_from(splitmix64(2000, ANGLE_N))).to(device)
    s, c = di.contract.sincos(theta)
    h.update(_canonical(s.cpu().numpy()))
    h.update(_canonical(c.cpu().numpy()))
    for K in REDUCE_KS:
        wb = bf16_from(splitmix64(3000 + 7 * K, REDUCE_ROWS * K)).reshape(REDUCE_ROWS, K)
        wf = f32_from(splitmix64(5000 + 7 * K, REDUCE_ROWS * K) | np.uint64(1), -10, 3).reshape(REDUCE_ROWS, K)
        x = torch.from_numpy(f32_from(splitmix64(4000 + 7 * K, K) | np.uint64(1), -7, 3))
        wb_t = torch.from_numpy(wb.view(np.int16)).view(torch.bfloat16)
        y = torch.cat([di.contract.gemv(wb_t, x), di.contract.gemv(torch.from_numpy(wf), x),
                       di.contract.row_sum(torch.from_numpy(wf))])
        h.update(_canonical(y.numpy()))
    v = ((splitmix64(6000, 1000) % np.uint64(16)).astype(np.int64) - 8).astype(np.float32)
    ids = [di.contract.argmax(torch.from_numpy(v))]
    v[617] = np.uint32(0x7FC00000).view(np.float32)
    v[923] = np.uint32(0xFFC00000).view(np.float32)
    ids.append(di.contract.argmax(torch.from_numpy(v)))
    v = np.where(np.arange(1000) % 3 != 0, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
    ids.append(di.contract.argmax(torch.from_numpy(v)))
    h.update(np.array(ids, dtype=np.int64).tobytes())
    return h.hexdigest()
