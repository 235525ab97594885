#include "trainer/comm/ep_routing.h"

#include "kernels/common/check.h"

namespace fp4moe {

void EpCounts::validate() const {
  FP4MOE_CHECK(ep >= 1 && rank >= 0 && rank < ep, "EpCounts: rank {} outside [0, ep = {})", rank, ep);
  FP4MOE_CHECK(E_l >= 1 && E == ep * E_l, "EpCounts: E = {} must be ep ({}) x E_l ({}) with E_l >= 1", E, ep, E_l);
  FP4MOE_CHECK(static_cast<int64_t>(offsets.size()) == E + 1 && offsets[0] == 0,
               "EpCounts: offsets must hold E + 1 = {} prefix sums from 0, got {} entries", E + 1, offsets.size());
  for (int64_t e = 0; e < E; ++e)
    FP4MOE_CHECK(offsets[e + 1] >= offsets[e], "EpCounts: offsets decrease at expert {} ({} -> {})", e, offsets[e],
                 offsets[e + 1]);
  FP4MOE_CHECK(static_cast<int64_t>(recv_counts.size()) == ep * E_l,
               "EpCounts: recv_counts must hold ep x E_l = {} entries, got {}", ep * E_l, recv_counts.size());
  for (int32_t c : recv_counts) FP4MOE_CHECK(c >= 0, "EpCounts: negative received count {}", c);
}

int64_t EpCounts::send_row_begin(int r) const { return offsets[static_cast<size_t>(r * E_l)]; }
int64_t EpCounts::send_rows(int r) const { return offsets[static_cast<size_t>((r + 1) * E_l)] - send_row_begin(r); }

int64_t EpCounts::recv_rows(int s) const {
  int64_t n = 0;
  for (int64_t e = 0; e < E_l; ++e) n += recv_counts[static_cast<size_t>(s * E_l + e)];
  return n;
}

int64_t EpCounts::recv_row_begin(int s) const {
  int64_t n = 0;
  for (int q = 0; q < s; ++q) n += recv_rows(q);
  return n;
}

int64_t EpCounts::recv_total() const { return recv_row_begin(ep); }

std::vector<int32_t> EpCounts::local_offsets() const {
  std::vector<int32_t> out(static_cast<size_t>(E_l + 1), 0);
  for (int64_t e = 0; e < E_l; ++e) {
    int64_t n = 0;
    for (int s = 0; s < ep; ++s) n += recv_counts[static_cast<size_t>(s * E_l + e)];
    out[static_cast<size_t>(e + 1)] = static_cast<int32_t>(out[static_cast<size_t>(e)] + n);
  }
  return out;
}

void ep_grouped_rows_ref(const int32_t* recv_counts, int ep, int64_t E_l, int32_t* grouped_of) {
  FP4MOE_CHECK(ep >= 1 && E_l >= 1, "ep_grouped_rows_ref: ep ({}) and E_l ({}) must be >= 1", ep, E_l);
  FP4MOE_CHECK(recv_counts, "ep_grouped_rows_ref: null recv_counts");
  EpCounts c;
  c.ep = ep;
  c.E_l = E_l;
  c.E = ep * E_l;
  c.offsets.assign(static_cast<size_t>(c.E + 1), 0);
  c.recv_counts.assign(recv_counts, recv_counts + ep * E_l);
  c.validate();
  FP4MOE_CHECK(grouped_of || c.recv_total() == 0, "ep_grouped_rows_ref: null grouped_of for {} rows",
               c.recv_total());
  const std::vector<int32_t> local = c.local_offsets();
  std::vector<int64_t> next(local.begin(), local.end() - 1);  // next grouped row of each local expert
  int64_t p = 0;
  for (int s = 0; s < ep; ++s)
    for (int64_t e = 0; e < E_l; ++e)
      for (int32_t i = 0; i < recv_counts[s * E_l + e]; ++i) grouped_of[p++] = static_cast<int32_t>(next[e]++);
}

}  // namespace fp4moe
