"""bitsandbytes nf4 checkpoints, as transformers saves them with
BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"), kept packed.

A quantized projection `P.weight` is stored as
    P.weight                                  uint8 (rows*cols/2, 1): two 4-bit codes per byte
    P.weight.absmax                           float32 (blocks,), or uint8 when double-quantized
    P.weight.quant_map                        float32 (16,): the nf4 codebook
    P.weight.nested_absmax, .nested_quant_map float32: the second quantization of absmax
    P.weight.quant_state.bitsandbytes__nf4    uint8: JSON {quant_type, blocksize, dtype, shape,
                                              nested_blocksize, nested_offset}
unpack() turns each into the codes viewed as (rows, cols/2) (no copy) and one fp32 absmax per block
(the nested form resolved once by the contract's formula, docs/SPEC.md §16), checking every field
against the others and against the contract's codebook.
"""
import json
import math

import torch

from ._ops import ops

QUANT_STATE = ".quant_state.bitsandbytes__nf4"
_AUX = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", QUANT_STATE)
# Projections the engine can hold packed (the lm_head and embeddings stay bf16).
PACKABLE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MIN_BLOCK, MAX_BLOCK = 8, 1 << 20  # contract/det_nf4.h, DET_NF4_{MIN,MAX}_BLOCK_SHIFT


class Nf4Error(ValueError):
    pass


def check_config(q):
    """The config's quantization_config: only bitsandbytes 4-bit nf4 with uint8 storage."""
    if not isinstance(q, dict):
        raise ValueError(f"det-infer: config field 'quantization_config' must be an object, got {q!r}")
    method = q.get("quant_method")
    if method != "bitsandbytes":
        raise ValueError(f"det-infer: config field 'quantization_config' has quant_method {method!r}; "
                         "supported: 'bitsandbytes' (4-bit nf4); other checkpoints: load a bf16/fp16/fp32 one")
    if q.get("load_in_8bit") or q.get("_load_in_8bit"):
        raise ValueError("det-infer: bitsandbytes 8-bit checkpoints (load_in_8bit) are not supported; "
                         "supported: load_in_4bit with bnb_4bit_quant_type 'nf4'")
    if not (q.get("load_in_4bit") or q.get("_load_in_4bit")):
        raise ValueError("det-infer: quantization_config is bitsandbytes but not load_in_4bit; supported: 4-bit nf4")
    kind = q.get("bnb_4bit_quant_type", "fp4")
    if kind != "nf4":
        raise ValueError(f"det-infer: bnb_4bit_quant_type {kind!r} is not supported (only 'nf4')")
    storage = q.get("bnb_4bit_quant_storage", "uint8")
    if storage not in ("uint8", None):
        raise ValueError(f"det-infer: bnb_4bit_quant_storage {storage!r} is not supported (only 'uint8')")
    return "nf4"


MAX_STATE_BYTES = 1 << 16  # bitsandbytes writes about 200


def _state(name, tensors):
    raw = tensors[name + QUANT_STATE]
    if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() > MAX_STATE_BYTES:
        raise Nf4Error(f"det-infer: {name}{QUANT_STATE} must be a 1-d uint8 tensor of JSON bytes (at most "
                       f"{MAX_STATE_BYTES})")
    try:
        state = json.loads(raw.contiguous().numpy().tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise Nf4Error(f"det-infer: {name}{QUANT_STATE} is not valid JSON ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise Nf4Error(f"det-infer: {name}{QUANT_STATE} is not a JSON object")
    return state


def _finite_number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an integer beyond the float range
        return False


def _int_field(name, state, key, lo, hi):
    v = state.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise Nf4Error(f"det-infer: {name}: quant state field {key!r} = {v!r} must be an integer in [{lo}, {hi}]")
    return v


def _tensor(name, tensors, suffix, dtype, numel):
    key = name + suffix
    if key not in tensors:
        raise Nf4Error(f"det-infer: {name} is nf4 but {key!r} is missing from the checkpoint")
    t = tensors[key]
    if t.dtype != dtype or t.numel() != numel:
        raise Nf4Error(f"det-infer: {key} must be {dtype} with {numel} elements, got {t.dtype} with {t.numel()}")
    return t.reshape(-1).contiguous()


def _unpack_one(name, tensors, expected_shape):
    state = _state(name, tensors)
    if state.get("quant_type") != "nf4":
        raise Nf4Error(f"det-infer: {name} has quant_type {state.get('quant_type')!r}; only 'nf4' is supported")
    shape = state.get("shape")
    if list(expected_shape) != shape:
        raise Nf4Error(f"det-infer: {name} has quantized shape {shape!r}, the config needs {list(expected_shape)}")
    rows, cols = expected_shape
    n = rows * cols
    block = _int_field(name, state, "blocksize", MIN_BLOCK, MAX_BLOCK)
    if block & (block - 1) or cols % 2:
        raise Nf4Error(f"det-infer: {name}: blocksize {block} must be a power of two (and the row length {cols} "
                       "even)")
    codes = tensors[name]
    if codes.dtype != torch.uint8 or codes.numel() != n // 2:
        raise Nf4Error(f"det-infer: {name} must hold {n // 2} uint8 bytes of nf4 codes, got {codes.dtype} "
                       f"with {codes.numel()} elements")
    codebook = _tensor(name, tensors, ".quant_map", torch.float32, 16)
    if not torch.equal(codebook.view(torch.int32), ops.nf4_codebook().view(torch.int32)):
        raise Nf4Error(f"det-infer: {name}.quant_map is not the nf4 codebook of docs/SPEC.md §16")
    n_blocks = -(-n // block)  # the last block may be partial
    nested = name + ".nested_absmax" in tensors
    if nested:
        nb2 = _int_field(name, state, "nested_blocksize", 1, 1 << 20)
        offset = state.get("nested_offset")
        if not _finite_number(offset):
            raise Nf4Error(f"det-infer: {name}: nested_offset {offset!r} must be a finite number")
        q2 = _tensor(name, tensors, ".absmax", torch.uint8, n_blocks)
        absmax2 = _tensor(name, tensors, ".nested_absmax", torch.float32, -(-n_blocks // nb2))
        code2 = _tensor(name, tensors, ".nested_quant_map", torch.float32, 256)
        absmax = ops.nf4_nested_absmax(q2, code2, absmax2, nb2, float(offset))
    else:
        absmax = _tensor(name, tensors, ".absmax", torch.float32, n_blocks).clone()
    if not bool(torch.isfinite(absmax).all()):
        raise Nf4Error(f"det-infer: {name} has a non-finite absmax")
    return codes.reshape(rows, cols // 2), absmax


def unpack(tensors, shapes):
    """({name: tensor} with every quantized projection's codes as (rows, cols/2) uint8 and its
    auxiliary tensors removed, {name: fp32 absmax}). shapes: {weight name: (rows, cols)} of the
    projections that may be packed."""
    quantized = sorted(k[: -len(QUANT_STATE)] for k in tensors if k.endswith(QUANT_STATE))
    for name in quantized:
        if name not in shapes:
            raise Nf4Error(f"det-infer: {name} is nf4-quantized; only the layers' "
                           f"{', '.join(PACKABLE)} weights can be (the embeddings and lm_head must be bf16)")
    out = dict(tensors)
    scales = {}
    for name in quantized:
        if name not in tensors:
            raise Nf4Error(f"det-infer: the checkpoint has a quant state for {name} but not the tensor itself")
        out[name], scales[name] = _unpack_one(name, tensors, shapes[name])
        for suffix in _AUX:
            out.pop(name + suffix, None)
    return out, scales
