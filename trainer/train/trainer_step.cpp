// One optimizer step of the Trainer (the sequence is documented in trainer/train/trainer.h).
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "kernels/common/check.h"
#include "trainer/model/profile.h"
#include "trainer/train/optimizer_step.h"
#include "trainer/train/schedule.h"
#include "trainer/train/trainer_state.h"

namespace fp4moe {

namespace {
constexpr double kGiB = 1073741824.0;
}  // namespace

StepRecord Trainer::State::train_step() {
  const TrainingConfig& t = cfg.train;
  const int64_t s = step + 1;
  const Clock::time_point start = Clock::now();
  const DataLoaderState loader_before = train->loader_state();
  const RngState rng_before = train->rng_state();
  ParamStore& store = model->params();

  mem->reset_peaks();
  model->take_exchange_totals();  // the evaluations' exchanges since the last step are not this step's
  if (profiler) profiler->begin_step();  // --profile: the step's first event (trainer/model/profile.h)
  const ModelContext& ctx = model->context();
  model->begin_step(static_cast<uint64_t>(s));  // the step's MXFP4 quantizer seed
  const float grad_scale = 1.0f / static_cast<float>(t.grad_accum);
  double loss_sum = 0;   // summed in micro-batch order: the backwards run in that order
  bool has_loss = true;  // false on an emulated pipeline stage without the LM head: loss NaN, not a divergence
  if (graph) {           // train.cuda_graph: the gradients zeroed and every pass in the graph (step_graph.h)
    stage_step_batches();
    const StepGraph::Pass pass = graph->run({pinned, tokens.data(), targets.data(), B, T}, grad_scale, s);
    CUDA_CHECK(cudaEventRecord(uploaded, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    loss_sum = graph->loss_sum();
    if (pass == StepGraph::Pass::captured)
      progress->message(fmt::format("step {}: its forwards and backwards captured in a CUDA graph (train.cuda_graph){}",
                                    s, graph->captures() > 1 ? ", again: since the last capture a buffer was freed "
                                                               "or an evaluation of fewer rows rewrote layer state"
                                                             : "; the next steps replay it"));
  } else {
    {
      ProfileScope profile_scope(ctx, ProfileModule::optimizer, ProfilePass::update);
      store.zero_grads(stream);
    }
    for (const PipelineStep& op : schedule) {
      if (op.pass == PipelinePass::forward) {
        upload(*train);  // micro-batch op.micro_batch: the batches are drawn in forward order
        model->forward_in_slot(op.slot, tokens.data(), targets.data(), B);
      } else {
        const StepStats stats = model->backward_in_slot(op.slot, grad_scale);
        loss_sum += stats.loss;
        has_loss = stats.has_loss;
      }
    }
  }
  double loss = loss_sum / static_cast<double>(t.grad_accum);
  if (opts.inject_nonfinite_step == s) {  // test hook (TrainerOptions): a diverged step
    loss = std::numeric_limits<double>::quiet_NaN();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CUDA_CHECK(cudaMemcpyAsync(store.params().front().grad, &nan, sizeof(float), cudaMemcpyHostToDevice, stream));
  }
  // Over W ranks: the group's loss (the mean of the ranks') with the stop signals in the same all-reduce, the
  // replicated gradients summed (model.h); then the group's gradient norm, the same on every rank, so that every rank
  // takes the same decision below.
  loss = reduce_step_loss(loss, s);
  {
    ProfileScope reduce(ctx, ProfileModule::dp_comm, ProfilePass::update);
    model->reduce_gradients();
  }
  const float max_norm = t.grad_clip > 0 ? static_cast<float>(t.grad_clip) : std::numeric_limits<float>::infinity();
  ProfileScope update(ctx, ProfileModule::optimizer, ProfilePass::update);
  const double norm = grad_norm->compute(max_norm, stream);
  const float* scale_d = grad_norm->clip_scale();
  const double lr = learning_rate(t, s);
  const bool finite = (!has_loss || std::isfinite(loss)) && std::isfinite(norm);

  if (!finite && t.non_finite == NonFinitePolicy::stop) {
    train->restore(loader_before, rng_before);  // back to the state after step s - 1
    stop_non_finite(s, loss, norm);
  }
  if (finite) {
    AdamWConfig ac;
    ac.lr = static_cast<float>(lr);
    ac.beta1 = static_cast<float>(t.beta1);
    ac.beta2 = static_cast<float>(t.beta2);
    ac.eps = static_cast<float>(t.eps);
    ac.step = optimizer_steps + 1;
    adamw_step_shards(store, ac, static_cast<float>(t.weight_decay), scale_d, stream);  // ZeRO-1: this GPU's shard
    update.end();
    ++optimizer_steps;
    model->end_step();  // the v3 router's bias update: its own scope (router, update)
  } else {
    ++result.skipped;
    progress->message(fmt::format("step {}: non-finite loss {} or gradient norm {}: update skipped "
                                  "(train.non_finite = skip; {} skipped in this run)",
                                  s, loss, norm, result.skipped));
  }
  update.end();
  if (profiler) profiler->end_step();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const Model::ExchangeTotals exchanged = model->take_exchange_totals();  // every step: the counts restart
  if (transport && s % opts.log_interval == 0) {  // rank 0's log only (the others' is silent)
    constexpr double kMiB = 1048576.0;
    progress->message(fmt::format("step {}: all-to-all of rank {} (every MoE layer, forward and backward): sent {:.3f} "
                                  "MiB, received {:.3f} MiB, to itself {:.3f} MiB; {:.3f} ms in the exchanges", s,
                                  rank, static_cast<double>(exchanged.bytes.sent) / kMiB,
                                  static_cast<double>(exchanged.bytes.received) / kMiB,
                                  static_cast<double>(exchanged.bytes.to_self) / kMiB, exchanged.ms));
  }
  if (profiler) profile->add_step(s, profiler->collect());  // read back after the step's own synchronisation
  step = s;
  tokens_seen += tokens_per_step * world;  // the group's tokens
  run_peaks.merge(*mem);

  StepRecord r;
  r.step = s;
  r.tokens = tokens_seen;
  r.loss = loss;
  r.lr = lr;
  r.grad_norm = norm;
  r.tokens_per_s = seconds > 0 ? static_cast<double>(tokens_per_step) / seconds : 0.0;
  r.mfu = flops_per_token * r.tokens_per_s / opts.peak_flops;
  r.peak_act_gib = static_cast<double>(mem->peak(MemCategory::activations)) / kGiB;
  r.peak_total_gib = static_cast<double>(mem->peak_total()) / kGiB;
  r.skipped = step - optimizer_steps;
  r.all_to_all_sent_bytes = exchanged.bytes.sent;
  r.all_to_all_received_bytes = exchanged.bytes.received;
  r.all_to_all_to_self_bytes = exchanged.bytes.to_self;
  r.all_to_all_ms = exchanged.ms;
  return r;
}

void Trainer::State::stop_non_finite(int64_t bad_step, double loss, double norm) {
  std::string saved;
  if (!cfg.train.checkpoint_dir.empty()) {
    const std::string path = checkpoint();  // step is still bad_step - 1; writes the metrics file too
    saved = fmt::format("the state after step {} is in '{}' (continue with --resume)", step, path);
  } else {
    write_metrics();
    saved = "no checkpoint was written (train.checkpoint_dir is not set)";
  }
  progress->finish();
  fail(__FILE__, __LINE__,
       fmt::format("non-finite loss {} or gradient norm {} at step {} with train.non_finite = stop: training "
                   "stopped; {}",
                   loss, norm, bad_step, saved));
}

}  // namespace fp4moe
