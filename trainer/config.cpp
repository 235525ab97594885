#include "trainer/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "kernels/common/check.h"
#include "trainer/data/loader.h"
#include "trainer/data/token_shard.h"

namespace fp4moe {

const char* recipe_name(Recipe r) {
  switch (r) {
    case Recipe::bf16: return "bf16";
    case Recipe::fp8: return "fp8";
    case Recipe::mxfp4: return "mxfp4";
  }
  return "?";
}

Recipe parse_recipe(const std::string& text, const std::string& what) {
  if (text == "bf16") return Recipe::bf16;
  if (text == "fp8") return Recipe::fp8;
  if (text == "mxfp4") return Recipe::mxfp4;
  FP4MOE_CHECK(false, "{} = '{}': unknown recipe, expected bf16, fp8 or mxfp4", what, text);
  return Recipe::bf16;
}

bool RecomputeConfig::has(const std::string& module) const {
  return std::find(modules.begin(), modules.end(), module) != modules.end() ||
         std::find(modules.begin(), modules.end(), "full") != modules.end();
}

namespace {

const char* router_text(RouterStyle s) { return s == RouterStyle::v2_softmax ? "v2" : "v3"; }
const char* policy_text(NonFinitePolicy p) { return p == NonFinitePolicy::stop ? "stop" : "skip"; }

}  // namespace

ConfigOptions::ConfigOptions(CLI::App& app, TrainerConfig& cfg) : app_(app), cfg_(cfg) {
  ModelConfig& m = cfg.model;
  MoeConfig& e = cfg.moe;
  TrainingConfig& t = cfg.train;
  router_ = router_text(e.router);
  non_finite_ = policy_text(t.non_finite);
  recipe_attention_ = recipe_name(cfg.recipe.attention);
  recipe_dense_ = recipe_name(cfg.recipe.dense_mlp);
  recipe_shared_ = recipe_name(cfg.recipe.shared_experts);
  recipe_routed_ = recipe_name(cfg.recipe.routed_experts);

  app.add_option("--config", config_path_, "TOML configuration file (configs/*.toml); options given here win");
  auto add = [&](const char* name, auto& var, const char* help) {
    app.add_option(name, var, help)->capture_default_str()->group("Configuration");
  };
  add("--model.name", m.name, "preset name, for reports");
  add("--model.vocab_size", m.vocab_size, "tokenizer vocabulary (the shards' vocab_size)");
  add("--model.hidden", m.hidden, "d_model");
  add("--model.layers", m.layers, "decoder layers");
  add("--model.n_dense_layers", m.n_dense_layers, "first layers with a dense FFN instead of MoE");
  add("--model.heads", m.heads, "attention heads");
  add("--model.q_lora_rank", m.q_lora_rank, "query down-projection rank (0: direct projection)");
  add("--model.kv_lora_rank", m.kv_lora_rank, "joint key/value compression rank");
  add("--model.qk_nope_head_dim", m.qk_nope_head_dim, "per-head query/key dims without RoPE");
  add("--model.qk_rope_head_dim", m.qk_rope_head_dim, "per-head decoupled RoPE dims");
  add("--model.v_head_dim", m.v_head_dim, "per-head value dims");
  add("--model.dense_ffn", m.dense_ffn, "dense SwiGLU intermediate size");
  add("--model.rope_theta", m.rope_theta, "RoPE base");
  add("--model.norm_eps", m.norm_eps, "RMSNorm epsilon");
  add("--moe.routed_experts", e.routed_experts, "routed experts per MoE layer");
  add("--moe.shared_experts", e.shared_experts, "shared experts per MoE layer");
  add("--moe.top_k", e.top_k, "routed experts per token");
  add("--moe.expert_ffn", e.expert_ffn, "expert intermediate size");
  add("--moe.router", router_, "v3 (sigmoid, aux-loss-free bias) or v2 (softmax, balance loss)");
  add("--moe.routed_scale", e.routed_scale, "routed_scaling_factor");
  add("--moe.aux_alpha", e.aux_alpha, "v2 balance loss coefficient");
  add("--moe.bias_update_rate", e.bias_update_rate, "v3 aux-loss-free bias update speed");
  add("--train.data_dir", t.data_dir, "token shards from make data");
  add("--train.seq_len", t.seq_len, "tokens per row");
  add("--train.micro_batch", t.micro_batch, "rows per micro-batch");
  add("--train.grad_accum", t.grad_accum, "micro-batches per optimizer step");
  add("--train.steps", t.steps, "optimizer steps");
  add("--train.lr", t.lr, "peak learning rate");
  add("--train.warmup_steps", t.warmup_steps, "linear warm-up steps");
  add("--train.min_lr", t.min_lr, "learning rate at the end of the cosine decay");
  add("--train.weight_decay", t.weight_decay, "AdamW weight decay");
  add("--train.beta1", t.beta1, "AdamW beta1");
  add("--train.beta2", t.beta2, "AdamW beta2");
  add("--train.eps", t.eps, "AdamW epsilon");
  add("--train.grad_clip", t.grad_clip, "global gradient-norm clip (0: none)");
  add("--train.seed", t.seed, "seed of weights, data order and stochastic rounding");
  add("--train.eval_interval", t.eval_interval, "steps between evaluations (0: none)");
  add("--train.eval_steps", t.eval_steps, "validation batches per evaluation");
  add("--train.non_finite", non_finite_, "skip or stop on a non-finite loss or gradient norm");
  add("--train.checkpoint_interval", t.checkpoint_interval, "steps between checkpoints (0: none)");
  add("--train.checkpoint_dir", t.checkpoint_dir, "checkpoint folder");
  add("--recipe.attention", recipe_attention_, "bf16, fp8 or mxfp4 for the MLA projections");
  add("--recipe.dense_mlp", recipe_dense_, "bf16, fp8 or mxfp4 for the dense FFN");
  add("--recipe.shared_experts", recipe_shared_, "bf16, fp8 or mxfp4 for the shared experts");
  add("--recipe.routed_experts", recipe_routed_, "bf16, fp8 or mxfp4 for the routed experts");
  app.add_option("--recompute.modules", cfg.recompute.modules,
                 "modules recomputed in backward: mla_up_proj core_attn layernorm moe_act moe mlp shared_experts "
                 "full (none: keep every activation)")
      ->expected(0, CLI::detail::expected_max_vector_size)
      ->group("Configuration");
}

void ConfigOptions::load_config_file() {
  if (!config_path_.empty()) {
    std::error_code ec;
    FP4MOE_CHECK(std::filesystem::is_regular_file(config_path_, ec), "config file '{}' does not exist or is not a file",
                 config_path_);
    std::vector<CLI::ConfigItem> items;
    try {
      items = CLI::ConfigTOML().from_file(config_path_);
    } catch (const CLI::Error& err) {
      FP4MOE_CHECK(false, "config file '{}': cannot read: {}", config_path_, err.what());
    }
    for (const CLI::ConfigItem& item : items) {
      if (item.name == "++" || item.name == "--") continue;  // section open/close markers
      const std::string key = item.fullname();
      CLI::Option* opt = app_.get_option_no_throw("--" + key);
      FP4MOE_CHECK(opt != nullptr && key != "config",
                   "config file '{}': unknown option '{}' (a key of a [section]; fp4moe train --help lists them)",
                   config_path_, key);
      if (opt->count() > 0) continue;  // given on the command line: that value wins
      try {
        // An empty array (`modules = []`) as one empty value: a list drops it, a number rejects it.
        opt->add_result(item.inputs.empty() ? std::vector<std::string>{""} : item.inputs);
        opt->run_callback();
      } catch (const CLI::Error& err) {
        FP4MOE_CHECK(false, "config file '{}': {} = [{}]: {}", config_path_, key, fmt::join(item.inputs, ", "),
                     err.what());
      }
    }
  }
  const std::string where = config_path_.empty() ? "" : fmt::format(" (config '{}')", config_path_);
  FP4MOE_CHECK(router_ == "v3" || router_ == "v2", "moe.router = '{}'{}: expected v3 (sigmoid) or v2 (softmax)",
               router_, where);
  cfg_.moe.router = router_ == "v2" ? RouterStyle::v2_softmax : RouterStyle::v3_sigmoid;
  FP4MOE_CHECK(non_finite_ == "skip" || non_finite_ == "stop", "train.non_finite = '{}'{}: expected skip or stop",
               non_finite_, where);
  cfg_.train.non_finite = non_finite_ == "stop" ? NonFinitePolicy::stop : NonFinitePolicy::skip;
  cfg_.recipe.attention = parse_recipe(recipe_attention_, "recipe.attention");
  cfg_.recipe.dense_mlp = parse_recipe(recipe_dense_, "recipe.dense_mlp");
  cfg_.recipe.shared_experts = parse_recipe(recipe_shared_, "recipe.shared_experts");
  cfg_.recipe.routed_experts = parse_recipe(recipe_routed_, "recipe.routed_experts");
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

// GEMM dimensions: multiples of 16 (grouped_gemm.h, cuBLASLt FP8), 32 where an MXFP4 recipe blocks along them.
void check_gemm_dim(int64_t v, const char* name, bool mx) {
  const int64_t m = mx ? 32 : 16;
  FP4MOE_CHECK(v % m == 0, "{} = {} must be a multiple of {} ({})", name, v, m,
               mx ? "an mxfp4 recipe quantizes blocks of 32 along the GEMM's K"
                  : "the FP8/BF16 GEMMs take N and K in multiples of 16");
}

}  // namespace

void validate_config(const TrainerConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  const TrainingConfig& t = cfg.train;
  const RecipeConfig& r = cfg.recipe;

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
  FP4MOE_CHECK(m.rope_theta > 0, "model.rope_theta must be > 0, got {}", m.rope_theta);
  FP4MOE_CHECK(m.norm_eps > 0 && m.norm_eps < 1, "model.norm_eps must be in (0, 1), got {}", m.norm_eps);

  const bool attn_mx = r.attention == Recipe::mxfp4;
  check_gemm_dim(m.hidden, "model.hidden", attn_mx || r.dense_mlp == Recipe::mxfp4 ||
                                               r.shared_experts == Recipe::mxfp4 || r.routed_experts == Recipe::mxfp4);
  if (m.q_lora_rank > 0) check_gemm_dim(m.q_lora_rank, "model.q_lora_rank", attn_mx);
  check_gemm_dim(m.kv_lora_rank, "model.kv_lora_rank", attn_mx);
  check_gemm_dim(m.heads * m.v_head_dim, "model.heads x model.v_head_dim", attn_mx);
  check_gemm_dim(m.heads * m.qk_head_dim(), "model.heads x (qk_nope_head_dim + qk_rope_head_dim)", false);
  if (m.n_dense_layers > 0) {
    check_positive(m.dense_ffn, "model.dense_ffn");
    check_gemm_dim(m.dense_ffn, "model.dense_ffn", r.dense_mlp == Recipe::mxfp4);
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
                   r.routed_experts == Recipe::mxfp4 || (e.shared_experts > 0 && r.shared_experts == Recipe::mxfp4));
    FP4MOE_CHECK(e.routed_scale > 0, "moe.routed_scale must be > 0, got {}", e.routed_scale);
    FP4MOE_CHECK(e.aux_alpha >= 0, "moe.aux_alpha must be >= 0, got {}", e.aux_alpha);
    FP4MOE_CHECK(e.bias_update_rate >= 0, "moe.bias_update_rate must be >= 0, got {}", e.bias_update_rate);
  }

  check_positive(t.seq_len, "train.seq_len");
  check_positive(t.micro_batch, "train.micro_batch");
  check_positive(t.grad_accum, "train.grad_accum");
  check_positive(t.steps, "train.steps");
  FP4MOE_CHECK(t.lr > 0, "train.lr must be > 0, got {}", t.lr);
  FP4MOE_CHECK(t.min_lr >= 0 && t.min_lr <= t.lr, "train.min_lr = {} must be in [0, train.lr = {}]", t.min_lr, t.lr);
  FP4MOE_CHECK(t.warmup_steps >= 0 && t.warmup_steps <= t.steps,
               "train.warmup_steps = {} must be in [0, train.steps = {}]", t.warmup_steps, t.steps);
  FP4MOE_CHECK(t.weight_decay >= 0, "train.weight_decay must be >= 0, got {}", t.weight_decay);
  FP4MOE_CHECK(t.beta1 >= 0 && t.beta1 < 1, "train.beta1 must be in [0, 1), got {}", t.beta1);
  FP4MOE_CHECK(t.beta2 >= 0 && t.beta2 < 1, "train.beta2 must be in [0, 1), got {}", t.beta2);
  FP4MOE_CHECK(t.eps > 0, "train.eps must be > 0, got {}", t.eps);
  FP4MOE_CHECK(t.grad_clip >= 0, "train.grad_clip must be >= 0 (0: no clipping), got {}", t.grad_clip);
  FP4MOE_CHECK(t.eval_interval >= 0, "train.eval_interval must be >= 0 (0: no evaluation), got {}", t.eval_interval);
  FP4MOE_CHECK(t.eval_interval == 0 || t.eval_steps >= 1,
               "train.eval_steps must be >= 1 when train.eval_interval = {} > 0, got {}", t.eval_interval,
               t.eval_steps);
  FP4MOE_CHECK(t.checkpoint_interval >= 0, "train.checkpoint_interval must be >= 0 (0: none), got {}",
               t.checkpoint_interval);
  FP4MOE_CHECK(t.checkpoint_interval == 0 || !t.checkpoint_dir.empty(),
               "train.checkpoint_interval = {} needs train.checkpoint_dir", t.checkpoint_interval);
  FP4MOE_CHECK(!t.data_dir.empty(), "train.data_dir is empty: name the folder of token shards (make data writes "
                                    "data/cache/shards)");

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
  std::vector<std::string> shards = find_token_shards(dir, "train");
  if (cfg.train.eval_interval > 0) {
    std::vector<std::string> val = find_token_shards(dir, "val");
    shards.insert(shards.end(), val.begin(), val.end());
  }
  for (const std::string& path : shards)  // header checks, including the vocabulary; payloads are read later
    TokenShard(path, static_cast<uint32_t>(cfg.model.vocab_size), /*verify_payload=*/false);
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
