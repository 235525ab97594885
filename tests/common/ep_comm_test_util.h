// Helpers of the expert-parallel exchange tests (tests/trainer/test_ep_comm*.cpp): random routings over N ranks
// with uneven and empty experts, row tensors of random bytes in host memory, and the CPU model of the all-to-all:
// the rows each rank's experts must hold, from the single-rank permutation (kernels/nn/permute.h) of all ranks'
// tokens concatenated in rank order, split by expert (trainer/comm/ep_routing.h).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/nn/permute.h"
#include "trainer/comm/ep_payload.h"

namespace fp4moe::test {

// Host row tensor of `rows` rows of format f: codes and scales filled with random bytes (any bits move).
struct HostRows {
  EpRowFormat format = EpRowFormat::bf16;
  int64_t rows = 0, d = 0;
  std::vector<uint8_t> codes, scales;
  HostRows(EpRowFormat f, int64_t n, int64_t hidden, uint64_t seed) : format(f), rows(n), d(hidden) {
    codes.resize(static_cast<size_t>(ep_rows_code_bytes(f, n, hidden)));
    scales.resize(static_cast<size_t>(ep_rows_scale_bytes(f, n, hidden)));
    std::mt19937_64 rng(seed);
    for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
    for (uint8_t& b : scales) b = static_cast<uint8_t>(rng());
  }
  EpRows view() { return EpRows{format, rows, d, codes.data(), scales.empty() ? nullptr : scales.data()}; }
  // Row r as a wire row (codes, then scales in block order: ep_payload.h), through the CPU reference pack.
  std::vector<uint8_t> wire_row(int64_t r) {
    std::vector<uint8_t> w(static_cast<size_t>(ep_wire_row_bytes(format, d)));
    const int32_t idx = static_cast<int32_t>(r);
    ep_pack_rows_ref(view(), &idx, 1, 1, w.data());
    return w;
  }
};

// Top-k routing [M_s, k] per rank: k distinct experts per token drawn with skewed weights from [0, E) without the
// experts in `empty` (they receive nothing), so that loads are uneven.
inline std::vector<std::vector<int32_t>> random_ep_routing(const std::vector<int64_t>& M, int64_t k, int64_t E,
                                                           const std::vector<int>& empty, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> weight(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) weight[static_cast<size_t>(e)] = 1.0 + static_cast<double>((e * 7) % 5) * 3.0;
  for (int e : empty) weight[static_cast<size_t>(e)] = 0.0;
  std::vector<std::vector<int32_t>> out;
  for (int64_t m : M) {
    std::vector<int32_t> topk(static_cast<size_t>(m * k));
    for (int64_t t = 0; t < m; ++t) {
      std::vector<double> w = weight;
      for (int64_t j = 0; j < k; ++j) {
        std::discrete_distribution<int> pick(w.begin(), w.end());
        const int e = pick(rng);
        topk[static_cast<size_t>(t * k + j)] = e;
        w[static_cast<size_t>(e)] = 0.0;  // distinct within the token
      }
    }
    out.push_back(std::move(topk));
  }
  return out;
}

// One row an expert rank must hold: source rank, token of that rank, slot.
struct EpRowOrigin {
  int source = 0;
  int64_t token = 0, slot = 0;
  bool operator==(const EpRowOrigin& o) const { return source == o.source && token == o.token && slot == o.slot; }
};

// The CPU model of the dispatch: for each of ep ranks, its grouped rows in order, from permute_map_ref over the
// concatenated tokens of all ranks (rank order) and all E experts, rows of experts [r E_l, (r + 1) E_l) for rank r.
inline std::vector<std::vector<EpRowOrigin>> ep_expected_rows(const std::vector<std::vector<int32_t>>& topk,
                                                             const std::vector<int64_t>& M, int64_t k, int64_t E) {
  const int ep = static_cast<int>(M.size());
  std::vector<int32_t> all;
  std::vector<int> source_of;
  std::vector<int64_t> token_of;
  for (int s = 0; s < ep; ++s) {
    all.insert(all.end(), topk[static_cast<size_t>(s)].begin(), topk[static_cast<size_t>(s)].end());
    for (int64_t t = 0; t < M[static_cast<size_t>(s)]; ++t) {
      source_of.push_back(s);
      token_of.push_back(t);
    }
  }
  const int64_t T = static_cast<int64_t>(token_of.size());
  std::vector<int32_t> counts(static_cast<size_t>(E)), offsets(static_cast<size_t>(E + 1));
  std::vector<int32_t> row_of(static_cast<size_t>(T * k)), assignment_of(static_cast<size_t>(T * k));
  permute_map_ref(all.data(), T, k, E, counts.data(), offsets.data(), row_of.data(), assignment_of.data());
  const int64_t El = E / ep;
  std::vector<std::vector<EpRowOrigin>> out(static_cast<size_t>(ep));
  for (int r = 0; r < ep; ++r)
    for (int32_t row = offsets[static_cast<size_t>(r * El)]; row < offsets[static_cast<size_t>((r + 1) * El)]; ++row) {
      const int64_t a = assignment_of[static_cast<size_t>(row)], g = a / k;
      out[static_cast<size_t>(r)].push_back(
          {source_of[static_cast<size_t>(g)], token_of[static_cast<size_t>(g)], a % k});
    }
  return out;
}

}  // namespace fp4moe::test
