// The memory estimator's layouts, parameter tensors and per-stage assembly (trainer/memory/estimate.h); the
// per-buffer terms are in trainer/memory/estimate_terms.cpp.
#include "trainer/memory/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/common/check.h"
#include "trainer/memory/estimate_detail.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/model.h"

namespace fp4moe {

using mem_detail::Dims;
using mem_detail::round_up_256;

namespace {

constexpr double kGiB = 1073741824.0;

std::string layer_name(int64_t l, const char* part) { return "layers." + std::to_string(l) + "." + part; }

// Parameters of decoder layer l on one GPU of the layout.
void layer_parameters(const TrainerConfig& cfg, const Dims& g, int64_t l, std::vector<ParamTensor>& out) {
  auto param = [&](const char* part, int64_t n) {
    const std::string name = layer_name(l, part);
    out.push_back(ParamTensor{name, n, is_routed_expert_param(name), false});
  };
  const int64_t d = g.d, qk = g.Hl * g.dqk;
  param("attn_norm", d);
  if (g.rq > 0) {
    param("attn.q_down", g.rq * d);
    param("attn.q_norm", g.rq);
    param("attn.q_up", qk * g.rq);
  } else {
    param("attn.q_proj", qk * d);
  }
  param("attn.kv_down", (g.rkv + g.rope) * d);
  param("attn.kv_norm", g.rkv);
  param("attn.kv_up", g.Hl * (g.nope + g.dv) * g.rkv);
  param("attn.out", d * g.Hl * g.dv);
  param("ffn_norm", d);
  if (!cfg.is_moe_layer(l)) {
    param("mlp.fc1", 2 * g.Fl * d);
    param("mlp.fc2", d * g.Fl);
    return;
  }
  param("moe.router", g.E * d);
  param("moe.experts.fc1", g.El * 2 * g.f * d);
  param("moe.experts.fc2", g.El * d * g.f);
  if (g.Sl > 0) {
    param("moe.shared.fc1", 2 * g.Sl * d);
    param("moe.shared.fc2", d * g.Sl);
  }
}

struct StageRange {
  int64_t first = 0, count = 0;
};

StageRange stage_range(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t stage) {
  const PipelineStage ps = pipeline_stage(cfg, lay, stage);
  return StageRange{ps.first_layer, ps.layers};
}

std::vector<ParamTensor> stage_tensors(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t stage) {
  const Dims g = mem_detail::dims_of(cfg, lay);
  const StageRange r = stage_range(cfg, lay, stage);
  std::vector<ParamTensor> out;
  if (stage == 0) out.push_back(ParamTensor{"embed", g.Vl * g.d, false, false});
  for (int64_t l = r.first; l < r.first + r.count; ++l) layer_parameters(cfg, g, l, out);
  if (stage == lay.pp - 1) {
    out.push_back(ParamTensor{"norm", g.d, false, false});
    out.push_back(ParamTensor{"lm_head", g.Vl * g.d, false, false});
  }
  if (cfg.moe.router == RouterStyle::v3_sigmoid)
    for (int64_t l = r.first; l < r.first + r.count; ++l)
      if (cfg.is_moe_layer(l)) out.push_back(ParamTensor{layer_name(l, "moe.router_bias"), g.E, false, true});
  return out;
}

// Adds `t` to `terms`, merged with an equal term (same category, module, tensor, size and flags) if there is one.
void merge(std::vector<MemoryTerm>& terms, MemoryTerm t) {
  for (MemoryTerm& u : terms)
    if (u.category == t.category && u.module == t.module && u.tensor == t.tensor && u.bytes == t.bytes &&
        u.kept == t.kept && u.device_memory == t.device_memory && u.first_forward == t.first_forward) {
      u.instances += t.instances;
      return;
    }
  terms.push_back(std::move(t));
}

void add_parameter_terms(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t stage, MemoryEstimate& e) {
  const std::vector<ParamTensor> tensors = stage_tensors(cfg, lay, stage);
  int64_t params = 0, state = 0;
  std::vector<int64_t> sizes;
  std::vector<bool> experts;
  for (const ParamTensor& t : tensors) {
    (t.state ? state : params) += param_padded(t.n);
    if (t.state) continue;
    sizes.push_back(t.n);
    experts.push_back(t.expert);
  }
  const int64_t shard = zero1_layout(sizes, experts, lay.zero1_parts()).storage();  // masters, m, v: the shard
  const int64_t fp32 = 4 * shard, moment = moment_dtype_bytes(cfg.train.moments) * shard;
  const bool bf16_moments = cfg.train.moments == MomentDtype::bf16;
  // The Linears' and Group Linears' FP8 weight copies (their buffer plans), from DeviceMemory at the first forward.
  int64_t routed_copies = 0, dense_copies = 0;
  const StageRange r = stage_range(cfg, lay, stage);
  for (int64_t l = r.first; l < r.first + r.count; ++l)
    for (const MemoryTerm& t : mem_detail::layer_buffer_terms(cfg, lay, l))
      if (t.category == MemCategory::weights)
        (t.module == "moe.experts" ? routed_copies : dense_copies) += round_up_256(t.bytes);
  auto add = [&](MemCategory c, const char* tensor, int64_t bytes, bool first_forward = false) {
    if (bytes > 0) e.terms.push_back(MemoryTerm{c, "params", tensor, bytes, 1, true, true, first_forward});
  };
  add(MemCategory::weights, "BF16 parameters", 2 * params);
  add(MemCategory::weights, "FP32 master weights", fp32);
  add(MemCategory::weights, "FP32 state", 4 * state);
  add(MemCategory::weights, "FP8 weight copies, routed experts", routed_copies, true);
  add(MemCategory::weights, "FP8 weight copies, dense linears", dense_copies, true);
  add(MemCategory::grads, lay.grad_bytes == 2 ? "BF16 gradients" : "FP32 gradients", lay.grad_bytes * params);
  add(MemCategory::optimizer, bf16_moments ? "AdamW m (BF16)" : "AdamW m (FP32)", moment);
  add(MemCategory::optimizer, bf16_moments ? "AdamW v (BF16)" : "AdamW v (FP32)", moment);
}

}  // namespace

ParallelLayout single_gpu_layout(const TrainerConfig& cfg) {
  ParallelLayout l;
  l.name = "1 GPU";
  l.source = "the configuration as run by fp4moe train";
  l.micro_batch = cfg.train.micro_batch;
  l.seq_len = cfg.train.seq_len;
  return l;
}

ParallelLayout layout_of(const TrainerConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  ParallelLayout l = single_gpu_layout(cfg);
  if (p.gpus() == 1 && p.ep == 1 && p.micro_batches == 1 && !p.zero1 && p.routed_load == 1.0) return l;
  l.gpus = p.gpus();
  l.name = fmt::format("{} GPU{}", l.gpus, l.gpus == 1 ? "" : "s");
  l.source = "the configuration's [parallel] section";
  l.tp = p.tp;
  l.pp = p.pp;
  l.dp = p.dp;
  l.ep = p.ep;
  l.micro_batches = p.micro_batches;
  l.zero1 = p.zero1;
  l.routed_load = p.routed_load;
  return l;
}

void validate_layout(const TrainerConfig& cfg, const ParallelLayout& l) {
  const ModelConfig& m = cfg.model;
  const std::pair<int64_t, const char*> sizes[] = {{l.gpus, "gpus"}, {l.tp, "tp"},
                                                   {l.pp, "pp"},     {l.dp, "dp"},
                                                   {l.ep, "ep"},     {l.micro_batch, "micro_batch"},
                                                   {l.seq_len, "seq_len"}, {l.micro_batches, "micro_batches"}};
  for (const auto& [v, name] : sizes)
    FP4MOE_CHECK(v >= 1, "layout {}: {} must be >= 1, got {}", l.name, name, v);
  FP4MOE_CHECK(l.gpus == l.tp * l.pp * l.dp, "layout {}: gpus = {} must equal tp x pp x dp = {} x {} x {}", l.name,
               l.gpus, l.tp, l.pp, l.dp);
  FP4MOE_CHECK((l.dp * l.tp) % l.ep == 0, "layout {}: ep = {} must divide dp x tp = {} (experts are split over the "
               "GPUs of one stage)", l.name, l.ep, l.dp * l.tp);
  const bool has_moe = m.n_dense_layers < m.layers;
  FP4MOE_CHECK(!has_moe || cfg.moe.routed_experts % l.ep == 0,
               "layout {}: ep = {} must divide moe.routed_experts = {}", l.name, l.ep, cfg.moe.routed_experts);
  FP4MOE_CHECK(m.heads % l.tp == 0, "layout {}: tp = {} must divide model.heads = {}", l.name, l.tp, m.heads);
  FP4MOE_CHECK(m.n_dense_layers == 0 || m.dense_ffn % l.tp == 0,
               "layout {}: tp = {} must divide model.dense_ffn = {}", l.name, l.tp, m.dense_ffn);
  FP4MOE_CHECK(!has_moe || (cfg.moe.shared_experts * cfg.moe.expert_ffn) % l.tp == 0,
               "layout {}: tp = {} must divide the shared experts' width {}", l.name, l.tp,
               cfg.moe.shared_experts * cfg.moe.expert_ffn);
  FP4MOE_CHECK(l.pp <= m.layers, "layout {}: pp = {} exceeds model.layers = {}", l.name, l.pp, m.layers);
  FP4MOE_CHECK(has_moe || l.ep == 1, "layout {}: ep = {} needs MoE layers (model.n_dense_layers = model.layers = {}: "
               "there are no routed experts to share)", l.name, l.ep, m.layers);
  FP4MOE_CHECK(l.routed_load <= static_cast<double>(l.ep),
               "layout {}: routed_load = {} must be at most ep = {} (a GPU receives at most every rank's rows)", l.name,
               l.routed_load, l.ep);
  FP4MOE_CHECK(std::isfinite(l.routed_load) && l.routed_load >= 1.0,
               "layout {}: routed_load must be finite and >= 1 (1: balanced routing), got {}", l.name, l.routed_load);
  FP4MOE_CHECK(l.grad_bytes == 4 || l.grad_bytes == 2,
               "layout {}: grad_bytes must be 4 (FP32 gradients) or 2 (BF16), got {}", l.name, l.grad_bytes);
  if (l.stage_layers.empty()) return;
  FP4MOE_CHECK(static_cast<int64_t>(l.stage_layers.size()) == l.pp,
               "layout {}: stage_layers has {} entries, expected pp = {}", l.name, l.stage_layers.size(), l.pp);
  int64_t sum = 0;
  for (int64_t n : l.stage_layers) {
    FP4MOE_CHECK(n >= 1, "layout {}: every stage needs a layer, got {}", l.name, n);
    sum += n;
  }
  FP4MOE_CHECK(sum == m.layers, "layout {}: stage_layers sum to {}, expected model.layers = {}", l.name, sum, m.layers);
}

std::vector<int64_t> stage_layer_counts(const TrainerConfig& cfg, const ParallelLayout& l) {
  validate_layout(cfg, l);
  if (!l.stage_layers.empty()) return l.stage_layers;
  const int64_t L = cfg.model.layers, base = L / l.pp, extra = L % l.pp;
  std::vector<int64_t> counts(static_cast<size_t>(l.pp), base);
  for (int64_t s = l.pp - extra; s < l.pp; ++s) counts[static_cast<size_t>(s)] += 1;
  return counts;
}

PipelineStage pipeline_stage(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t stage) {
  const std::vector<int64_t> counts = stage_layer_counts(cfg, lay);
  FP4MOE_CHECK(stage >= 0 && stage < lay.pp, "pipeline stage {} is outside [0, pp = {})", stage, lay.pp);
  PipelineStage r;
  r.stage = stage;
  r.pp = lay.pp;
  for (int64_t s = 0; s < stage; ++s) r.first_layer += counts[static_cast<size_t>(s)];
  r.layers = counts[static_cast<size_t>(stage)];
  return r;
}

PipelineStage pipeline_stage(const TrainerConfig& cfg) {
  validate_config(cfg);  // parallel.stage in [-1, pp)
  const ParallelLayout layout = layout_of(cfg);
  const int64_t stage = cfg.parallel.stage >= 0 ? cfg.parallel.stage : estimate_memory(cfg, layout).stage;
  return pipeline_stage(cfg, layout, stage);
}

std::vector<ParamTensor> parameter_tensors(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage) {
  validate_config(cfg);
  return stage_tensors(cfg, layout, stage);
}

LayerActivationBuckets layer_activation_buckets(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t layer) {
  LayerActivationBuckets b;
  for (const MemoryTerm& t : layer_activation_terms(cfg, layout, layer)) {
    if (!t.kept || !t.device_memory) continue;
    const int64_t bytes = round_up_256(t.bytes);
    if (t.first_forward) {
      b.quantized_copies += bytes;
      continue;
    }
    const bool norm = t.tensor == "attn_norm out" || t.tensor == "ffn_norm out" || t.tensor == "n_q" ||
                      t.tensor == "n_kv" || t.tensor.find("rstd") != std::string::npos;
    if (norm) b.norms += bytes;
    else if (t.module == "layer") b.residual += bytes;
    else if (t.module == "mla") b.attn += bytes;
    else b.ffn += bytes;
    if (t.module == "moe.experts") b.routed_experts += bytes;
  }
  return b;
}

MemoryEstimate estimate_memory_stage(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t stage) {
  validate_config(cfg);
  const StageRange range = stage_range(cfg, lay, stage);  // validates the layout and the stage
  MemoryEstimate e;
  e.layout = lay;
  e.stage = stage;
  e.first_layer = range.first;
  e.layers = range.count;
  e.in_flight = lay.in_flight(stage);
  e.tokens = lay.micro_batch * lay.seq_len;
  add_parameter_terms(cfg, lay, stage, e);

  // Activations over the stage's layers; workspace: the Linears' own scratch of every layer, and the shared scratch
  // arena the layers' passes take from in turn, sized as the model sizes it (Model::scratch_arena_bytes).
  const LayerShape shape = mem_detail::layer_shape(cfg, lay);
  int64_t layers_scratch = 0;  // every layer's arena high-water, summed
  bool has_moe = false;
  for (int64_t l = range.first; l < range.first + range.count; ++l) {
    has_moe = has_moe || cfg.is_moe_layer(l);
    // The Linears' and Group Linears' own scratch buffers, held by every layer (their buffer plans' first_forward
    // workspace).
    for (MemoryTerm t : mem_detail::layer_buffer_terms(cfg, lay, l))
      if (t.category == MemCategory::workspace && t.first_forward) merge(e.terms, std::move(t));
    int64_t kept = 0;
    for (MemoryTerm t : layer_activation_terms(cfg, lay, l)) {
      kept += t.total();  // a term not kept is taken from the arena while a pass makes or rebuilds it
      t.instances = e.in_flight;
      merge(e.terms, std::move(t));
    }
    e.layer_activation_bytes.push_back(kept);
    if (cfg.train.cuda_graph && cfg.is_moe_layer(l) && cfg.moe.router == RouterStyle::v3_sigmoid)
      // the v3 router's expert loads counted on the device (moe_router.h), by the first backward without host
      // synchronisation
      merge(e.terms, MemoryTerm{MemCategory::workspace, "moe.router", "step tally (train.cuda_graph)",
                                4 * cfg.moe.routed_experts, 1, true, true, true});
    layers_scratch += static_cast<int64_t>(DecoderLayer::scratch(cfg, l, shape).high_water());
  }
  // cub's sort storage of the embedding backward: only a device can tell it (not counted).
  const PipelineStage ps = pipeline_stage(cfg, lay, stage);
  const auto arena = static_cast<int64_t>(Model::scratch_arena_bytes(cfg, ps, shape, 0));
  e.terms.push_back(MemoryTerm{MemCategory::workspace, "model", kScratchArenaTerm, arena, 1, true, true, false});
  for (MemoryTerm t : mem_detail::model_terms(cfg, lay, stage)) {
    if (t.category == MemCategory::activations) t.instances = e.in_flight;
    merge(e.terms, std::move(t));
  }
  for (MemoryTerm t : mem_detail::comm_terms(cfg, lay, has_moe)) merge(e.terms, std::move(t));

  for (const MemoryTerm& t : e.terms) {
    const int c = static_cast<int>(t.category);
    e.bytes[c] += t.total();
    if (t.device_memory && t.kept) e.device_memory[c] += round_up_256(t.bytes) * t.instances;
  }
  const auto head = static_cast<int64_t>(Model::head_scratch_bytes(cfg, ps, shape.seq_share, 0));
  e.workspace_all_layers = e.category(MemCategory::workspace) - arena + layers_scratch + head;
  return e;
}

MemoryEstimate estimate_memory(const TrainerConfig& cfg, const ParallelLayout& layout) {
  validate_config(cfg);
  validate_layout(cfg, layout);
  MemoryEstimate best = estimate_memory_stage(cfg, layout, 0);
  for (int64_t s = 1; s < layout.pp; ++s) {
    MemoryEstimate e = estimate_memory_stage(cfg, layout, s);
    if (e.total() > best.total()) best = std::move(e);
  }
  return best;
}

MemoryEstimate estimate_memory(const TrainerConfig& cfg) {
  validate_config(cfg);
  const ParallelLayout layout = layout_of(cfg);
  return cfg.parallel.stage < 0 ? estimate_memory(cfg, layout)
                                 : estimate_memory_stage(cfg, layout, pipeline_stage(cfg).stage);
}

int64_t MemoryEstimate::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

double MemoryEstimate::gib(MemCategory c) const { return static_cast<double>(category(c)) / kGiB; }
double MemoryEstimate::total_gib() const { return static_cast<double>(total()) / kGiB; }
double MemoryEstimate::fraction_of(double card_gib) const { return total_gib() / card_gib; }

std::vector<std::pair<std::string, int64_t>> MemoryEstimate::activations_by_module() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const MemoryTerm& t : terms) {
    if (t.category != MemCategory::activations) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == t.module; });
    if (it == out.end()) out.emplace_back(t.module, t.total());
    else it->second += t.total();
  }
  return out;
}

}  // namespace fp4moe
