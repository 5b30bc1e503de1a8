"""The contract functions as tensor ops: the same bits as the CPU engine computes, and, by
construction, as the CUDA build (reproduced on an H200, sm_90; compiled and audited for sm_75 to
sm_120, the other architectures not run: docs/RESULTS.md §9).

Each function takes a contiguous tensor (fp32, or fp64 angles for `sincos`) and returns a new fp32
tensor; the elementwise functions and `sincos` also take CUDA tensors in a CUDA build, while `gemv`,
`row_sum` and `argmax` (the reference orders) take CPU tensors only. docs/SPEC.md defines every operation.
"""
import torch

from ._ops import ops

# Bumped whenever any bit of any contract function can change; recorded in certificates.
CONTRACT_VERSION = 2

UNARY_FUNCTIONS = ("exp", "tanh", "silu", "gelu_tanh", "rsqrt", "bf16_round", "log")


def _check_tensor(x, name, dtype):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"det-infer: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"det-infer: {name} must be {dtype}, got {x.dtype}")
    return x.contiguous()


def unary(x: torch.Tensor, fn: str) -> torch.Tensor:
    """fn(x) elementwise for fn in UNARY_FUNCTIONS; x is fp32."""
    if fn not in UNARY_FUNCTIONS:
        raise ValueError(f"det-infer: unknown contract function {fn!r}; supported: {', '.join(UNARY_FUNCTIONS)}")
    x = _check_tensor(x, "x", torch.float32)
    out = torch.empty_like(x)
    ops.unary_f32(out, x, fn)
    return out


def exp(x):
    """e^x, <= 1 ulp (double-float evaluation, one final rounding)."""
    return unary(x, "exp")


def tanh(x):
    """tanh(x), built on the contract exp."""
    return unary(x, "tanh")


def silu(x):
    """x * sigmoid(x)."""
    return unary(x, "silu")


def gelu_tanh(x):
    """The tanh approximation of gelu, evaluated as x * sigmoid(2*sqrt(2/pi)*(x + 0.044715 x^3))."""
    return unary(x, "gelu_tanh")


def rsqrt(x):
    """1/sqrt(x) through fp64 sqrt and divide, rounded once to fp32."""
    return unary(x, "rsqrt")


def log(x):
    """The natural logarithm, <= 1 ulp (double-float atanh series, one final rounding); x < 0 -> NaN,
    +-0 -> -inf."""
    return unary(x, "log")


def bf16_round(x):
    """fp32 -> nearest bf16 (ties to even) -> fp32."""
    return unary(x, "bf16_round")


def sincos(theta: torch.Tensor):
    """(sin, cos) of fp64 angles, each rounded to fp32; |theta| <= 2**22, else NaN."""
    theta = _check_tensor(theta, "theta", torch.float64)
    s = torch.empty(theta.shape, dtype=torch.float32, device=theta.device)
    c = torch.empty_like(s)
    ops.sincos_f64(s, c, theta)
    return s, c


def gemv(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """w @ x in the canonical reduction order (CPU reference); w is (rows, K) bf16 or fp32."""
    if not isinstance(w, torch.Tensor) or w.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError("det-infer: w must be a bf16 or fp32 torch.Tensor")
    if w.dim() != 2:
        raise ValueError(f"det-infer: w must be 2-d (rows, K), got shape {tuple(w.shape)}")
    x = _check_tensor(x, "x", torch.float32)
    out = torch.empty(w.shape[0], dtype=torch.float32)
    ops.gemv_ref(out, w.contiguous(), x)
    return out


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of each row of a (rows, K) fp32 tensor in the canonical order (CPU reference)."""
    x = _check_tensor(x, "x", torch.float32)
    if x.dim() != 2:
        raise ValueError(f"det-infer: x must be 2-d (rows, K), got shape {tuple(x.shape)}")
    out = torch.empty(x.shape[0], dtype=torch.float32)
    ops.sum_ref(out, x)
    return out


def log_softmax(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The contract's log-softmax of each row of a (V,) or (n, V) fp32 CPU tensor at a temperature
    > 0 (docs/SPEC.md §15.1): fl(d_i - log S) with d_i = fl(z_i - max z), z = logits / T, and S the
    canonical sum of exp(d_i), the sampler's own S."""
    x = _check_tensor(logits, "logits", torch.float32)
    if x.dim() not in (1, 2) or x.shape[-1] < 1:
        raise ValueError(f"det-infer: logits must be (V,) or (n, V) with V >= 1, got shape {tuple(x.shape)}")
    if x.device.type != "cpu":
        raise ValueError(f"det-infer: log_softmax runs on CPU tensors, got {x.device}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < float("inf"):
        raise ValueError(f"det-infer: temperature must be a finite number > 0, got {temperature!r}")
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    ops.log_softmax_rows(rows, float(temperature), out)
    return out.reshape(x.shape)


def argmax(x: torch.Tensor) -> int:
    """The contract argmax: NaN ranks highest, then the largest value, ties to the lowest id."""
    x = _check_tensor(x, "x", torch.float32)
    if x.numel() == 0:
        raise ValueError("det-infer: argmax of an empty tensor")
    return int(ops.argmax_f32(x))
