// GPU tests of checkpoints, the whole-split evaluation, the agreed stop and the all-to-all columns over ranks
// (trainer/train/param_checkpoint.h save_ranks_checkpoint / load_ranks_checkpoint; ValidationWindows::next_share;
// through the Trainer: trainer/train/trainer.h): N = 2 simulated ranks (InProcessTransport, one host thread, stream
// and Trainer per rank on one device, tests/common/ep_ranks_test_util.h, handed to the
// Trainer in TrainerOptions::transport) train configs/tiny.toml on synthetic tokens, each rank holding 4 of the 8
// routed experts.
//   - Resumption is bitwise: run A trains 6 steps with checkpoints at steps 3 and 6 (each: both ranks' shards and
//     rank 0's replicated file); run B, fresh Trainers (fresh Models) resumed from A's step-3 checkpoint, trains
//     steps 4..6: the same losses and gradient norms bit for bit on both ranks, and at step 6 every tensor of the
//     replicated file and of both shards (masters, AdamW moments, the v3 router bias) the same bytes.
//   - Refusals, every rank throwing (none hanging), each with its message: a checkpoint of 2 ranks resumed over 4
//     ranks, or on one GPU, and a one-GPU checkpoint resumed over 2 ranks; a missing shard (the rank without it
//     names the file, the other names that rank); a shard of another step in its place.
//   - A failed shard write (a folder in the way of rank 1's shard): both ranks throw, and no replicated file of
//     that step exists, so the shards left are never taken for a checkpoint (latest_checkpoint finds none).
//   - The final evaluation of the whole validation split (43 windows of T = 64, groups of B = 4: the last of the 6
//     passes gives rank 1 nothing, so it runs a forward it does not count) over 2 ranks: val_tokens every window's
//     tokens once, val_loss the one-GPU run's within 1e-3 relative. The learning rate is 1e-30 and the v3 bias
//     frozen, so that after the one training step both hold the initial weights (a master of 0 may move to
//     1e-30); a rank's forward runs over its own rows, so the GEMMs and the summation order differ in the last bits.
//   - A stop signal on one rank (the test hook TrainerOptions::inject_stop_step) stops both after the same step,
//     with the final checkpoint written together.
//   - Every step's all-to-all columns: over the ranks, the formats' bytes of every MoE layer's exchanges; an
//     evaluation's exchanges not counted in the next step.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='TrainRanks*'
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/ep_ranks_test_util.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/trainer_options_test_util.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/data/token_shard.h"
#include "trainer/model/ep_traffic.h"
#include "trainer/train/resume.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr int kRanks = 2;

// tiny, 6 steps, a checkpoint every 3 into `dir`, no evaluation (it is not part of the state).
TrainerConfig tiny_config(const std::string& dir, int64_t steps = 6) {
  return parse_config_args({"--config", test::preset("tiny"), "--train.steps", std::to_string(steps),
                            "--train.warmup_steps", "2", "--train.eval_interval", "0", "--train.checkpoint_interval",
                            "3", "--train.checkpoint_dir", dir});
}

// test::quiet_options, resuming from `resume` when set.
TrainerOptions resuming_options(const std::string& resume = "") {
  TrainerOptions o = test::quiet_options();
  o.resume_path = resume;
  return o;
}

// Every simulated rank trains cfg (resuming from `resume` when set); their results in rank order.
std::vector<TrainResult> train_over_ranks(int N, const TrainerConfig& cfg, const std::string& resume = "") {
  return test::run_simulated_ranks<TrainResult>(N, [&](EpTransport& t) {
    TrainerOptions o = resuming_options(resume);
    o.transport = &t;
    Trainer trainer(cfg, o);
    return trainer.run();
  });
}

// Every simulated rank's fp4moe::Error message ("" when it trained without one), in rank order. Each rank catches
// its own: the ranks must agree on failing (the checkpoint's collectives), or a rank would wait out the timeout.
std::vector<std::string> errors_over_ranks(int N, const TrainerConfig& cfg, const std::string& resume = "") {
  return test::run_simulated_ranks<std::string>(N, [&](EpTransport& t) {
    TrainerOptions o = resuming_options(resume);
    o.transport = &t;
    return test::error_message([&] { Trainer(cfg, o).run(); });
  });
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<uint8_t> tensor_bytes(const CheckpointReader& r, const CheckpointEntry& e) {
  std::vector<uint8_t> b(e.bytes);
  r.read(e.section, e.name, e.dtype, e.shape, b.data(), b.size());
  return b;
}

// The replicated file lists the header CRC-32 of each rank's shard beside it (its completion record).
void expect_lists_its_shards(const std::string& path, uint32_t world_size) {
  SCOPED_TRACE(path);
  const CheckpointReader rep(path, 0);
  std::vector<uint64_t> listed(world_size);
  rep.read(CheckpointSection::ranks, "shard_header_crc32", CheckpointDtype::u64, {int64_t{world_size}}, listed.data(),
           listed.size() * sizeof(uint64_t));
  for (uint32_t r = 0; r < world_size; ++r)
    EXPECT_EQ(listed[r], CheckpointReader(checkpoint_shard_path(path, r, world_size), 0).header_crc32())
        << "rank " << r;
}

// Every tensor of file a is in file b with the same bytes, and b has no other; the replicated file's list of its
// shards' header CRCs is compared with the shards instead (expect_lists_its_shards): a header holds the run's
// configuration text, which names the run's own checkpoint folder.
void expect_same_tensors(const std::string& a, const std::string& b) {
  SCOPED_TRACE(a + " vs " + b);
  const CheckpointReader ra(a, 0), rb(b, 0);
  EXPECT_EQ(ra.state().step, rb.state().step);
  EXPECT_EQ(ra.state().optimizer_steps, rb.state().optimizer_steps);
  EXPECT_EQ(ra.state().rng, rb.state().rng);
  EXPECT_EQ(ra.state().data_loader, rb.state().data_loader);
  ASSERT_EQ(ra.entries().size(), rb.entries().size());
  for (const CheckpointEntry& e : ra.entries()) {
    const CheckpointEntry* f = rb.find(e.section, e.name);
    ASSERT_NE(f, nullptr) << e.name;
    if (e.section == CheckpointSection::ranks && e.name == "shard_header_crc32") continue;
    EXPECT_TRUE(tensor_bytes(ra, e) == tensor_bytes(rb, *f)) << e.name;
  }
}

void expect_contains(const std::string& msg, const std::vector<std::string>& parts, const std::string& who) {
  EXPECT_FALSE(msg.empty()) << who << ": no error";
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << who << ": '" << p << "' not in: " << msg;
}

TEST(TrainRanksCheckpoint, ResumeOverTwoRanksIsBitwise) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const std::string a_dir = dir.file("a"), b_dir = dir.file("b");
  const TrainerConfig a_cfg = tiny_config(a_dir);
  const std::vector<TrainResult> a = train_over_ranks(kRanks, a_cfg);
  ASSERT_EQ(a.size(), 2u);
  const std::string a3 = a_dir + "/" + checkpoint_file_name(3), a6 = a_dir + "/" + checkpoint_file_name(6);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(a[r].steps.size(), 6u) << "rank " << r;
    EXPECT_EQ(a[r].last_checkpoint, a6) << "rank " << r;
  }
  for (const std::string& path : {a3, a6}) {
    const CheckpointReader rep(path, model_config_hash(a_cfg));
    EXPECT_EQ(rep.state().part, CheckpointPart::replicated);
    EXPECT_EQ(rep.state().world_size, 2u);
    EXPECT_EQ(rep.find(CheckpointSection::model, "layers.1.moe.experts.fc1"), nullptr);  // routed: in the shards
    for (uint32_t r = 0; r < kRanks; ++r) {
      const CheckpointReader shard(checkpoint_shard_path(path, r, 2), model_config_hash(a_cfg));
      EXPECT_EQ(shard.state().part, CheckpointPart::expert_shard);
      EXPECT_EQ(shard.state().rank, r);
      EXPECT_EQ(shard.state().step, rep.state().step);
      for (const CheckpointEntry& e : shard.entries()) EXPECT_NE(e.name.find(".experts."), std::string::npos) << e.name;
    }
  }
  EXPECT_EQ(latest_checkpoint(a_dir), a6);

  // Run B: fresh Trainers resumed from A's step-3 checkpoint, their own checkpoint folder.
  const TrainerConfig b_cfg = tiny_config(b_dir);
  const std::vector<TrainResult> b = train_over_ranks(kRanks, b_cfg, a3);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(b[r].start_step, 3);
    ASSERT_EQ(b[r].steps.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const StepRecord &x = a[r].steps[3 + i], &y = b[r].steps[i];
      SCOPED_TRACE("step " + std::to_string(x.step));
      EXPECT_EQ(y.step, x.step);
      EXPECT_EQ(y.tokens, x.tokens);
      EXPECT_TRUE(same_bits(y.loss, x.loss)) << y.loss << " vs " << x.loss;
      EXPECT_TRUE(same_bits(y.grad_norm, x.grad_norm)) << y.grad_norm << " vs " << x.grad_norm;
    }
  }
  const std::string b6 = b_dir + "/" + checkpoint_file_name(6);
  expect_same_tensors(a6, b6);
  for (const std::string& path : {a3, a6, b6}) expect_lists_its_shards(path, kRanks);
  for (uint32_t r = 0; r < kRanks; ++r)
    expect_same_tensors(checkpoint_shard_path(a6, r, 2), checkpoint_shard_path(b6, r, 2));
}

TEST(TrainRanksCheckpoint, RefusesAnotherWorldSizeAMissingShardAndAShardOfAnotherStep) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const std::string a_dir = dir.file("a");
  const TrainerConfig cfg = tiny_config(a_dir);
  train_over_ranks(kRanks, cfg);
  const std::string a3 = a_dir + "/" + checkpoint_file_name(3), a6 = a_dir + "/" + checkpoint_file_name(6);
  const TrainerConfig resumed = tiny_config(dir.file("r"));

  // Another world size: every one of 4 ranks refuses; one GPU refuses the replicated file alone.
  const std::vector<std::string> four = errors_over_ranks(4, resumed, a3);
  for (int r = 0; r < 4; ++r)
    expect_contains(four[r], {"written by 2 ranks, this run has 4", "world size must be the same"},
                    "rank " + std::to_string(r));
  TrainerOptions one = resuming_options(a3);
  expect_contains(test::error_message([&] { Trainer(resumed, one); }),
                  {a3, "replicated state", "over 2 ranks", "resume it over 2 ranks"}, "one GPU");
  // A one-GPU checkpoint over 2 ranks.
  const std::string g_dir = dir.file("one_gpu");
  {
    TrainerOptions o = test::quiet_options();
    Trainer(tiny_config(g_dir, 3), o).run();
  }
  const std::string g3 = g_dir + "/" + checkpoint_file_name(3);
  for (const std::string& e : errors_over_ranks(kRanks, resumed, g3))
    expect_contains(e, {g3, "one GPU's whole model", "has 2 ranks"}, "one-GPU checkpoint");

  // A missing shard: rank 1 names its file, rank 0 names rank 1.
  const std::string rank1 = checkpoint_shard_path(a3, 1, 2);
  const std::string kept = dir.file("kept.ckpt");
  fs::rename(rank1, kept);
  std::vector<std::string> e = errors_over_ranks(kRanks, resumed, a3);
  expect_contains(e[1], {"the shard of rank 1 of 2", rank1, "is missing"}, "rank 1");
  expect_contains(e[0], {"rank 1 of 2 failed", "nothing was restored"}, "rank 0");

  // A shard of another step in its place.
  fs::copy_file(checkpoint_shard_path(a6, 1, 2), rank1);
  e = errors_over_ranks(kRanks, resumed, a3);
  expect_contains(e[1], {rank1, "is at step 6", "at step 3", "different checkpoints"}, "rank 1");
  expect_contains(e[0], {"rank 1 of 2 failed"}, "rank 0");

  // The right shard back: resumable again.
  fs::remove(rank1);
  fs::rename(kept, rank1);
  for (const std::string& msg : errors_over_ranks(kRanks, resumed, a3)) EXPECT_EQ(msg, "");
}

TEST(TrainRanksCheckpoint, AFailedShardWriteLeavesNoCheckpoint) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const std::string a_dir = dir.file("a");
  const std::string a3 = a_dir + "/" + checkpoint_file_name(3);
  fs::create_directories(checkpoint_shard_path(a3, 1, 2));  // a folder where rank 1's shard goes
  const std::vector<std::string> e = errors_over_ranks(kRanks, tiny_config(a_dir, 3));
  expect_contains(e[1], {"is a folder", "is not complete", "replicated file was not written"}, "rank 1");
  expect_contains(e[0], {"rank 1 of 2 failed", "is not complete"}, "rank 0");
  EXPECT_FALSE(fs::exists(a3));
  EXPECT_TRUE(fs::exists(checkpoint_shard_path(a3, 0, 2)));  // rank 0's shard, alone, is no checkpoint
  EXPECT_EQ(latest_checkpoint(a_dir), "");
}

// A shard of n tokens counting up from `first` (in 1 .. vocab - 1), the last one the end-of-text token 0.
void write_counting_shard(const std::string& path, uint32_t first, size_t n, uint32_t vocab) {
  std::vector<uint16_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>((first + i * 7 - 1) % (vocab - 1) + 1);
  tokens.back() = 0;
  write_token_shard(path, tokens, vocab, 0);
}

TEST(TrainRanksEval, WholeSplitOverTwoRanksEqualsOneGpu) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const uint32_t vocab = 32768;
  write_counting_shard(dir.file("train_000.bin"), 5, 20000, vocab);
  write_counting_shard(dir.file("val_000.bin"), 1000, 2800, vocab);  // floor(2799 / 64) = 43 windows
  const TrainerConfig cfg = parse_config_args(
      {"--config", test::preset("tiny"), "--train.data_dir", dir.path().string(), "--train.steps", "1",
       "--train.warmup_steps", "0", "--train.lr", "1e-30", "--train.min_lr", "0", "--moe.bias_update_rate", "0",
       "--train.eval_interval", "1",
       "--train.eval_steps", "1", "--train.final_eval_steps", "0"});
  ASSERT_EQ(cfg.train.micro_batch, 4);
  ASSERT_EQ(cfg.train.seq_len, 64);
  auto options = [] {
    TrainerOptions o = test::quiet_options();
    o.synthetic_data = false;
    return o;
  };
  TrainResult one;
  {
    Trainer trainer(cfg, options());
    one = trainer.run();
  }
  const std::vector<TrainResult> ranks = test::run_simulated_ranks<TrainResult>(kRanks, [&](EpTransport& t) {
    TrainerOptions o = options();
    o.transport = &t;
    Trainer trainer(cfg, o);
    return trainer.run();
  });
  ASSERT_EQ(one.evals.size(), 1u);
  EXPECT_EQ(one.evals[0].val_tokens, 43 * 64);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(ranks[r].evals.size(), 1u);
    const EvalRecord& e = ranks[r].evals[0];
    EXPECT_EQ(e.val_tokens, 43 * 64);
    EXPECT_TRUE(std::isfinite(e.val_loss));
    EXPECT_NEAR(e.val_loss, one.evals[0].val_loss, 1e-3 * one.evals[0].val_loss);
    EXPECT_EQ(e.val_loss, ranks[0].evals[0].val_loss);  // one all-reduce: the same on every rank
  }
}

// Trains `cfg` over kRanks simulated ranks where rank 1 acts as if it had received SIGTERM from step `stop_step` on
// (TrainerOptions::inject_stop_step).
std::vector<TrainResult> train_with_stop_on_rank_1(const TrainerConfig& cfg, int64_t stop_step) {
  return test::run_simulated_ranks<TrainResult>(kRanks, [&](EpTransport& t) {
    TrainerOptions o = test::quiet_options();
    o.transport = &t;
    o.inject_stop_step = stop_step;
    o.inject_stop_rank = 1;
    Trainer trainer(cfg, o);
    return trainer.run();
  });
}

// A stop signal on one rank stops every rank after the same step: from step 2 on rank 1 "has received" SIGTERM
// (TrainerOptions::inject_stop_step; the signal rides on the step's loss all-reduce); both ranks end after step 2,
// report SIGTERM and write the final checkpoint of step 2 together (its collectives meet); rank 0 never received it.
TEST(TrainRanksStop, ASignalOnOneRankStopsEveryRankAfterTheSameStep) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const TrainerConfig cfg = tiny_config(dir.file("ckpt"));  // 6 steps, checkpoints every 3
  const std::vector<TrainResult> r = train_with_stop_on_rank_1(cfg, 2);
  for (int rank = 0; rank < kRanks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(r[rank].stop_signal, SIGTERM);
    EXPECT_EQ(r[rank].step, 2);
    EXPECT_EQ(r[rank].steps.size(), 2u);
    EXPECT_EQ(r[rank].last_checkpoint, dir.file("ckpt") + "/" + checkpoint_file_name(2));
  }
  EXPECT_EQ(latest_checkpoint(dir.file("ckpt")), dir.file("ckpt") + "/" + checkpoint_file_name(2));
}

// A signal that arrives on one rank after the last step's loss all-reduce (inject_stop_step = steps + 1) is agreed
// once more before the final evaluation: every rank reports it, skips the final evaluation and writes the final
// checkpoint, as one GPU does with a signal read after its last step.
TEST(TrainRanksStop, ASignalAfterTheLastStepsAllReduceStopsEveryRankBeforeTheFinalEvaluation) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  TrainerConfig cfg = tiny_config(dir.file("ckpt"), 4);  // checkpoints every 3 and the final one at 4
  cfg.train.eval_interval = 2;
  cfg.train.eval_steps = 1;
  cfg.train.final_eval_steps = 1;
  const std::vector<TrainResult> r = train_with_stop_on_rank_1(cfg, cfg.train.steps + 1);
  for (int rank = 0; rank < kRanks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(r[rank].stop_signal, SIGTERM);
    EXPECT_EQ(r[rank].step, 4);
    ASSERT_EQ(r[rank].evals.size(), 1u);  // the periodic one at step 2; no final evaluation
    EXPECT_EQ(r[rank].evals[0].step, 2);
    EXPECT_EQ(r[rank].last_checkpoint, dir.file("ckpt") + "/" + checkpoint_file_name(4));
  }
}

// Every step's all-to-all columns (metrics.h StepRecord) count the step's exchanges on each rank: over the two
// ranks, what every MoE layer's exchanges moved (sent between the ranks plus each rank's copy to itself) is the
// formats' arithmetic of its forward and backward (ep_step_bytes_by_formats) for the group's routed rows; what one
// rank sent the other received; the exchanges were timed.
TEST(TrainRanksAllToAll, StepColumnsCountEveryExchange) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny"), "--train.steps", "3",
                                               "--train.warmup_steps", "1", "--train.eval_interval", "2",
                                               "--train.eval_steps", "1"});
  const std::vector<TrainResult> r = train_over_ranks(kRanks, cfg);
  const int64_t moe_layers = cfg.model.layers - cfg.model.n_dense_layers;
  const int64_t routed = kRanks * cfg.train.micro_batch * cfg.train.seq_len * cfg.moe.top_k;  // per micro-batch
  int64_t per_step = 0;
  for (int64_t b : ep_step_bytes_by_formats(cfg.recipe.routed_experts, cfg.model.hidden, kRanks,
                                            cfg.moe.routed_experts, routed))
    per_step += b * moe_layers * cfg.train.grad_accum;
  ASSERT_EQ(r[0].steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));  // step 3 follows an evaluation: its exchanges are not counted
    const StepRecord &a = r[0].steps[i], &b = r[1].steps[i];
    EXPECT_EQ(a.all_to_all_sent_bytes + a.all_to_all_to_self_bytes + b.all_to_all_sent_bytes +
                  b.all_to_all_to_self_bytes, per_step);
    EXPECT_EQ(a.all_to_all_sent_bytes, b.all_to_all_received_bytes);
    EXPECT_EQ(b.all_to_all_sent_bytes, a.all_to_all_received_bytes);
    EXPECT_GT(a.all_to_all_sent_bytes, 0);
    EXPECT_GT(a.all_to_all_ms, 0.0);
    EXPECT_GT(b.all_to_all_ms, 0.0);
  }
}

}  // namespace
}  // namespace fp4moe
