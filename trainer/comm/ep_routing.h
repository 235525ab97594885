// The routing tables of the expert-parallel exchanges (DESIGN.md "Expert parallelism"): which rows each rank sends
// to each rank, and where a received row goes.
//
// Group of ep ranks, E experts (E % ep == 0), E_l = E / ep per rank: rank r holds experts [r E_l, (r + 1) E_l).
// Sender (rank s, M tokens, top-k ids topk_idx [M, k] over all E): its rows are the M k (token, slot) assignments
// in the permutation of kernels/nn/permute.h over the E global experts (permute_map: grouped by expert in expert
// order, within an expert by token, the assignment a = t k + j at row row_of[a]). The rows for rank r are the
// contiguous range of experts [r E_l, (r + 1) E_l): rows [offsets[r E_l], offsets[(r + 1) E_l]), sent in that order.
// Receiver (rank r): from source s it receives counts[s][e] rows for each local expert e (the counts exchange,
// EpCounts below), in the source's order (by expert, then the source's token order), source after source. It keeps
// them grouped by local expert (what Group Linear's grouped GEMMs read: contiguous per expert, local offsets
// [E_l + 1]), and within an expert by source rank, then by the source's token order. Received row p (p counts
// over the sources' ranges back to back) goes to grouped row grouped_of[p]:
//   grouped_of[p] = local_offsets[e] + sum_{s' < s} counts[s'][e] + i    for the i-th row of (source s, expert e).
// So rank r's grouped rows are exactly the rows of experts [r E_l, (r + 1) E_l) in the permutation of all ranks'
// tokens concatenated in rank order over all E experts: the single-GPU model's rows, split by expert.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace fp4moe {

// One rank's host view of one layer's routing after the counts exchange.
struct EpCounts {
  int ep = 1, rank = 0;
  int64_t E = 0, E_l = 0;
  std::vector<int32_t> offsets;      // [E + 1] this rank's rows per global expert (prefix sums; permute order)
  std::vector<int32_t> recv_counts;  // [ep * E_l] rows source s sends to local expert e, at s * E_l + e

  // Checks the sizes, E = ep E_l, rank in [0, ep), offsets non-decreasing from 0, counts >= 0 (fp4moe::Error).
  void validate() const;
  int64_t send_row_begin(int r) const;  // this rank's rows for rank r: [send_row_begin(r), + send_rows(r))
  int64_t send_rows(int r) const;
  int64_t recv_row_begin(int s) const;  // received rows from source s: [recv_row_begin(s), + recv_rows(s))
  int64_t recv_rows(int s) const;
  int64_t recv_total() const;           // rows this rank's experts receive
  std::vector<int32_t> local_offsets() const;  // [E_l + 1] grouped rows per local expert (prefix sums)
};

// grouped_of [recv_total] from recv_counts [ep, E_l] (the formula above). Rejects ep < 1, E_l < 1, negative
// counts (reference) and null pointers where rows exist. Device (ep_routing.cu): device pointers, asynchronous
// on `stream`; R = recv_total must be the counts' sum (the caller has them on the host); R = 0 launches nothing.
void ep_grouped_rows(const int32_t* recv_counts, int ep, int64_t E_l, int64_t R, int32_t* grouped_of,
                     cudaStream_t stream);
void ep_grouped_rows_ref(const int32_t* recv_counts, int ep, int64_t E_l, int32_t* grouped_of);

}  // namespace fp4moe
