// det_model_ops.h: the model's per-element formulas outside the layer's matrix products
// (docs/SPEC.md §13.3 step 1, §13.7): the embedding's widening and scale and Gemma-4's
// per-layer-input combine. Every executor calls these; none spells them out.
#pragma once

#include "det_bf16.h"
#include "det_rsqrt.h"

// Element of a token's embedding row: fl(bf16 value * embed_scale).
DET_HD float det_embed_f32(uint16_t e, float embed_scale) { return det_mul_f32(det_bf16_to_f32(e), embed_scale); }

// Gemma-4's per-layer-input constants for hidden size H and slice width P: the projection's
// scale rsqrt(H), the per-layer embedding's scale sqrt(P) (correctly rounded) and rsqrt(2).
struct det_ple_scales {
  float proj, embed, half;
};
DET_HD det_ple_scales det_ple_scales_of(int64_t H, int64_t P) {
  return {det_rsqrt_f32((float)H), det_sqrt_f32((float)P), det_rsqrt_f32(2.0f)};
}

// One element of a layer's per-layer input: fl(fl(y + fl(e * sqrt(P))) * rsqrt(2)), y the
// normalized projection, e the token's per-layer embedding (bf16).
DET_HD float det_ple_combine_f32(float y, uint16_t e, const det_ple_scales& s) {
  return det_mul_f32(det_add_f32(y, det_embed_f32(e, s.embed)), s.half);
}
