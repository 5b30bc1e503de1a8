// engine_digest.cpp: the torch-free CPU engine core on its own, for the portability rows
// (tests/test_engine_portability.py): reads a model and its certificate inputs from a binary dump
// written by the test, runs the teacher-forced pass and the greedy generation of
// tests/certification.py, and writes the raw results to stdout: the teacher-forced logits
// (n x vocab fp32), then the generated tokens (int32) and each step's logits (fp32). The test
// hashes them and compares with the pinned digests. Built with several compilers and for aarch64.
//
// Dump (little-endian): "DETM", int64 n + n int64 config ints (torch-ext/det_infer/config.py
// engine_ints: LLAMA_CFG_FIELDS, then window and rope table per layer), float64 eps, int64 n + n
// float64 inverse frequencies, int64 tensor count, each tensor as int64 byte count + its bytes
// (canonical order of names.py: bf16 matrices, fp32 norm multipliers), then int64 n + int32
// teacher ids, int64 n + int32 prompt ids, int64 max_new.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "det_infer_cpu/det_llama_cpu.h"

namespace {

FILE* in;

void need(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "engine_digest: bad dump (%s)\n", what);
    exit(2);
  }
}
int64_t read_i64() {
  int64_t v;
  need(fread(&v, 8, 1, in) == 1, "int64");
  return v;
}
template <typename T>
std::vector<T> read_array(int64_t n) {
  need(n >= 0 && n < ((int64_t)1 << 32), "array length");
  std::vector<T> v(n);
  need(fread(v.data(), sizeof(T), n, in) == (size_t)n, "array");
  return v;
}
void write_all(const void* p, size_t bytes) { need(fwrite(p, 1, bytes, stdout) == bytes, "write"); }

}  // namespace

int main(int argc, char** argv) {
  need(argc == 2 && (in = fopen(argv[1], "rb")) != nullptr, "usage: engine_digest DUMP");
  char magic[4];
  need(fread(magic, 1, 4, in) == 4 && memcmp(magic, "DETM", 4) == 0, "magic");
  const std::vector<int64_t> cfg = read_array<int64_t>(read_i64());
  need(cfg.size() >= 15 && (int64_t)cfg.size() == 15 + 2 * cfg[1], "config");
  double eps;
  need(fread(&eps, 8, 1, in) == 1, "eps");
  det_llama_model m{};
  m.hidden = cfg[0], m.n_layers = cfg[1], m.n_heads = cfg[2], m.n_kv_heads = cfg[3], m.head_dim = cfg[4];
  m.inter = cfg[5], m.vocab = cfg[6], m.rope_pairs = cfg[7], m.rope_tables = cfg[8], m.rms_eps = (float)eps;
  const bool qk = cfg[9] != 0, tied = cfg[10] != 0, out_norms = cfg[11] != 0;
  m.act = cfg[12], m.attn_scale_dim = cfg[13], m.embed_scale = cfg[14] ? sqrtf((float)m.hidden) : 1.0f;
  const std::vector<double> inv_freq = read_array<double>(read_i64());
  need((int64_t)inv_freq.size() == m.rope_tables * m.rope_pairs, "inv_freq");
  m.inv_freq = inv_freq.data();
  std::vector<std::vector<uint8_t>> t(read_i64());
  for (auto& x : t) x = read_array<uint8_t>(read_i64());
  auto bf16 = [&](size_t i) { return (const uint16_t*)t[i].data(); };
  auto f32 = [&](size_t i) { return (const float*)t[i].data(); };
  const size_t per_layer = 9 + (qk ? 2 : 0) + (out_norms ? 2 : 0), head = tied ? 2 : 3;
  need(t.size() == head + per_layer * m.n_layers, "tensor count");
  m.embed = bf16(0), m.final_norm = f32(1), m.lm_head = tied ? m.embed : bf16(2);
  std::vector<det_llama_layer> layers(m.n_layers);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    size_t i = head + l * per_layer;
    det_llama_layer& L = layers[l];
    L.attn_norm = f32(i++), L.wq.bf16 = bf16(i++), L.wk.bf16 = bf16(i++), L.wv.bf16 = bf16(i++);
    L.wo.bf16 = bf16(i++);
    L.q_norm = qk ? f32(i++) : nullptr;
    L.k_norm = qk ? f32(i++) : nullptr;
    L.attn_out_norm = out_norms ? f32(i++) : nullptr;
    L.mlp_norm = f32(i++), L.w_gate.bf16 = bf16(i++), L.w_up.bf16 = bf16(i++);
    L.w_down.bf16 = bf16(i++);
    L.mlp_out_norm = out_norms ? f32(i++) : nullptr;
    L.window = cfg[15 + 2 * l], L.rope_table = cfg[16 + 2 * l];
  }
  m.layers = layers.data();
  const std::vector<int32_t> teacher = read_array<int32_t>(read_i64()), prompt = read_array<int32_t>(read_i64());
  const int64_t max_new = read_i64(), V = m.vocab, KVD = m.n_kv_heads * m.head_dim;

  auto cache = [&](int64_t cap, std::vector<float>& store) {
    store.assign(2 * m.n_layers * cap * KVD, 0.0f);
    return det_kv_cache{store.data(), store.data() + m.n_layers * cap * KVD, cap};
  };
  std::vector<float> store;
  det_kv_cache c = cache((int64_t)teacher.size(), store);
  std::vector<det_kv_cache*> rows(teacher.size(), &c);
  std::vector<int64_t> pos(teacher.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = (int64_t)i;
  std::vector<float> logits(teacher.size() * V);
  need(det_llama_forward(&m, (int64_t)teacher.size(), teacher.data(), pos.data(), rows.data(), nullptr,
                         logits.data()) == DET_OK, "forward");
  write_all(logits.data(), logits.size() * 4);

  det_kv_cache g = cache((int64_t)prompt.size() + max_new, store);
  det_kv_cache* gp = &g;
  const int64_t offsets[2] = {0, (int64_t)prompt.size()}, start = 0;
  std::vector<int32_t> tokens(max_new);
  int64_t length = 0;
  std::vector<float> steps(max_new * V);
  need(det_llama_generate(&m, 1, prompt.data(), offsets, &start, &gp, max_new, nullptr, 0, nullptr, tokens.data(),
                          &length, steps.data()) == DET_OK && length == max_new, "generate");
  write_all(tokens.data(), tokens.size() * 4);
  write_all(steps.data(), steps.size() * 4);
  return 0;
}
