// The reference trainer's model: a DeepSeek-style decoder (DESIGN.md "Trainer") with hand-written forward and
// backward, one class per layer (trainer/model/*.h).
//
//   tokens [B*T] -> embed [V, d] -> per layer l:
//        h = h + MLA(RMSNorm(h))                                   (trainer/model/mla.h)
//        h = h + FFN(RMSNorm(h))   dense SwiGLU for l < n_dense_layers, else MoE (trainer/model/moe.h)
//   -> RMSNorm -> LM head [V, d] -> cross-entropy (vocabulary-chunked, kernels/nn/cross_entropy.h)
//
// Activations kept for backward are allocated once, at construction, for micro_batch x seq_len tokens
// (MemCategory::activations), as the recompute policy (cfg.recompute, trainer/model/recompute.h) decides, once per
// micro-batch the model's pipeline stage keeps in flight under 1F1B (PipelinePosition below: its activation slots,
// trainer/memory/device_memory.h; one on one GPU); every
// layer's scratch and what it recomputes come from one shared arena (trainer/memory/scratch.h, MemCategory::
// workspace) sized once to the largest single layer call. Parameters live in a ParamStore. Deterministic: the same
// weights and batch give bitwise the same loss and gradients (no floating-point atomics on the training path),
// under every recompute policy, with the attention core on our kernels (model.attention_backend = own, the default)
// or on cuDNN with model.attention_deterministic = true.
//
// Attention core backend (model.attention_backend, kernels/attention/attention_backend.h): the model owns one
// AttentionCore (kernels/attention/attention_core.h), which resolves the backend at construction for the MLA shape
// at micro_batch x seq_len tokens (auto: both backends timed there on the model's stream, on temporary buffers within
// the budget's room, freed before the parameters are allocated; attention_backend_note says what was chosen and
// why) and at its first call for any other row count (a forward with fewer sequences: cuDNN where it was chosen and
// can run that shape, else our kernels under auto, an error naming the shape under cudnn). With cuDNN chosen, its
// plans are shared by all layers and one workspace, sized to the larger its forward and backward plans ask at
// micro_batch x seq_len, comes from DeviceMemory's workspace category ("cuDNN attention workspace"); the layers
// reach both through ModelContext::attention. That workspace is queried from the device and is not in the memory
// estimator's plans (like cub's sort storage); neither are the timing buffers, outside DeviceMemory.
//
// Emulated layout (cfg's [parallel] section, DESIGN.md "Trainer"): the model builds ONE GPU of that layout, run for
// real on the local GPU, with no other rank and no transfer:
//   - its pipeline stage (pipeline_stage(cfg), trainer/memory/estimate.h: parallel.stage, or the largest): decoder
//     layers [first_layer, first_layer + layers) under their global indices ("layers.<l>...", dense or MoE as in the
//     whole model); the embedding on the first stage only; final norm, LM head and loss on the last only;
//   - the stand-ins of the neighbour stages (trainer/model/layout_emulation.h): a stage without the embedding takes
//     its input from the "pipeline receive" buffer, filled with a fixed pseudo-random embedding of the token ids; a
//     stage without the LM head writes its output to the "pipeline send" buffer and takes its output gradient from
//     the receive buffer, filled with a pseudo-random gradient of scale grad_scale / M; the input gradient of a
//     stage without the embedding goes to the send buffer and is dropped. Such a stage has no loss (StepStats);
//   - each MoE layer's expert-parallel share: E / ep local experts fed from this GPU's own tokens (moe_router.h);
//   - the EP and PP communication buffers (comm_buffers, MemCategory::comm), allocated and counted, never sent.
// Not emulated (check_emulated_layout rejects them): tensor parallelism and a skewed routed load. The 1F1B
// schedule's in-flight micro-batches and the ZeRO-1 shard are described where they are built. Without a
// [parallel] section the model is the whole one, as before.
//
// Expert and data parallelism over real ranks (DESIGN.md "Expert parallelism"): given an EpTransport of W ranks
// (W >= 1; NcclTransport in `fp4moe train` under `fp4moe launch`, InProcessTransport in tests), every MoE layer is an
// ExpertParallelMoeLayer (moe_expert_parallel.h: rank r holds routed experts [r E/W, (r + 1) E/W), the tokens travel
// to their experts and back) and every other parameter is replicated: the embedding, attention, norms, dense FFNs,
// routers, shared experts and LM head. Each rank brings its own micro-batch. The objective is the mean of the W
// ranks' micro-batch losses, L = (1/W) sum_r L_r (L_r: rank r's mean cross-entropy, + its v2 balance loss), which is
// the mean over all W ranks' tokens when the ranks' micro-batches have equal valid-target counts (as the grad_accum
// micro-batches of one GPU, averaged the same way). Its gradient:
//   - a replicated parameter: dL/dθ = (1/W) sum_r dL_r/dθ, where rank r computes only dL_r/dθ: backward scales by
//     grad_scale / W and reduce_gradients() sums the W ranks' replicated gradients (one all-reduce over the
//     contiguous range ParamStore::replicated_grads);
//   - a routed expert's parameter, held by one rank: it multiplies rows of every rank's tokens, and its Wgrad sums
//     over all of them, sum_r dL_r/dθ_e; the same grad_scale / W makes it dL/dθ_e with no communication.
// So after every rank's backward_in_slot(grad_scale) and reduce_gradients(), every replicated gradient on every rank
// and each rank's expert gradients are those of ONE model holding all E experts run on the W micro-batches as W
// accumulated micro-batches with grad_scale / W (the summation orders, the quantizers' per-rank random bits and, for
// v2, the balance loss taken per rank's tokens aside, as grad_accum does on one GPU). At W = 1 the scale is grad_scale itself. Without a transport
// nothing of this exists (the single-GPU model, unchanged). Rejected with a transport (check_ranks_config): a
// [parallel] layout (emulation and real ranks do not mix), and what ExpertParallelMoeLayer rejects (routed experts
// not a multiple of W, recompute of the routed experts).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trainer/comm/transport.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/context.h"
#include "trainer/model/params.h"

namespace fp4moe {

struct DispatchBytes;  // trainer/model/moe_experts.h
class ScratchArena;    // trainer/memory/scratch.h
struct LayerShape;     // trainer/model/decoder_layer.h

// Device memory of one decoder layer for micro_batch x seq_len tokens, in bytes as DeviceMemory counts them (each
// buffer rounded up to 256): what it keeps from forward to backward (MemCategory::activations) by module, under the
// model's recompute policy, and the most of the shared scratch its forward and its backward take (the arena is
// sized to the largest over layers and the LM head). Not counted here: the Linears' and Group Linears' FP8 weight
// copies and own scratch (DeviceMemory counts them from the first forward, under weights and workspace), and the
// cuBLASLt workspaces (cudaMalloc'd, counted nowhere).
struct LayerMemory {
  int64_t layer = 0;
  bool moe = false;              // MoE block (else dense SwiGLU FFN)
  size_t residual = 0;           // h[l] (the layer input, 2 d per token) and h_mid (the residual after attention,
                                 // 2 d; not under full)
  size_t norms = 0;              // attn_norm and ffn_norm outputs (2 d each) and the rstd of the layer's four norms
                                 // (attn_norm, ffn_norm, MLA's q_norm and kv_norm: 4 each) with MLA's n_q, n_kv;
                                 // 0 under layernorm and full
  size_t attn = 0;               // MlaAttention's other tensors (mla.h)
  size_t ffn = 0;                // the MoE block (moe.h) or the dense SwiGLU FFN (swiglu_mlp.h)
  size_t routed_experts = 0;     // the part of ffn held by the routed experts (moe_experts.h; 0 for dense)
  size_t quantized_copies = 0;   // not in kept(): what the layer's fp8/mxfp4 Linears and fp8 Group Linears hold of
                                 // their inputs (FP8 column or MXFP4 copies, linear.h, group_linear.h) under
                                 // activations from their first forward on, each rounded up to 256 as DeviceMemory
                                 // counts it; under every policy (their buffers stay allocated); 0 with bf16
                                 // recipes
  size_t scratch_forward = 0;    // the most of the shared scratch in this layer's forward
  size_t scratch_backward = 0;   // the same in its backward (with what it recomputes)
  size_t kept() const { return residual + norms + attn + ffn; }
};

// Where the model's GPU sits in the 1F1B schedule (trainer/train/pipeline_schedule.h), from the configuration's
// [parallel] layout (layout_of, trainer/memory/estimate.h): one GPU is stage 0 of 1 with one slot.
struct PipelinePosition {
  int64_t stages = 1;     // pipeline stages (parallel.pp)
  int64_t stage = 0;      // this GPU's stage, 0 <= stage < stages
  int64_t in_flight = 1;  // micro-batches whose activations it keeps: its activation slots
                          // (ParallelLayout::in_flight: min(stages - stage, parallel.micro_batches))
};

// What one forward (and backward) produced, for logging (host values, read back before the call returns).
struct StepStats {
  float loss = 0.0f;      // mean cross-entropy over the micro-batch's valid targets (nats/token); NaN when has_loss
                          // is false
  bool has_loss = true;   // false on a pipeline stage without the LM head (the emulated layout): it has no loss
  float aux_loss = 0.0f;  // v2 router balance loss summed over MoE layers (0 for v3), already in the gradient
  int64_t tokens = 0;     // valid targets
};

// Host tokens and targets [M] of a batch of rows of T tokens (T >= 1): rejects (fp4moe::Error, naming `who`, the
// position, its row and t) a token outside [0, vocab) or a target neither in [0, vocab) nor kIgnoreIndex; returns
// the valid targets. What Model::forward and forward_in_slot check on the host before a pass with host
// synchronisation, and what a caller of the mode without it checks before it uploads (trainer/train/step_graph.h).
int64_t check_batch_ids(std::span<const int32_t> tokens, std::span<const int32_t> targets, int64_t vocab, int64_t T,
                        const char* who);

// Whether cfg's [parallel] section describes one GPU of a larger layout, which the model emulates: tp x pp x dp > 1
// or ep > 1 (a section of one GPU, micro-batches or ZeRO-1 alone, builds the whole model).
bool emulates_layout(const TrainerConfig& cfg);
// Whether the model runs one GPU of `layout` as the estimator counts it (a skewed routed load included,
// layout_emulation.h): tp = 1; tensor parallelism stays an estimate only.
bool layout_is_emulated(const ParallelLayout& layout);
// Rejects (fp4moe::Error, one line naming the option) what the model cannot emulate of cfg's [parallel] layout
// (layout_is_emulated of layout_of(cfg)): parallel.tp > 1.
void check_emulated_layout(const TrainerConfig& cfg);
// Rejects (fp4moe::Error, one line naming the option) what a Model over `world_size` real ranks cannot run: world_size
// < 1, a [parallel] section that emulates a layout (emulates_layout), routed experts that do not split over the
// ranks (a model with MoE layers).
void check_ranks_config(const TrainerConfig& cfg, int world_size);

class Model {
 public:
  // Validates `cfg` (validate_config, check_emulated_layout), registers and allocates every tensor of its pipeline
  // stage for batches of up to cfg.train.micro_batch rows of cfg.train.seq_len tokens, the held activations once per
  // slot of its PipelinePosition (which it sets as mem.slots()'s count: one model per DeviceMemory); under
  // parallel.zero1 the store holds rank 0's ZeRO-1 shard of the masters and moments (layout_of(cfg).zero1_parts(),
  // trainer/model/params.h). Throws fp4moe::Error
  // before allocating anything for a bad config; an allocation over mem's budget throws with mem's report.
  // transport (outliving the model): one rank of an expert- and data-parallel group (above); its forwards,
  // backwards, reduce_gradients and end_step are collectives, which every rank calls in the same order.
  Model(const TrainerConfig& cfg, DeviceMemory& mem, cudaStream_t stream, EpTransport* transport = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Weights from `seed` (ParamStore::init; the init std of each tensor is documented in model.cpp).
  void init_weights(uint64_t seed);

  // tokens, targets: device int32 [B * T] with T = cfg.train.seq_len, 1 <= B <= cfg.train.micro_batch; row b holds
  // tokens b*T .. b*T+T-1 of one sequence (attention is causal within a row). Tokens must be in [0, vocab);
  // targets in [0, vocab) or kIgnoreIndex (-100), not counted. Both are copied to the host first (one stream
  // synchronisation) and checked there: a token or target outside its range throws fp4moe::Error naming the
  // position, before any launch. Returns once the stream has finished the pass (the loss is read back).
  //
  // Forward only (evaluation): the mean loss over valid targets -> stats. Uses slot 0; rejects a call while a
  // micro-batch is in flight (forward_in_slot without its backward).
  StepStats forward(const int32_t* tokens, const int32_t* targets, int64_t B);
  // Forward and backward: every parameter's grad += grad_scale * d(loss)/d(param), where loss is the mean
  // cross-entropy of this micro-batch (+ the v2 aux loss). Use grad_scale = 1 / grad_accum to average over
  // micro-batches. Grads are not zeroed here (ParamStore::zero_grads). forward_in_slot(0, ...) then
  // backward_in_slot(0, grad_scale), whose stats it returns.
  StepStats forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, float grad_scale);

  // Training in two passes, for the 1F1B schedule (trainer/train/pipeline_schedule.h): forward_in_slot runs the
  // embedding, the layers and the final norm, and keeps the micro-batch's activations, and its own copy of tokens
  // and targets, in activation slot `slot` (copied on the model's stream: the caller may rewrite its arrays with
  // work queued on that stream, or once it has synchronised);
  // backward_in_slot(slot) later runs the LM head's loss (cross-entropy forward and backward: the head's stage keeps
  // one micro-batch in flight, so its loss waits for the backward without holding more) and the backward of the
  // micro-batch that slot holds, and frees the slot. Between them other slots' forwards and backwards may run: the
  // gradients are those of forward_backward, bit for bit, when the backwards run in the same order.
  // forward_in_slot's stats: tokens and aux_loss (loss 0: it comes with the backward); backward_in_slot's: all
  // three. forward_in_slot rejects (fp4moe::Error) a slot outside [0, position().in_flight), a slot in flight,
  // a B other than that of the micro-batches in flight (the Linears' lazily grown copies of their input would be
  // reallocated under them), and what forward rejects; backward_in_slot a slot without a forward and a
  // non-finite grad_scale.
  StepStats forward_in_slot(int64_t slot, const int32_t* tokens, const int32_t* targets, int64_t B);
  StepStats backward_in_slot(int64_t slot, float grad_scale);
  const PipelinePosition& position() const { return position_; }

  // Without host synchronisation (on = true): forward_in_slot and backward_in_slot then neither copy nor wait for
  // anything on the host, so that a step's forwards and backwards can be captured in one CUDA graph (after one
  // eager step with the same B, which allocates every buffer; tests/trainer/test_step_graph_gpu.cpp): the tokens and
  // targets are not range-checked (the caller checks them on the host before it uploads them), their stats hold
  // tokens 0, aux_loss and loss NaN (the loss of the last backward stays on the device: loss_device()), the routers
  // keep the expert counts on the device (moe_router.h) and the expert GEMMs read the device offsets
  // (ModelContext::host_sync_free). The same weights and batch give the same loss and gradients as an eager pass in
  // the same mode, bit for bit, and within the GEMMs' summation-order differences of a pass with it off (whose
  // expert GEMMs may run on cuBLASLt). forward (evaluation) and end_step are unchanged by it (end_step waits for
  // nothing in this mode either). Rejects (fp4moe::Error) on = true over a transport (its exchanges size their
  // buffers on the host) and while a micro-batch is in flight.
  void set_host_sync_free(bool on);
  bool host_sync_free() const { return ctx_.host_sync_free; }
  // The last backward's mean cross-entropy, device FP32 [1] (a stage without the LM head: never written).
  const float* loss_device() const;
  // ModelContext::device_state_writes of the model's passes so far: a CUDA graph of its passes stays valid while this
  // count (and DeviceMemory::releases) is unchanged; an evaluation forward of another B changes it.
  uint64_t device_state_writes() const { return ctx_.device_state_writes; }

  // Over a transport of W ranks (above): backward_in_slot and forward_backward add (grad_scale / W) d(L_r)/dθ, the
  // rank's part of the group's objective; reduce_gradients() then sums the replicated parameters' gradients over the
  // ranks (in place, asynchronous on the model's stream; the routed experts' stay local). A collective, once per
  // optimizer step after the last backward. Without a transport a no-op (W = 1, nothing to sum).
  void reduce_gradients();
  // Over a transport: the expert-parallel exchanges of every MoE layer (EpExchange, trainer/comm/ep_exchange.h) since
  // the last call, summed over the layers and the kinds (counts, dispatch, combine and their gradients): bytes sent to
  // and received from the other ranks and copied to itself, and the milliseconds of the transport's exchanges when
  // timed (set_exchange_timing: CUDA events around each; waits for them); the counts then restart. Zero without a
  // transport.
  struct ExchangeTotals {
    EpExchangeBytes bytes;
    double ms = 0;
  };
  ExchangeTotals take_exchange_totals();
  void set_exchange_timing(bool on);
  EpTransport* transport() const;  // null on one GPU
  int world_size() const;          // the transport's ranks; 1 without one
  int rank() const;                // this rank; 0 without a transport

  // Once per optimizer step, before its first forward: the step number (counted from 1, as the trainer's) seeds the
  // step's MXFP4 quantizer choices, ModelContext::quant_seed = splitmix64_at(train.seed, step) (random Hadamard
  // signs, stochastic rounding of gradients: fresh per step, the same after a resume); over a transport, mixed with
  // the rank (splitmix64_at(that, rank)) so that the ranks draw independent bits. Without it: seed 0.
  void begin_step(uint64_t step);
  // Once per optimizer step, after the update: the v3 router's aux-loss-free bias update from the expert loads
  // counted over the step's micro-batches (then the counts restart). No-op for v2 and dense models.
  void end_step();

  // For checks against another implementation: the top-k expert ids [B*T, top_k] (device int32) each MoE
  // layer chose in the active slot's forward (the last one with one slot), in layer order (empty for a dense model).
  std::vector<const int32_t*> last_topk_indices() const;
  // Forces the routing of the next forward/forward_backward: per MoE layer in order a device int32
  // [B*T, top_k] of expert ids (the router's scores, gates and bias are computed as usual, only the choice is
  // taken from here); an empty vector returns to normal routing. The arrays stay owned by the caller and must
  // outlive the forwards that use them. Throws fp4moe::Error for a non-empty vector whose size is not the number
  // of MoE layers.
  void force_routing(std::vector<const int32_t*> topk_per_layer);

  // Per MoE layer in layer order: the bytes per routed token of its expert dispatch payload
  // (MoeRoutedExperts::dispatch_bytes, trainer/model/moe_experts.h); empty for a dense model.
  std::vector<DispatchBytes> dispatch_bytes() const;

  // Per decoder layer of the stage, in order (LayerMemory above), for one micro-batch (one slot).
  std::vector<LayerMemory> layer_memory() const;
  // Activations kept outside the decoder layers for one micro-batch: on the last stage the final norm's input h[L]
  // and output (2 d per token each), its rstd (4 per token) and the model's copy of the targets (4 per token); on
  // the first stage its copy of the tokens (4 per token). layer_memory()'s kept() summed plus this, times
  // position().in_flight, is MemCategory::activations after construction.
  size_t head_activation_bytes() const;
  // The model's own buffers beside its layers' (trainer/memory/buffer_plan.h; module "model") for `seq_share`
  // rows of hidden d: activations "h[L] (final norm input)", "h_out (LM head input)" [seq_share, d] BF16, the
  // final norm's RmsNorm::buffers prefixed "final norm " and "targets (loss input)" [seq_share] int32 (last stage),
  // "tokens (embedding backward input)" [seq_share] int32 (first stage); workspace "sub-layer output / branch grad"
  // and "residual-stream grad" [seq_share, d] BF16 (shared by all layers), "loss" [1] FP32 (last stage); backward's
  // scratch "LM head Dgrad (FP32)" [seq_share, d] (last stage) and "embedding backward workspace" (first stage:
  // embedding_backward_array_bytes + embedding_sort_bytes, cub's sort storage, which only a device can tell: the
  // model queries it, the estimator passes 0). One GPU holds the first and the last stage. Each layer's input h[l]
  // is in its own plan (DecoderLayer::buffers). Rejects seq_share < 0 and embedding_sort_bytes < 0.
  static BufferPlan buffers(const TrainerConfig& cfg, int64_t seq_share, bool first_stage, bool last_stage,
                            int64_t embedding_sort_bytes);
  // The vocabulary chunk of the LM head's cross-entropy (LmHeadCrossEntropy) for a vocabulary (a GPU's share of
  // it): min(8192, vocab rounded up to 8).
  static int64_t lm_head_chunk(int64_t vocab);
  // The shared scratch (capacity: scratch_arena_bytes on this GPU; high_water: the most used since construction).
  const ScratchArena& scratch() const;
  // The capacity of the shared scratch arena on one GPU of `stage` (trainer/memory/scratch.h): the largest single
  // call, over the stage's decoder layers (DecoderLayer::scratch(cfg, l, shape).high_water()) and
  // head_scratch_bytes. The model sizes its arena with it at LayerShape::one_gpu and cub's sort storage queried from
  // the device; the memory estimator calls it at one GPU's shapes of any layout with embedding_sort_bytes = 0 (only
  // a device can tell it). Rejects what DecoderLayer::scratch and buffers() reject.
  static size_t scratch_arena_bytes(const TrainerConfig& cfg, const PipelineStage& stage, const LayerShape& shape,
                                    int64_t embedding_sort_bytes);
  // The largest backward scratch of the model's own passes for `seq_share` rows, each rounded as the arena takes it:
  // buffers()' "LM head Dgrad (FP32)" and the final norm's backward (last stage), "embedding backward workspace"
  // (first stage, with embedding_sort_bytes). Rejects what buffers() rejects.
  static size_t head_scratch_bytes(const TrainerConfig& cfg, const PipelineStage& stage, int64_t seq_share,
                                   int64_t embedding_sort_bytes);

  // The pipeline stage this model is (pipeline_stage(cfg): stage 0 of 1 with every layer without a [parallel]
  // section) and so its decoder layers [stage().first_layer, stage().first_layer + stage().layers).
  const PipelineStage& stage() const;

  // The communication buffers of one GPU of a layout (module "comm", MemCategory::comm, held from construction),
  // stated once for the model (which allocates them) and the estimator: with ep > 1 and a stage with MoE layers, one
  // MoE layer's expert-parallel exchange: "dispatch send" (seq_share k rows) and "dispatch receive" (routed_rows
  // rows) of the routed recipe's forward payload, "combine send (BF16)" (routed_rows) and "combine receive (BF16)"
  // (seq_share k), or, when the backward's two exchanges are larger, "backward dy send", "backward dy receive" of
  // expert_parallel_row_bytes' backward_dispatch row and "backward dx send (BF16)", "backward dx receive (BF16)" of
  // its backward_combine row (bytes, ElemType::byte);
  // with pp > 1 kPipelineSend and kPipelineReceive [seq_share, hidden] BF16, one micro-batch's hidden state (or its
  // gradient). Nothing with ep = pp = 1. Rejects seq_share < 0, routed_rows < 0, ep < 1, pp < 1.
  static BufferPlan comm_buffers(const TrainerConfig& cfg, int64_t seq_share, int64_t routed_rows, int64_t ep,
                                 int64_t pp, bool stage_has_moe);
  static constexpr const char* kPipelineSend = "pipeline send (hidden state)";
  static constexpr const char* kPipelineReceive = "pipeline receive (hidden state)";

  ParamStore& params() { return store_; }
  const TrainerConfig& config() const { return cfg_; }
  ModelContext& context() { return ctx_; }
  // The attention core's backend as resolved at construction for micro_batch x seq_len tokens (own or cudnn), and
  // one line saying which: with the cuDNN version and backward mode, under auto both times in ms (or why untimed),
  // or why cuDNN could not run it.
  AttentionBackend attention_backend() const;
  const std::string& attention_backend_note() const;

 private:
  struct Impl;
  TrainerConfig cfg_;
  PipelinePosition position_;
  ParamStore store_;
  ModelContext ctx_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe
