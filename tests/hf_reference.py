"""transformers' own implementation of a checkpoint, run in float64 on the same bf16 weights: the
correctness oracle. Rope is recomputed in float64 from det-infer's exact table (transformers
evaluates cos/sin in fp32 even in a float64 model), so the comparison measures the engine, not
transformers' fp32 rope."""
import json
import os

import torch


def load_float64(directory, inv_freq):
    import transformers
    from safetensors.torch import load_file

    with open(os.path.join(directory, "config.json")) as f:
        cfg_dict = json.load(f)
    arch = cfg_dict["architectures"][0]
    config = transformers.AutoConfig.for_model(**cfg_dict)
    model = getattr(transformers, arch)(config).eval()
    sd = {k: v.to(torch.float64) for k, v in load_file(os.path.join(directory, "model.safetensors")).items()}
    model = model.to(torch.float64)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all("rotary" in m or (m == "lm_head.weight" and config.tie_word_embeddings) for m in missing), missing
    if config.tie_word_embeddings:
        model.tie_weights()
    model.config._attn_implementation = "eager"
    rot = model.model.rotary_emb
    # Gemma's tables, concatenated as ModelConfig.inv_freq() does: [full layers, sliding layers].
    tables = dict(zip(("full_attention", "sliding_attention"), inv_freq.to(torch.float64).chunk(2))) \
        if hasattr(rot, "layer_types") else None

    def forward(x, position_ids, layer_type=None):
        exact = tables[layer_type] if tables else inv_freq.to(torch.float64)
        freqs = position_ids[..., None].to(torch.float64) * exact
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rot.forward = forward
    return model


@torch.no_grad()
def logits_float64(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0]
