// emulation_modes.cpp: the megakernel under the SIMT emulation's stricter modes
// (DET_SIMT_MODES, megakernel/host/det_simt_host.cpp) gives the same bits as under the default
// emulation, which tests/native/emulation_harness.cpp holds equal to the CPU engine. Built by
// tests/test_emulation_modes.py with AddressSanitizer (deferred async copies, poisoned and exactly
// sized shared memory: a read of an in-flight copy or past the shared memory is a report), with
// ThreadSanitizer (a thread per block, the real grid barrier: a missing edge between blocks is a
// report) and for aarch64 under qemu-user. Each case runs under every mode list given on the
// command line and prints a digest of all its outputs; the test compares them with the default
// emulation's, from a plain build on this host.
//   emulation_modes [--cases=DIGITS] MODES...    e.g. emulation_modes --cases=03 default strict
// Prints "case<i> <modes> <rc> <digest>" per case and mode; exits non-zero when a launch failed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "emulation_models.h"
#include "megakernel/det_megakernel.h"

namespace {

struct Bytes {
  std::vector<unsigned char> b;
  void add(const void* p, size_t n) {
    const size_t at = b.size();
    b.resize(at + n);
    memcpy(b.data() + at, p, n);
  }
};

// Two sequences' rows interleaved (seq 0: 140 positions, crossing a 128-position chunk; seq 1: 12):
// every row's logits and the KV caches.
struct Forward {
  std::vector<int32_t> tok, seq;
  std::vector<int64_t> pos;
  Forward(const Model& M) {
    int64_t next[2] = {0, 0};
    for (int i = 0; i < 152; ++i) {
      const int s = (i % 8 == 3 && next[1] < 12) ? 1 : (next[0] < 140 ? 0 : 1);
      tok.push_back((int32_t)(next_u32() % M.m.vocab));
      seq.push_back(s);
      pos.push_back(next[s]++);
    }
  }
  Bytes run(const Model& M, const det_mk_geometry& g, int& rc) const {
    const int64_t V = M.m.vocab;
    std::vector<uint8_t> want(tok.size(), 1);
    Caches c(M.m, 2, 144);
    std::vector<det_mk_seq> seqs;
    for (auto& v : c.views) seqs.push_back({v.k, v.v, v.capacity});
    std::vector<float> logits(tok.size() * V);
    std::vector<unsigned char> ws(det_mk_workspace_bytes(&M.m, g.tile_rows) + 16, 0);
    det_mk_params p{};
    p.model = M.m, p.geo = g, p.ws = det_mk_workspace_carve(&M.m, g.tile_rows, ws.data());
    p.prog.n_rows = (int64_t)tok.size();
    p.prog.tokens = tok.data(), p.prog.positions = pos.data(), p.prog.seq = seq.data(), p.prog.want = want.data();
    p.prog.n_seq = 2, p.prog.seqs = seqs.data(), p.prog.logits = logits.data();
    rc = det_mk_run_emulated(&p);
    Bytes out;
    out.add(logits.data(), logits.size() * 4);
    for (int s = 0; s < 2; ++s) {
      out.add(c.k[s].data(), c.k[s].size() * 4);
      out.add(c.v[s].data(), c.v[s].size() * 4);
    }
    return out;
  }
};

// Three prompts, 6 new tokens each, one greedy and two sampled, a stop id: tokens, lengths and
// step logits.
struct Generate {
  std::vector<int32_t> tok, seq;
  std::vector<int64_t> pos;
  std::vector<uint8_t> want;
  static constexpr int B = 3, max_new = 6;
  Generate(const Model& M) {
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < 4 + 5 * b; ++i)
        tok.push_back((int32_t)(next_u32() % M.m.vocab)), seq.push_back(b), pos.push_back(i),
            want.push_back(i == 3 + 5 * b);
  }
  Bytes run(const Model& M, const det_mk_geometry& g, int& rc) const {
    const int64_t V = M.m.vocab;
    const det_sample_params sample[B] = {
        {0.0f, 0, 1.0f, 0.0f, 0}, {0.9f, 0, 1.0f, 0.0f, 11}, {1.1f, 30, 0.8f, 0.01f, 12}};
    const int32_t stop = 7;
    Caches c(M.m, B, 32);
    std::vector<det_mk_seq> seqs;
    for (auto& v : c.views) seqs.push_back({v.k, v.v, v.capacity});
    std::vector<int32_t> out(B * max_new, -1);
    std::vector<int64_t> len(B, 0);
    std::vector<float> lg(B * max_new * V, 0.0f);
    std::vector<unsigned char> ws(det_mk_workspace_bytes(&M.m, g.tile_rows) + 16, 0);
    det_mk_params p{};
    p.model = M.m, p.geo = g, p.ws = det_mk_workspace_carve(&M.m, g.tile_rows, ws.data());
    p.prog.n_rows = (int64_t)tok.size();
    p.prog.tokens = tok.data(), p.prog.positions = pos.data(), p.prog.seq = seq.data(), p.prog.want = want.data();
    p.prog.n_seq = B, p.prog.seqs = seqs.data(), p.prog.max_new = max_new, p.prog.stop_ids = &stop;
    p.prog.n_stop = 1, p.prog.sample = sample, p.prog.out_tokens = out.data(), p.prog.out_lengths = len.data();
    p.prog.step_logits = lg.data();
    rc = det_mk_run_emulated(&p);
    Bytes o;
    o.add(out.data(), out.size() * 4), o.add(len.data(), len.size() * 8), o.add(lg.data(), lg.size() * 4);
    return o;
  }
};

uint64_t fnv1a(const Bytes& x) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : x.b) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

int failures = 0;

// One line per mode: "<case> <mode> <rc> <fnv-1a of every output byte>".
template <class Case>
void run_case(int index, const Case& c, const Model& M, const det_mk_geometry& g,
              const std::vector<std::string>& modes) {
  for (const std::string& mode : modes) {
    setenv("DET_SIMT_MODES", mode.c_str(), 1);
    int rc = 0;
    const uint64_t h = fnv1a(c.run(M, g, rc));
    printf("case%d %s %d %016llx\n", index, mode.c_str(), rc, (unsigned long long)h);
    fflush(stdout);
    failures += rc != DET_MK_OK;
  }
  unsetenv("DET_SIMT_MODES");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> modes;
  std::string only;  // --cases=LIST: the cases to run, by index (default: all)
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--cases=", 8) == 0) only = argv[i] + 8;
    else modes.push_back(argv[i]);
  }
  if (modes.empty()) modes = {"strict"};
  auto on = [&](int i) { return only.empty() || only.find(std::to_string(i)) != std::string::npos; };
  // Dense bf16 projections (16-byte copies) with a 4-deep ring; nf4 projections (4-byte copies,
  // blocks of 16) with a 2-deep ring and Gemma-3's switches; the Gemma-4 layout. Every case's
  // inputs are drawn whether it runs or not, so a case's bits do not depend on the selection.
  const Model dense(true, 40), nf4(false, 0, 4, true);
  const Gemma4Model g4;
  // a and c split the attention (geometry attn): a's forward reaches position 140, two chunks, a
  // pass each (the fold's state between passes); c in one pass. a and c take their weights ahead of
  // their inputs (geometry ahead): under async mode the ring stages primed before a barrier hold NaN
  // until the GEMV's wait_group lands them. b and c meet at the monotonic counter (geometry
  // barrier 1): in threads mode between OS threads, under TSan. b streams its weight rows 2 at a
  // time (geometry outs 2), a and c 4 at a time (outs 4; a in passes of 16 input rows, 64
  // accumulators a lane). b and c copy RESIDUAL's and PLE_GATE's inputs into shared memory
  // (geometry stage 1), a reads them from global memory. a and c copy each chunk's keys and values
  // into shared memory for a prompt tile's rows (stage 2: cp.async, landed by the block's wait and
  // barrier; in threads mode under TSan, the block barriers around each copy). a takes
  // the rows in prompt tiles of 64 (152 = 64 + 64 + 24), the normalizing phases 16 rows at a time
  // (area_rows: in smem mode the exactly sized shared memory holds 16 rows, not 64).
  // d splits the attention in passes of 2 chunks: the forward's rows at positions 128..139 have two
  // units a (row, query pair) in one pass, on different warps and blocks, and the later of them
  // folds the earlier's partial (the arrival count: in threads mode between OS threads, under TSan);
  // e the same with each block's copy of the chunk (stage 2: the staged units arrive).
  const det_mk_geometry a = {3, 2, 4, 64, 5, 1, 2, 0, 4, 2, 16}, b = {2, 1, 2, 16, 6, 0, 0, 1, 2, 1},
                        c = {3, 2, 4, 4, 7, 32, 16, 1, 4, 3}, d = {3, 2, 2, 16, 8, 2, 0, 1, 1, 0},
                        e = {3, 2, 2, 16, 9, 2, 0, 0, 1, 2};
  const Forward f0(dense), f2(nf4);
  const Generate g1(dense), g3(nf4), g4c(g4);
  if (on(0)) run_case(0, f0, dense, a, modes);
  if (on(1)) run_case(1, g1, dense, b, modes);
  if (on(2)) run_case(2, f2, nf4, b, modes);
  if (on(3)) run_case(3, g3, nf4, c, modes);
  if (on(4)) run_case(4, g4c, g4, c, modes);
  if (on(5)) run_case(5, f0, dense, d, modes);
  if (on(6)) run_case(6, f0, dense, e, modes);
  return failures ? 1 : 0;
}
