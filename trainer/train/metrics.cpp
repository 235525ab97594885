#include "trainer/train/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "kernels/common/check.h"
#include "results/h5_file.h"
#include "results/h5_read.h"
#include "results/run_info.h"
#include "trainer/model/model.h"
#include "trainer/model/moe_experts.h"

namespace fp4moe {

namespace {

constexpr double kGiB = 1073741824.0;

// The train.* settings and recompute.modules, in one order for the attributes and the checkpoint text.
Attributes train_settings(const TrainerConfig& cfg) {
  const TrainingConfig& t = cfg.train;
  Attributes a;
  auto add = [&](const char* key, Value v) { a.emplace_back(key, std::move(v)); };
  add("train.data_dir", t.data_dir);
  add("train.seq_len", t.seq_len);
  add("train.micro_batch", t.micro_batch);
  add("train.grad_accum", t.grad_accum);
  add("train.steps", t.steps);
  add("train.lr", t.lr);
  add("train.warmup_steps", t.warmup_steps);
  add("train.min_lr", t.min_lr);
  add("train.weight_decay", t.weight_decay);
  add("train.beta1", t.beta1);
  add("train.beta2", t.beta2);
  add("train.eps", t.eps);
  add("train.moments", std::string(moment_dtype_name(t.moments)));
  add("train.grad_clip", t.grad_clip);
  if (t.seed <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    add("train.seed", static_cast<int64_t>(t.seed));
  else
    add("train.seed", std::to_string(t.seed));
  add("train.eval_interval", t.eval_interval);
  add("train.eval_steps", t.eval_steps);
  add("train.final_eval_steps", t.final_eval_steps);
  add("train.non_finite", std::string(t.non_finite == NonFinitePolicy::stop ? "stop" : "skip"));
  add("train.checkpoint_interval", t.checkpoint_interval);
  add("train.checkpoint_dir", t.checkpoint_dir);
  add("train.cuda_graph", std::string(t.cuda_graph ? "true" : "false"));
  add("train.tokens_per_step", t.tokens_per_step());
  add("recompute.modules", cfg.recompute.modules.empty() ? std::string("none")
                                                         : fmt::format("{}", fmt::join(cfg.recompute.modules, " ")));
  return a;
}

std::string value_text(const Value& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  return fmt::format("{}", std::get<double>(v));
}

// Column `name` of the table at `group` (no leading '/'), as float64.
std::vector<double> read_column(const H5Reader& r, const std::string& group, const std::string& name, size_t rows) {
  const std::string ds = group + "/" + name;
  FP4MOE_CHECK(r.has_dataset(ds), "result file '{}': /{} has no column '{}'", r.path(), group, name);
  std::vector<double> v = r.read_f64(ds);
  FP4MOE_CHECK(rows == static_cast<size_t>(-1) || v.size() == rows,
               "result file '{}': column /{} holds {} rows, the table's other columns {}", r.path(), ds, v.size(), rows);
  return v;
}

}  // namespace

void MemoryPeaks::merge(const DeviceMemory& mem) {
  for (int c = 0; c < kMemCategories; ++c) peak[c] = std::max(peak[c], mem.peak(static_cast<MemCategory>(c)));
  peak_total = std::max(peak_total, mem.peak_total());
  budget = mem.budget();
}

Attributes layout_attributes(const TrainerConfig& cfg, const PipelineStage& stage) {
  if (!emulates_layout(cfg)) return {};
  const ParallelConfig& p = cfg.parallel;
  Attributes a;
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"parallel.tp", p.tp}, {"parallel.pp", p.pp},
                               {"parallel.dp", p.dp}, {"parallel.ep", p.ep}, {"parallel.micro_batches",
                               p.micro_batches}, {"parallel.zero1", p.zero1 ? 1 : 0}, {"stage", stage.stage},
                               {"stage.first_layer", stage.first_layer}, {"stage.layers", stage.layers},
                               {"loss_absent", stage.last() ? 0 : 1}})
    a.emplace_back(key, v);
  return a;
}

Attributes train_run_attributes(const TrainerConfig& cfg) {
  Attributes a;
  a.emplace_back("model_config_text", model_config_text(cfg));
  a.emplace_back("model_config_hash", fmt::format("{:016x}", model_config_hash(cfg)));
  a.emplace_back("model.name", cfg.model.name);
  for (auto& kv : train_settings(cfg)) a.push_back(std::move(kv));
  return a;
}

std::string train_config_text(const TrainerConfig& cfg) {
  std::string s = model_config_text(cfg);
  for (const auto& [key, v] : train_settings(cfg)) s += fmt::format("{} = {}\n", key, value_text(v));
  return s;
}

void check_run_name(const std::string& run) {
  FP4MOE_CHECK(!run.empty() && run.find('/') == std::string::npos && run != "." && run != "..",
               "run name '{}' cannot name an HDF5 group: it must be non-empty, without '/', and not '.' or '..'", run);
}

TrainMetrics::TrainMetrics(std::string run, Attributes attributes, std::string command, EnvInfo env)
    : run_(std::move(run)), attributes_(std::move(attributes)), command_(std::move(command)), env_(std::move(env)) {
  check_run_name(run_);
}

void TrainMetrics::set_attribute(const std::string& name, Value v) {
  fp4moe::set_attribute(attributes_, name, std::move(v));
}

void TrainMetrics::set_memory_attribute(const std::string& name, Value v) {
  FP4MOE_CHECK(name != "budget_bytes", "metrics: /memory attribute 'budget_bytes' comes from the allocator's budget");
  fp4moe::set_attribute(memory_attributes_, name, std::move(v));
}

void set_dispatch_attributes(TrainMetrics& metrics, const TrainerConfig& cfg, const std::vector<DispatchBytes>& layers) {
  if (layers.empty()) return;
  const DispatchBytes& first = layers.front();
  for (size_t i = 1; i < layers.size(); ++i)
    FP4MOE_CHECK(layers[i].payload == first.payload && layers[i].scales == first.scales,
                 "metrics: MoE layer {} dispatches {} + {} bytes per routed token, the first {} + {}: every MoE layer "
                 "has one shape and recipe", i, layers[i].payload, layers[i].scales, first.payload, first.scales);
  const double per_step = first.total() * static_cast<double>(cfg.train.tokens_per_step()) *
                          static_cast<double>(cfg.moe.top_k) * static_cast<double>(layers.size());
  metrics.set_memory_attribute("dispatch_recipe", std::string(recipe_name(cfg.recipe.routed_experts)));
  metrics.set_memory_attribute("dispatch_hidden", cfg.model.hidden);
  metrics.set_memory_attribute("dispatch_top_k", cfg.moe.top_k);
  metrics.set_memory_attribute("dispatch_moe_layers", static_cast<int64_t>(layers.size()));
  metrics.set_memory_attribute("dispatch_payload_bytes_per_token", first.payload);
  metrics.set_memory_attribute("dispatch_scale_bytes_per_token", first.scales);
  metrics.set_memory_attribute("dispatch_bytes_per_token", first.total());
  metrics.set_memory_attribute("dispatch_bytes_per_step", per_step);
}

void TrainMetrics::add_step(const StepRecord& r) {
  FP4MOE_CHECK(steps_.empty() || r.step > steps_.back().step, "metrics: step {} does not follow step {}", r.step,
               steps_.back().step);
  steps_.push_back(r);
}

void TrainMetrics::add_eval(const EvalRecord& r) { evals_.push_back(r); }

void TrainMetrics::load_previous(const std::string& path, int64_t up_to_step) {
  FP4MOE_CHECK(steps_.empty() && evals_.empty(), "metrics: load_previous must come before any row");
  const H5Reader r(path);
  const std::string steps = "train/" + run_ + "/steps", eval = "train/" + run_ + "/eval";
  if (r.has_dataset(steps + "/step")) {
    const std::vector<double> step = read_column(r, steps, "step", static_cast<size_t>(-1));
    const size_t n = step.size();
    const auto tokens = read_column(r, steps, "tokens", n), loss = read_column(r, steps, "loss", n),
               lr = read_column(r, steps, "lr", n), norm = read_column(r, steps, "grad_norm", n),
               tps = read_column(r, steps, "tokens_per_s", n), mfu = read_column(r, steps, "mfu", n),
               act = read_column(r, steps, "peak_act_gib", n), total = read_column(r, steps, "peak_total_gib", n),
               skipped = read_column(r, steps, "skipped", n);
    // The all-to-all columns are absent from files written before they existed: 0 there.
    auto optional = [&](const char* name) {
      return r.has_dataset(steps + "/" + name) ? read_column(r, steps, name, n) : std::vector<double>(n, 0.0);
    };
    const auto sent = optional("all_to_all_sent_bytes"), received = optional("all_to_all_received_bytes"),
               to_self = optional("all_to_all_to_self_bytes"), a2a_ms = optional("all_to_all_ms");
    for (size_t i = 0; i < n; ++i) {
      if (step[i] > static_cast<double>(up_to_step)) continue;
      StepRecord s;
      s.step = static_cast<int64_t>(step[i]);
      s.tokens = static_cast<int64_t>(tokens[i]);
      s.loss = loss[i];
      s.lr = lr[i];
      s.grad_norm = norm[i];
      s.tokens_per_s = tps[i];
      s.mfu = mfu[i];
      s.peak_act_gib = act[i];
      s.peak_total_gib = total[i];
      s.skipped = static_cast<int64_t>(skipped[i]);
      s.all_to_all_sent_bytes = static_cast<int64_t>(sent[i]);
      s.all_to_all_received_bytes = static_cast<int64_t>(received[i]);
      s.all_to_all_to_self_bytes = static_cast<int64_t>(to_self[i]);
      s.all_to_all_ms = a2a_ms[i];
      add_step(s);
    }
  }
  if (r.has_dataset(eval + "/step")) {
    const std::vector<double> step = read_column(r, eval, "step", static_cast<size_t>(-1));
    const auto tokens = read_column(r, eval, "tokens", step.size()), loss = read_column(r, eval, "val_loss", step.size());
    // val_tokens is absent from files written before it existed: 0 (unknown) there.
    const auto val_tokens = r.has_dataset(eval + "/val_tokens") ? read_column(r, eval, "val_tokens", step.size())
                                                                 : std::vector<double>(step.size(), 0.0);
    for (size_t i = 0; i < step.size(); ++i)
      if (step[i] <= static_cast<double>(up_to_step))
        add_eval({static_cast<int64_t>(step[i]), static_cast<int64_t>(tokens[i]), loss[i],
                  static_cast<int64_t>(val_tokens[i])});
  }
}

void TrainMetrics::write(const std::string& path) const {
  ResultFile file;
  fill_root_attributes(file, command_, env_);

  Table run;  // no columns: the group that carries the configuration
  for (const auto& [name, v] : attributes_) run.set_attribute(name, v);
  file.add_table("/train/" + run_, std::move(run));

  Table steps;
  steps.add_column("step", ColumnType::i64).add_column("tokens", ColumnType::i64).add_column("loss", ColumnType::f64);
  steps.add_column("lr", ColumnType::f64).add_column("grad_norm", ColumnType::f64);
  steps.add_column("tokens_per_s", ColumnType::f64).add_column("mfu", ColumnType::f64);
  steps.add_column("peak_act_gib", ColumnType::f64).add_column("peak_total_gib", ColumnType::f64);
  steps.add_column("skipped", ColumnType::i64);
  steps.add_column("all_to_all_sent_bytes", ColumnType::i64).add_column("all_to_all_received_bytes", ColumnType::i64);
  steps.add_column("all_to_all_to_self_bytes", ColumnType::i64).add_column("all_to_all_ms", ColumnType::f64);
  for (const StepRecord& s : steps_)
    steps.add_row({s.step, s.tokens, s.loss, s.lr, s.grad_norm, s.tokens_per_s, s.mfu, s.peak_act_gib,
                   s.peak_total_gib, s.skipped, s.all_to_all_sent_bytes, s.all_to_all_received_bytes,
                   s.all_to_all_to_self_bytes, s.all_to_all_ms});
  file.add_table("/train/" + run_ + "/steps", std::move(steps));

  Table eval;
  eval.add_column("step", ColumnType::i64).add_column("tokens", ColumnType::i64).add_column("val_loss", ColumnType::f64);
  eval.add_column("val_tokens", ColumnType::i64);
  for (const EvalRecord& e : evals_) eval.add_row({e.step, e.tokens, e.val_loss, e.val_tokens});
  file.add_table("/train/" + run_ + "/eval", std::move(eval));
  if (has_profile_) file.add_table("/train/" + run_ + "/profile", Table(profile_));

  Table mem;
  mem.add_column("category", ColumnType::str).add_column("peak_bytes", ColumnType::i64);
  mem.add_column("peak_gib", ColumnType::f64);
  for (int c = 0; c < kMemCategories; ++c)
    mem.add_row({std::string(mem_category_name(static_cast<MemCategory>(c))), static_cast<int64_t>(memory_.peak[c]),
                 static_cast<double>(memory_.peak[c]) / kGiB});
  mem.add_row({std::string("total"), static_cast<int64_t>(memory_.peak_total),
               static_cast<double>(memory_.peak_total) / kGiB});
  mem.set_attribute("budget_bytes", static_cast<int64_t>(memory_.budget));
  for (const auto& [name, v] : memory_attributes_) mem.set_attribute(name, v);
  file.add_table("/memory/" + run_, std::move(mem));

  file.write(path);
}

}  // namespace fp4moe
