// `fp4moe parity --config FILE --out PATH [--seed N] [--batch B] [--dry-run] [--section.key VALUE ...]`: one
// forward and backward of the trainer's model (trainer/model/model.h) on a seeded synthetic batch, dumped to an
// HDF5 file for the PyTorch model of the same architecture (benchmarks/peers/moe_model_torch.py parity PATH),
// which recomputes the loss and every gradient with the same weights, batch and routing (DESIGN.md "Testing").
//
// What runs: the configuration (trainer/config.h, any key overridable as --section.key) is validated; the model
// is built for it (B <= train.micro_batch rows of T = train.seq_len tokens), init_weights(seed) (default
// train.seed), then forward_backward(tokens, targets, B, grad_scale = 1) on zeroed gradients. The batch: row b is
// s[b, 0..T] with s[b, t] = splitmix64(splitmix64(seed) + b (T + 1) + t) mod vocab_size; tokens[b, t] = s[b, t],
// targets[b, t] = s[b, t + 1] (the tokens shifted by one), except every position p = b T + t with p mod 17 = 16,
// whose target is kIgnoreIndex (-100, no loss). No token shards are read. --dry-run checks the options and prints
// the config_toml attribute below (--out not needed), without a GPU and without writing anything.
//
// The file (results/h5_file.h, written atomically):
//   /                  root attributes: the run's provenance (results/run_info.h), config_path (the --config
//                      file), model_config_text (trainer/config.h), config_toml (the [model], [moe], [train] shape
//                      keys and [recipe] as TOML: what the PyTorch side builds from), seed, batch, seq_len (int64),
//                      grad_scale, loss, aux_loss (float64), valid_targets (int64)
//   /tokens, /targets  int32 [B, T]
//   /loss, /aux_loss   float32 scalars: StepStats of the pass (aux_loss: v2 balance loss summed over MoE layers,
//                      part of the gradient; 0 for v3)
//   /params/<name>     float32, the parameter's shape: the BF16 values forward read, widened exactly
//   /grads/<name>      float32, the parameter's shape: d(loss + aux_loss)/d(param) (the FP32 gradient)
//   /states/<name>     float32: the non-trainable state (the v3 router bias [E])
//   /routing/<l>       int32 [B*T, top_k] for every MoE layer l (its index among all layers): the experts each
//                      token was sent to (Model::last_topk_indices)
//
// Exit codes: 0 written; 2 a bad option or configuration, or no CUDA device (one line, before any allocation);
// 1 a failure while running or writing, or a non-finite loss or gradient (the file is written first, for
// inspection).
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/nn/cross_entropy.h"
#include "results/env_info.h"
#include "results/h5_file.h"
#include "results/output_path.h"
#include "results/run_info.h"
#include "trainer/config.h"
#include "trainer/config_file.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"

namespace fp4moe::cli {

namespace {

constexpr int64_t kIgnoreEvery = 17;  // targets at positions p with p % 17 == 16 are kIgnoreIndex

struct ParityOptions {
  TrainerConfig cfg;
  std::unique_ptr<ConfigOptions> config;
  std::string out;
  int64_t seed_arg = 0;  // --seed, >= 0
  uint64_t seed = 0;      // --seed or train.seed
  int64_t batch = 0;
  bool dry_run = false;
  CLI::Option* seed_option = nullptr;
  CLI::Option* batch_option = nullptr;
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The batch described at the top of this file: tokens, targets [B * T].
void synthetic_batch(uint64_t seed, int64_t B, int64_t T, int64_t V, std::vector<int32_t>& tokens,
                     std::vector<int32_t>& targets) {
  const uint64_t key = splitmix64(seed);
  auto token = [&](int64_t b, int64_t t) {
    return static_cast<int32_t>(splitmix64(key + static_cast<uint64_t>(b * (T + 1) + t)) % static_cast<uint64_t>(V));
  };
  tokens.resize(B * T);
  targets.resize(B * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = b * T + t;
      tokens[p] = token(b, t);
      targets[p] = p % kIgnoreEvery == kIgnoreEvery - 1 ? kIgnoreIndex : token(b, t + 1);
    }
}

// The configuration the PyTorch model builds from, as TOML (doubles in their shortest exact form).
std::string config_toml(const TrainerConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  std::string s = "[model]\n";
  auto line = [&](const char* key, const auto& v) { s += fmt::format("{} = {}\n", key, v); };
  line("name", toml_basic_string(m.name));
  line("vocab_size", m.vocab_size);
  line("hidden", m.hidden);
  line("layers", m.layers);
  line("n_dense_layers", m.n_dense_layers);
  line("heads", m.heads);
  line("q_lora_rank", m.q_lora_rank);
  line("kv_lora_rank", m.kv_lora_rank);
  line("qk_nope_head_dim", m.qk_nope_head_dim);
  line("qk_rope_head_dim", m.qk_rope_head_dim);
  line("v_head_dim", m.v_head_dim);
  line("dense_ffn", m.dense_ffn);
  line("rope_theta", m.rope_theta);
  line("norm_eps", m.norm_eps);
  line("attention_backend", toml_basic_string(attention_backend_name(m.attention_backend)));  // ours; torch ignores it
  line("attention_deterministic", m.attention_deterministic);
  s += "\n[moe]\n";
  line("routed_experts", e.routed_experts);
  line("shared_experts", e.shared_experts);
  line("top_k", e.top_k);
  line("expert_ffn", e.expert_ffn);
  line("router", toml_basic_string(e.router == RouterStyle::v2_softmax ? "v2" : "v3"));
  line("routed_scale", e.routed_scale);
  line("aux_alpha", e.aux_alpha);
  line("bias_update_rate", e.bias_update_rate);
  s += "\n[train]\n";
  line("seq_len", cfg.train.seq_len);
  line("micro_batch", cfg.train.micro_batch);
  line("seed", cfg.train.seed);
  s += "\n[recipe]\n";
  line("attention", toml_basic_string(recipe_name(cfg.recipe.attention)));
  line("dense_mlp", toml_basic_string(recipe_name(cfg.recipe.dense_mlp)));
  line("shared_experts", toml_basic_string(recipe_name(cfg.recipe.shared_experts)));
  line("routed_experts", toml_basic_string(recipe_name(cfg.recipe.routed_experts)));
  return s;
}

// Validates everything that needs no GPU; throws CliError.
void resolve(ParityOptions& o) {
  try {
    if (o.config->config_path().empty())
      throw Error("no configuration: pass --config FILE (e.g. configs/tiny.toml)");
    o.config->load_config_file();
    validate_config(o.cfg);
  } catch (const Error& e) {
    throw CliError(user_message(e.what()));
  }
  if (!o.dry_run) {
    if (o.out.empty()) throw CliError("no output: pass --out FILE.h5 (the HDF5 file to write)");
    try {
      check_output_path("--out", o.out, {{"--config", o.config->config_path()}});
    } catch (const Error& e) {
      throw CliError(user_message(e.what()));
    }
  }
  const int64_t mb = o.cfg.train.micro_batch;
  if (o.batch_option->count() == 0) o.batch = mb;
  if (o.batch < 1 || o.batch > mb)
    throw CliError(fmt::format("--batch {} must be in [1, train.micro_batch = {}] (the model is allocated for "
                               "micro_batch rows; raise --train.micro_batch for more)",
                               o.batch, mb));
  if (o.seed_option->count() > 0 && o.seed_arg < 0)
    throw CliError(fmt::format("--seed {} must be >= 0", o.seed_arg));
  o.seed = o.seed_option->count() > 0 ? static_cast<uint64_t>(o.seed_arg) : o.cfg.train.seed;
}

template <typename T>
std::vector<T> download(const T* device, int64_t n) {
  std::vector<T> host(n);
  if (n > 0) CUDA_CHECK(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

int64_t count_non_finite(const std::vector<float>& v) {
  int64_t bad = 0;
  for (float x : v) bad += !std::isfinite(x);
  return bad;
}

// Owns a CUDA stream.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

int run_parity(ParityOptions& o) {
  resolve(o);
  if (o.dry_run) {
    fmt::print("{}", config_toml(o.cfg));
    return kExitOk;
  }
  const std::string no_gpu = why_no_cuda_device();
  if (!no_gpu.empty())
    throw CliError(fmt::format("the parity dump runs the model on a GPU: {}", no_gpu));

  const TrainerConfig& cfg = o.cfg;
  const int64_t B = o.batch, T = cfg.train.seq_len, M = B * T, k = cfg.moe.top_k;
  std::vector<int32_t> tokens, targets;
  synthetic_batch(o.seed, B, T, cfg.model.vocab_size, tokens, targets);

  ResultFile file;
  fill_root_attributes(file, invocation());
  int64_t bad = 0;
  StepStats stats;
  try {
    Stream stream;
    DeviceMemory mem;  // outlives the model (declared first)
    std::unique_ptr<Model> built;
    try {
      built = std::make_unique<Model>(cfg, mem, stream.s);
    } catch (const Error& e) {  // a setting the layers do not build yet (e.g. a recipe), before any allocation
      throw CliError(
          fmt::format("cannot build the model of '{}': {}", o.config->config_path(), user_message(e.what())));
    }
    Model& model = *built;
    model.init_weights(o.seed);
    model.params().zero_grads(stream.s);
    DeviceArray<int32_t> d_tokens(mem, M, MemCategory::workspace, "parity tokens");
    DeviceArray<int32_t> d_targets(mem, M, MemCategory::workspace, "parity targets");
    CUDA_CHECK(cudaMemcpy(d_tokens.data(), tokens.data(), M * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_targets.data(), targets.data(), M * sizeof(int32_t), cudaMemcpyHostToDevice));
    stats = model.forward_backward(d_tokens.data(), d_targets.data(), B, 1.0f);
    CUDA_CHECK(cudaStreamSynchronize(stream.s));

    for (const Param& p : model.params().params()) {
      const std::vector<uint16_t> bits = download(reinterpret_cast<const uint16_t*>(p.param), p.n);
      std::vector<float> values(p.n);
      for (int64_t i = 0; i < p.n; ++i) values[i] = bf16_bits_to_f32(bits[i]);
      std::vector<float> grad = download(p.grad, p.n);
      bad += count_non_finite(grad);
      file.add_array("/params/" + p.name, p.shape, values);
      file.add_array("/grads/" + p.name, p.shape, grad);
    }
    for (const StateTensor& s : model.params().states())
      file.add_array("/states/" + s.name, s.shape, download(s.data, s.n));
    const std::vector<const int32_t*> routing = model.last_topk_indices();
    for (size_t i = 0; i < routing.size(); ++i) {
      const int64_t layer = cfg.model.n_dense_layers + static_cast<int64_t>(i);  // MoE layers follow the dense ones
      file.add_array("/routing/" + std::to_string(layer), {M, k}, download(routing[i], M * k));
    }
  } catch (const Error& e) {
    throw std::runtime_error(user_message(e.what()));
  }

  file.add_array("/tokens", {B, T}, tokens);
  file.add_array("/targets", {B, T}, targets);
  file.add_array("/loss", {}, std::vector<float>{stats.loss});
  file.add_array("/aux_loss", {}, std::vector<float>{stats.aux_loss});
  file.set_attribute("config_path", o.config->config_path());
  file.set_attribute("model_config_text", model_config_text(cfg));
  file.set_attribute("config_toml", config_toml(cfg));
  file.set_attribute("seed", static_cast<int64_t>(o.seed));
  file.set_attribute("batch", B);
  file.set_attribute("seq_len", T);
  file.set_attribute("grad_scale", 1.0);
  file.set_attribute("loss", static_cast<double>(stats.loss));
  file.set_attribute("aux_loss", static_cast<double>(stats.aux_loss));
  file.set_attribute("valid_targets", stats.tokens);
  try {
    file.write(o.out);
  } catch (const Error& e) {
    throw std::runtime_error(user_message(e.what()));
  }
  fmt::print("parity dump of {} (seed {}, batch {} x {} tokens, {} valid targets): loss {:.7g}, aux loss {:.7g}\n",
             o.config->config_path(), o.seed, B, T, stats.tokens, stats.loss, stats.aux_loss);
  fmt::print("wrote {}; compare with: benchmarks/peers/moe_model_torch.py parity {}\n", o.out, o.out);
  if (bad > 0 || !std::isfinite(stats.loss) || !std::isfinite(stats.aux_loss))
    throw std::runtime_error(fmt::format("non-finite results: loss {}, aux loss {}, {} gradient elements (written to "
                                         "{} for inspection)",
                                         stats.loss, stats.aux_loss, bad, o.out));
  return kExitOk;
}

}  // namespace

Command add_parity_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "parity", "dump one forward and backward of the model (weights, batch, routing, loss, gradients) to HDF5 "
                "for the PyTorch parity check");
  auto o = std::make_shared<ParityOptions>();
  o->config = std::make_unique<ConfigOptions>(*sub, o->cfg);
  sub->add_option("--out", o->out, "HDF5 file to write (replaced atomically)");
  o->seed_option = sub->add_option("--seed", o->seed_arg, "weights and batch seed (default: train.seed)");
  o->batch_option = sub->add_option("--batch", o->batch, "rows of seq_len tokens, 1..train.micro_batch (default: "
                                                         "train.micro_batch)");
  sub->add_flag("--dry-run", o->dry_run, "check the options, print the configuration the file would carry (TOML) "
                                         "and exit; no GPU needed");
  return {sub, [o] { return run_parity(*o); }};
}

}  // namespace fp4moe::cli
