"""nf4 checkpoints of the synthetic models, written the way transformers saves a bitsandbytes 4-bit
model (each projection's packed codes plus its QuantState.as_dict(packed=True) tensors), and the
dense bf16 twin whose projections are bitsandbytes' own dequantization of those codes.

bitsandbytes 0.50.2's CPU dequantize_4bit (its AVX-512 kernel) reads the absmax of the wrong
block when a row length is not a multiple of the blocksize (measured: tests/test_nf4.py,
test_bitsandbytes_cpu_kernel_disagrees_across_rows). Its reference implementation
(backends/default/ops.py, _dequantize_4bit_compute: flat blocks, fp32 product, one rounding to
the output dtype, as its CUDA kernel) is what bnb_dequantize uses.
"""
import json
import os

from det_fixtures import synthetic
from det_fixtures.contract_inputs import splitmix64
import torch

QUANT_STATE = ".quant_state.bitsandbytes__nf4"


def bnb_dequantize(codes, state):
    """bitsandbytes' dequantize_4bit of (codes, QuantState) to bf16, through its reference compute."""
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

    absmax = state.absmax
    if state.nested:
        absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    return _dequantize_4bit_compute(codes.reshape(-1), absmax.float(), state.code, state.blocksize, state.shape,
                                    torch.bfloat16)


def quantize(t, blocksize, nested):
    import bitsandbytes.functional as F

    return F.quantize_4bit(t, blocksize=blocksize, quant_type="nf4", compress_statistics=nested,
                           quant_storage=torch.uint8)


def write_pair(family, directory, blocksize=64, nested=False, seed=0):
    """(nf4 directory, dense directory) for a synthetic model."""
    from safetensors.torch import save_file

    dense = synthetic.state_dict(family, seed)
    packed = {}
    for name, t in dense.items():
        if not name.endswith("_proj.weight"):
            packed[name] = t
            continue
        codes, state = quantize(t, blocksize, nested)
        packed[name] = codes
        for key, value in state.as_dict(packed=True).items():
            packed[f"{name}.{key}"] = value
        dense[name] = bnb_dequantize(codes, state)
    config = dict(synthetic.CONFIGS[family])
    out = {}
    for kind, sd in (("nf4", packed), ("dense", dense)):
        d = os.path.join(directory, f"{family}-{kind}-{blocksize}{'-nested' if nested else ''}")
        os.makedirs(d, exist_ok=True)
        cfg = dict(config)
        if kind == "nf4":
            cfg["quantization_config"] = {
                "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": nested,
                "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"))
        out[kind] = d
    return out["nf4"], out["dense"]


def write_packed(family, directory, codebook, blocksize=64, seed=0):
    """An nf4 checkpoint of a synthetic model without bitsandbytes (for machines that lack it):
    codes and absmax from the seeded generator, in the same tensor layout."""
    from safetensors.torch import save_file

    sd = synthetic.state_dict(family, seed)
    for name in [n for n in sd if n.endswith("_proj.weight")]:
        rows, cols = sd[name].shape
        n = rows * cols
        raw = splitmix64(synthetic._seed(name + ".codes", seed), n // 2)
        sd[name] = torch.from_numpy((raw & 0xFF).astype("uint8")).reshape(-1, 1)
        absmax = synthetic.irwin_hall_bf16(name + ".absmax", (-(-n // blocksize),), -3, 0.5, seed).float()
        state = {"quant_type": "nf4", "blocksize": blocksize, "dtype": "bfloat16", "shape": [rows, cols]}
        sd[name + ".absmax"] = absmax
        sd[name + ".quant_map"] = codebook.clone()
        sd[name + QUANT_STATE] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
    cfg = dict(synthetic.CONFIGS[family])
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                  "bnb_4bit_quant_type": "nf4", "bnb_4bit_quant_storage": "uint8"}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(sd, os.path.join(directory, "model.safetensors"))
    return directory
