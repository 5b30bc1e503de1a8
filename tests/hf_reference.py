"""transformers' own implementation of a checkpoint, run in float64 on the same bf16 weights: the
correctness oracle. Rope is recomputed in float64 from det-infer's exact table (transformers
evaluates cos/sin in fp32 even in a float64 model), so the comparison measures the engine, not
transformers' fp32 rope."""
import copy
import json
import os

import torch


def _float64_norms(model):
    """Gemma-4's RMSNorm computes in fp32 even in a float64 model: make it float64 throughout."""
    for module in model.modules():
        if type(module).__name__ == "Gemma4RMSNorm":
            def forward(x, m=module):
                y = m._norm(x)
                return y * m.weight if m.with_scale else y
            module.forward = forward


def load_float64(directory, inv_freq, det_config=None):
    """det_config: the det-infer ModelConfig, whose rope tables (pairs, pair offset) the reference's
    rope replaces transformers' with; needed for models with two tables."""
    import transformers
    from safetensors.torch import load_file

    with open(os.path.join(directory, "config.json")) as f:
        cfg_dict = json.load(f)
    arch = cfg_dict["architectures"][0]
    config = transformers.AutoConfig.for_model(**copy.deepcopy(cfg_dict))
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
    _float64_norms(model)
    # Gemma's tables, concatenated as ModelConfig.inv_freq() does: [full layers, sliding layers],
    # each padded with zero frequencies to half its head size (transformers' rotate-half layout).
    tables = None
    if det_config is not None and det_config.local_rope_parameters:
        tables, start = {}, 0
        for kind, (pairs, half) in zip(("full_attention", "sliding_attention"), det_config.rope_table_shapes()):
            f = inv_freq.to(torch.float64)[start:start + pairs]
            tables[kind] = torch.cat([f, torch.zeros(half - pairs, dtype=torch.float64)])
            start += pairs

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
