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
#include "trainer/model/decoder_layer.h"

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

// The decoder layer's sizes on one GPU of the layout (trainer/model/decoder_layer.h's LayerShape).
LayerShape layer_shape(const TrainerConfig& cfg, const ParallelLayout& layout);

// Every buffer of decoder layer `layer` on one GPU of the layout, from DecoderLayer::buffers at layer_shape: one
// term per planned buffer with bytes > 0 (kept = held; first_forward for the Linears' and Group Linears' own), in
// its category (activations, weights: the FP8 weight copies, workspace: the Linears' and Group Linears' own
// scratch, held per layer).
std::vector<MemoryTerm> layer_buffer_terms(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t layer);

// The model's terms outside the decoder layers for `stage` of `pp` stages: activations of the final norm and LM
// head (last stage), workspace of the residual stream, the LM head's chunked cross-entropy and the batch (the model's
// passes' scratch is the shared arena's, Model::scratch_arena_bytes).
std::vector<MemoryTerm> model_terms(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage);

// Communication buffers of a stage (MemCategory::comm): Model::comm_buffers at this GPU's shapes (one MoE layer's
// dispatch and combine when ep > 1 and the stage has a MoE layer, the pipeline's hidden-state buffers when pp > 1),
// allocated by the model when it emulates the layout.
std::vector<MemoryTerm> comm_terms(const TrainerConfig& cfg, const ParallelLayout& layout, bool stage_has_moe);

inline int64_t round_up_256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace fp4moe::mem_detail
