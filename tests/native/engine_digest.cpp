// engine_digest.cpp: the torch-free CPU engine core on its own, for the portability rows
// (tests/test_engine_portability.py): reads a model and its certificate inputs from a binary dump
// written by the test, runs the teacher-forced pass and the greedy generation of
// det_fixtures/certification.py, and writes the raw results to stdout: the teacher-forced logits
// (n x vocab fp32), then the generated tokens (int32) and each step's logits (fp32). The test
// hashes them and compares with the pinned digests. Built with several compilers and for aarch64.
//
// Dump (little-endian): "DETM", int64 n + n int64 config ints (torch-ext/det_infer/config.py
// engine_ints: LLAMA_CFG_FIELDS, then (pairs, pair offset) per rope table, then LAYER_FIELDS per
// layer), float64 eps, int64 n + n float64 inverse frequencies, int64 tensor count, each tensor as
// int64 byte count + its bytes (canonical order of names.py: bf16 matrices, fp32 norm multipliers
// and the softcap / layer scalars), then int64 n + int32 teacher ids, int64 n + int32 prompt ids,
// int64 max_new.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "det_infer_cpu/det_llama_cpu.h"
#include "model/det_model_cfg.h"

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
  need(det_cfg_well_formed(cfg.data(), cfg.size()), "config");
  double eps;
  need(fread(&eps, 8, 1, in) == 1, "eps");
  const std::vector<double> inv_freq = read_array<double>(read_i64());
  std::vector<std::vector<uint8_t>> t(read_i64());
  for (auto& x : t) x = read_array<uint8_t>(read_i64());
  // The tensors in order, each of the byte size its shape says (dense bf16 projections only).
  struct Taker {
    std::vector<std::vector<uint8_t>>& t;
    size_t i = 0;
    const uint8_t* next(int64_t bytes) {
      need(i < t.size() && (int64_t)t[i].size() == bytes, "tensor size");
      return t[i++].data();
    }
    const uint16_t* bf16(int64_t rows, int64_t cols, const std::string&) { return (const uint16_t*)next(2 * rows * cols); }
    det_matrix matrix(int64_t rows, int64_t cols, const std::string& what) { return det_dense_matrix(bf16(rows, cols, what)); }
    const float* norm(int64_t n, const std::string&) { return (const float*)next(4 * n); }
  } take{t};
  det_llama_model m{};
  det_model_storage storage;
  det_model_from_cfg(cfg.data(), m, storage, take);
  need(take.i == t.size() && (int64_t)inv_freq.size() == m.rope_pairs, "tensor count");
  m.rms_eps = (float)eps, m.inv_freq = inv_freq.data();
  need(det_llama_model_valid(&m), "model");
  const std::vector<int32_t> teacher = read_array<int32_t>(read_i64()), prompt = read_array<int32_t>(read_i64());
  const int64_t max_new = read_i64(), V = m.vocab;

  auto cache = [&](int64_t cap, std::vector<float>& store) {
    store.assign(2 * cap * m.kv_row, 0.0f);
    return det_kv_cache{store.data(), store.data() + cap * m.kv_row, cap};
  };
  std::vector<float> store;
  det_kv_cache c = cache((int64_t)teacher.size(), store);
  det_kv_cache* cp = &c;
  std::vector<int32_t> seq(teacher.size(), 0);
  std::vector<int64_t> pos(teacher.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = (int64_t)i;
  std::vector<float> logits(teacher.size() * V);
  need(det_llama_forward(&m, (int64_t)teacher.size(), teacher.data(), pos.data(), seq.data(), &cp, 1, nullptr,
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
