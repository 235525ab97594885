// The all-to-all traffic of the expert-parallel MoE layer (ExpertParallelMoeLayer, moe_expert_parallel.h), measured
// on one GPU (DESIGN.md "Expert parallelism"; benchmarks/bench_ep_comm.cu, the comm_volume scenario):
//   ep_step_bytes_by_formats  the bytes one layer forward + backward moves per exchange, by the formats' arithmetic
//   simulate_ep_step          one forward + backward over N simulated ranks (InProcessTransport, one GPU: no
//                             interconnect): the bytes the transport copied and those the layers counted, per exchange
//   EpLayerProbe              one rank's layer with its own allocator, cuBLASLt handle, stream, scratch and seeded
//                             tokens, over any transport (bench_ep_comm times it over NCCL at world size 1)
// The header keeps to C++17 (the benchmarks are CUDA sources): the layer itself stays behind EpLayerProbe.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>

#include "trainer/comm/ep_exchange.h"
#include "trainer/comm/transport.h"
#include "trainer/config.h"

namespace fp4moe {

// A MoE layer configuration for the measurements: hidden d and the routed experts' recipe; top-k, routed experts and
// their FFN width as given; no shared expert; the v3 router (sigmoid scores, routed scale 2.5). The exchange's bytes
// depend on d, the recipe, the routed rows and (the counts) the experts per rank, not on the FFN width.
TrainerConfig ep_probe_config(int64_t hidden, const Recipe& routed, int64_t top_k, int64_t experts,
                              int64_t expert_ffn);

// Bytes of one layer forward + backward over `ranks` ranks holding `experts` routed experts in all, by the formats,
// per exchange (EpExchangeKind order), summed over every ordered pair of ranks, each rank to itself included:
//   counts                              ranks^2 x 4 E_l (E_l = experts / ranks: int32 counts per local expert)
//   dispatch, combine,                  routed_rows x the row bytes of expert_parallel_row_bytes(routed, d)
//   dispatch_gradient, combine_gradient (trainer/memory/estimate.h): every routed (token, expert) row moves once each
// routed_rows: the (token, expert) rows of all ranks (sum of M k). Rejects (fp4moe::Error) ranks < 1, experts not a
// positive multiple of ranks, routed_rows < 0, and what expert_parallel_row_bytes rejects.
std::array<int64_t, kEpExchangeKinds> ep_step_bytes_by_formats(const Recipe& routed, int64_t d, int ranks,
                                                               int64_t experts, int64_t routed_rows);

// One forward + backward of the layer over N simulated ranks.
struct EpSimulatedStep {
  int64_t routed_rows = 0;  // over the ranks (sum of M k)
  // Per exchange, over the group. transport: what InProcessGroup copied (take_exchange_rounds: sent = received =
  // bytes between distinct ranks over every ordered pair, to_self every rank's copy to itself), counted where the
  // copies are issued; layers: EpExchange::bytes summed over the ranks (sent, received, to_self of each).
  EpLayerBytes transport, layers;
  // The dispatch payload rank 0's layer buffers hold per routed token (MoeRoutedExperts::dispatch_bytes: what
  // `fp4moe train` writes as the dispatch_* attributes of /memory/<run>).
  double dispatch_payload_per_token = 0, dispatch_scales_per_token = 0;
};

// Runs the layer of cfg (check_moe_layer_config, and routed experts that split over the ranks) once forward and
// backward over `ranks` simulated ranks (an InProcessGroup, run_in_process_ranks: a host thread per rank on the
// current device), each rank an EpLayerProbe of tokens_per_rank tokens drawn from (seed, rank), the router choosing
// on its own. Throws fp4moe::Error for what the layer and the transport throw, and when the transport logged other
// than one round per exchange kind.
EpSimulatedStep simulate_ep_step(const TrainerConfig& cfg, int ranks, int64_t tokens_per_rank, uint64_t seed);

class EpLayerProbe {
 public:
  // Rank transport.rank()'s layer "layers.0.moe" of cfg (ExpertParallelMoeLayer: its E / world size experts) with
  // its parameters from ParamStore::init(seed) and M = tokens tokens and output gradients [M, d] BF16 drawn N(0, 1)
  // from (seed, rank); its own DeviceMemory, cuBLASLt handle, stream and scratch arena. The transport outlives it.
  // Rejects (fp4moe::Error) what ExpertParallelMoeLayer rejects and tokens < 1.
  EpLayerProbe(const TrainerConfig& cfg, int64_t tokens, EpTransport& transport, uint64_t seed);
  ~EpLayerProbe();
  EpLayerProbe(const EpLayerProbe&) = delete;
  EpLayerProbe& operator=(const EpLayerProbe&) = delete;

  // One forward and backward on the probe's tokens (collectives: every rank of the group calls it), enqueued on
  // stream() (the layer's host synchronisations aside); the parameters' grads accumulate.
  void step();
  EpExchange& exchange();
  cudaStream_t stream() const;
  int64_t tokens() const;
  // MoeRoutedExperts::dispatch_bytes of the layer: element and scale bytes per routed token.
  double dispatch_payload_per_token() const;
  double dispatch_scales_per_token() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe
