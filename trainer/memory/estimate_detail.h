// Internals of the memory estimator shared by trainer/memory/estimate.cpp (layout, parameters, assembly) and
// trainer/memory/estimate_terms.cpp (activation, scratch, model-level and communication terms). Not a public API: the
// formulas and their meaning are documented in trainer/memory/estimate.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/estimate.h"

namespace fp4moe::mem_detail {

// The sizes of trainer/memory/estimate.h's notation for one GPU of a layout (validated beforehand).
struct Dims {
  int64_t d, H, Hl, nope, rope, dqk, dv, rq, rkv;  // model; Hl = H / tp
  int64_t F, Fl;                                   // dense FFN width, per GPU
  int64_t E, El, k, f, Sl;                         // experts; Sl = shared_experts x f / tp
  int64_t V, Vl;                                   // vocabulary, per GPU (ceil(V / tp))
  int64_t N, Ns, R;                                // tokens of a micro-batch, sequence-parallel share, routed rows
  Recipe attn, dense, shared, routed;
};
Dims dims_of(const TrainerConfig& cfg, const ParallelLayout& layout);

// The recompute modules of cfg.recompute as flags (`full` sets only `full`).
struct Policy {
  bool mla_up_proj = false, core_attn = false, layernorm = false, moe_act = false, moe = false, mlp = false,
       shared_experts = false, full = false;
};
Policy policy_of(const RecomputeConfig& rc);

// Q_r(K, G) of the header: bytes a linear of recipe r (G groups) keeps of its input X [M, K] for backward, as
// codes (BF16 elements for bf16) and scales; fp8 checked against GroupLinear::held_activation_bytes.
struct QuantizedCopy {
  int64_t codes = 0, scales = 0;
};
QuantizedCopy quantized_input_copy(Recipe r, int64_t M, int64_t K, int64_t G);
int64_t quantized_input_bytes(Recipe r, int64_t M, int64_t K, int64_t G);  // codes + scales

// FP8 copies of a linear's weights W [G, N, K] and W^T (GroupLinear::weight_copy_bytes; 0 for bf16); with
// `as_allocated`, each of the four buffers (W codes, W scales, W^T codes, W^T scales) rounded up to 256 bytes.
int64_t weight_copy_bytes(Recipe r, int64_t G, int64_t N, int64_t K, bool as_allocated);

// Scratch that decoder layer `layer` allocates for its backward as the trainer is built (MemCategory::workspace,
// every term allocated through DeviceMemory): norms' dweight partial sums, MLA's gradient buffers and attention
// backward workspace, the FFN's or the MoE's gradient buffers.
std::vector<MemoryTerm> layer_scratch_terms(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t layer);

// The model's terms outside the decoder layers for `stage` of `pp` stages: activations of the final norm and LM
// head (last stage), workspace of the residual stream, LM head, embedding backward and batch (first / last stage).
std::vector<MemoryTerm> model_terms(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage);

// Communication buffers of a stage (MemCategory::comm): one MoE layer's dispatch and combine when ep > 1 and the
// stage has a MoE layer, the pipeline's hidden-state buffers when pp > 1. Not allocated by the trainer as built.
std::vector<MemoryTerm> comm_terms(const TrainerConfig& cfg, const ParallelLayout& layout, bool stage_has_moe);

inline int64_t round_up_256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace fp4moe::mem_detail
