// Measuring stage times through `fp4moe train` children (trainer/memory/stage_measure.h).
#include "trainer/memory/stage_measure.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/common/check.h"
#include "results/h5_read.h"
#include "trainer/config_file.h"
#include "trainer/memory/estimate_report.h"

extern char** environ;

namespace fp4moe {

namespace {

constexpr const char* kRun = "measure";

// The last non-blank line the child wrote (its progress lines end in '\r' on a terminal: split there too).
std::string last_line(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str(), line, last;
  std::replace(all.begin(), all.end(), '\r', '\n');
  std::istringstream lines(all);
  while (std::getline(lines, line))
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  std::replace(last.begin(), last.end(), '\t', ' ');
  if (last.size() > 300) last = last.substr(0, 297) + "...";
  return last.empty() ? std::string("no output") : last;
}

// A failed measurement: thrown without a source location, as its text is recorded in the cache and the report.
void check_run(bool ok, const std::string& why) {
  if (!ok) throw Error(why);
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

std::string trainer_config_toml(const TrainerConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  const TrainingConfig& t = cfg.train;
  const ParallelConfig& p = cfg.parallel;
  std::string s;
  auto str = [](const std::string& v) { return toml_basic_string(v); };
  s += fmt::format("[model]\nname = {}\nvocab_size = {}\nhidden = {}\nlayers = {}\nn_dense_layers = {}\nheads = {}\n",
                   str(m.name), m.vocab_size, m.hidden, m.layers, m.n_dense_layers, m.heads);
  s += fmt::format("q_lora_rank = {}\nkv_lora_rank = {}\nqk_nope_head_dim = {}\nqk_rope_head_dim = {}\n", m.q_lora_rank,
                   m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim);
  s += fmt::format("v_head_dim = {}\ndense_ffn = {}\nrope_theta = {}\nnorm_eps = {}\n\n", m.v_head_dim, m.dense_ffn,
                   m.rope_theta, m.norm_eps);
  s += fmt::format("[moe]\nrouted_experts = {}\nshared_experts = {}\ntop_k = {}\nexpert_ffn = {}\nrouter = {}\n",
                   e.routed_experts, e.shared_experts, e.top_k, e.expert_ffn,
                   str(e.router == RouterStyle::v2_softmax ? "v2" : "v3"));
  s += fmt::format("routed_scale = {}\naux_alpha = {}\nbias_update_rate = {}\n\n", e.routed_scale, e.aux_alpha,
                   e.bias_update_rate);
  s += fmt::format("[train]\ndata_dir = {}\nseq_len = {}\nmicro_batch = {}\ngrad_accum = {}\nsteps = {}\nlr = {}\n",
                   str(t.data_dir), t.seq_len, t.micro_batch, t.grad_accum, t.steps, t.lr);
  s += fmt::format("warmup_steps = {}\nmin_lr = {}\nweight_decay = {}\nbeta1 = {}\nbeta2 = {}\neps = {}\n",
                   t.warmup_steps, t.min_lr, t.weight_decay, t.beta1, t.beta2, t.eps);
  s += fmt::format("grad_clip = {}\nseed = {}\neval_interval = {}\neval_steps = {}\nfinal_eval_steps = {}\n",
                   t.grad_clip, t.seed, t.eval_interval, t.eval_steps, t.final_eval_steps);
  s += fmt::format("non_finite = {}\ncheckpoint_interval = {}\ncheckpoint_dir = {}\n\n",
                   str(t.non_finite == NonFinitePolicy::stop ? "stop" : "skip"), t.checkpoint_interval,
                   str(t.checkpoint_dir));
  s += fmt::format("[recipe]\nattention = {}\ndense_mlp = {}\nshared_experts = {}\nrouted_experts = {}\n\n",
                   str(recipe_name(cfg.recipe.attention)), str(recipe_name(cfg.recipe.dense_mlp)),
                   str(recipe_name(cfg.recipe.shared_experts)), str(recipe_name(cfg.recipe.routed_experts)));
  std::vector<std::string> modules;
  for (const std::string& mod : cfg.recompute.modules) modules.push_back(str(mod));
  s += fmt::format("[recompute]\nmodules = [{}]\n\n", fmt::join(modules, ", "));
  s += fmt::format("[parallel]\ntp = {}\npp = {}\nep = {}\ndp = {}\nmicro_batches = {}\nzero1 = {}\nstage = {}\n"
                   "routed_load = {}\n",
                   p.tp, p.pp, p.ep, p.dp, p.micro_batches, p.zero1 ? "true" : "false", p.stage, p.routed_load);
  return s;
}

TrainerConfig measurement_config(const TrainerConfig& model, const StageTimeKey& key, bool last_stage,
                                 const MeasureSettings& settings) {
  FP4MOE_CHECK(key.kind != LayerKind::head, "measurement_config: head is measured on its base kind's last stage");
  FP4MOE_CHECK(settings.micro_batches >= 1 && settings.warmup_steps >= 0 && settings.timed_steps >= 1,
               "measurement settings: micro_batches and timed_steps must be >= 1 and warmup_steps >= 0, got {}, {}, {}",
               settings.micro_batches, settings.timed_steps, settings.warmup_steps);
  const bool moe = key.kind == LayerKind::moe;
  FP4MOE_CHECK(moe ? model.model.n_dense_layers < model.model.layers : model.model.n_dense_layers > 0,
               "the model has no {} layer to measure", layer_kind_name(key.kind));
  TrainerConfig cfg;
  cfg.model = model.model;
  cfg.moe = model.moe;
  cfg.model.layers = 3;
  cfg.model.n_dense_layers = moe ? 0 : 3;
  TrainingConfig& t = cfg.train;
  t.data_dir = "data/cache/shards";  // not read: synthetic tokens
  t.seq_len = key.seq_len;
  t.micro_batch = key.micro_batch;
  t.grad_accum = settings.micro_batches;
  t.steps = settings.warmup_steps + settings.timed_steps;
  t.lr = 1e-4;
  t.min_lr = 1e-5;
  t.weight_decay = 0.1;
  t.seed = 1234;
  t.non_finite = NonFinitePolicy::skip;  // a diverging step still runs every kernel
  cfg.recipe = paper_recipe(parse_recipe(key.recipe, "stage time recipe"));
  if (key.policy != "none") cfg.recompute.modules = split_words(key.policy);
  ParallelConfig& p = cfg.parallel;
  p.tp = 1;
  p.pp = 3;
  p.ep = moe ? key.ep : 1;
  p.dp = 8 * p.ep;
  p.micro_batches = settings.micro_batches;
  p.zero1 = true;
  p.stage = last_stage ? 2 : 1;
  validate_config(cfg);
  return cfg;
}

double run_stage_measurement(const TrainerConfig& cfg, const MeasureSettings& settings, const std::string& name) {
  const std::filesystem::path dir(settings.work_dir);
  const std::string toml = (dir / (name + ".toml")).string(), log = (dir / (name + ".log")).string(),
                    h5 = (dir / (name + ".h5")).string();
  {
    std::ofstream out(toml, std::ios::binary | std::ios::trunc);
    out << trainer_config_toml(cfg);
    check_run(out.good(), fmt::format("cannot write '{}'", toml));
  }
  std::vector<std::string> args = {settings.exe, "train",     "--config", toml, "--synthetic-data", "--out", h5,
                                   "--overwrite", "--run",    kRun,       "--log-interval", "1000"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, settings.exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  check_run(spawned == 0, fmt::format("cannot start '{}': {}", settings.exe, std::strerror(spawned)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    check_run(errno == EINTR, fmt::format("waiting for '{}' failed: {}", settings.exe, std::strerror(errno)));
  if (WIFSIGNALED(status))
    check_run(false, fmt::format("fp4moe train ended by signal {}: {}", WTERMSIG(status), last_line(log)));
  check_run(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            fmt::format("fp4moe train exit {}: {}", WEXITSTATUS(status), last_line(log)));

  const std::vector<double> rate = H5Reader(h5).read_f64(fmt::format("train/{}/steps/tokens_per_s", kRun));
  const int64_t timed = settings.timed_steps, steps = static_cast<int64_t>(rate.size());
  check_run(steps >= timed, fmt::format("'{}' holds {} steps, expected {}", h5, steps, settings.warmup_steps + timed));
  const double tokens = static_cast<double>(cfg.train.tokens_per_step());
  std::vector<double> step_s;
  for (int64_t i = steps - timed; i < steps; ++i) {
    const double r = rate[static_cast<size_t>(i)];
    check_run(std::isfinite(r) && r > 0, fmt::format("'{}': step {} ran at {} tokens/s, expected > 0", h5, i + 1, r));
    step_s.push_back(tokens / r);
  }
  std::sort(step_s.begin(), step_s.end());
  const size_t n = step_s.size();
  const double median = n % 2 == 1 ? step_s[n / 2] : 0.5 * (step_s[n / 2 - 1] + step_s[n / 2]);
  return median / static_cast<double>(cfg.train.grad_accum);
}

int64_t measure_stage_times(const TrainerConfig& model, const std::vector<StageTimeKey>& keys, StageTimeCache& cache,
                            const MeasureSettings& settings, const MeasureFn& measure,
                            const std::function<void(int64_t, int64_t, const StageTimeKey&)>& progress) {
  std::vector<const StageTimeKey*> todo;
  for (const StageTimeKey& k : keys)
    if (cache.find(k) == nullptr &&
        std::none_of(todo.begin(), todo.end(), [&](const StageTimeKey* t) { return *t == k; }))
      todo.push_back(&k);
  const auto total = static_cast<int64_t>(todo.size());
  int64_t done = 0;
  for (const StageTimeKey* k : todo) {
    if (progress) progress(done, total, *k);
    StageTimeEntry e;
    e.key = *k;
    try {
      if (k->kind == LayerKind::head) {
        const StageTimeKey& base = head_base_key(keys);
        const StageTimeEntry* middle = cache.find(base);
        check_run(middle != nullptr && middle->measured(),
                  fmt::format("its middle-stage twin ({}) was not measured", base.text()));
        const double last = measure(measurement_config(model, base, true, settings), fmt::format("m{}_last", done));
        e.seconds = last - middle->seconds;
        check_run(e.seconds > 0, fmt::format("the last stage ({:.3f} ms) was not slower than the middle one ({:.3f} ms)",
                                             1e3 * last, 1e3 * middle->seconds));
      } else {
        e.seconds = measure(measurement_config(model, *k, false, settings), fmt::format("m{}", done));
        check_run(std::isfinite(e.seconds) && e.seconds > 0,
                  fmt::format("measured {} s per micro-batch, expected > 0", e.seconds));
      }
    } catch (const Error& err) {
      e.seconds = 0;
      e.failure = err.what();
      std::replace(e.failure.begin(), e.failure.end(), '\t', ' ');
      std::replace(e.failure.begin(), e.failure.end(), '\n', ' ');
    }
    cache.put(std::move(e));
    cache.save();
    ++done;
  }
  if (progress && total > 0) progress(total, total, *todo.back());
  return total;
}

}  // namespace fp4moe
