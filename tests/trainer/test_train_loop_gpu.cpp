// GPU tests of the training loop (trainer/train/trainer.h) on the tiny configuration (configs/tiny.toml) with
// synthetic tokens (trainer/train/batch.h), so no shards are needed:
//   - 20 steps lower the loss (from about ln(32768) = 10.4; the synthetic rows' successor rule is learnable), the
//     learning rate follows the schedule, evaluations run at steps 10 and 20, and the HDF5 file holds every row;
//   - resumption is bitwise: 6 steps with a checkpoint at step 3, then a second Trainer resumed from that
//     checkpoint gives bitwise the same losses and gradient norms for steps 4..6, and the same tensors at step 6;
//   - the non-finite policy through TrainerOptions::inject_nonfinite_step: `skip` counts the step, applies no
//     update (the next losses stay finite) and continues; `stop` writes the checkpoint of the step before and
//     throws naming the step;
//   - BF16 AdamW moments (train.moments = "bf16", DeepSeek-V3 sec. 3.3.3): 20 steps lower the loss; steps 1 and 2
//     are bit for bit the FP32-moment run's (the moments start at zero and step 1's update reads them unrounded),
//     later ones not (the stored moments are BF16); the checkpoint holds the moments as BF16, and resuming it gives
//     steps 11..20 and the tensors at step 20 bit for bit; a checkpoint's moments in the other dtype are refused,
//     naming train.moments;
//   - a memory budget below what the model needs fails with the allocator's report;
//   - the final evaluation covers the whole validation split (a last group of fewer windows), also with the attention
//     backend auto.
// Each test writes under its own temporary folder (TempDir, under the system temporary folder).
// Run: fp4moe_tests_gpu --gtest_filter='TrainLoop*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/trainer_options_test_util.h"
#include "tests/common/trainer_test_util.h"
#include "tests/common/gpu_test_util.h"
#include "kernels/attention/cudnn_sdpa.h"
#include "results/h5_read.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/data/token_shard.h"
#include "trainer/train/schedule.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::TempDir;

TrainerConfig tiny_config(std::vector<std::string> overrides) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return parse_config_args(args);
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(TrainLoop, TwentySyntheticStepsLowerTheLoss) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const TrainerConfig cfg = tiny_config({});  // 20 steps, warm-up 2, eval every 10 steps (2 batches)
  ASSERT_EQ(cfg.train.steps, 20);
  Trainer trainer(cfg, test::quiet_options(dir.file("run.h5")));
  const TrainResult r = trainer.run();

  ASSERT_EQ(r.steps.size(), 20u);
  EXPECT_EQ(r.start_step, 0);
  EXPECT_EQ(r.step, 20);
  EXPECT_EQ(r.optimizer_steps, 20);
  EXPECT_EQ(r.skipped, 0);
  EXPECT_EQ(r.tokens, 20 * cfg.train.tokens_per_step());
  EXPECT_EQ(r.stop_signal, 0);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepRecord& s = r.steps[i];
    SCOPED_TRACE("step " + std::to_string(s.step));
    EXPECT_EQ(s.step, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(s.tokens, s.step * cfg.train.tokens_per_step());
    EXPECT_TRUE(std::isfinite(s.loss));
    EXPECT_TRUE(std::isfinite(s.grad_norm) && s.grad_norm > 0);
    EXPECT_EQ(s.lr, learning_rate(cfg.train, s.step));
    EXPECT_GT(s.tokens_per_s, 0);
    EXPECT_GT(s.mfu, 0);
    EXPECT_GT(s.peak_act_gib, 0);
    EXPECT_GE(s.peak_total_gib, s.peak_act_gib);
    EXPECT_EQ(s.skipped, 0);
    // One GPU without a transport: no all-to-all (metrics.h StepRecord).
    EXPECT_EQ(s.all_to_all_sent_bytes + s.all_to_all_received_bytes + s.all_to_all_to_self_bytes, 0);
    EXPECT_EQ(s.all_to_all_ms, 0.0);
  }
  // At initialisation the logits are near zero: the loss is about ln(vocab).
  EXPECT_NEAR(r.steps[0].loss, std::log(32768.0), 0.5);
  const double last = (r.steps[17].loss + r.steps[18].loss + r.steps[19].loss) / 3;
  EXPECT_LT(last, r.steps[0].loss - 0.25) << "first loss " << r.steps[0].loss << ", mean of the last three " << last;

  ASSERT_EQ(r.evals.size(), 2u);
  EXPECT_EQ(r.evals[0].step, 10);
  EXPECT_EQ(r.evals[1].step, 20);
  EXPECT_TRUE(std::isfinite(r.evals[0].val_loss));
  EXPECT_LT(r.evals[1].val_loss, r.evals[0].val_loss);  // the same validation batches, 10 more steps
  EXPECT_LT(r.evals[1].val_loss, r.steps[0].loss);
  // Synthetic data has no end: the final evaluation reads the periodic one's eval_steps batches of B x T tokens.
  const int64_t subset = cfg.train.eval_steps * cfg.train.micro_batch * cfg.train.seq_len;
  EXPECT_EQ(r.evals[0].val_tokens, subset);
  EXPECT_EQ(r.evals[1].val_tokens, subset);

  // The HDF5 file has every row.
  const H5Reader h5(dir.file("run.h5"));
  const std::vector<double> steps = h5.read_f64("train/tiny/steps/step"), loss = h5.read_f64("train/tiny/steps/loss");
  ASSERT_EQ(steps.size(), 20u);
  ASSERT_EQ(loss.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(steps[i], static_cast<double>(i + 1));
    EXPECT_TRUE(same_bits(loss[i], r.steps[i].loss)) << "row " << i;
  }
  EXPECT_EQ(h5.read_f64("train/tiny/eval/step"), (std::vector<double>{10, 20}));
  EXPECT_EQ(h5.read_f64("train/tiny/steps/all_to_all_sent_bytes"), std::vector<double>(20, 0.0));
  EXPECT_EQ(h5.read_f64("train/tiny/steps/all_to_all_ms"), std::vector<double>(20, 0.0));
  EXPECT_EQ(h5.string_attribute("train/tiny", "model_config_text"), model_config_text(cfg));
  const std::vector<double> peaks = h5.read_f64("memory/tiny/peak_bytes");  // 6 categories and the total
  ASSERT_EQ(peaks.size(), 7u);
  EXPECT_GT(peaks[0], 0);  // weights
  EXPECT_GT(peaks[6], 0);  // total
  EXPECT_GE(peaks[6], static_cast<double>(trainer.memory().peak_total()));  // the run's peak >= the last step's
}

TEST(TrainLoop, ResumeIsBitwise) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const std::string a_dir = dir.file("a"), b_dir = dir.file("b");
  // Run A: 6 uninterrupted steps, checkpoints at steps 3 and 6. No evaluation (it is not part of the state).
  const TrainerConfig a_cfg = tiny_config({"--train.steps", "6", "--train.warmup_steps", "2", "--train.eval_interval",
                                           "0", "--train.checkpoint_interval", "3", "--train.checkpoint_dir", a_dir});
  TrainResult a;
  {
    Trainer trainer(a_cfg, test::quiet_options(dir.file("a.h5")));
    a = trainer.run();
  }
  ASSERT_EQ(a.steps.size(), 6u);
  const std::string a3 = a_dir + "/" + checkpoint_file_name(3), a6 = a_dir + "/" + checkpoint_file_name(6);
  ASSERT_TRUE(std::filesystem::exists(a3));
  ASSERT_TRUE(std::filesystem::exists(a6));
  {
    const CheckpointReader ckpt(a3, model_config_hash(a_cfg));
    EXPECT_EQ(ckpt.state().step, 3u);
    EXPECT_EQ(ckpt.state().optimizer_steps, 3u);
    EXPECT_EQ(ckpt.state().tokens_seen, static_cast<uint64_t>(3 * a_cfg.train.tokens_per_step()));
    EXPECT_EQ(ckpt.state().rng.offset, static_cast<uint64_t>(3 * a_cfg.train.micro_batch));  // rows drawn
  }

  // Run B: resumed from A's step-3 checkpoint, its own checkpoint folder.
  TrainerConfig b_cfg = a_cfg;
  b_cfg.train.checkpoint_dir = b_dir;
  TrainerOptions b_opts = test::quiet_options(dir.file("b.h5"));
  b_opts.resume_path = a3;
  TrainResult b;
  {
    Trainer trainer(b_cfg, b_opts);
    EXPECT_EQ(trainer.step(), 3);
    b = trainer.run();
  }
  EXPECT_EQ(b.start_step, 3);
  ASSERT_EQ(b.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const StepRecord &x = a.steps[3 + i], &y = b.steps[i];
    SCOPED_TRACE("step " + std::to_string(x.step));
    EXPECT_EQ(y.step, x.step);
    EXPECT_EQ(y.tokens, x.tokens);
    EXPECT_TRUE(same_bits(y.loss, x.loss)) << y.loss << " vs " << x.loss;
    EXPECT_TRUE(same_bits(y.grad_norm, x.grad_norm)) << y.grad_norm << " vs " << x.grad_norm;
    EXPECT_EQ(y.lr, x.lr);
  }

  // Every tensor at step 6 is bitwise the same.
  const CheckpointReader ra(a6, 0), rb(b_dir + "/" + checkpoint_file_name(6), 0);
  EXPECT_EQ(ra.state().optimizer_steps, rb.state().optimizer_steps);
  EXPECT_EQ(ra.state().rng, rb.state().rng);
  ASSERT_EQ(ra.entries().size(), rb.entries().size());
  for (const CheckpointEntry& e : ra.entries()) {
    const CheckpointEntry* f = rb.find(e.section, e.name);
    ASSERT_NE(f, nullptr) << e.name;
    EXPECT_EQ(f->crc32, e.crc32) << e.name;
    EXPECT_EQ(f->bytes, e.bytes) << e.name;
  }

  // The resumed file carries A's rows? Not this one (b.h5 is new): it holds steps 4..6 only.
  EXPECT_EQ(H5Reader(dir.file("b.h5")).read_f64("train/tiny/steps/step"), (std::vector<double>{4, 5, 6}));
  // Resumed into A's own file, the rows up to the checkpoint are kept and the rest rewritten.
  TrainerOptions c_opts = test::quiet_options(dir.file("a.h5"));
  c_opts.resume_path = a3;
  TrainerConfig c_cfg = a_cfg;
  c_cfg.train.checkpoint_dir = dir.file("c");
  {
    Trainer trainer(c_cfg, c_opts);
    trainer.run();
  }
  const H5Reader h5(dir.file("a.h5"));
  EXPECT_EQ(h5.read_f64("train/tiny/steps/step"), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  const std::vector<double> loss = h5.read_f64("train/tiny/steps/loss");
  for (size_t i = 0; i < 6; ++i) EXPECT_TRUE(same_bits(loss[i], a.steps[i].loss)) << "row " << i;
}

double mean_of_last_three(const TrainResult& r) {
  const size_t n = r.steps.size();
  return (r.steps[n - 3].loss + r.steps[n - 2].loss + r.steps[n - 1].loss) / 3;
}

TEST(TrainLoop, Bf16MomentsTrainAndResumeBitwise) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const std::string a_dir = dir.file("a"), b_dir = dir.file("b"), f_dir = dir.file("f");
  const std::vector<std::string> common = {"--train.eval_interval", "0", "--train.checkpoint_interval", "10"};
  auto config = [&](const char* moments, const std::string& ckpt_dir) {
    std::vector<std::string> args = common;
    args.insert(args.end(), {"--train.moments", moments, "--train.checkpoint_dir", ckpt_dir});
    return tiny_config(args);
  };
  const TrainerConfig a_cfg = config("bf16", a_dir), f_cfg = config("fp32", f_dir);
  ASSERT_EQ(a_cfg.train.steps, 20);
  ASSERT_EQ(a_cfg.train.moments, MomentDtype::bf16);
  TrainResult a, f;
  {
    Trainer trainer(a_cfg, test::quiet_options(dir.file("a.h5")));
    a = trainer.run();
  }
  {
    Trainer trainer(f_cfg, test::quiet_options(dir.file("f.h5")));
    f = trainer.run();
  }
  ASSERT_EQ(a.steps.size(), 20u);
  ASSERT_EQ(f.steps.size(), 20u);
  EXPECT_EQ(a.optimizer_steps, 20);
  EXPECT_EQ(a.skipped, 0);
  for (const StepRecord& s : a.steps) EXPECT_TRUE(std::isfinite(s.loss) && std::isfinite(s.grad_norm)) << s.step;
  EXPECT_NEAR(a.steps[0].loss, std::log(32768.0), 0.5);
  EXPECT_LT(mean_of_last_three(a), a.steps[0].loss - 0.25)
      << "first loss " << a.steps[0].loss << ", mean of the last three " << mean_of_last_three(a);
  std::printf("  mean loss of steps 18-20: BF16 moments %.6f, FP32 moments %.6f\n", mean_of_last_three(a),
              mean_of_last_three(f));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(same_bits(a.steps[i].loss, f.steps[i].loss)) << "step " << i + 1;
    EXPECT_TRUE(same_bits(a.steps[i].grad_norm, f.steps[i].grad_norm)) << "step " << i + 1;
  }
  int differ = 0;
  for (size_t i = 2; i < 20; ++i) differ += !same_bits(a.steps[i].loss, f.steps[i].loss);
  EXPECT_GT(differ, 0) << "BF16 moments changed no loss: are they stored as BF16?";

  // The checkpoint: masters FP32, moments BF16 (2 bytes per element), beside the FP32-moment run's.
  const std::string a10 = a_dir + "/" + checkpoint_file_name(10), f10 = f_dir + "/" + checkpoint_file_name(10);
  {
    const CheckpointReader ra(a10, model_config_hash(a_cfg)), rf(f10, model_config_hash(f_cfg));
    int moments = 0;
    for (const CheckpointEntry& e : ra.entries()) {
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      const bool moment = e.section == CheckpointSection::optimizer;
      moments += moment;
      EXPECT_EQ(e.dtype, moment ? CheckpointDtype::bf16 : CheckpointDtype::f32) << e.name;
      EXPECT_EQ(e.bytes, static_cast<uint64_t>(n) * (moment ? 2 : 4)) << e.name;
      const CheckpointEntry* g = rf.find(e.section, e.name);
      ASSERT_NE(g, nullptr) << e.name;
      EXPECT_EQ(g->dtype, CheckpointDtype::f32) << e.name;
    }
    EXPECT_GT(moments, 0);
    EXPECT_EQ(ra.entries().size(), rf.entries().size());
  }

  // Resumed from step 10 with BF16 moments: steps 11..20 and every tensor at step 20 bit for bit.
  TrainerConfig b_cfg = a_cfg;
  b_cfg.train.checkpoint_dir = b_dir;
  TrainerOptions b_opts = test::quiet_options(dir.file("b.h5"));
  b_opts.resume_path = a10;
  TrainResult b;
  {
    Trainer trainer(b_cfg, b_opts);
    EXPECT_EQ(trainer.step(), 10);
    b = trainer.run();
  }
  ASSERT_EQ(b.steps.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    const StepRecord &x = a.steps[10 + i], &y = b.steps[i];
    SCOPED_TRACE("step " + std::to_string(x.step));
    EXPECT_EQ(y.step, x.step);
    EXPECT_TRUE(same_bits(y.loss, x.loss)) << y.loss << " vs " << x.loss;
    EXPECT_TRUE(same_bits(y.grad_norm, x.grad_norm)) << y.grad_norm << " vs " << x.grad_norm;
  }
  const CheckpointReader ra(a_dir + "/" + checkpoint_file_name(20), 0), rb(b_dir + "/" + checkpoint_file_name(20), 0);
  ASSERT_EQ(ra.entries().size(), rb.entries().size());
  for (const CheckpointEntry& e : ra.entries()) {
    const CheckpointEntry* g = rb.find(e.section, e.name);
    ASSERT_NE(g, nullptr) << e.name;
    EXPECT_EQ(g->dtype, e.dtype) << e.name;
    EXPECT_EQ(g->crc32, e.crc32) << e.name;
  }

  // Moments of the other dtype are refused, not converted, before anything is restored.
  TrainerConfig wrong = f_cfg;
  wrong.train.checkpoint_dir = dir.file("w");
  TrainerOptions w_opts = test::quiet_options(dir.file("w.h5"));
  w_opts.resume_path = a10;
  test::expect_error_with([&] { Trainer trainer(wrong, w_opts); },
                          {"stored as bf16", "train.moments = fp32", "--train.moments bf16"});
  TrainerConfig wrong2 = a_cfg;
  wrong2.train.checkpoint_dir = dir.file("w2");
  TrainerOptions w2_opts = test::quiet_options(dir.file("w2.h5"));
  w2_opts.resume_path = f10;
  test::expect_error_with([&] { Trainer trainer(wrong2, w2_opts); },
                          {"stored as fp32", "train.moments = bf16", "--train.moments fp32"});
}

TEST(TrainLoop, NonFiniteStepIsSkippedAndCounted) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const TrainerConfig cfg =
      tiny_config({"--train.steps", "6", "--train.eval_interval", "0", "--train.non_finite", "skip"});
  TrainResult clean, skipped;
  {
    Trainer trainer(cfg, test::quiet_options(dir.file("clean.h5")));
    clean = trainer.run();
  }
  TrainerOptions opts = test::quiet_options(dir.file("skip.h5"));
  opts.inject_nonfinite_step = 3;
  {
    Trainer trainer(cfg, opts);
    skipped = trainer.run();
  }
  ASSERT_EQ(skipped.steps.size(), 6u);
  EXPECT_EQ(skipped.step, 6);
  EXPECT_EQ(skipped.skipped, 1);
  EXPECT_EQ(skipped.optimizer_steps, 5);
  EXPECT_EQ(skipped.tokens, 6 * cfg.train.tokens_per_step());  // a skipped step still consumed its batch
  for (const StepRecord& s : skipped.steps) {
    SCOPED_TRACE("step " + std::to_string(s.step));
    EXPECT_EQ(s.skipped, s.step >= 3 ? 1 : 0);  // the count of skipped steps so far
    if (s.step == 3) {
      EXPECT_TRUE(std::isnan(s.loss));
      EXPECT_FALSE(std::isfinite(s.grad_norm));
    } else {
      EXPECT_TRUE(std::isfinite(s.loss));  // no NaN reached the weights
      EXPECT_TRUE(std::isfinite(s.grad_norm));
    }
  }
  // Before the bad step both runs are the same; after it they differ (one update fewer).
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(skipped.steps[i].loss, clean.steps[i].loss)) << "step " << i + 1;
  EXPECT_NE(skipped.steps[3].loss, clean.steps[3].loss);
  EXPECT_EQ(H5Reader(dir.file("skip.h5")).read_f64("train/tiny/steps/skipped"),
            (std::vector<double>{0, 0, 1, 1, 1, 1}));
}

TEST(TrainLoop, NonFiniteStepStopsWithACheckpointOfTheStepBefore) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const std::string ckpt_dir = dir.file("ckpt");
  const TrainerConfig cfg = tiny_config({"--train.steps", "6", "--train.eval_interval", "0", "--train.non_finite",
                                         "stop", "--train.checkpoint_dir", ckpt_dir});
  TrainerOptions opts = test::quiet_options(dir.file("run.h5"));
  opts.inject_nonfinite_step = 3;
  Trainer trainer(cfg, opts);
  const std::string msg = test::error_message([&] { trainer.run(); });
  ASSERT_FALSE(msg.empty()) << "run() did not throw";
  EXPECT_NE(msg.find("at step 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.non_finite = stop"), std::string::npos) << msg;
  const std::string ckpt = ckpt_dir + "/" + checkpoint_file_name(2);
  EXPECT_NE(msg.find(ckpt), std::string::npos) << msg;

  const CheckpointReader r(ckpt, model_config_hash(cfg));
  EXPECT_EQ(r.state().step, 2u);
  EXPECT_EQ(r.state().optimizer_steps, 2u);
  EXPECT_EQ(r.state().tokens_seen, static_cast<uint64_t>(2 * cfg.train.tokens_per_step()));
  EXPECT_EQ(r.state().rng.offset, static_cast<uint64_t>(2 * cfg.train.micro_batch));  // step 3's rows not taken
  EXPECT_FALSE(std::filesystem::exists(ckpt_dir + "/" + checkpoint_file_name(3)));
  EXPECT_EQ(H5Reader(dir.file("run.h5")).read_f64("train/tiny/steps/step"), (std::vector<double>{1, 2}));

  // Resuming from it without the injected fault continues from step 3.
  TrainerOptions again = test::quiet_options(dir.file("again.h5"));
  again.resume_path = ckpt;
  Trainer resumed(cfg, again);
  const TrainResult r2 = resumed.run();
  EXPECT_EQ(r2.start_step, 2);
  EXPECT_EQ(r2.step, 6);
  EXPECT_EQ(r2.skipped, 0);
}

TEST(TrainLoop, MemoryBudgetFailsWithTheAllocatorsReport) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  TrainerOptions opts = test::quiet_options(dir.file("run.h5"));
  opts.memory_budget_bytes = size_t{1} << 20;  // 1 MiB: the tiny model's embedding alone is 4 MiB in BF16
  const std::string msg = test::error_message([&] { Trainer trainer(tiny_config({}), opts); });
  EXPECT_NE(msg.find("out of the memory budget"), std::string::npos) << msg;
  EXPECT_NE(msg.find("weights"), std::string::npos) << msg;
}

// Token shards: the final evaluation reads every validation window once (11 windows of T = 64 with B = 4: groups of
// 4, 4 and 3), the periodic ones the first eval_steps batches; train.final_eval_steps = N reads N batches instead;
// the same under model.attention_backend = auto.
TEST(TrainLoop, FinalEvaluationCoversTheWholeValidationSplit) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  auto shard = [&](const std::string& name, size_t n) {
    std::vector<uint16_t> tokens(n);
    for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(1 + (i * 7919) % 30000);
    tokens.back() = 0;
    write_token_shard(dir.file(name), tokens, 32768, 0);
  };
  shard("train_000.bin", 64 * 40 + 1);
  shard("val_000.bin", 64 * 11 + 1);
  const std::vector<std::string> common = {"--train.data_dir", dir.path().string(), "--train.steps", "4",
                                           "--train.warmup_steps", "1", "--train.eval_interval", "2",
                                           "--train.eval_steps", "2"};
  auto run = [&](std::vector<std::string> extra, const std::string& out) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    TrainerOptions o = test::quiet_options(dir.file(out));
    o.synthetic_data = false;
    return Trainer(tiny_config(args), o).run();
  };
  const TrainResult whole = run({}, "whole.h5");
  ASSERT_EQ(whole.evals.size(), 2u);
  EXPECT_EQ(whole.evals[0].step, 2);
  EXPECT_EQ(whole.evals[0].val_tokens, 2 * 4 * 64);  // periodic: the first 2 batches
  EXPECT_EQ(whole.evals[1].step, 4);
  EXPECT_EQ(whole.evals[1].val_tokens, 11 * 64);  // final: every window
  EXPECT_TRUE(std::isfinite(whole.evals[1].val_loss));
  const H5Reader h5(dir.file("whole.h5"));
  EXPECT_EQ(h5.read_f64("train/tiny/eval/val_tokens"), (std::vector<double>{512, 704}));

  const TrainResult first = run({"--train.final_eval_steps", "2"}, "first.h5");
  ASSERT_EQ(first.evals.size(), 2u);
  EXPECT_EQ(first.evals[1].val_tokens, 2 * 4 * 64);
  EXPECT_TRUE(same_bits(first.evals[0].val_loss, whole.evals[0].val_loss));  // same seed: same run up to here
  EXPECT_NE(first.evals[1].val_loss, whole.evals[1].val_loss);

  // model.attention_backend = auto (where this build has cuDNN): timed at B = 4, the note (one line, both times) in
  // the result file; the final evaluation's group of 3 windows runs at a row count resolved at its first call.
  if (!cudnn_sdpa_built()) return;
  const TrainResult timed = run({"--model.attention_backend", "auto"}, "auto.h5");
  ASSERT_EQ(timed.evals.size(), 2u);
  EXPECT_EQ(timed.evals[1].val_tokens, 11 * 64);
  for (const EvalRecord& e : timed.evals) EXPECT_TRUE(std::isfinite(e.val_loss)) << "step " << e.step;
  const std::string note =
      H5Reader(dir.file("auto.h5")).string_attribute("train/tiny", "attention_backend").value_or("(none)");
  std::printf("%s\n", note.c_str());
  EXPECT_NE(note.find("(auto, forward + backward at B=4 T=64 H=4 32/16: own "), std::string::npos) << note;
  EXPECT_NE(note.find(" ms, cudnn "), std::string::npos) << note;
}

}  // namespace
}  // namespace fp4moe
