// One rank's expert-parallel dispatch and combine of one MoE layer (DESIGN.md "Expert parallelism"; issue 17 items 1
// and 5), over an EpTransport (transport.h), with the routing tables of ep_routing.h and the row formats of
// ep_payload.h. Per layer forward:
//   route            topk_idx [M, k] (global expert ids) -> counts [E], offsets [E+1], the permutation row_of /
//                    assignment_of over all E (kernels/nn/router.h, permute.h); the counts exchange (rank s sends
//                    rank r its counts of r's E_l experts, int32: 4 E_l bytes per peer); then ONE device-to-host
//                    copy of offsets [E+1] and the received count matrix [ep, E_l] (one buffer) and ONE host wait
//                    (EpTransport::wait) per layer: the receive buffers and Group Linear's grouped GEMMs
//                    (GroupSplit) are sized on the host; then grouped_of on the device.
//   dispatch         tokens [M, d] in the dispatch format (quantized per token: the MXFP4 / FP8 rules are per row,
//                    so a token's k copies carry the same codes) -> pack M k rows in permute order -> exchange ->
//                    unpack into expert rows [recv_total, d] grouped by local expert (ep_routing.h)
//   combine          expert outputs [recv_total, d] BF16 (grouped) -> pack by source -> exchange -> ys [M k, d] BF16
//                    in permute order (the output of (token t, slot j) at row row_of[t k + j]), which
//                    unpermute_forward (kernels/nn/permute.h) sums with the top-k weights, as on one GPU
// Backward:
//   dispatch_gradient  dys [M k, d] in permute order (unpermute_backward's output, w[t, j] dy[t]) in the backward
//                      dispatch format (FP8 rows for fp8 / mxfp4) -> expert rows [recv_total, d] grouped: the operand
//                      of fc2's Dgrad and Wgrad
//   combine_gradient   dxs [recv_total, d] BF16 (grouped) -> [M k, d] BF16 in permute order, which
//                      permute_backward sums over the k slots in FP32 at the token's rank (why BF16: ep_payload.h)
// Every call returns the bytes of its exchange (EpExchangeBytes: sent / received over the wire, to itself), and
// bytes() sums them per kind for the layer until reset_bytes(). The four payload calls need the route() of the same
// layer and micro-batch before them, on every rank in the same order (they are collectives).
// Timing (optional, set_timing): a CUDA event pair around each exchange of the transport (counts and payload, not
// the pack / unpack kernels); exchange_ms() waits for the recorded events and returns the milliseconds per kind
// since the last reset_bytes(). Off by default (no events recorded).
// Memory: the class allocates its wire buffers and tables (grown on demand after route's host wait, kept): from the
// DeviceMemory given at construction, counted under MemCategory::comm ("ep exchange send wire", "... receive wire",
// "... counts", "... table", "... row_of", "... assignment_of", "... grouped_of"), else cudaMalloc (counted nowhere).
// Sizes: the send wire holds max(M k dispatch rows, R BF16 combine rows, M k backward rows), the receive wire R rows
// of the larger dispatch format (the combines receive in place into the caller's [M k, d]); the routing tables
// 4 (2 M k + R + 2 E + 1 + ep E_l) bytes. Model::comm_buffers (trainer/model/model.h), the plan the emulated layout
// allocates and the estimator counts, sizes the same exchange as four buffers of a layer's larger direction; the two
// are not one plan yet (the exchange's are grown on demand, not taken from that plan).
// Not built: overlap with compute (every exchange runs on the caller's stream).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/common/types.h"
#include "trainer/comm/ep_payload.h"
#include "trainer/comm/ep_routing.h"
#include "trainer/comm/transport.h"
#include "trainer/memory/device_memory.h"

namespace fp4moe {

enum class EpExchangeKind { counts, dispatch, combine, dispatch_gradient, combine_gradient };
constexpr int kEpExchangeKinds = 5;
const char* ep_exchange_kind_name(EpExchangeKind k);

// Bytes of one layer's exchanges, by kind, as one rank sees them.
struct EpLayerBytes {
  EpExchangeBytes kind[kEpExchangeKinds];
  const EpExchangeBytes& operator[](EpExchangeKind k) const { return kind[static_cast<int>(k)]; }
  EpExchangeBytes total() const;
};

class EpExchange {
 public:
  // Over `transport` (outlives this object), E global experts split evenly over transport.world_size() ranks,
  // hidden d; buffers from `mem` (MemCategory::comm, outliving this object) or, when null, cudaMalloc. Rejects
  // (fp4moe::Error), before any allocation: E outside [1, kRouterMaxExperts] (kernels/nn/router.h), E not a multiple
  // of the world size, d < 1.
  EpExchange(EpTransport& transport, int64_t E, int64_t d, DeviceMemory* mem = nullptr);
  ~EpExchange();
  EpExchange(const EpExchange&) = delete;
  EpExchange& operator=(const EpExchange&) = delete;

  // topk_idx: device [M, k] int32, entries in [0, E), distinct per token (not checked on the device); M >= 0,
  // 1 <= k <= E. Synchronises the stream once (above). Returns this rank's counts (valid until the next route).
  const EpCounts& route(const int32_t* topk_idx, int64_t M, int64_t k, cudaStream_t stream);

  // tokens: [M, d] device rows in any format (the route's M); expert_rows: [recv_total, d] device, same format.
  EpExchangeBytes dispatch(const EpRows& tokens, const EpRows& expert_rows, cudaStream_t stream);
  // rows: [M k, d] in permute order; expert_rows: [recv_total, d], same format.
  EpExchangeBytes dispatch_gradient(const EpRows& rows, const EpRows& expert_rows, cudaStream_t stream);
  // expert_out: [recv_total, d] BF16 grouped; ys: [M k, d] BF16, permute order (overwritten).
  EpExchangeBytes combine(const bf16* expert_out, bf16* ys, cudaStream_t stream);
  EpExchangeBytes combine_gradient(const bf16* dxs, bf16* dys_rows, cudaStream_t stream);
  // Payload-call arguments are rejected (fp4moe::Error) before any transfer: no route yet, a row count or d other
  // than stated, a null pointer where rows exist.

  int64_t experts() const { return E_; }        // E, over all ranks
  int64_t local_experts() const { return E_l_; }
  int64_t hidden() const { return d_; }
  const EpTransport& transport() const { return *t_; }
  const EpCounts& counts() const { return counts_; }
  int64_t tokens() const { return M_; }
  int64_t top_k() const { return k_; }
  const int32_t* row_of() const;         // device [M k]: row of assignment t k + j in permute order
  const int32_t* assignment_of() const;  // device [M k]: its inverse
  const int32_t* grouped_of() const;     // device [recv_total]: ep_routing.h
  const EpLayerBytes& bytes() const { return bytes_; }
  void reset_bytes();  // clears the bytes and the timings
  void set_timing(bool on) { timing_ = on; }
  // Milliseconds per kind (EpExchangeKind order) of the exchanges timed since reset_bytes(); synchronises with
  // their stop events. All zero when timing is off.
  std::vector<double> exchange_ms();

 private:
  struct Buffers;
  // rows (format f) in send order -> wire -> expert rows: the shared body of dispatch and dispatch_gradient.
  EpExchangeBytes send_rows(const EpRows& src, const int32_t* gather, int64_t divisor, const EpRows& expert_rows,
                            EpExchangeKind kind, cudaStream_t stream);
  EpExchangeBytes return_rows(const bf16* grouped, bf16* permuted, EpExchangeKind kind, cudaStream_t stream);
  void check_routed(const char* what) const;
  // The transport's exchange, timed when timing is on, its bytes added to kind's.
  EpExchangeBytes exchange(const std::vector<EpPeerBuffers>& peers, EpExchangeKind kind, cudaStream_t stream);

  EpTransport* t_;
  int64_t E_, E_l_, d_;
  int64_t M_ = -1, k_ = 0;
  EpCounts counts_;
  EpLayerBytes bytes_;
  bool timing_ = false;
  std::unique_ptr<Buffers> buf_;
};

}  // namespace fp4moe
