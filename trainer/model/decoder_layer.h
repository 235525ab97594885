// One decoder layer of the model (model.h, DESIGN.md "Trainer"), with its recompute policy:
//
//   a_in  = attn_norm(h)             RmsNorm "layers.<l>.attn_norm"
//   h_mid = h + MLA(a_in)            MlaAttention "layers.<l>.attn" (mla.h)
//   f_in  = ffn_norm(h_mid)          RmsNorm "layers.<l>.ffn_norm"
//   h'    = h_mid + FFN(f_in)        dense SwiGLU "layers.<l>.mlp" for l < n_dense_layers (swiglu_mlp.h), else MoE
//                                    "layers.<l>.moe" (moe.h)
// The residual stream is BF16: each branch output is added with one FP32 addition and one BF16 rounding (add_bf16);
// in backward the residual gradient d_res is BF16 too, summed the same way.
//
// Memory. Kept from forward to backward (MemCategory::activations), bytes per token besides the sub-layers' own:
//   h_mid 2 d (not under full), a_in 2 d and f_in 2 d (not under layernorm or full, nor when the branch's backward
//   does not read its input: fp8/mxfp4 projections keep their own copy, linear.h; the MoE block always reads it:
//   its router's Wgrad and its shared experts); the layer input h is the model's. Under layernorm the two norms keep
//   nothing (their outputs and rstd are recomputed from h and h_mid: f_in is rebuilt by ffn_norm in the FFN half of
//   backward, before the FFN's backward reads it, which is how the MoE block gets its input back under moe +
//   layernorm); under full the layer keeps nothing of its own and its backward reruns attn_norm, MLA
//   (MlaAttention::recompute_forward: its tensors stay in the layer's scratch scope for its backward), the residual
//   add and ffn_norm, then each FFN recomputes itself (the MoE block from the routing and dispatched expert input
//   it keeps under full as under moe, moe.h).
// Scratch (ModelContext::scratch): one scope per forward and per backward, empty at the start of each; the tensors
// not kept, then each sub-layer's own scope above them (scratch() states the most; forward_bytes / backward_bytes
// for M = max_tokens).
// Expert parallelism over real ranks (a transport given): the MoE block is an ExpertParallelMoeLayer
// (moe_expert_parallel.h) instead of a MoeLayer; buffers() and scratch() state its buffers at
// LayerShape::expert_parallel_rank's shapes.
// In-flight micro-batches (trainer/memory/device_memory.h): every kept buffer of the layer and its sub-layers has
// one copy per slot of the DeviceMemory it is built on; a backward differentiates the active slot's forward, so
// several forwards may run before their backwards (1F1B). memory() reports one micro-batch (one copy).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/context.h"
#include "trainer/model/mla.h"
#include "trainer/model/moe.h"
#include "trainer/model/moe_expert_parallel.h"
#include "trainer/model/params.h"
#include "trainer/model/recompute.h"
#include "trainer/model/rms_norm.h"
#include "trainer/model/swiglu_mlp.h"

namespace fp4moe {

struct LayerMemory;  // trainer/model/model.h

// The sizes of one decoder layer that one GPU holds: on the GPU that runs (one_gpu) the micro-batch and the whole
// layer but for the routed experts, of which it holds its expert-parallel share E / parallel.ep (the emulated layout,
// trainer/model/layout_emulation.h; all of them without a [parallel] section); trainer/memory/estimate.h derives them
// for one GPU of any parallel layout (tensor, expert parallel).
struct LayerShape {
  int64_t tokens = 0;         // N: rows of the attention and of the FFN widths' tensors (micro_batch x seq_len)
  int64_t seq_len = 1;        // tokens per row (the attention's causal rows)
  int64_t seq_share = 0;      // rows of the sequence-parallel tensors (the residual stream, norms, down-projection
                              // and fc1 inputs, the router): ceil(N / tp)
  int64_t heads = 0;          // attention heads on this GPU
  int64_t dense_ffn = 0;      // the dense FFN's width on this GPU
  int64_t routed_rows = 0;    // R: routed rows this GPU's experts receive (N top_k on one GPU)
  int64_t local_experts = 0;  // routed experts on this GPU
  int64_t shared_ffn = 0;     // the shared experts' width on this GPU (shared_experts x expert_ffn on one GPU)
  int64_t ep_ranks = 0;       // > 0: the ranks of a real expert-parallel group (a Model over an EpTransport, model.h)
                              // whose MoE block here is an ExpertParallelMoeLayer (moe_expert_parallel.h), receiving
                              // up to routed_rows = its R_max rows on local_experts = E / ep_ranks; 0: MoeLayer

  static LayerShape one_gpu(const TrainerConfig& cfg, int64_t max_tokens);
  // One rank of a real expert-parallel group of `ranks` ranks: one_gpu's shapes but for the MoE block's (ep_ranks,
  // routed_rows = ExpertParallelMoeLayer::max_received_rows, local_experts = E / ranks). Rejects ranks < 1.
  static LayerShape expert_parallel_rank(const TrainerConfig& cfg, int64_t max_tokens, int ranks);
};

class DecoderLayer {
 public:
  // Layer l of `cfg` (validated by the model) for up to max_tokens tokens, policy from cfg.recompute. With a transport
  // (outliving the layer) a MoE layer's block is an ExpertParallelMoeLayer over it (its experts split over the
  // transport's ranks, shapes LayerShape::expert_parallel_rank), else a MoeLayer.
  DecoderLayer(ParamStore& store, const TrainerConfig& cfg, int64_t l, int64_t max_tokens, DeviceMemory& mem,
               EpTransport* transport = nullptr);

  // h [M, d] BF16 (kept by the caller until backward) -> h_next [M, d] BF16; tmp [M, d] BF16 is the caller's
  // scratch for the branch outputs. 1 <= M <= max_tokens, a multiple of seq_len.
  void forward(ModelContext& ctx, const bf16* h, int64_t M, bf16* tmp, bf16* h_next);
  // h as in forward; d_res [M, d] BF16: d h_next in, d h out (in place); tmp as in forward. aux_grad_scale: the
  // upstream gradient of the v2 balance loss (MoeLayer::set_aux_grad_scale). Every parameter grad +=.
  void backward(ModelContext& ctx, const bf16* h, int64_t M, bf16* d_res, bf16* tmp, float aux_grad_scale);

  // Kept bytes by module and the scratch of one forward and backward; `input_bytes` (the layer input h, which the
  // model holds) goes into residual.
  LayerMemory memory(size_t input_bytes) const;
  size_t forward_bytes() const { return scratch_.forward; }
  size_t backward_bytes() const { return scratch_.backward; }
  size_t scratch_bytes() const { return scratch_.high_water(); }

  // The shared scratch of layer l's forward and backward (trainer/memory/scratch.h) at one GPU's `shape`, as the
  // passes below take it (the inputs of buffers()): forward h_mid under full, then the larger of the attention half
  // (attn_norm out when not kept, MLA's forward) and the FFN half (ffn_norm out when not kept, the FFN's forward);
  // backward, under full, the rerun up to h_mid (attn_norm out and rstd, MLA's recompute, h_mid), then the larger of
  // the FFN half (ffn_norm out and rstd when recomputed, then the larger of the FFN's and ffn_norm's backward) and
  // the attention half (attn_norm out and rstd when recomputed outside full, then the larger of MLA's backward and
  // attn_norm's). Rejects what buffers() rejects.
  static PassScratch scratch(const TrainerConfig& cfg, int64_t l, const LayerShape& shape);

  // Every buffer of layer l (trainer/memory/buffer_plan.h) at `shape`, one plan per module: "layer" ("h (layer
  // input)" [seq_share, d], which the model holds; "h_mid", "attn_norm out", "ffn_norm out" [seq_share, d] BF16 as
  // the Memory paragraph above keeps them; the two norms' RmsNorm::buffers prefixed "attn_norm " and "ffn_norm "),
  // then MlaAttention::buffers ("mla") and SwigluMlp::buffers ("mlp") or MoeLayer::buffers ("moe.router",
  // "moe.experts", "moe.shared"). Rejects a layer outside [0, model.layers).
  static std::vector<BufferPlan> buffers(const TrainerConfig& cfg, int64_t l, const LayerShape& shape);
  const std::vector<BufferPlan>& plans() const { return plans_; }  // buffers() on this GPU, at max_tokens

  MoeLayer* moe() { return moe_ ? &*moe_ : nullptr; }
  const MoeLayer* moe() const { return moe_ ? &*moe_ : nullptr; }
  ExpertParallelMoeLayer* ep_moe() { return ep_moe_.get(); }
  const ExpertParallelMoeLayer* ep_moe() const { return ep_moe_.get(); }
  // The MoE block, whichever it is (MoeLayer or ExpertParallelMoeLayer); a dense layer has none:
  bool has_moe() const { return moe_ || ep_moe_; }
  float moe_aux_loss_host() const;                    // its v2 balance loss of the last forward (0: v3, dense)
  void moe_end_step(ModelContext& ctx);               // its end_step (a collective over a transport); dense: nothing
  const int32_t* moe_topk_idx() const;                // its top-k ids of the last forward; null for a dense layer
  void moe_force_routing(const int32_t* topk_or_null);  // its force_routing; rejects a dense layer
  DispatchBytes moe_dispatch_bytes() const;           // its routed experts' dispatch payload; rejects a dense layer
  const LayerRecompute& recompute() const { return rc_; }

 private:
  static std::string name(int64_t l, const char* part) { return "layers." + std::to_string(l) + "." + part; }
  // The "layer" plan of buffers() (the layer's own buffers and its two norms') for seq_share rows; plan_for(M)
  // keeps the one of the last M.
  static BufferPlan own_buffers(const TrainerConfig& cfg, int64_t l, int64_t seq_share);
  const BufferPlan& plan_for(int64_t M);

  int64_t index_, d_;
  LayerRecompute rc_;
  bool keep_a_in_ = false, keep_f_in_ = false;
  RmsNorm attn_norm_;
  MlaAttention attn_;
  RmsNorm ffn_norm_;
  std::optional<SwigluMlp> mlp_;  // l < n_dense_layers
  std::optional<MoeLayer> moe_;   // l >= n_dense_layers, one GPU
  std::unique_ptr<ExpertParallelMoeLayer> ep_moe_;  // l >= n_dense_layers over a transport
  // Kept (MemCategory::activations), [max_tokens, d] BF16 each, one copy per in-flight slot; empty when the policy
  // does not keep them:
  KeptArray<bf16> h_mid_;         // residual stream after attention        (not under full)
  KeptArray<bf16> a_in_;          // attn_norm output, MLA input            (when keep_a_in_)
  KeptArray<bf16> f_in_;          // ffn_norm output, FFN input             (when keep_f_in_)
  TrainerConfig cfg_;
  std::vector<BufferPlan> plans_;  // buffers() at LayerShape::one_gpu
  BufferPlan pass_plan_{"layer"};
  int64_t pass_M_ = -1;
  PassScratch scratch_;            // scratch() at LayerShape::one_gpu
};

}  // namespace fp4moe
