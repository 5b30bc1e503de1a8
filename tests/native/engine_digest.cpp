// engine_digest.cpp: the torch-free CPU engine core on its own, for the portability rows
// (tests/test_engine_portability.py): reads a model and its certificate inputs from a binary dump
// written by the test, runs the teacher-forced pass and the greedy generation of
// tests/certification.py, and writes the raw results to stdout: the teacher-forced logits
// (n x vocab fp32), then the generated tokens (int32) and each step's logits (fp32). The test
// hashes them and compares with the pinned digests. Built with several compilers and for aarch64.
//
// Dump (little-endian): "DETM", 11 int64 config fields (torch-ext/det_infer/config.py order),
// float64 eps, rope_pairs float64 inverse frequencies, int64 tensor count, each tensor as int64
// element count + bf16 bits (canonical order of names.py), then int64 n + int32 teacher ids,
// int64 n + int32 prompt ids, int64 max_new.
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
  int64_t cfg[11];
  for (int64_t& c : cfg) c = read_i64();
  double eps;
  need(fread(&eps, 8, 1, in) == 1, "eps");
  det_llama_model m{};
  m.hidden = cfg[0], m.n_layers = cfg[1], m.n_heads = cfg[2], m.n_kv_heads = cfg[3], m.head_dim = cfg[4];
  m.inter = cfg[5], m.vocab = cfg[6], m.rope_pairs = cfg[7], m.sliding_window = cfg[8], m.rms_eps = (float)eps;
  const bool qk = cfg[9] != 0, tied = cfg[10] != 0;
  const std::vector<double> inv_freq = read_array<double>(m.rope_pairs);
  m.inv_freq = inv_freq.data();
  std::vector<std::vector<uint16_t>> t(read_i64());
  for (auto& x : t) x = read_array<uint16_t>(read_i64());
  const size_t per_layer = qk ? 11 : 9, head = tied ? 2 : 3;
  need(t.size() == head + per_layer * m.n_layers, "tensor count");
  m.embed = t[0].data(), m.final_norm = t[1].data(), m.lm_head = tied ? m.embed : t[2].data();
  std::vector<det_llama_layer> layers(m.n_layers);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    size_t i = head + l * per_layer;
    det_llama_layer& L = layers[l];
    L.attn_norm = t[i++].data(), L.wq.bf16 = t[i++].data(), L.wk.bf16 = t[i++].data(), L.wv.bf16 = t[i++].data();
    L.wo.bf16 = t[i++].data();
    L.q_norm = qk ? t[i++].data() : nullptr;
    L.k_norm = qk ? t[i++].data() : nullptr;
    L.mlp_norm = t[i++].data(), L.w_gate.bf16 = t[i++].data(), L.w_up.bf16 = t[i++].data();
    L.w_down.bf16 = t[i++].data();
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
