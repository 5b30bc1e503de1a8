// det_philox.h: the counter-based generator of seeded sampling (docs/SPEC.md §15, step 6):
// Philox4x32-10 (Salmon et al., SC'11), integer-only, so every device draws the same bits. The draw
// for a token is keyed by the user's 64-bit seed and counted by the token's absolute position,
// never by batch slot or call: a sequence samples the same alone, in a batch, in one launch or per
// step.
#pragma once

#include "det_round.h"

struct det_u32x4 {
  uint32_t v[4];
};

DET_HD det_u32x4 det_philox4x32_10(det_u32x4 ctr, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    const uint64_t p0 = (uint64_t)0xD2511F53u * ctr.v[0], p1 = (uint64_t)0xCD9E8D57u * ctr.v[2];
    ctr = {{(uint32_t)(p1 >> 32) ^ ctr.v[1] ^ k0, (uint32_t)p1, (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ k1, (uint32_t)p0}};
  }
  return ctr;
}

// A uniform fp32 in [0, 1) with 24 random bits (exact: an integer below 2^24 times 2^-24).
DET_HD float det_sample_uniform(uint64_t seed, int64_t position) {
  const det_u32x4 ctr = {{(uint32_t)(uint64_t)position, (uint32_t)((uint64_t)position >> 32), 0u, 0u}};
  const det_u32x4 r = det_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
  return det_mul_f32((float)(r.v[0] >> 8), 0x1.0p-24f);
}
