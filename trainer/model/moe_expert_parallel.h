// The MoE layer of one rank of an expert-parallel group (DESIGN.md "Expert parallelism"; issue 17 items 1 and 5): the
// layer of trainer/model/moe.h with its routed experts split over the ranks of an EpTransport (trainer/comm/), the
// tokens moved to their experts and back by the layer's own EpExchange (trainer/comm/ep_exchange.h).
//
// A separate class, composed of the same parts as MoeLayer (MoeRouter, MoeRoutedExperts, SwigluMlp), not a mode of
// MoeLayer: MoeLayer's routed experts permute, run and unpermute in one call on one device, while here the rows
// leave for other ranks between the permutation and the expert GEMMs and come back between the GEMMs and the top-k
// sum; MoeRoutedExperts' rows entry (forward_rows, backward_rows) runs the experts on rows that arrive grouped. The
// single-GPU MoeLayer is unchanged.
//
// ep ranks (the transport's world size), E routed experts, E_l = E / ep on each: rank r holds experts
// [r E_l, (r + 1) E_l) as "<prefix>.experts.fc1" [E_l, 2f, d] and "<prefix>.experts.fc2" [E_l, d, f] (the split
// EpExchange uses); the router "<prefix>.router" [E, d] (and the v3 bias [E]) scores all E on every rank, the shared
// experts stay local. Each rank brings its own micro-batch of M tokens (M may be 0: the rank still takes part in
// every exchange, its experts may receive rows).
//   forward   router over all E (its host synchronisation, moe_router.h); EpExchange::route (the counts exchange and
//             the exchange's host synchronisation: two per layer, the router's and the exchange's); the tokens in the
//             routed recipe's dispatch format (ep_payload.h: bf16 as they are; fp8 bf16_to_fp8_row with power-of-two
//             scales, Group Linear's default; mxfp4 bf16_to_mxfp4_row with the default options, the rule by which
//             MoeRoutedExperts quantizes its permuted rows on one device) -> dispatch -> R rows grouped by local
//             expert (bf16 and mxfp4: into the experts' kept input; fp8: FP8 rows, back to BF16 for Group Linear,
//             which quantizes them again to the same values) -> forward_rows -> combine (BF16) -> the combined
//             rows ys [M k, d] in permute order, kept -> unpermute_forward with the top-k weights -> y; shared
//             experts added as in MoeLayer.
//   backward  unpermute_backward (dy, the kept ys) -> d rows [M k, d] and the top-k weights' gradient; the d rows
//             in the backward dispatch format (fp8 for the fp8 and mxfp4 recipes, bf16 for bf16) ->
//             dispatch_gradient -> BF16 rows [R, d] grouped -> backward_rows (fc2, swiglu, fc1: Dgrad and Wgrad)
//             -> combine_gradient (BF16) -> permute_backward -> the routed part of dx; shared experts and the router
//             (Dgrad into dx in FP32, Wgrad) as in MoeLayer.
// Every exchange's bytes are counted by exchange() (EpExchange::bytes, per kind, until reset_bytes).
//
// Against MoeLayer on one GPU with all E experts and the same weights, run on each rank's tokens: the rows each
// expert multiplies are the same (the per-row quantization rules make the same codes); what differs is that an
// expert's GEMMs here run over all ranks' rows at once (the reference: one micro-batch at a time), which changes
// the GEMMs' summation order only, and, for fp8 / mxfp4, the FP8 column blocks of Wgrad (1x128 along tokens) and
// the backward's FP8 dY, quantized before the exchange and again (to the same values) by Group Linear.
//
// Initial weights: rank r's experts "<prefix>.experts.fc1" / ".fc2" draw the values of experts [r E_l, (r + 1) E_l)
// of the single-GPU layer (Param::init_index), so ranks hold distinct experts and init_weights(seed) on every rank
// gives the single-GPU model's weights split over the ranks. The v3 bias (end_step) moves with the expert loads of
// every rank's tokens: the step's tally is summed over the ranks (EpTransport::all_reduce_sum) before the update,
// so every rank's bias stays the one bias of one GPU holding all the tokens. The router's and shared experts'
// gradients are this rank's only: the model all-reduces them (trainer/model/model.h, data parallelism).
//
// Not built (rejected at construction, fp4moe::Error): a recompute policy that drops the routed experts' tensors (moe,
// full, moe_act: the rows entry keeps what backward reads), several in-flight micro-batches (the exchange holds one
// layer routing from forward to backward), a routed recipe other than the presets (the exchange's formats). Also
// not built: overlap of the exchanges with compute.
//
// Memory. Kept (MemCategory::activations, counted): the router's and shared experts' as in MoeLayer; the routed
// experts' for R_max = ep max_tokens min(k, E_l) rows (every rank's tokens may route to this rank's experts); the
// combined rows "combined ys" [max_tokens k, d] BF16 (exchange_buffers). The local expert offsets (device [E_l + 1]
// int32, MemCategory::workspace, and a pinned host copy). The exchange's wire buffers and routing tables come from
// the same DeviceMemory, counted under MemCategory::comm (ep_exchange.h "Memory"), grown at the first forward that
// needs them.
// Scratch (ModelContext::scratch): exchange_buffers' forward and backward entries, the block's (MoeLayer::
// block_buffers), and the sub-layers' passes; scratch() sizes them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/common/types.h"
#include "trainer/comm/ep_exchange.h"
#include "trainer/comm/transport.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/moe_experts.h"
#include "trainer/model/moe_router.h"
#include "trainer/model/params.h"
#include "trainer/model/swiglu_mlp.h"

namespace fp4moe {

class ExpertParallelMoeLayer {
 public:
  // cfg as MoeLayer takes it (check_moe_layer_config); the experts split over transport.world_size() ranks, this rank
  // transport.rank() (cfg.parallel.ep, the emulated layout's, is not read). The transport outlives the layer.
  // Rejects (fp4moe::Error), before registering anything: what check_moe_layer_config rejects, routed_experts not
  // a multiple of the world size, more rows to receive (ep max_tokens min(k, E_l)) than int32 indexes, a routed
  // recipe that is not a preset, a recompute policy that drops the routed experts' tensors, and mem with more than
  // one in-flight slot. The router is built as on one GPU (cfg.parallel ignored: no emulated layout).
  ExpertParallelMoeLayer(ParamStore& store, const std::string& prefix, const TrainerConfig& cfg, int64_t max_tokens,
                         DeviceMemory& mem, EpTransport& transport);

  // x [M, d] BF16 -> y [M, d] BF16 (overwritten; null allowed when M = 0). 0 <= M <= max_tokens. A collective:
  // every rank of the group calls it for the same layer in the same order. Synchronises the stream twice.
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // dy [M, d], x the forward's -> dx [M, d] BF16 (overwritten); every parameter grad of this rank's layer +=
  // (the router's and shared experts' from this rank's tokens, the local experts' from every rank's rows). M must
  // be the last forward's. A collective, as forward.
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx);

  float aux_loss_host() const { return router_.aux_loss_host(); }
  void set_aux_grad_scale(float g) { aux_grad_scale_ = g; }
  // Once per optimizer step, a collective: v3: the step's expert loads summed over the ranks (an all-reduce of E
  // FP32 counts, exact below 2^24 tokens per expert; more throws fp4moe::Error), then the router's bias update
  // (MoeRouter::end_step); v2: nothing.
  void end_step(ModelContext& ctx);
  const int32_t* topk_idx() const { return router_.topk_idx(); }  // device [M, top_k], global expert ids
  void force_routing(const int32_t* topk_or_null) { router_.force_routing(topk_or_null); }

  const MoeRouter& router() const { return router_; }
  const MoeRoutedExperts& experts() const { return experts_; }
  const SwigluMlp* shared() const { return shared_.get(); }
  EpExchange& exchange() { return exchange_; }
  const EpExchange& exchange() const { return exchange_; }
  int64_t local_experts() const { return E_l_; }
  int64_t max_rows() const { return max_rows_; }  // R_max above
  // Activations kept from forward to backward (router, routed and shared experts, the combined rows), as
  // DeviceMemory counts them.
  size_t kept_bytes() const;

  // Every buffer of one rank's layer (trainer/memory/buffer_plan.h) for seq_share tokens of this rank and
  // R = routed_rows rows on local_experts experts: MoeLayer::block_buffers ("moe"), MoeRouter::buffers over all E
  // ("moe.router"), MoeRoutedExperts::buffers at R and E_l ("moe.experts"), the shared experts' SwigluMlp::buffers
  // ("moe.shared"), exchange_buffers ("moe.ep"). Rejects what those reject.
  static std::vector<BufferPlan> buffers(const TrainerConfig& cfg, int64_t seq_share, int64_t routed_rows,
                                         int64_t local_experts);
  // The rows one rank's experts may receive (R_max above) in a group of `ranks` ranks: ranks max_tokens
  // min(top_k, E / ranks).
  static int64_t max_received_rows(const TrainerConfig& cfg, int64_t max_tokens, int ranks);

  // The layer's own buffers (module "moe.ep") for M tokens of this rank and R received rows, in cfg's routed recipe:
  //   kept        "combined ys" [M k, d] BF16 (the combine's output, read by unpermute_backward)
  //   forward     "tokens FP8 codes" [M, d] E4M3 and "tokens FP8 scales" [fp8_row_scale_count(M, d)] FP32 (fp8);
  //               "tokens MXFP4 codes" [M, d/2] and "tokens MXFP4 scales" [M, d/32] (mxfp4): the dispatched tokens;
  //               "received FP8 codes" [R, d] and "received FP8 scales" [fp8_row_scale_count(R, d)], "received rows
  //               (BF16)" [R, d] (fp8)
  //   backward    "d rows" [M k, d] BF16 (unpermute_backward's output, then combine_gradient's); "d rows FP8 codes"
  //               [M k, d] and "d rows FP8 scales" (fp8, mxfp4); "received d rows FP8 codes" [R, d] and scales (fp8,
  //               mxfp4); "expert d rows" [R, d] BF16 (the experts' dY, then their dX)
  // Rejects M < 0, R < 0, and what the recipe's formats reject (ep_dispatch_format).
  static BufferPlan exchange_buffers(int64_t M, int64_t R, int64_t d, int64_t k, const Recipe& routed);
  // The scratch of the passes for M tokens and R received rows: forward the router's, then the exchange's forward
  // entries, the experts' forward (for R rows), the shared experts' output and forward; backward the exchange's
  // backward entries, the block's own (MoeLayer::block_buffers), then the largest of the experts', shared experts'
  // and router's backward.
  static PassScratch scratch(const TrainerConfig& cfg, int64_t M, int64_t R, int64_t E_l);
  size_t scratch_bytes() const { return std::max(scratch_.forward, scratch_.backward); }

 private:
  // The local expert split of the last route (device and host offsets [E_l + 1]).
  GroupSplit local_split() const;

  std::string prefix_;
  EpTransport* transport_;
  int64_t d_, k_, max_tokens_, E_l_, max_rows_;
  Recipe recipe_;
  float aux_grad_scale_ = 1.0f;
  int64_t last_M_ = -1;
  EpExchange exchange_;
  MoeRouter router_;
  MoeRoutedExperts experts_;
  std::unique_ptr<SwigluMlp> shared_;
  KeptArray<bf16> ys_;                 // [max_tokens k, d] combined rows, permute order
  DeviceArray<int32_t> local_offsets_;  // [E_l + 1] of the last route
  PinnedHost host_local_offsets_;       // the same, host
  DeviceArray<float> step_loads_;       // [E] the v3 step tally, summed over the ranks in end_step (empty for v2)
  PassScratch scratch_;
};

}  // namespace fp4moe
