#include "trainer/train/trainer.h"

#include <fmt/format.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <optional>

#include "kernels/common/check.h"
#include "results/env_info.h"
#include "results/output_path.h"
#include "trainer/flops.h"
#include "trainer/memory/estimate.h"
#include "trainer/model/moe_experts.h"
#include "trainer/train/param_checkpoint.h"
#include "trainer/train/stop_signals.h"
#include "trainer/train/trainer_state.h"

namespace fp4moe {

namespace fs = std::filesystem;

void check_trainable(const TrainerConfig& cfg, const TrainerOptions& options) {
  validate_config(cfg);
  check_emulated_layout(cfg);
  FP4MOE_CHECK(!options.ranks || !options.transport, "TrainerOptions: ranks and transport are exclusive (a launched "
               "rank builds its NcclTransport; a test's simulated rank brings its transport)");
  if (options.ranks || options.transport) {  // real or simulated ranks: expert and data parallel, no emulated layout
    const int W = options.ranks ? options.ranks->world_size : options.transport->world_size();
    check_ranks_config(cfg, W);
  }
  FP4MOE_CHECK(!options.synthetic_data || cfg.train.eval_interval == 0 || cfg.train.eval_steps >= 1,
               "train.eval_steps = 0 evaluates the whole validation split, which synthetic data does not have; give "
               "train.eval_steps N >= 1 batches (or train.eval_interval 0)");
  if (!cfg.train.checkpoint_dir.empty() || !options.resume_path.empty())  // a ZeRO-1 shard: no whole-tensor checkpoint
    require_whole_optimizer_state(layout_of(cfg).zero1_parts(),
                                  !options.resume_path.empty() ? "--resume" : "train.checkpoint_dir");
  if (cfg.train.cuda_graph) {  // trainer/train/step_graph.h
    FP4MOE_CHECK(!options.ranks && !options.transport, "train.cuda_graph = true is not supported over ranks: the "
                 "expert-parallel exchanges size their buffers on the host every step (set train.cuda_graph = false)");
    FP4MOE_CHECK(!emulates_layout(cfg), "train.cuda_graph = true is not supported with an emulated [parallel] layout "
                 "(tp {} pp {} dp {} ep {}): its passes are not captured (set train.cuda_graph = false)",
                 cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.ep);
    FP4MOE_CHECK(!options.profile, "train.cuda_graph = true with --profile: the step profile times each module's "
                 "kernels in an eager step, which a replayed graph does not run one by one (drop one of the two)");
  }
  if (!emulates_layout(cfg)) return;
  const ParallelConfig& p = cfg.parallel;
  const std::string layout = fmt::format("the emulated layout (tp {} pp {} dp {} ep {})", p.tp, p.pp, p.dp, p.ep);
  if (p.pp > 1 || p.ep > 1) {  // a stage or an expert share, not the whole model (a data-parallel replica is whole)
    FP4MOE_CHECK(cfg.train.checkpoint_dir.empty(), "train.checkpoint_dir = '{}': {} holds one GPU's share of the "
                 "model, which a checkpoint cannot hold (unset train.checkpoint_dir and train.checkpoint_interval)",
                 cfg.train.checkpoint_dir, layout);
    FP4MOE_CHECK(options.resume_path.empty(), "--resume: {} is not resumed from a checkpoint", layout);
  }
  const PipelineStage stage = pipeline_stage(cfg);
  FP4MOE_CHECK(cfg.train.eval_interval == 0 || stage.last(), "train.eval_interval = {}: stage {} of {} has no LM "
               "head and so no loss to evaluate (set train.eval_interval = 0)", cfg.train.eval_interval, stage.stage,
               layout);
}

// Training FLOPs per token of what this GPU runs: the whole model, or under an emulated layout its stage (the
// stage's layers, their routed experts' share x parallel.routed_load, the rows a skewed load adds; and the LM head on
// the last stage; the embedding counts none).
double training_flops_per_token(const TrainerConfig& cfg) {
  const int64_t T = cfg.train.seq_len;
  if (!emulates_layout(cfg)) return model_flops_per_token(cfg, T).training;
  const PipelineStage stage = pipeline_stage(cfg);
  double forward = stage.last() ? lm_head_flops_per_token(cfg.model) : 0.0;
  for (int64_t l = stage.first_layer; l < stage.first_layer + stage.layers; ++l) {
    LayerFlopsPerToken f = layer_flops_per_token(cfg, l, T);
    f.routed_experts *= cfg.parallel.routed_load;
    forward += f.total();
  }
  return 3.0 * forward;
}

Trainer::State::~State() {
  if (stream) cudaStreamSynchronize(stream);  // no throw from a destructor
  graph.reset();  // its graph and losses, before the model
  model.reset();
  profiler.reset();  // its events, before the stream
  tokens.reset();
  targets.reset();
  grad_norm.reset();
  rank_value.reset();
  mem.reset();
  nccl.reset();  // after the model and its exchanges
  if (uploaded) cudaEventDestroy(uploaded);
  if (pinned) cudaFreeHost(pinned);
  if (stream) cudaStreamDestroy(stream);
}

void Trainer::State::setup() {
  const TrainingConfig& t = cfg.train;
  // Everything that can be refused without a device, first.
  check_trainable(cfg, opts);  // validate_config, what an emulated layout does not support, ZeRO-1's checkpoints
  if (!opts.synthetic_data) validate_data(cfg);
  if ((opts.ranks && opts.ranks->rank != 0) || (opts.transport && opts.transport->rank() != 0)) {
    // rank 0 alone writes the result file and logs
    opts.out_path.clear();
    opts.log = nullptr;
  }
  FP4MOE_CHECK(opts.log_interval >= 1, "log_interval must be >= 1, got {}", opts.log_interval);
  FP4MOE_CHECK(std::isfinite(opts.peak_flops) && opts.peak_flops > 0, "peak_flops must be > 0, got {}",
               opts.peak_flops);
  FP4MOE_CHECK(opts.inject_nonfinite_step >= 0, "inject_nonfinite_step must be >= 0, got {}",
               opts.inject_nonfinite_step);
  FP4MOE_CHECK(opts.profile_warmup >= 0, "profile_warmup must be >= 0 steps, got {}", opts.profile_warmup);
  run_name = !opts.run_name.empty() ? opts.run_name : !cfg.model.name.empty() ? cfg.model.name : "run";
  check_run_name(run_name);
  std::error_code ec;
  FP4MOE_CHECK(opts.resume_path.empty() || fs::is_regular_file(opts.resume_path, ec),
               "resume: checkpoint '{}' does not exist or is not a file", opts.resume_path);
  if (!opts.out_path.empty())
    check_output_path("the result file", opts.out_path,
                      {{"the configuration file", opts.config_path}, {"the resume checkpoint", opts.resume_path}},
                      OutputFolder::may_be_created);

  B = t.micro_batch;
  T = t.seq_len;
  tokens_per_step = t.tokens_per_step();
  flops_per_token = training_flops_per_token(cfg);
  rows.resize(static_cast<size_t>(B * (T + 1)));
  other_rows.resize(rows.size());
  if (opts.synthetic_data) {
    train = TokenBatches::synthetic(t.seed, kSyntheticTrainStream, cfg.model.vocab_size, B, T);
    if (t.eval_interval > 0) val = TokenBatches::synthetic(t.seed, kSyntheticValStream, cfg.model.vocab_size, B, T);
  } else {
    train = TokenBatches::from_shards(shard_loader_config(cfg, "train"));
    if (t.eval_interval > 0) {
      val = TokenBatches::from_shards(shard_loader_config(cfg, "val"));
      val_split = std::make_unique<ValidationWindows>(shard_loader_config(cfg, "val"));
    }
  }
  const std::string no_gpu = why_no_cuda_device();
  FP4MOE_CHECK(no_gpu.empty(), "{}: training needs one", no_gpu);

  if (!opts.out_path.empty() && fs::path(opts.out_path).has_parent_path()) {
    fs::create_directories(fs::path(opts.out_path).parent_path(), ec);
    FP4MOE_CHECK(!ec, "cannot create the folder of the result file '{}': {}", opts.out_path, ec.message());
  }
  if (!t.checkpoint_dir.empty()) {
    fs::create_directories(t.checkpoint_dir, ec);
    FP4MOE_CHECK(!ec, "cannot create train.checkpoint_dir '{}': {}", t.checkpoint_dir, ec.message());
  }

  if (opts.ranks) {  // a launched run: the communicator first (it makes the rank's device current)
    nccl = std::make_unique<NcclTransport>(*opts.ranks);
    transport = nccl.get();
  } else {
    transport = opts.transport;
  }
  if (transport) {
    rank = transport->rank();
    world = transport->world_size();
  }
  CUDA_CHECK(cudaStreamCreate(&stream));
  CUDA_CHECK(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming));
  // [2][B*T]: one micro-batch's tokens and targets; train.cuda_graph: [grad_accum][2][B*T], the step's (StepGraph)
  const int64_t staged = t.cuda_graph ? t.grad_accum : 1;
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned),
                           static_cast<size_t>(2 * B * T * staged) * sizeof(int32_t), cudaHostAllocDefault));
  mem = std::make_unique<DeviceMemory>(opts.memory_budget_bytes);
  model = std::make_unique<Model>(cfg, *mem, stream, transport);
  const PipelinePosition& at = model->position();
  FP4MOE_CHECK(one_f_one_b_slots(at.stages, at.stage, t.grad_accum) == at.in_flight,
               "stage {} of {} keeps {} micro-batches in flight, but train.grad_accum = {} micro-batches per step "
               "need {} (train.grad_accum must equal parallel.micro_batches)",
               at.stage, at.stages, at.in_flight, t.grad_accum, one_f_one_b_slots(at.stages, at.stage, t.grad_accum));
  schedule = one_f_one_b_schedule(at.stages, at.stage, t.grad_accum);
  tokens = DeviceArray<int32_t>(*mem, B * T, MemCategory::workspace, "batch tokens [B*T]");
  targets = DeviceArray<int32_t>(*mem, B * T, MemCategory::workspace, "batch targets [B*T]");
  grad_norm = std::make_unique<GradNorm>(model->params(), *mem, transport);
  if (t.cuda_graph) {
    model->set_host_sync_free(true);
    graph = std::make_unique<StepGraph>(*model, *mem, stream, schedule, opts.capture_step_graph);
  }
  model->set_exchange_timing(transport != nullptr);  // the step's all-to-all time (trainer_step.cpp)
  if (transport) rank_value = DeviceArray<float>(*mem, 3, MemCategory::workspace, "values summed over the ranks");
  if (opts.profile) {
    profiler = std::make_unique<StepProfiler>(stream);
    profile = std::make_unique<StepProfile>(opts.log_interval, opts.profile_warmup);
    model->context().profiler = profiler.get();
  }

  metrics = std::make_unique<TrainMetrics>(run_name, train_run_attributes(cfg), opts.command, query_env_info());
  metrics->set_attribute("config_file", opts.config_path);
  metrics->set_attribute("synthetic_data", static_cast<int64_t>(opts.synthetic_data ? 1 : 0));
  metrics->set_attribute("peak_flops", opts.peak_flops);
  metrics->set_attribute("training_flops_per_token", flops_per_token);
  metrics->set_attribute("memory_budget_bytes", static_cast<int64_t>(opts.memory_budget_bytes));
  metrics->set_attribute("resumed_from", opts.resume_path);
  metrics->set_attribute("attention_backend", model->attention_backend_note());
  set_dispatch_attributes(*metrics, cfg, model->dispatch_bytes());
  for (auto& [key, v] : layout_attributes(cfg, model->stage())) metrics->set_attribute(key, std::move(v));

  if (opts.resume_path.empty()) {
    model->init_weights(t.seed);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  } else {
    restore(opts.resume_path);
    if (!opts.out_path.empty() && !opts.replace_out && fs::exists(opts.out_path, ec))
      metrics->load_previous(opts.out_path, step);
  }
  result.start_step = step;
  run_peaks.merge(*mem);  // construction and initialisation

  const bool terminal = opts.progress == ProgressMode::terminal ||
                        (opts.progress == ProgressMode::automatic && ProgressPrinter::is_terminal(opts.log));
  progress = std::make_unique<ProgressPrinter>(opts.log, terminal, opts.log_interval);
}

void Trainer::State::draw(TokenBatches& source) {
  for (int r = 0; r < world; ++r) {  // the group's next W batches; this rank's is the rank-th
    if (r != rank) source.next(other_rows);
    else source.next(rows);
  }
}

void Trainer::State::upload(TokenBatches& source) {
  draw(source);
  upload_rows(B);
}

void Trainer::State::stage_step_batches() {
  CUDA_CHECK(cudaEventSynchronize(uploaded));  // the previous copies out of `pinned` have finished
  const size_t n = static_cast<size_t>(B * T);
  for (int64_t i = 0; i < cfg.train.grad_accum; ++i) {
    draw(*train);
    const std::span<int32_t> tok(pinned + 2 * i * n, n), tgt(pinned + (2 * i + 1) * n, n);
    split_rows(std::span<const int32_t>(rows).first(static_cast<size_t>(B * (T + 1))), B, T, tok, tgt);
    check_batch_ids(tok, tgt, cfg.model.vocab_size, T, "training batch");
  }
}

void Trainer::State::sum_over_ranks(std::span<double> values) {
  if (!transport) return;
  FP4MOE_CHECK(values.size() <= 3, "sum_over_ranks: {} values, at most 3", values.size());
  float f[3] = {};
  for (size_t i = 0; i < values.size(); ++i) f[i] = static_cast<float>(values[i]);
  const int64_t n = static_cast<int64_t>(values.size());
  CUDA_CHECK(cudaMemcpyAsync(rank_value.data(), f, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  transport->all_reduce_sum(rank_value.data(), n, stream);
  CUDA_CHECK(cudaMemcpyAsync(f, rank_value.data(), n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  transport->wait(stream);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(f[i]);
}

namespace {
// The stop signal every rank takes from an all-reduce of (signalled 0 or 1, signal number) over the ranks: none when
// no rank was signalled; a signalled rank keeps its own; the others take the signalled ranks' mean (exact when they
// received the same one).
int agreed_signal(int local, double signalled_ranks, double signal_sum) {
  if (signalled_ranks < 0.5) return 0;
  return local != 0 ? local : static_cast<int>(std::lround(signal_sum / signalled_ranks));
}
}  // namespace

int Trainer::State::local_stop_signal(int64_t s) const {
  if (opts.inject_stop_step > 0 && s >= opts.inject_stop_step && rank == opts.inject_stop_rank) return SIGTERM;
  return StopSignals::pending();
}

double Trainer::State::reduce_step_loss(double loss, int64_t s) {
  if (!transport) return loss;
  // Every rank must take the same decision after the same step (the next step's and the final checkpoint's
  // collectives otherwise meet different calls): a signal on any rank stops every rank. It rides on the loss's
  // all-reduce (no collective of its own): [loss, signalled (0 or 1), signal number], summed.
  const int local = local_stop_signal(s);
  double v[3] = {loss, local != 0 ? 1.0 : 0.0, static_cast<double>(local)};
  sum_over_ranks(v);
  step_stop_signal = agreed_signal(local, v[1], v[2]);
  return v[0] / world;
}

int Trainer::State::agree_final_stop_signal(int64_t steps) {
  if (!transport) return 0;
  const int local = local_stop_signal(steps + 1);
  double v[2] = {local != 0 ? 1.0 : 0.0, static_cast<double>(local)};
  sum_over_ranks(v);
  return agreed_signal(local, v[0], v[1]);
}

int Trainer::State::stop_after_step() const { return transport ? step_stop_signal : local_stop_signal(step); }

double Trainer::State::mean_over_ranks(double v) {
  double sum[1] = {v};
  sum_over_ranks(sum);
  return transport ? sum[0] / world : v;
}

void Trainer::State::upload_rows(int64_t rows_n) {
  FP4MOE_CHECK(rows_n >= 1 && rows_n <= B, "upload_rows: {} rows, expected 1 to B = {}", rows_n, B);
  CUDA_CHECK(cudaEventSynchronize(uploaded));  // the previous batch's copies out of `pinned` have finished
  const size_t n = static_cast<size_t>(rows_n * T);
  split_rows(std::span<const int32_t>(rows).first(static_cast<size_t>(rows_n * (T + 1))), rows_n, T, {pinned, n},
             {pinned + n, n});
  CUDA_CHECK(cudaMemcpyAsync(tokens.data(), pinned, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(targets.data(), pinned + n, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaEventRecord(uploaded, stream));
}

Trainer::Trainer(const TrainerConfig& cfg, const TrainerOptions& options) : s_(std::make_unique<State>()) {
  s_->cfg = cfg;
  s_->opts = options;
  s_->setup();
}

Trainer::~Trainer() = default;

Model& Trainer::model() { return *s_->model; }
const DeviceMemory& Trainer::memory() const { return *s_->mem; }
int64_t Trainer::step() const { return s_->step; }

TrainResult Trainer::run() {
  State& s = *s_;
  const TrainingConfig& t = s.cfg.train;
  FP4MOE_CHECK(s.step < t.steps, "Trainer::run: already at step {} of train.steps = {}", s.step, t.steps);
  std::optional<StopSignals> signals;
  if (s.opts.handle_signals) signals.emplace();

  s.progress->message(fmt::format(
      "training {}: steps {}..{} of {} tokens ({} rows x {} tokens x {} micro-batches), {}{}", s.run_name,
      s.step + 1, t.steps, s.tokens_per_step, s.B, s.T, t.grad_accum,
      s.opts.synthetic_data ? std::string("synthetic tokens") : fmt::format("shards of {}", t.data_dir),
      s.opts.out_path.empty() ? std::string() : fmt::format(", results in {}", s.opts.out_path)));
  if (s.cfg.model.attention_backend != AttentionBackend::own) s.progress->message(s.model->attention_backend_note());
  const Recipe& routed = s.cfg.recipe.routed_experts;
  if (s.graph && s.cfg.model.n_dense_layers < s.cfg.model.layers &&
      (routed.fprop == GemmPrecision::bf16 || routed.dgrad == GemmPrecision::bf16 || routed.wgrad == GemmPrecision::bf16))
    s.progress->message(fmt::format(
        "train.cuda_graph: the routed experts' GEMMs read the expert counts on the device; their BF16 ones (recipe "
        "{}) run on CUDA cores there (kernels/gemm/grouped_gemm_simt.h), slower than the cuBLASLt calls of a step "
        "without the graph beyond small shapes (scripts/graph_step_time.sh measures both)",
        recipe_name(routed)));
  if (s.transport) {
    const int64_t E = s.cfg.moe.routed_experts;
    s.progress->message(fmt::format("rank {} of {}: expert parallel ({} of {} routed experts per MoE layer on each "
                                    "rank) and data parallel ({} tokens per step over the ranks)",
                                    s.rank, s.world, E / s.world, E, s.tokens_per_step * s.world));
  }
  if (emulates_layout(s.cfg)) {
    const ParallelConfig& p = s.cfg.parallel;
    const PipelineStage& st = s.model->stage();
    s.progress->message(fmt::format(
        "emulating one GPU of tp {} pp {} dp {} ep {}: stage {} (layers {}-{}), {} of {} routed experts per MoE "
        "layer{}{}",
        p.tp, p.pp, p.dp, p.ep, st.stage, st.first_layer, st.first_layer + st.layers - 1,
        s.cfg.moe.routed_experts / p.ep, s.cfg.moe.routed_experts,
        p.routed_load == 1.0 ? "" : fmt::format(" receiving {:g}x the balanced routed rows", p.routed_load),
        st.last() ? "" : "; no LM head: the loss is absent (NaN)"));
  }
  s.run_start = State::Clock::now();
  while (s.step < t.steps) {
    const StepRecord r = s.train_step();
    s.metrics->add_step(r);
    s.result.steps.push_back(r);
    const double elapsed = std::chrono::duration<double>(State::Clock::now() - s.run_start).count();
    const double eta = elapsed / static_cast<double>(s.step - s.result.start_step) * static_cast<double>(t.steps - s.step);
    s.progress->step({s.step, t.steps, r.loss, r.lr, r.tokens_per_s, r.mfu, r.peak_total_gib, eta, r.skipped});

    // The last step's evaluation is the final one (below) rather than a periodic one.
    const bool eval_now = t.eval_interval > 0 && s.step % t.eval_interval == 0 && s.step < t.steps;
    if (eval_now) s.evaluate(false);
    if (t.checkpoint_interval > 0 && s.step % t.checkpoint_interval == 0)
      s.checkpoint();  // writes the metrics file too
    else if (eval_now)
      s.write_metrics();
    if (const int signal = s.stop_after_step(); signal != 0) {
      s.result.stop_signal = signal;
      s.progress->message(fmt::format("{} received: stopping after step {}", stop_signal_name(s.result.stop_signal),
                                      s.step));
      break;
    }
  }
  if (s.result.stop_signal == 0 && s.step == t.steps) {
    if (const int signal = s.agree_final_stop_signal(t.steps); signal != 0) {
      s.result.stop_signal = signal;
      s.progress->message(fmt::format("{} received after the last step: no final evaluation",
                                      stop_signal_name(signal)));
    }
  }
  if (s.result.stop_signal == 0 && t.eval_interval > 0 && s.last_eval_step != s.step) s.evaluate(true);
  if (!t.checkpoint_dir.empty() && s.last_checkpoint_step != s.step) s.checkpoint();
  s.write_metrics();

  const double seconds = std::chrono::duration<double>(State::Clock::now() - s.run_start).count();
  s.result.step = s.step;
  s.result.optimizer_steps = s.optimizer_steps;
  s.result.tokens = s.tokens_seen;
  std::string summary = fmt::format("{} at step {}/{} after {}: loss {:.4f}", s.result.stop_signal ? "stopped" : "done",
                                    s.step, t.steps, format_duration(seconds), s.result.steps.back().loss);
  if (!s.result.evals.empty()) summary += fmt::format(", val_loss {:.4f}", s.result.evals.back().val_loss);
  if (s.result.skipped > 0) summary += fmt::format(", {} steps skipped", s.result.skipped);
  if (!s.opts.out_path.empty()) summary += fmt::format("; results in {}", s.opts.out_path);
  if (!s.result.last_checkpoint.empty()) summary += fmt::format("; last checkpoint {}", s.result.last_checkpoint);
  if (s.graph) {
    s.result.graph_captures = s.graph->captures();
    s.result.graph_replays = s.graph->replays();
  }
  if (s.profile) {
    s.result.profile = s.profile->rows();
    s.progress->message(StepProfile::format(s.profile->run_rows()));
  }
  s.progress->message(summary);
  s.progress->finish();
  return s.result;
}

}  // namespace fp4moe
