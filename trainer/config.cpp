#include "trainer/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "kernels/common/check.h"
#include "trainer/data/loader.h"
#include "trainer/data/token_shard.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

bool RecomputeConfig::has(const std::string& module) const {
  return std::find(modules.begin(), modules.end(), module) != modules.end() ||
         std::find(modules.begin(), modules.end(), "full") != modules.end();
}

namespace {

const char* router_text(RouterStyle s) { return s == RouterStyle::v2_softmax ? "v2" : "v3"; }
const char* policy_text(NonFinitePolicy p) { return p == NonFinitePolicy::stop ? "stop" : "skip"; }

// The command line's integers: decimal and within int64_t (CLI11 alone reads 010 as octal 8 and clamps
// 99999999999999999999 to 2^63 - 1 without a word).
const CLI::Validator kDecimalInt64(
    [](std::string& text) -> std::string {
      int64_t v = 0;
      const char* end = text.data() + text.size();
      const auto [ptr, ec] = std::from_chars(text.data(), end, v);
      const std::string_view digits = std::string_view(text).substr(text.starts_with('-') ? 1 : 0);
      const bool octal = digits.size() > 1 && digits[0] == '0';
      if (ec == std::errc() && ptr == end && !octal) return "";
      return fmt::format("'{}' is not a decimal integer in [{}, {}]", text, std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max());
    },
    "", "INT64");

// The command line's booleans: true or false, as the configuration file's TOML booleans (CLI11 alone reads any
// integer, 2 as true and -1 as false, and yes/no/on/off).
const CLI::Validator kBoolean(
    [](std::string& text) -> std::string {
      return text == "true" || text == "false" ? "" : fmt::format("'{}' is not a boolean (true or false)", text);
    },
    "", "BOOLEAN");

}  // namespace

ConfigOptions::ConfigOptions(CLI::App& app, TrainerConfig& cfg) : cfg_(cfg) {
  ModelConfig& m = cfg.model;
  MoeConfig& e = cfg.moe;
  TrainingConfig& t = cfg.train;
  router_ = router_text(e.router);
  non_finite_ = policy_text(t.non_finite);
  recipe_attention_ = recipe_name(cfg.recipe.attention);
  recipe_dense_ = recipe_name(cfg.recipe.dense_mlp);
  recipe_shared_ = recipe_name(cfg.recipe.shared_experts);
  recipe_routed_ = recipe_name(cfg.recipe.routed_experts);
  attention_backend_ = attention_backend_name(m.attention_backend);
  moments_ = moment_dtype_name(t.moments);

  app.add_option("--config", config_path_, "TOML configuration file (configs/*.toml); options given here win");
  seed_ = static_cast<int64_t>(t.seed);
  auto add = [&](const char* key, auto& var, const char* help) {
    fields_.push_back({key, &var});
    options_.push_back(
        app.add_option(fmt::format("--{}", key), var, help)->capture_default_str()->group("Configuration"));
    if constexpr (std::is_same_v<std::remove_reference_t<decltype(var)>, int64_t>)
      options_.back()->check(kDecimalInt64);
    if constexpr (std::is_same_v<std::remove_reference_t<decltype(var)>, bool>) options_.back()->check(kBoolean);
  };
  add("model.name", m.name, "preset name, for reports");
  add("model.vocab_size", m.vocab_size, "tokenizer vocabulary (the shards' vocab_size)");
  add("model.hidden", m.hidden, "d_model");
  add("model.layers", m.layers, "decoder layers");
  add("model.n_dense_layers", m.n_dense_layers, "first layers with a dense FFN instead of MoE");
  add("model.heads", m.heads, "attention heads");
  add("model.q_lora_rank", m.q_lora_rank, "query down-projection rank (0: direct projection)");
  add("model.kv_lora_rank", m.kv_lora_rank, "joint key/value compression rank");
  add("model.qk_nope_head_dim", m.qk_nope_head_dim, "per-head query/key dims without RoPE");
  add("model.qk_rope_head_dim", m.qk_rope_head_dim, "per-head decoupled RoPE dims");
  add("model.v_head_dim", m.v_head_dim, "per-head value dims");
  add("model.dense_ffn", m.dense_ffn, "dense SwiGLU intermediate size");
  add("model.rope_theta", m.rope_theta, "RoPE base");
  add("model.norm_eps", m.norm_eps, "RMSNorm epsilon");
  add("model.attention_backend", attention_backend_,
      "attention core: own (our flash attention kernels), cudnn (cuDNN's fused attention) or auto (the faster of the "
      "two, timed at micro_batch x seq_len; own where cuDNN cannot run)");
  add("model.attention_deterministic", m.attention_deterministic,
      "true or false: deterministic backward of the cuDNN attention backend (more workspace; our kernels always are)");
  add("moe.routed_experts", e.routed_experts, "routed experts per MoE layer");
  add("moe.shared_experts", e.shared_experts, "shared experts per MoE layer");
  add("moe.top_k", e.top_k, "routed experts per token");
  add("moe.expert_ffn", e.expert_ffn, "expert intermediate size");
  add("moe.router", router_, "v3 (sigmoid, aux-loss-free bias) or v2 (softmax, balance loss)");
  add("moe.routed_scale", e.routed_scale, "routed_scaling_factor");
  add("moe.aux_alpha", e.aux_alpha, "v2 balance loss coefficient");
  add("moe.bias_update_rate", e.bias_update_rate, "v3 aux-loss-free bias update speed");
  add("train.data_dir", t.data_dir, "token shards from make data");
  add("train.seq_len", t.seq_len, "tokens per row");
  add("train.micro_batch", t.micro_batch, "rows per micro-batch");
  add("train.grad_accum", t.grad_accum, "micro-batches per optimizer step");
  add("train.steps", t.steps, "optimizer steps");
  add("train.lr", t.lr, "peak learning rate");
  add("train.warmup_steps", t.warmup_steps, "linear warm-up steps");
  add("train.min_lr", t.min_lr, "learning rate at the end of the cosine decay");
  add("train.weight_decay", t.weight_decay, "AdamW weight decay");
  add("train.beta1", t.beta1, "AdamW beta1");
  add("train.beta2", t.beta2, "AdamW beta2");
  add("train.eps", t.eps, "AdamW epsilon");
  add("train.moments", moments_, "AdamW m and v storage: fp32 or bf16 (DeepSeek-V3's, round to nearest even)");
  add("train.grad_clip", t.grad_clip, "global gradient-norm clip (0: none)");
  add("train.seed", seed_, "seed of weights, data order and stochastic rounding");
  add("train.eval_interval", t.eval_interval, "steps between evaluations (0: none)");
  add("train.eval_steps", t.eval_steps, "validation batches per periodic evaluation (0: the whole validation split)");
  add("train.final_eval_steps", t.final_eval_steps,
      "validation batches of the final evaluation (0: the whole validation split)");
  add("train.non_finite", non_finite_, "skip or stop on a non-finite loss or gradient norm");
  add("train.checkpoint_interval", t.checkpoint_interval, "steps between checkpoints (0: none)");
  add("train.checkpoint_dir", t.checkpoint_dir, "checkpoint folder");
  add("train.cuda_graph", t.cuda_graph,
      "true or false: replay each step's forwards and backwards from one CUDA graph (no host synchronisation)");
  add("recipe.attention", recipe_attention_,
      "bf16, fp8 or mxfp4 for the MLA projections, then overrides (fp8 fprop=mxfp4 rounding=sr transform=h16)");
  add("recipe.dense_mlp", recipe_dense_,
      "bf16, fp8 or mxfp4 for the dense FFN, then overrides (fp8 fprop=mxfp4 rounding=sr transform=h16)");
  add("recipe.shared_experts", recipe_shared_,
      "bf16, fp8 or mxfp4 for the shared experts, then overrides (fp8 fprop=mxfp4 rounding=sr transform=h16)");
  add("recipe.routed_experts", recipe_routed_,
      "bf16, fp8 or mxfp4 for the routed experts, then overrides (fp8 fprop=mxfp4 rounding=sr transform=h16)");
  add("recompute.modules", cfg.recompute.modules,
      "modules recomputed in backward: mla_up_proj core_attn layernorm moe_act moe mlp shared_experts full (none: "
      "keep every activation)");
  options_.back()->expected(0, CLI::detail::expected_max_vector_size);
  ParallelConfig& p = cfg.parallel;
  add("parallel.tp", p.tp, "tensor-parallel GPUs (with sequence parallelism)");
  add("parallel.pp", p.pp, "pipeline stages (1F1B)");
  add("parallel.ep", p.ep, "expert-parallel GPUs (divides dp x tp and moe.routed_experts)");
  add("parallel.dp", p.dp, "data-parallel replicas (GPUs = tp x pp x dp)");
  add("parallel.micro_batches", p.micro_batches,
      "micro-batches per optimizer step per pipeline (must equal train.grad_accum, unless 1 on one GPU)");
  add("parallel.zero1", p.zero1,
      "true or false: distributed optimizer, FP32 masters and AdamW moments sharded over dp (dp > 1)");
  add("parallel.stage", p.stage, "pipeline stage to estimate and train (-1: the one with the largest peak)");
  add("parallel.routed_load", p.routed_load,
      "routed rows a GPU receives over the balanced share, in [1, ep] (1: balanced; more: the hottest rank of a "
      "skewed routing, emulated with extra rows of weight 0)");
}

void ConfigOptions::check_required(const std::set<std::string>& set) const {
  std::vector<const char*> required = {"model.vocab_size",       "model.hidden",           "model.layers",
                                       "model.heads",            "model.kv_lora_rank",     "model.qk_nope_head_dim",
                                       "model.qk_rope_head_dim", "model.v_head_dim",       "train.seq_len",
                                       "train.micro_batch",      "train.steps",            "train.lr"};
  if (cfg_.model.n_dense_layers > 0) required.push_back("model.dense_ffn");
  if (cfg_.model.n_dense_layers < cfg_.model.layers)
    for (const char* key : {"moe.routed_experts", "moe.top_k", "moe.expert_ffn"}) required.push_back(key);
  for (const char* key : required)
    FP4MOE_CHECK(set.count(key), "{} is missing (set it in the config file{} or with --{})", key,
                 config_path_.empty() ? "" : fmt::format(" '{}'", config_path_), key);
}

std::string ConfigOptions::origin(const std::string& key) const {
  if (from_command_line_.count(key)) return fmt::format("command line --{}", key);
  if (from_file_.count(key)) return fmt::format("config file '{}'", config_path_);
  return fmt::format("default of {}", key);
}

void ConfigOptions::load_config_file() {
  from_command_line_.clear();
  from_file_.clear();
  for (size_t i = 0; i < fields_.size(); ++i)
    if (options_[i]->count() > 0) from_command_line_.insert(fields_[i].key);
  if (!config_path_.empty()) {
    std::error_code ec;
    FP4MOE_CHECK(std::filesystem::is_regular_file(config_path_, ec), "config file '{}' does not exist or is not a file",
                 config_path_);
    from_file_ = read_config_file(config_path_, fields_, from_command_line_);
  }
  std::set<std::string> set = from_command_line_;  // the keys given on the command line or in the file
  set.insert(from_file_.begin(), from_file_.end());
  check_required(set);
  // Converts the text of option `key` with `convert`; an fp4moe::Error it throws is thrown again starting with where
  // the value came from (origin).
  auto from = [&](const char* key, auto&& convert) {
    try {
      return convert();
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", origin(key), e.what()));
    }
  };
  cfg_.train.seed = from("train.seed", [&] {
    FP4MOE_CHECK(seed_ >= 0, "train.seed must be >= 0, got {}", seed_);
    return static_cast<uint64_t>(seed_);
  });
  cfg_.moe.router = from("moe.router", [&] {
    FP4MOE_CHECK(router_ == "v3" || router_ == "v2", "moe.router = '{}': expected v3 (sigmoid) or v2 (softmax)",
                 router_);
    return router_ == "v2" ? RouterStyle::v2_softmax : RouterStyle::v3_sigmoid;
  });
  cfg_.train.non_finite = from("train.non_finite", [&] {
    FP4MOE_CHECK(non_finite_ == "skip" || non_finite_ == "stop", "train.non_finite = '{}': expected skip or stop",
                 non_finite_);
    return non_finite_ == "stop" ? NonFinitePolicy::stop : NonFinitePolicy::skip;
  });
  cfg_.model.attention_backend = from("model.attention_backend", [&] {
    return parse_attention_backend(attention_backend_, "model.attention_backend");
  });
  cfg_.train.moments = from("train.moments", [&] {
    FP4MOE_CHECK(moments_ == "fp32" || moments_ == "bf16",
                 "train.moments = '{}': expected fp32 or bf16 (the storage of AdamW's m and v)", moments_);
    return moments_ == "bf16" ? MomentDtype::bf16 : MomentDtype::fp32;
  });
  auto recipe = [&](const char* key, const std::string& text) {
    return from(key, [&] { return parse_recipe(text, key); });
  };
  cfg_.recipe.attention = recipe("recipe.attention", recipe_attention_);
  cfg_.recipe.dense_mlp = recipe("recipe.dense_mlp", recipe_dense_);
  cfg_.recipe.shared_experts = recipe("recipe.shared_experts", recipe_shared_);
  cfg_.recipe.routed_experts = recipe("recipe.routed_experts", recipe_routed_);
  // `modules = []` or `--recompute.modules none`: nothing recomputed.
  auto& mods = cfg_.recompute.modules;
  mods.erase(std::remove_if(mods.begin(), mods.end(), [](const std::string& s) { return s.empty() || s == "none"; }),
             mods.end());
}

TrainerConfig parse_config_args(const std::vector<std::string>& args) {
  TrainerConfig cfg;
  CLI::App app{"trainer configuration"};
  ConfigOptions options(app, cfg);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the arguments in reverse order
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& err) {
    FP4MOE_CHECK(false, "command line: {}", err.what());
  }
  options.load_config_file();
  validate_config(cfg);
  return cfg;
}

namespace {

void check_positive(int64_t v, const char* name) { FP4MOE_CHECK(v >= 1, "{} must be >= 1, got {}", name, v); }

// A float option, used in float32 by the model and the optimizer: finite and within [lo or (lo, and, when hi is
// finite, hi] or hi), both as given and after rounding to float32; the value must not overflow float32, and one that
// must be > 0 must stay a normal float32 (>= FLT_MIN), not round to a subnormal or to 0. The message states the range.
void check_float(double v, const char* name, double lo, bool lo_closed, double hi = INFINITY, bool hi_closed = false) {
  auto in_range = [&](double x) { return (lo_closed ? x >= lo : x > lo) && (hi_closed ? x <= hi : x < hi); };
  const std::string range = std::isinf(hi) ? fmt::format("{} {}", lo_closed ? ">=" : ">", lo)
                                           : fmt::format("in {}{}, {}{}", lo_closed ? '[' : '(', lo, hi,
                                                         hi_closed ? ']' : ')');
  FP4MOE_CHECK(std::isfinite(v) && in_range(v), "{} must be a finite number {}, got {}", name, range, v);
  constexpr float kMax = std::numeric_limits<float>::max(), kMinNormal = std::numeric_limits<float>::min();
  FP4MOE_CHECK(std::fabs(v) <= kMax, "{} = {} exceeds the largest float32 {:g}; it is used in float32", name, v, kMax);
  const float f = static_cast<float>(v);
  FP4MOE_CHECK(lo_closed || std::fabs(f) >= kMinNormal,
               "{} = {} is below the smallest normal float32 {:g}; it is used in float32", name, v, kMinNormal);
  FP4MOE_CHECK(in_range(f), "{} = {} rounds to {} in float32, which is not {}; it is used in float32", name, v, f,
               range);
}

// model.name: at most kMaxModelName characters, each printable ASCII (0x20 to 0x7e), so that it can be written into
// any result file or TOML string as it is.
constexpr size_t kMaxModelName = 128;
void check_model_name(const std::string& name) {
  FP4MOE_CHECK(name.size() <= kMaxModelName, "model.name is {} characters long, expected at most {}", name.size(),
               kMaxModelName);
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    FP4MOE_CHECK(c >= 0x20 && c <= 0x7e,
                 "model.name has character {:#04x} at position {}, expected printable ASCII (letters, digits, "
                 "punctuation, spaces)",
                 c, i);
  }
}

// The product of `factors` ({option name, value >= 0}) as int64_t; throws, naming the options, when it does not
// fit. `what` says what the product is.
int64_t checked_product(const char* what, std::initializer_list<std::pair<const char*, int64_t>> factors) {
  int64_t p = 1;
  bool overflow = false;
  std::vector<std::string> names, values;
  for (const auto& [name, v] : factors) {
    overflow |= __builtin_mul_overflow(p, v, &p);
    names.push_back(name);
    values.push_back(std::to_string(v));
  }
  FP4MOE_CHECK(!overflow, "{} = {} = {} does not fit in a 64-bit integer (at most {}): lower them", what,
               fmt::join(names, " x "), fmt::join(values, " x "), std::numeric_limits<int64_t>::max());
  return p;
}

int64_t checked_sum(const char* what, const char* a_name, int64_t a, const char* b_name, int64_t b) {
  int64_t s = 0;
  FP4MOE_CHECK(!__builtin_add_overflow(a, b, &s), "{} = {} + {} = {} + {} does not fit in a 64-bit integer: lower them",
               what, a_name, b_name, a, b);
  return s;
}

// GEMM dimensions: multiples of 16 (grouped_gemm.h, cuBLASLt FP8), 32 where an MXFP4 recipe blocks along them.
void check_gemm_dim(int64_t v, const char* name, bool mx) {
  const int64_t m = mx ? 32 : 16;
  FP4MOE_CHECK(v % m == 0, "{} = {} must be a multiple of {} ({})", name, v, m,
               mx ? "an mxfp4 recipe quantizes blocks of 32 along the GEMM's K"
                  : "the FP8/BF16 GEMMs take N and K in multiples of 16");
}

// Every size derived from the configuration as a product, once the factors are known to be positive.
void check_derived_sizes(const TrainerConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  const TrainingConfig& t = cfg.train;
  const int64_t row = checked_sum("tokens per row", "train.seq_len", t.seq_len, "1", 1);
  checked_product("tokens read per micro-batch", {{"train.micro_batch", t.micro_batch}, {"(train.seq_len + 1)", row}});
  const int64_t tokens = checked_product("tokens per micro-batch",
                                         {{"train.seq_len", t.seq_len}, {"train.micro_batch", t.micro_batch}});
  const int64_t step = checked_product("tokens per step", {{"train.seq_len", t.seq_len},
                                                           {"train.micro_batch", t.micro_batch},
                                                           {"train.grad_accum", t.grad_accum}});
  checked_product("tokens of the run", {{"tokens per step", step}, {"train.steps", t.steps}});
  checked_product("logits per micro-batch", {{"tokens per micro-batch", tokens}, {"model.vocab_size", m.vocab_size}});
  checked_product("activations per micro-batch", {{"tokens per micro-batch", tokens}, {"model.hidden", m.hidden}});
  checked_product("embedding weights", {{"model.vocab_size", m.vocab_size}, {"model.hidden", m.hidden}});
  const int64_t q_in = m.q_lora_rank > 0 ? m.q_lora_rank : m.hidden;
  checked_product("query up-projection weights", {{m.q_lora_rank > 0 ? "model.q_lora_rank" : "model.hidden", q_in},
                                                  {"model.heads", m.heads},
                                                  {"model.qk_nope_head_dim + qk_rope_head_dim", m.qk_head_dim()}});
  checked_product("key/value up-projection weights",
                  {{"model.kv_lora_rank", m.kv_lora_rank},
                   {"model.heads", m.heads},
                   {"model.qk_nope_head_dim + v_head_dim",
                    checked_sum("key/value head dims", "model.qk_nope_head_dim", m.qk_nope_head_dim,
                                "model.v_head_dim", m.v_head_dim)}});
  checked_product("output projection weights",
                  {{"model.heads", m.heads}, {"model.v_head_dim", m.v_head_dim}, {"model.hidden", m.hidden}});
  checked_product("dense FFN weights", {{"model.n_dense_layers", m.n_dense_layers},
                                        {"3", 3},
                                        {"model.hidden", m.hidden},
                                        {"model.dense_ffn", m.dense_ffn}});
  if (m.n_dense_layers < m.layers) {
    const int64_t moe_layers = m.layers - m.n_dense_layers;
    checked_product("routed expert weights", {{"MoE layers", moe_layers},
                                              {"moe.routed_experts", e.routed_experts},
                                              {"3", 3},
                                              {"model.hidden", m.hidden},
                                              {"moe.expert_ffn", e.expert_ffn}});
    checked_product("shared expert weights", {{"MoE layers", moe_layers},
                                              {"moe.shared_experts", e.shared_experts},
                                              {"3", 3},
                                              {"model.hidden", m.hidden},
                                              {"moe.expert_ffn", e.expert_ffn}});
    checked_product("routed activations per micro-batch", {{"tokens per micro-batch", tokens},
                                                           {"moe.top_k", e.top_k},
                                                           {"2", 2},
                                                           {"moe.expert_ffn", e.expert_ffn}});
  }
}

// [parallel]: the sizes, the GPU count and the stage here; the layout's divisibility rules are validate_layout's,
// applied to layout_of(cfg) (its messages name the layout "[parallel]").
void validate_parallel(const TrainerConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  constexpr int64_t kMaxGpus = int64_t{1} << 20;
  const std::pair<int64_t, const char*> sizes[] = {
      {p.tp, "parallel.tp"}, {p.pp, "parallel.pp"}, {p.ep, "parallel.ep"}, {p.dp, "parallel.dp"},
      {p.micro_batches, "parallel.micro_batches"}};
  for (const auto& [v, name] : sizes) {
    check_positive(v, name);
    FP4MOE_CHECK(v <= kMaxGpus, "{} = {} exceeds {}", name, v, kMaxGpus);
  }
  FP4MOE_CHECK(p.gpus() <= kMaxGpus, "[parallel]: tp x pp x dp = {} x {} x {} exceeds {} GPUs", p.tp, p.pp, p.dp,
               kMaxGpus);
  FP4MOE_CHECK(p.stage >= -1 && p.stage < p.pp,
               "parallel.stage = {} must be -1 (the stage with the largest peak) or in [0, parallel.pp = {})", p.stage,
               p.pp);
  FP4MOE_CHECK(std::isfinite(p.routed_load) && p.routed_load >= 1.0,
               "parallel.routed_load must be a finite number >= 1 (1: balanced routing), got {}", p.routed_load);
  FP4MOE_CHECK(p.routed_load <= static_cast<double>(p.ep),
               "parallel.routed_load = {} must be at most parallel.ep = {} (a GPU receives at most every rank's rows; "
               "1 without expert parallelism)", p.routed_load, p.ep);
  FP4MOE_CHECK(!p.zero1 || p.dp > 1, "parallel.zero1 = true needs parallel.dp > 1 (ZeRO-1 shards the optimizer over "
               "the data-parallel replicas), got dp = {}", p.dp);
  ParallelLayout layout = layout_of(cfg);
  layout.name = "[parallel]";
  validate_layout(cfg, layout);
  FP4MOE_CHECK((p.gpus() == 1 && p.micro_batches == 1) || cfg.train.grad_accum == p.micro_batches,
               "train.grad_accum = {} must equal parallel.micro_batches = {} when [parallel] describes {} GPUs or sets "
               "micro_batches (the micro-batches of one optimizer step, which the 1F1B schedule runs through the "
               "pipeline)",
               cfg.train.grad_accum, p.micro_batches, p.gpus());
}

// train.cuda_graph = true: validate_config's refusals of TrainingConfig::cuda_graph (config.h).
void check_cuda_graph(const TrainerConfig& cfg) {
  const RecipeConfig& r = cfg.recipe;
  const bool moe = cfg.model.n_dense_layers < cfg.model.layers;
  const std::pair<const char*, const Recipe*> used[] = {
      {"recipe.attention", &r.attention},
      {"recipe.dense_mlp", cfg.model.n_dense_layers > 0 ? &r.dense_mlp : nullptr},
      {"recipe.shared_experts", moe && cfg.moe.shared_experts > 0 ? &r.shared_experts : nullptr},
      {"recipe.routed_experts", moe ? &r.routed_experts : nullptr}};
  for (const auto& [name, recipe] : used)
    FP4MOE_CHECK(recipe == nullptr || (recipe->mx.rounding == Rounding::rne && recipe->mx.transform != MxTransform::rht),
                 "train.cuda_graph = true with {} = '{}': stochastic rounding and the random Hadamard draw fresh bits "
                 "each step from a host seed, which a replayed step graph would repeat (use rounding=rne and "
                 "transform none, h16 or h32, or train.cuda_graph = false)",
                 name, recipe_name(*recipe));
  FP4MOE_CHECK(!moe || r.routed_experts.wgrad != GemmPrecision::mxfp4,
               "train.cuda_graph = true with recipe.routed_experts = '{}': paper 2's MXFP4 Wgrad of the routed experts "
               "converts each expert's operands from the host's counts, which the step graph does not read (use "
               "wgrad=fp8 or wgrad=bf16 there, or train.cuda_graph = false)",
               recipe_name(r.routed_experts));
  FP4MOE_CHECK(!moe || cfg.moe.router != RouterStyle::v3_sigmoid || cfg.train.tokens_per_step() < (int64_t{1} << 31),
               "train.cuda_graph = true with {} tokens per step: the v3 router's expert loads are counted on the "
               "device in int32 (at most 2^31 - 1 tokens per step)",
               cfg.train.tokens_per_step());
  FP4MOE_CHECK(cfg.model.attention_backend == AttentionBackend::own,
               "train.cuda_graph = true needs model.attention_backend = own, got {}: cuDNN's fused attention is not "
               "captured in the step graph",
               attention_backend_name(cfg.model.attention_backend));
}

}  // namespace

void validate_config(const TrainerConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  const TrainingConfig& t = cfg.train;
  const RecipeConfig& r = cfg.recipe;

  check_model_name(m.name);
  FP4MOE_CHECK(m.vocab_size >= 2, "model.vocab_size must be >= 2, got {}", m.vocab_size);
  check_positive(m.hidden, "model.hidden");
  check_positive(m.layers, "model.layers");
  check_positive(m.heads, "model.heads");
  check_positive(m.kv_lora_rank, "model.kv_lora_rank");
  check_positive(m.qk_nope_head_dim, "model.qk_nope_head_dim");
  check_positive(m.qk_rope_head_dim, "model.qk_rope_head_dim");
  check_positive(m.v_head_dim, "model.v_head_dim");
  FP4MOE_CHECK(m.q_lora_rank >= 0, "model.q_lora_rank must be >= 0 (0: direct query projection), got {}",
               m.q_lora_rank);
  FP4MOE_CHECK(m.n_dense_layers >= 0 && m.n_dense_layers <= m.layers,
               "model.n_dense_layers = {} must be in [0, model.layers = {}]", m.n_dense_layers, m.layers);
  FP4MOE_CHECK(m.hidden % m.heads == 0,
               "model.heads = {} does not divide model.hidden = {} (DeepSeek shapes keep hidden a multiple of heads: "
               "7168 = 128 x 56, 5120 = 128 x 40)",
               m.heads, m.hidden);
  FP4MOE_CHECK(m.qk_rope_head_dim % 2 == 0, "model.qk_rope_head_dim = {} must be even (RoPE rotates pairs)",
               m.qk_rope_head_dim);
  check_float(m.rope_theta, "model.rope_theta", 0, false);
  check_float(m.norm_eps, "model.norm_eps", 0, false, 1, false);
  check_float(e.routed_scale, "moe.routed_scale", 0, false);
  check_float(e.aux_alpha, "moe.aux_alpha", 0, true);
  check_float(e.bias_update_rate, "moe.bias_update_rate", 0, true);
  const int64_t qk_head_dim = checked_sum("the query/key head dim", "model.qk_nope_head_dim", m.qk_nope_head_dim,
                                          "model.qk_rope_head_dim", m.qk_rope_head_dim);
  const int64_t qk_width = checked_product("the query/key width", {{"model.heads", m.heads},
                                                                  {"model.qk_nope_head_dim + qk_rope_head_dim",
                                                                   qk_head_dim}});
  const int64_t v_width =
      checked_product("the value width", {{"model.heads", m.heads}, {"model.v_head_dim", m.v_head_dim}});

  // K (in_features) of a layer in MX blocks: needs_mx_blocks_along_k; N (out_features): needs_mx_blocks_along_n.
  const bool attn_k = needs_mx_blocks_along_k(r.attention), attn_n = needs_mx_blocks_along_n(r.attention);
  const bool dense_k = needs_mx_blocks_along_k(r.dense_mlp), dense_n = needs_mx_blocks_along_n(r.dense_mlp);
  const bool shared_k = needs_mx_blocks_along_k(r.shared_experts), shared_n = needs_mx_blocks_along_n(r.shared_experts);
  const bool routed_k = needs_mx_blocks_along_k(r.routed_experts), routed_n = needs_mx_blocks_along_n(r.routed_experts);
  check_gemm_dim(m.hidden, "model.hidden",
                 attn_k || attn_n || dense_k || dense_n || shared_k || shared_n || routed_k || routed_n);
  if (m.q_lora_rank > 0) check_gemm_dim(m.q_lora_rank, "model.q_lora_rank", attn_k || attn_n);
  check_gemm_dim(m.kv_lora_rank, "model.kv_lora_rank", attn_k || attn_n);
  check_gemm_dim(v_width, "model.heads x model.v_head_dim", attn_k);
  check_gemm_dim(qk_width, "model.heads x (qk_nope_head_dim + qk_rope_head_dim)", attn_n);
  if (attn_n)  // kv_down's out_features, which an MXFP4 Dgrad blocks along
    check_gemm_dim(m.kv_lora_rank + m.qk_rope_head_dim, "model.kv_lora_rank + qk_rope_head_dim", true);
  if (m.n_dense_layers > 0) {
    check_positive(m.dense_ffn, "model.dense_ffn");
    check_gemm_dim(m.dense_ffn, "model.dense_ffn", dense_k || dense_n);
  }

  if (m.n_dense_layers < m.layers) {  // some layer is MoE
    check_positive(e.routed_experts, "moe.routed_experts");
    FP4MOE_CHECK(e.routed_experts <= kRouterMaxExperts,
                 "moe.routed_experts = {} exceeds the router kernels' limit of {} experts", e.routed_experts,
                 kRouterMaxExperts);
    check_positive(e.top_k, "moe.top_k");
    FP4MOE_CHECK(e.top_k <= e.routed_experts, "moe.top_k = {} exceeds moe.routed_experts = {}", e.top_k,
                 e.routed_experts);
    FP4MOE_CHECK(e.shared_experts >= 0, "moe.shared_experts must be >= 0, got {}", e.shared_experts);
    check_positive(e.expert_ffn, "moe.expert_ffn");
    check_gemm_dim(e.expert_ffn, "moe.expert_ffn",
                   routed_k || routed_n || (e.shared_experts > 0 && (shared_k || shared_n)));
    check_recipe_built(r.routed_experts, "recipe.routed_experts");
  }

  check_positive(t.seq_len, "train.seq_len");
  check_positive(t.micro_batch, "train.micro_batch");
  check_positive(t.grad_accum, "train.grad_accum");
  check_positive(t.steps, "train.steps");
  check_float(t.lr, "train.lr", 0, false);
  check_float(t.min_lr, "train.min_lr", 0, true);
  FP4MOE_CHECK(t.min_lr <= t.lr, "train.min_lr = {} must be <= train.lr = {}", t.min_lr, t.lr);
  FP4MOE_CHECK(t.warmup_steps >= 0 && t.warmup_steps <= t.steps,
               "train.warmup_steps = {} must be in [0, train.steps = {}]", t.warmup_steps, t.steps);
  check_float(t.weight_decay, "train.weight_decay", 0, true);
  check_float(t.beta1, "train.beta1", 0, true, 1, false);
  check_float(t.beta2, "train.beta2", 0, true, 1, false);
  check_float(t.eps, "train.eps", 0, false);
  check_float(t.grad_clip, "train.grad_clip", 0, true);  // 0: no clipping
  FP4MOE_CHECK(t.eval_interval >= 0, "train.eval_interval must be >= 0 (0: no evaluation), got {}", t.eval_interval);
  FP4MOE_CHECK(t.eval_steps >= 0,
               "train.eval_steps must be >= 0 (0: the whole validation split, N: its first N batches), got {}",
               t.eval_steps);
  FP4MOE_CHECK(t.final_eval_steps >= 0,
               "train.final_eval_steps must be >= 0 (0: the whole validation split, N: its first N batches), got {}",
               t.final_eval_steps);
  FP4MOE_CHECK(t.checkpoint_interval >= 0, "train.checkpoint_interval must be >= 0 (0: none), got {}",
               t.checkpoint_interval);
  FP4MOE_CHECK(t.checkpoint_interval == 0 || !t.checkpoint_dir.empty(),
               "train.checkpoint_interval = {} needs train.checkpoint_dir", t.checkpoint_interval);
  if (!t.checkpoint_dir.empty()) {
    std::error_code ec;
    const auto st = std::filesystem::status(t.checkpoint_dir, ec);
    FP4MOE_CHECK(!std::filesystem::exists(st) || std::filesystem::is_directory(st),
                 "train.checkpoint_dir '{}' exists and is not a folder, expected a folder or a path that does not "
                 "exist (it is created)",
                 t.checkpoint_dir);
  }
  FP4MOE_CHECK(!t.data_dir.empty(), "train.data_dir is empty: name the folder of token shards (make data writes "
                                    "data/cache/shards)");
  check_derived_sizes(cfg);

  const auto& known = recompute_module_names();
  std::set<std::string> seen;
  for (const std::string& mod : cfg.recompute.modules) {
    FP4MOE_CHECK(std::find(known.begin(), known.end(), mod) != known.end(),
                 "recompute.modules: unknown module '{}', expected some of: {}", mod, fmt::join(known, ", "));
    FP4MOE_CHECK(seen.insert(mod).second, "recompute.modules: '{}' is listed twice", mod);
  }
  FP4MOE_CHECK(!seen.count("full") || seen.size() == 1,
               "recompute.modules: 'full' recomputes the whole layer and cannot be combined with {}",
               fmt::join(cfg.recompute.modules, ", "));
  if (t.cuda_graph) check_cuda_graph(cfg);
  validate_parallel(cfg);
}

void validate_data(const TrainerConfig& cfg) {
  const std::string& dir = cfg.train.data_dir;
  FP4MOE_CHECK(cfg.model.vocab_size <= 65536,
               "model.vocab_size = {} exceeds 65536: token shards hold uint16 tokens (make data's tokenizer has 32768)",
               cfg.model.vocab_size);
  std::error_code ec;
  FP4MOE_CHECK(std::filesystem::is_directory(dir, ec),
               "train.data_dir {} is not a folder (make it with {}, or point it at the folder of token shards)",
               folder_for_message(dir), make_data_command(dir));
  const std::vector<std::string> train = find_token_shards(dir, "train");
  const std::vector<std::string> val =
      cfg.train.eval_interval > 0 ? find_token_shards(dir, "val") : std::vector<std::string>{};
  // Header checks, including the vocabulary (payloads are read later), and one batch per split: B windows of
  // T + 1 tokens, a shard of n tokens holding floor((n - 1) / T) of them (trainer/data/loader.h).
  const auto T = static_cast<uint64_t>(cfg.train.seq_len), B = static_cast<uint64_t>(cfg.train.micro_batch);
  auto check_split = [&](const std::vector<std::string>& shards, const char* split, const char* needs) {
    uint64_t windows = 0;
    for (const std::string& path : shards) {
      const uint64_t n = TokenShard(path, static_cast<uint32_t>(cfg.model.vocab_size), false).header().token_count;
      windows += n >= 1 ? (n - 1) / T : 0;
    }
    FP4MOE_CHECK(windows >= B,
                 "train.data_dir '{}': the {} shards hold {} windows of train.seq_len + 1 = {} tokens, fewer than one "
                 "batch of train.micro_batch = {} rows ({}; lower train.seq_len or train.micro_batch, or add data)",
                 dir, split, windows, T + 1, B, needs);
  };
  check_split(train, "train", "training needs one per step");
  if (!val.empty()) check_split(val, "val", "evaluation needs one; train.eval_interval = 0 turns it off");
}

std::string model_config_text(const TrainerConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  std::string s;
  auto line = [&](const char* key, auto v) { s += fmt::format("{} = {}\n", key, v); };
  line("model.vocab_size", m.vocab_size);
  line("model.hidden", m.hidden);
  line("model.layers", m.layers);
  line("model.n_dense_layers", m.n_dense_layers);
  line("model.heads", m.heads);
  line("model.q_lora_rank", m.q_lora_rank);
  line("model.kv_lora_rank", m.kv_lora_rank);
  line("model.qk_nope_head_dim", m.qk_nope_head_dim);
  line("model.qk_rope_head_dim", m.qk_rope_head_dim);
  line("model.v_head_dim", m.v_head_dim);
  line("model.dense_ffn", m.dense_ffn);
  line("model.rope_theta", m.rope_theta);
  line("model.norm_eps", m.norm_eps);
  line("moe.routed_experts", e.routed_experts);
  line("moe.shared_experts", e.shared_experts);
  line("moe.top_k", e.top_k);
  line("moe.expert_ffn", e.expert_ffn);
  line("moe.router", router_text(e.router));
  line("moe.routed_scale", e.routed_scale);
  line("recipe.attention", recipe_name(cfg.recipe.attention));
  line("recipe.dense_mlp", recipe_name(cfg.recipe.dense_mlp));
  line("recipe.shared_experts", recipe_name(cfg.recipe.shared_experts));
  line("recipe.routed_experts", recipe_name(cfg.recipe.routed_experts));
  return s;
}

uint64_t model_config_hash(const TrainerConfig& cfg) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : model_config_text(cfg)) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace fp4moe
