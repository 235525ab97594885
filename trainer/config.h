// The reference trainer's configuration: model shape, training schedule, recipe per layer class and recompute
// policy (DESIGN.md "Trainer"), read from a TOML file, with any option overridable on the command line:
// `fp4moe train --config configs/small.toml --train.lr 3e-4`.
//
// Every option is named `section.key`, in the file as
//
//   [train]
//   lr = 3e-4            # a comment
//
// and on the command line as `--train.lr 3e-4`; the command line wins over the file. Sections: model, moe,
// train, recipe, recompute, parallel (see the presets in configs/ for every key with its meaning; [parallel] is
// described at ParallelConfig below and may be left out: one GPU). Integers on the command
// line must be decimal and within int64_t (010, 0x40 and 99999999999999999999 are rejected).
//
// The file is TOML v1.0 (https://toml.io/en/v1.0.0), read by toml++ (trainer/config_file.h): comments anywhere
// after a '#' outside a string (a '#' inside "a#b" is part of the string), a UTF-8 byte order mark, basic and
// literal strings with escapes ("a\tb", 'C:\path'), multi-line strings, arrays over several lines with comments
// and a trailing comma, `section.key = v` dotted keys and inline tables. Each option takes one TOML type: an
// integer (64 = ok, 64.0 is not) for the sizes, steps and seed; a boolean (true or false, in the file and on the
// command line) for parallel.zero1, model.attention_deterministic and train.cuda_graph; a float or an integer (3e-4,
// 1, inf and nan parse, validation rejects the last two) for the rates and coefficients; a string for names, paths,
// recipes, router, policy, the attention backend and train.moments; an array of strings for recompute.modules (`[]`:
// none).
//
// Loading rejects (fp4moe::Error, one line naming the file, with the line and column): a file that is not TOML
// (an unterminated string, a key or section given twice, ...), a key no option has, a value of the wrong type;
// then a required key set neither in the file nor on the command line ("model.hidden is missing"); then a value
// that names no choice or does not parse (moe.router, train.non_finite, model.attention_backend, train.moments, the
// recipes) and a negative train.seed, the message starting with where the value came from: "command line
// --train.moments: train.moments = 'fp16': ..." or "config file 'PATH': train.moments = 'half': ...". Required are
// the keys whose default cannot run: the shape (model.vocab_size, hidden, layers, heads, kv_lora_rank,
// qk_nope_head_dim, qk_rope_head_dim, v_head_dim; model.dense_ffn when n_dense_layers > 0; moe.routed_experts,
// top_k and expert_ffn when some layer is MoE) and train.seq_len, micro_batch, steps and lr. The other keys have
// working defaults (n_dense_layers, q_lora_rank and shared_experts 0: none). Validation (validate_config) then
// rejects shapes and settings that cannot run, before anything is allocated; validate_data opens the shard
// headers.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kernels/attention/attention_backend.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/router.h"
#include "trainer/config_file.h"
#include "trainer/model/recipe.h"

namespace fp4moe {

// What to do with a step whose loss or gradient norm is not finite: skip the update (the step still counts) or
// stop the run with an error.
enum class NonFinitePolicy { skip, stop };

// Modules recomputed in backward instead of kept from forward, named as in Megatron-Core's
// --recompute-modules; `full` recomputes the whole layer (and must stand alone).
inline const std::vector<std::string>& recompute_module_names() {
  static const std::vector<std::string> names = {"mla_up_proj", "core_attn", "layernorm",     "moe_act",
                                                 "moe",         "mlp",       "shared_experts", "full"};
  return names;
}

// The decoder's shape (DeepSeek-V2/V3 naming, as in their Hugging Face configs).
struct ModelConfig {
  std::string name;                // preset name, for reports
  int64_t vocab_size = 0;          // tokenizer vocabulary (training data: <= 65536, uint16 token shards)
  int64_t hidden = 0;              // d_model
  int64_t layers = 0;              // decoder layers
  int64_t n_dense_layers = 0;      // the first n layers have a dense SwiGLU FFN, the others MoE
  int64_t heads = 0;               // attention heads
  int64_t q_lora_rank = 0;         // query down-projection rank (0: a direct hidden -> heads * qk projection)
  int64_t kv_lora_rank = 0;        // joint key/value compression rank
  int64_t qk_nope_head_dim = 0;    // per-head query/key dims without RoPE
  int64_t qk_rope_head_dim = 0;    // per-head decoupled RoPE dims (the RoPE key is shared by all heads)
  int64_t v_head_dim = 0;          // per-head value dims
  int64_t dense_ffn = 0;           // intermediate size of the dense SwiGLU FFN
  double rope_theta = 10000.0;     // RoPE base
  double norm_eps = 1e-6;          // RMSNorm epsilon
  // Which implementation runs the attention core (kernels/attention/attention_backend.h): own (our flash attention
  // kernels, deterministic; the default), cudnn (cuDNN's fused attention; an error where it is not built or cannot
  // run a shape) or auto (the faster of the two, timed at construction at micro_batch x seq_len tokens; own where
  // cuDNN cannot run); "own", "cudnn" or "auto" in the file and on the command line. Not part of the model's
  // identity (model_config_text): a checkpoint resumes under any backend.
  AttentionBackend attention_backend = AttentionBackend::own;
  // The cuDNN backend's backward: deterministic (true: the same bits on every run, more workspace) or not (false,
  // the default, as cuDNN and PyTorch run it: dQ summed with atomics). Our kernels are deterministic either way.
  bool attention_deterministic = false;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// The MoE layers: routed experts through Group Linear, shared experts as a dense SwiGLU of n * expert_ffn.
struct MoeConfig {
  int64_t routed_experts = 0;
  int64_t shared_experts = 0;
  int64_t top_k = 0;
  int64_t expert_ffn = 0;              // intermediate size of one expert
  RouterStyle router = RouterStyle::v3_sigmoid;  // "v3": sigmoid + aux-loss-free bias; "v2": softmax + aux loss
  double routed_scale = 1.0;           // routed_scaling_factor (V3: 2.5, V2: 16)
  double aux_alpha = 0.0;              // v2: expert balance loss coefficient (V2: 0.003)
  double bias_update_rate = 0.0;       // v3: aux-loss-free bias update speed gamma (V3: 0.001)
};

struct TrainingConfig {
  std::string data_dir;          // folder of token shards made by `make data` (train_NNN.bin, val_NNN.bin)
  int64_t seq_len = 0;           // T tokens per row
  int64_t micro_batch = 0;       // rows per micro-batch (per GPU)
  int64_t grad_accum = 1;        // micro-batches per optimizer step
  int64_t steps = 0;             // optimizer steps
  double lr = 0;                 // peak learning rate
  int64_t warmup_steps = 0;      // linear warm-up from 0 to lr
  double min_lr = 0;             // cosine decay from lr to min_lr at `steps`
  double weight_decay = 0;       // AdamW decoupled weight decay
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  // AdamW m and v storage (kernels/nn/adamw.h): fp32 (the default) or bf16, as DeepSeek-V3 trains (sec. 3.3.3);
  // "fp32" or "bf16" in the file and on the command line. Not part of the model's identity (model_config_text), but
  // a checkpoint's moments must be in this dtype to resume (trainer/train/param_checkpoint.h).
  MomentDtype moments = MomentDtype::fp32;
  double grad_clip = 1.0;        // global gradient-norm clip (0: none)
  uint64_t seed = 0;             // weights, data order, stochastic rounding (set as a signed value >= 0)
  int64_t eval_interval = 0;     // steps between evaluations (0: none)
  int64_t eval_steps = 0;        // validation batches per periodic evaluation (the first ones in file order; 0:
                                 // the whole validation split, as the final evaluation; not with synthetic data)
  int64_t final_eval_steps = 0;  // validation batches of the final evaluation (0: the whole validation split;
                                 // with synthetic data, which has no end, eval_steps batches)
  NonFinitePolicy non_finite = NonFinitePolicy::skip;
  int64_t checkpoint_interval = 0;  // steps between checkpoints (0: none)
  std::string checkpoint_dir;        // where checkpoints go (needed when checkpoint_interval > 0)
  // The steps' forwards and backwards replayed from one CUDA graph (trainer/train/step_graph.h): the model runs
  // without host synchronisation (Model::set_host_sync_free), the first step eagerly, the second captured. Refused,
  // one line each, where a replay would not give the eager step's result or the passes are not captured:
  // validate_config: stochastic rounding and the random Hadamard in a layer class the model has (their per-step
  // seed is a launch argument), the routed experts' MXFP4 Wgrad (converted per expert from the host's counts),
  // model.attention_backend cudnn or auto (cuDNN's fused attention is not captured), a v3 router with 2^31 or more
  // tokens per step (its device tally is int32); check_trainable: ranks, an emulated [parallel] layout, --profile.
  // Not part of the model's identity: a checkpoint resumes with it on or off.
  bool cuda_graph = false;

  // seq_len x micro_batch x grad_accum (validate_config checks that it fits in int64_t).
  int64_t tokens_per_step() const { return seq_len * micro_batch * grad_accum; }
};

// Recipe per layer class (trainer/model/recipe.h; DESIGN.md "Recipes"): a preset, bf16, fp8 or mxfp4, optionally
// followed by paper 2's per-GEMM-class overrides, key=value separated by spaces:
//
//   [recipe]
//   attention = "fp8 fprop=mxfp4"                                    # MXFP4 Fprop, FP8 Dgrad and Wgrad
//   dense_mlp = "fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4 rounding=sr transform=h16"
//
// keys fprop, dgrad, wgrad (bf16 | fp8 | mxfp4), input (bf16 | mxfp4: X stored as MXFP4), rounding (rne | sr: of
// the gradient operands of the mxfp4 classes), transform (none | h16 | h32 | rht: both operands of each mxfp4
// class along its reduction dimension). parse_recipe rejects an unknown key or value, a repeated key and a
// combination that is not built, with one line naming the option (the same for every class, routed experts
// included: trainer/model/recipe.h). Embedding, LM head, router and norms stay
// BF16/FP32 and the attention core BF16 whatever is chosen here.
struct RecipeConfig {
  Recipe attention = Recipe::bf16;       // MLA projections (q down/up, kv down/up, output)
  Recipe dense_mlp = Recipe::bf16;       // dense SwiGLU FFN of the first n_dense_layers
  Recipe shared_experts = Recipe::bf16;  // the shared experts of MoE layers
  Recipe routed_experts = Recipe::bf16;  // Group Linear of the routed experts
};

struct RecomputeConfig {
  std::vector<std::string> modules;  // subset of recompute_module_names(); empty: keep every activation
  bool has(const std::string& module) const;
};

// [parallel]: the layout of a multi-GPU run whose one GPU the memory estimate describes (`fp4moe train --dry-run`,
// trainer/memory/estimate.h's ParallelLayout, Megatron-Core terms). The defaults describe one GPU. gpus = tp x pp x
// dp; every GPU of a stage holds its layers, 1/tp of the heads and FFN widths, E/ep routed experts (ep divides dp x
// tp and moe.routed_experts) and, under zero1, a 1/dp share of the FP32 masters and AdamW moments (1/(dp tp / ep)
// for the routed experts'). 1F1B: stage s keeps the activations of min(pp - s, micro_batches) micro-batches of
// train.micro_batch x train.seq_len tokens; when the section describes more than one GPU, train.grad_accum (the
// micro-batches of one optimizer step, which the trainer runs in the stage's 1F1B order) must equal micro_batches
// (validate_config says so). `fp4moe train` runs one GPU of it, emulated (trainer/model/model.h; a routed_load > 1
// as the hottest rank's R = ceil(N k routed_load) rows, trainer/model/layout_emulation.h; tp > 1: --dry-run only).
// validate_config applies the layout's rules (validate_layout) to this section.
struct ParallelConfig {
  int64_t tp = 1;             // tensor parallel (with sequence parallelism)
  int64_t pp = 1;             // pipeline stages (1F1B)
  int64_t ep = 1;             // expert parallel
  int64_t dp = 1;             // data-parallel replicas
  int64_t micro_batches = 1;  // micro-batches per optimizer step per pipeline (= train.grad_accum unless 1 on one GPU)
  bool zero1 = false;         // distributed optimizer: masters and moments sharded over dp (needs dp > 1); on the
                              // command line true or false, as in the file
  int64_t stage = -1;         // the pipeline stage to estimate, 0 <= stage < pp; -1: the one with the largest peak
  double routed_load = 1.0;   // routed rows a GPU receives over the balanced share (in [1, ep]; 1: balanced routing)

  int64_t gpus() const { return tp * pp * dp; }
};

struct TrainerConfig {
  ModelConfig model;
  MoeConfig moe;
  TrainingConfig train;
  RecipeConfig recipe;
  RecomputeConfig recompute;
  ParallelConfig parallel;

  bool is_moe_layer(int64_t layer) const { return layer >= model.n_dense_layers; }
};

// Registers every configuration option on `app` as `--section.key`, bound to `cfg` (whose current values become
// the defaults shown by --help), and a `--config FILE` option. Call load_config_file after app.parse().
class ConfigOptions {
 public:
  ConfigOptions(CLI::App& app, TrainerConfig& cfg);
  // Reads the file named by --config, if any (read_config_file), assigning every key not given on the command
  // line, checks that every required key was set in one of them and that train.seed >= 0, then converts the text
  // options (recipes, router, policy, attention backend, moments, recompute) into `cfg`. Throws fp4moe::Error as
  // described at the top of this file; a rejected value's message starts with origin(key).
  void load_config_file();
  const std::string& config_path() const { return config_path_; }
  // Where the value of option `key` (`section.key`) came from, after load_config_file: "command line --KEY",
  // "config file 'PATH'" or, for a key given in neither, "default of KEY".
  std::string origin(const std::string& key) const;

 private:
  // Throws "KEY is missing (...)" for the first required key (top of this file) not in `set`.
  void check_required(const std::set<std::string>& set) const;

  TrainerConfig& cfg_;
  std::string config_path_;
  std::vector<ConfigField> fields_;
  std::vector<CLI::Option*> options_;  // options_[i] is the --fields_[i].key option
  std::set<std::string> from_command_line_, from_file_;  // the keys each sets (the command line wins)
  int64_t seed_ = 0;                   // train.seed, read signed so that a negative value is rejected, not wrapped
  std::string router_, non_finite_, recipe_attention_, recipe_dense_, recipe_shared_, recipe_routed_;
  std::string attention_backend_;  // model.attention_backend as text
  std::string moments_;            // train.moments as text
};

// Parses `args` (without a program name: {"--config", "configs/tiny.toml", "--train.lr", "1e-3"}) into a config
// and validates it with validate_config. Throws fp4moe::Error (also for command-line parse errors).
TrainerConfig parse_config_args(const std::vector<std::string>& args);

// Rejects, with a message naming the option and the rule: non-positive sizes; heads not dividing hidden (as in
// every DeepSeek shape); an odd qk_rope_head_dim (RoPE rotates pairs); n_dense_layers > layers; top_k > routed
// experts or routed experts beyond the router kernels' limit (1024); vocab_size < 2; dimensions the GEMMs
// cannot take (hidden, ffn sizes and ranks multiples of 16; multiples of 32 for an mxfp4 class, MX
// blocks); bad schedule values (warm-up > steps, min_lr > lr, betas outside [0, 1), eps <= 0, negative clip or
// weight decay); checkpoint_interval > 0 without checkpoint_dir; a checkpoint_dir that exists but is not a folder;
// a model.name longer than 128 characters or with any but printable ASCII characters (it is written into result
// files and the parity TOML); unknown or duplicate recompute modules, and `full` combined with others. Every float
// option must be finite and in its range, whatever the layers (the message states the range: "train.lr must be a
// finite number > 0, got inf"), and, as it is used in float32, must not overflow float32 nor, where it must be
// > 0, fall below the smallest normal float32 (FLT_MIN); its float32 rounding must be in the range too. Every size
// derived as a product (tokens per micro-batch, per step and per run, logits per micro-batch, heads x head dims,
// the largest weight tensors) must fit in int64_t, checked without overflowing. The other MoE settings are checked
// only when some layer is MoE. [parallel]: sizes >= 1, the product tp x pp x dp within 2^20 GPUs, stage -1 or in
// [0, pp), then validate_layout's rules on layout_of(cfg) (trainer/memory/estimate.h), each one line naming what
// does not divide ("[parallel]: ep = 3 must divide moe.routed_experts = 8").
void validate_config(const TrainerConfig& cfg);

// Checks the data before anything is allocated: model.vocab_size <= 65536 (uint16 tokens), train.data_dir exists
// and holds train shards (and val shards when eval_interval > 0), every shard header's vocabulary equals
// model.vocab_size (TokenShard, header only), and each split read holds at least one batch of the configured
// shape: train.micro_batch windows of train.seq_len + 1 tokens (windows as in trainer/data/loader.h). Throws
// fp4moe::Error naming the folder or file. Call validate_config first.
void validate_data(const TrainerConfig& cfg);

// A canonical text of the settings a checkpoint depends on (the [model] and [moe] sections and the recipe), one
// `key = value` line each, and its 64-bit FNV-1a hash: a checkpoint written under one hash is refused under
// another. Schedule and data settings are not part of it (a run may be resumed with a longer schedule).
std::string model_config_text(const TrainerConfig& cfg);
uint64_t model_config_hash(const TrainerConfig& cfg);

}  // namespace fp4moe
