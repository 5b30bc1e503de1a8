// emulation_harness.cpp: the megakernel under host SIMT emulation against the CPU engine, torch-free,
// built with AddressSanitizer and UBSan by tests/test_emulation_sanitized.py: every out-of-bounds
// access of the device code (or the engine) on the way is reported. Small llama-family models with
// seeded bf16 weights (with and without qk-norm, with a sliding window; projections dense or nf4-packed
// in exactly sized buffers, blocks of 16 and of 8), several programs (two
// sequences interleaved, a prefill crossing a 128-position chunk, generation with a stop id) and
// several geometries, greedy and sampled; every emulated result must equal the engine's bit for bit.
// A Gemma-4 layout adds per-layer head sizes (one above 256, not a multiple of 256), MLP widths, KV
// sharing, v norm, proportional rope, per-layer inputs, layer scalars and a softcapped head.
// Prints "ok <cases>" or the first mismatch, and exits non-zero on a mismatch.
#include <string>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "det_infer_cpu/det_llama_cpu.h"
#include "emulation_models.h"
#include "megakernel/det_megakernel.h"

namespace {

int failures = 0, cases = 0;

void expect_equal(const void* a, const void* b, size_t bytes, const char* what, const det_mk_geometry& g) {
  ++cases;
  if (memcmp(a, b, bytes) == 0) return;
  ++failures;
  printf("MISMATCH %s at geometry grid %d warps %d ring %d tile %d attn %d ahead %d barrier %d outs %d stage %d "
         "area_rows %d seed %llu\n", what, g.grid, g.warps, g.ring, g.tile_rows, g.attn, g.ahead, g.barrier, g.outs,
         g.stage, g.area_rows, (unsigned long long)g.seed);
}

det_mk_params params(const Model& M, std::vector<unsigned char>& ws, const det_mk_geometry& g) {
  det_mk_params p{};
  p.model = M.m;
  ws.assign(det_mk_workspace_bytes(&M.m, g.tile_rows) + 16, 0);
  p.ws = det_mk_workspace_carve(&M.m, g.tile_rows, ws.data());
  p.geo = g;
  return p;
}

// Two sequences' rows interleaved (seq 0: 150 positions, crossing a chunk; seq 1: 20), all wanted.
void forward_case(const Model& M, const det_mk_geometry& g) {
  const int64_t V = M.m.vocab, cap = 160;
  std::vector<int32_t> tok, seq;
  std::vector<int64_t> pos;
  int64_t next[2] = {0, 0};
  for (int i = 0; i < 170; ++i) {
    const int s = (i % 8 == 3 && next[1] < 20) ? 1 : (next[0] < 150 ? 0 : 1);
    tok.push_back((int32_t)(next_u32() % V));
    seq.push_back(s);
    pos.push_back(next[s]++);
  }
  std::vector<uint8_t> want(tok.size(), 1);
  Caches ce(M.m, 2, cap), cm(M.m, 2, cap);
  std::vector<det_kv_cache*> caches = {&ce.views[0], &ce.views[1]};
  std::vector<float> a(tok.size() * V), b(tok.size() * V);
  if (det_llama_forward(&M.m, (int64_t)tok.size(), tok.data(), pos.data(), seq.data(), caches.data(), 2, want.data(),
                        a.data())) {
    printf("engine refused the program\n");
    ++failures;
    return;
  }
  std::vector<det_mk_seq> seqs;
  for (auto& v : cm.views) seqs.push_back({v.k, v.v, v.capacity});
  std::vector<unsigned char> ws;
  det_mk_params p = params(M, ws, g);
  p.prog.n_rows = (int64_t)tok.size();
  p.prog.tokens = tok.data(), p.prog.positions = pos.data(), p.prog.seq = seq.data(), p.prog.want = want.data();
  p.prog.n_seq = 2, p.prog.seqs = seqs.data(), p.prog.logits = b.data();
  const int rc = det_mk_run_emulated(&p);
  if (rc != DET_MK_OK) printf("emulation failed: %d\n", rc), ++failures;
  expect_equal(a.data(), b.data(), a.size() * 4, "forward logits", g);
  expect_equal(ce.k[0].data(), cm.k[0].data(), ce.k[0].size() * 4, "KV cache", g);
}

// Three prompts, 12 new tokens, a stop id taken from the engine's own free-running stream; the
// first sequence greedy, the others sampled (docs/SPEC.md §15).
void generate_case(const Model& M, const det_mk_geometry& g) {
  const int64_t V = M.m.vocab, max_new = 12, B = 3;
  const det_sample_params sample[3] = {{0.0f, 0, 1.0f, 0.0f, 0}, {0.9f, 0, 1.0f, 0.0f, 11}, {1.1f, 30, 0.8f, 0.01f, 12}};
  std::vector<int32_t> prompts;
  std::vector<int64_t> offsets = {0}, starts(B, 0);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < 5 + 7 * b; ++i) prompts.push_back((int32_t)(next_u32() % V));
    offsets.push_back((int64_t)prompts.size());
  }
  auto engine = [&](const int32_t* stops, int64_t n_stop, std::vector<int32_t>& out, std::vector<int64_t>& len,
                    std::vector<float>& lg) {
    Caches c(M.m, B, 64);
    std::vector<det_kv_cache*> ptrs;
    for (auto& v : c.views) ptrs.push_back(&v);
    out.assign(B * max_new, -1), len.assign(B, 0), lg.assign(B * max_new * V, 0.0f);
    det_llama_generate(&M.m, B, prompts.data(), offsets.data(), starts.data(), ptrs.data(), max_new, stops, n_stop,
                       sample, out.data(), len.data(), lg.data());
  };
  std::vector<int32_t> free_tok, want_tok;
  std::vector<int64_t> free_len, want_len;
  std::vector<float> free_lg, want_lg;
  engine(nullptr, 0, free_tok, free_len, free_lg);
  const int32_t stop = free_tok[1 * max_new + 4];
  engine(&stop, 1, want_tok, want_len, want_lg);

  std::vector<int32_t> tok, seq;
  std::vector<int64_t> pos;
  std::vector<uint8_t> want;
  for (int b = 0; b < B; ++b)
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i)
      tok.push_back(prompts[i]), seq.push_back(b), pos.push_back(i - offsets[b]), want.push_back(i == offsets[b + 1] - 1);
  // With the step logits returned, and without (the kernel then keeps them in its workspace).
  for (bool with_logits : {true, false}) {
    std::vector<int32_t> out(B * max_new, -1);
    std::vector<int64_t> len(B, 0);
    std::vector<float> lg(B * max_new * V, 0.0f);
    std::vector<unsigned char> ws;
    Caches fresh(M.m, B, 64);
    std::vector<det_mk_seq> fresh_seqs;
    for (auto& v : fresh.views) fresh_seqs.push_back({v.k, v.v, v.capacity});
    det_mk_params p = params(M, ws, g);
    p.prog.n_rows = (int64_t)tok.size();
    p.prog.tokens = tok.data(), p.prog.positions = pos.data(), p.prog.seq = seq.data(), p.prog.want = want.data();
    p.prog.n_seq = B, p.prog.seqs = fresh_seqs.data(), p.prog.max_new = max_new, p.prog.stop_ids = &stop;
    p.prog.n_stop = 1, p.prog.sample = sample, p.prog.out_tokens = out.data(), p.prog.out_lengths = len.data();
    p.prog.step_logits = with_logits ? lg.data() : nullptr;
    if (det_mk_run_emulated(&p) != DET_MK_OK) printf("emulation failed\n"), ++failures;
    expect_equal(want_len.data(), len.data(), B * 8, "generation lengths", g);
    for (int b = 0; b < B; ++b) {
      expect_equal(&want_tok[b * max_new], &out[b * max_new], want_len[b] * 4, "generated tokens", g);
      if (with_logits)
        expect_equal(&want_lg[b * max_new * V], &lg[b * max_new * V], want_len[b] * V * 4, "step logits", g);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // "quick" (CI): each model in two of the four geometries, rotating so that every geometry still
  // runs, and Gemma-4 in one; no argument: every model in every geometry (the opt-in slow test).
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  // The third: a prompt tile of 128 rows (the forward case's 170 rows of two sequences in 128 + 42),
  // the normalizing phases 32 rows at a time (area_rows), each GEMV 16 at a time against 4 weight
  // rows (outs 4: 64 accumulators a lane).
  const det_mk_geometry geometries[] = {{1, 1, 2, 1, 0}, {2, 2, 4, 4, 3, 1, 8, 1, 4, 1},
                                        {3, 1, 2, 128, 7, 0, 4, 1, 4, 0, 32},
                                        {5, 2, 4, 2, 9, 32, 1, 0, 4, 1}};  // the last: ahead (KB), barrier, outs,
                                                                          // stage, area_rows
  for (int variant = 0; variant < 5; ++variant) {
    const bool gemma = variant == 4;
    Model M(variant % 2 == 1 || gemma, variant % 2 == 1 || gemma ? 40 : 0, variant == 2 ? 4 : variant == 3 ? 3 : 0,
            gemma);
    for (int gi = 0; gi < 4; ++gi) {
      if (quick && gi != variant % 4 && gi != (variant + 2) % 4) continue;
      forward_case(M, geometries[gi]);
      generate_case(M, geometries[gi]);
    }
  }
  const Gemma4Model G;
  for (int gi : {1, 2}) {
    if (quick && gi != 1) continue;
    forward_case(G, geometries[gi]);
    generate_case(G, geometries[gi]);
  }
  printf("%s %d\n", failures ? "FAILED" : "ok", cases);
  return failures ? 1 : 0;
}
