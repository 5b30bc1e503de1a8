"""MegaModel.update_weights: new weights for a loaded model without reading a checkpoint again (an
RL loop hands the trainer's tensors to the sampler after every optimizer step).

The tensors are taken by checkpoint name (names.py), any subset, bf16 / fp16 / fp32 on any
device, and turned into the engine's form exactly as a load does (names.engine_tensor: bf16
rounded once, norm multipliers, biases widened). Every name, dtype and shape is checked before
anything changes; then the model's weight list is rebuilt around the new tensors and bound to a
new native model in one step, so a failed update leaves the old weights in place and a good one
gives the logits of a fresh load of the new weights, bit for bit.

The engine keeps its own copy of every tensor it is given here (never a view of the caller's,
which an optimizer goes on changing). While an update runs, the replaced tensors exist twice.
"""
from collections.abc import Mapping

import torch

from . import names


class WeightUpdateError(ValueError):
    pass


def _check_model(mm):
    if mm.config.quantization == "nf4":
        raise WeightUpdateError("det-infer: update_weights does not take nf4 models (their projections are packed "
                                "4-bit codes); load the new checkpoint with from_pretrained, or use a bf16 model")
    if (mm.source or {}).get("format") == "gguf":
        raise WeightUpdateError("det-infer: update_weights does not take GGUF models (their weights are the "
                                "dequantized file); load the new file with from_gguf, or use a safetensors model")


def _own_copy(new, given):
    """new (already the engine's dtype and shape) on no storage the caller holds."""
    if new.untyped_storage().data_ptr() == given.untyped_storage().data_ptr():
        return new.clone()
    return new


def prepare(mm, tensors):
    """{index in mm's weight list: the engine's tensor on mm's device} for a {name: tensor} update,
    after checking every entry; a WeightUpdateError (a ValueError) or TypeError names the first bad one."""
    _check_model(mm)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"det-infer: update_weights takes a mapping of checkpoint names to tensors (a state "
                        f"dict), got {type(tensors).__name__}")
    cfg = mm.config
    entries = names.llama_tensor_names(cfg)
    index = {n: i for i, n in enumerate(entries) if "=" not in n}
    updates, tied_head = {}, None
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"det-infer: update_weights: tensor names must be strings, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"det-infer: update_weights: {name!r} must be a torch.Tensor, got {type(t).__name__}")
        if names.IGNORED.search(name):
            continue  # rotary buffers: recomputed exactly, as at load
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            tied_head = t  # a tied head in a state dict: must be the embedding (checked below)
            continue
        if name not in index:
            raise WeightUpdateError(f"det-infer: update_weights: {name!r} is not a weight of this {cfg.family} "
                                    "model (give checkpoint names, e.g. 'model.layers.0.self_attn.q_proj.weight')")
        t = t.detach()
        new = names.engine_tensor(cfg, name, t).to(mm.device)
        updates[index[name]] = _own_copy(new, t)
    if tied_head is not None:
        embed = index["model.embed_tokens.weight"]
        head = names.engine_tensor(cfg, "model.embed_tokens.weight", tied_head.detach()).to(mm.device)
        if not torch.equal(head, updates.get(embed, mm._weights[embed])):
            raise WeightUpdateError("det-infer: update_weights: 'lm_head.weight' differs from the embedding, but this "
                                    "model ties them (tie_word_embeddings); give the embedding only")
    return updates
