// det_program.h: a program of rows and its rules, one copy for every executor: the builder of a
// generate call's prefill rows, the validator of any program's rows, and the decode-step rule.
// Used by the CPU engine (det_llama_forward / det_llama_generate), the megakernel (its torch
// binding, det_mk_check_program and the device's decode step) and, through the decode_continues
// op, the Python per-step path. docs/SPEC.md §14.1.
//
// A program is rows (token, position, sequence, want) over n_seq sequences, each with its KV
// cache; a generate program then decodes up to max_new tokens per sequence.
#pragma once

#include <stdint.h>

#include <vector>

#include "det_llama_model.h"

// The decode-step rule: a sequence that has just emitted token id as its step-th generated token
// (0-based) continues unless id is one of the stop ids or the token was the max_new-th. A
// continuing sequence feeds id back at the position after its previous row.
DET_HD bool det_decode_continues(int32_t id, int64_t step, int64_t max_new, const int32_t* stop_ids, int64_t n_stop) {
  if (step + 1 >= max_new) return false;
  for (int64_t i = 0; i < n_stop; ++i)
    if (stop_ids[i] == id) return false;
  return true;
}

// A program's rows, on the host.
struct det_program_rows {
  std::vector<int32_t> tokens, seq;
  std::vector<int64_t> positions;
  std::vector<uint8_t> want;
  void add(int32_t token, int64_t position, int32_t s, bool wanted) {
    tokens.push_back(token), positions.push_back(position), seq.push_back(s), want.push_back(wanted);
  }
  int64_t size() const { return (int64_t)tokens.size(); }
};

// A generate program's prefill: prompt b is prompts[offsets[b] .. offsets[b + 1]), its tokens at
// positions starts[b], starts[b] + 1, ..., its last row wanted. DET_ERR_ARG for an empty prompt.
inline int det_program_prefill(int64_t B, const int32_t* prompts, const int64_t* offsets, const int64_t* starts,
                               det_program_rows& rows) {
  for (int64_t b = 0; b < B; ++b) {
    if (offsets[b + 1] <= offsets[b]) return DET_ERR_ARG;
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i)
      rows.add(prompts[i], starts[b] + i - offsets[b], (int32_t)b, i == offsets[b + 1] - 1);
  }
  return DET_OK;
}

// Every row's sequence index in range, token in the vocabulary and position inside its cache and
// the 1M rope bound; each sequence's rows in increasing position order. With max_new > 0 (a
// generate program) each sequence has rows, exactly its last one wanted, and room in its cache
// (and under the bound) for max_new tokens after it. Returns DET_OK or the error code, with a
// sentence in why when why is not null.
inline int det_program_check(const det_llama_model* m, int64_t n, const int32_t* tokens, const int64_t* positions,
                             const int32_t* seq, const uint8_t* want, int64_t n_seq, const int64_t* capacities,
                             int64_t max_new, const char** why) {
  auto fail = [&](int code, const char* text) {
    if (why) *why = text;
    return code;
  };
  if (n < 1 || n_seq < 1) return fail(DET_ERR_ARG, "a program needs at least one row and one sequence");
  if (max_new < 0) return fail(DET_ERR_ARG, "max_new must not be negative");
  for (int64_t i = 0; i < n; ++i) {
    if (seq[i] < 0 || seq[i] >= n_seq) return fail(DET_ERR_ARG, "a row's sequence index is out of range");
    if (tokens[i] < 0 || tokens[i] >= m->vocab) return fail(DET_ERR_TOKEN, "a token id is outside the vocabulary");
    if (positions[i] < 0 || positions[i] >= capacities[seq[i]] || positions[i] > DET_MAX_POSITION)
      return fail(DET_ERR_POSITION, "a position is outside its KV cache or the 1M rope bound");
  }
  std::vector<int64_t> last(n_seq, -1), wanted(n_seq, 0), last_row(n_seq, -1), wanted_row(n_seq, -1);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = seq[i];
    if (positions[i] <= last[s]) return fail(DET_ERR_ORDER, "rows of one sequence must come in increasing position order");
    last[s] = positions[i], last_row[s] = i;
    if (want && want[i]) ++wanted[s], wanted_row[s] = i;
  }
  for (int64_t s = 0; max_new > 0 && s < n_seq; ++s) {
    if (last_row[s] < 0 || wanted[s] != 1 || wanted_row[s] != last_row[s])
      return fail(DET_ERR_ARG, "in generate mode each sequence has rows and exactly its last row is wanted");
    if (last[s] + max_new > capacities[s] || last[s] + max_new - 1 > DET_MAX_POSITION)
      return fail(DET_ERR_POSITION, "the generated tokens do not fit the sequence's KV cache");
  }
  return DET_OK;
}
