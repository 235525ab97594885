// The ZeRO-1 shard rule (trainer/model/param_shard.h), no device needed:
//   - the shard size S = round_up(ceil(B / parts), 64) of a flat block, its rejections;
//   - every element of every tensor belongs to exactly one rank, in rank order, for uneven divisions and for
//     tensors smaller than a shard or than the number of ranks; ranks past the block own nothing;
//   - rank 0's layout of a store (zero1_layout): the non-expert and the routed experts' blocks, split over their
//     own parts, the storage offsets, and the whole tensors without sharding;
//   - which names are the routed experts', and that the estimator's parameter tensors and ParamStore agree on it;
//   - the estimator's masters and moments under zero1 equal the rule's shard, by hand on configs/tiny.toml and on
//     DeepSeek-V3's production layout;
//   - checkpoints refuse a sharded store and the Trainer refuses checkpoint_dir / --resume under zero1, before any
//     device work.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/model/param_shard.h"
#include "trainer/model/params.h"
#include "trainer/train/param_checkpoint.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

TrainerConfig tiny(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

TEST(Zero1Shard, ShardElemsRoundUpToTheTensorPadding) {
  EXPECT_EQ(zero1_shard_elems(0, 4), 0);
  EXPECT_EQ(zero1_shard_elems(640, 1), 640);   // one rank: the whole block
  EXPECT_EQ(zero1_shard_elems(640, 2), 320);   // even: 320 = 5 x 64
  EXPECT_EQ(zero1_shard_elems(640, 3), 256);   // ceil(640 / 3) = 214 -> 256; the third rank holds 128
  EXPECT_EQ(zero1_shard_elems(128, 4), 64);    // more ranks than 64-element pieces: ranks 2 and 3 hold nothing
  EXPECT_EQ(zero1_shard_elems(64, 64), 64);
  expect_error_with([] { zero1_shard_elems(100, 2); }, {"multiple of 64", "100"});
  expect_error_with([] { zero1_shard_elems(-64, 2); }, {"non-negative"});
  expect_error_with([] { zero1_shard_elems(64, 0); }, {"parts must be >= 1, got 0"});
}

TEST(Zero1Shard, TensorShardsByHand) {
  // A 1000-element tensor first in a block of 1024 + more, S = 256: ranks 0-2 hold 256 each, rank 3 the last 232.
  EXPECT_EQ(zero1_tensor_shard(0, 1000, 256, 0), (ShardRange{0, 256}));
  EXPECT_EQ(zero1_tensor_shard(0, 1000, 256, 3), (ShardRange{768, 1000}));
  EXPECT_TRUE(zero1_tensor_shard(0, 1000, 256, 4).empty());
  // A 5-element tensor at offset 64 with S = 64: rank 1 holds all of it, ranks 0 and 2 nothing.
  EXPECT_TRUE(zero1_tensor_shard(64, 5, 64, 0).empty());
  EXPECT_EQ(zero1_tensor_shard(64, 5, 64, 1), (ShardRange{0, 5}));
  EXPECT_TRUE(zero1_tensor_shard(64, 5, 64, 2).empty());
  // Straddling: a tensor at 192 of 200 elements with S = 256: rank 0 its first 64, rank 1 the other 136.
  EXPECT_EQ(zero1_tensor_shard(192, 200, 256, 0), (ShardRange{0, 64}));
  EXPECT_EQ(zero1_tensor_shard(192, 200, 256, 1), (ShardRange{64, 200}));
  expect_error_with([] { zero1_tensor_shard(0, 0, 64, 0); }, {"n >= 1"});
  expect_error_with([] { zero1_tensor_shard(0, 8, 64, -1); }, {"rank >= 0"});
}

TEST(Zero1Shard, EveryElementHasExactlyOneRankUnevenAndSmallTensors) {
  const std::vector<int64_t> sizes = {1, 5, 200, 64, 1000, 3, 4096, 65, 7};  // 1, 5, 3, 7: fewer than the ranks
  std::vector<int64_t> offset;
  int64_t block = 0;
  for (int64_t n : sizes) {
    offset.push_back(block);
    block += param_padded(n);
  }
  for (int64_t parts : {1, 2, 3, 4, 7, 16, 64, 200}) {
    SCOPED_TRACE("parts " + std::to_string(parts));
    const int64_t S = zero1_shard_elems(block, parts);
    const int64_t share = (block + parts - 1) / parts;  // ceil(B / parts)
    EXPECT_EQ(S % 64, 0);
    EXPECT_GE(S, share);
    EXPECT_LT(S - 64, share) << "S is the smallest aligned share";
    std::vector<int64_t> owned(static_cast<size_t>(parts), 0);
    for (size_t i = 0; i < sizes.size(); ++i) {
      int64_t next = 0;  // the ranks' ranges tile [0, n) in rank order
      for (int64_t r = 0; r < parts; ++r) {
        const ShardRange s = zero1_tensor_shard(offset[i], sizes[i], S, r);
        ASSERT_LE(0, s.begin);
        ASSERT_LE(s.begin, s.end);
        ASSERT_LE(s.end, sizes[i]);
        if (s.empty()) continue;
        EXPECT_EQ(s.begin, next) << "tensor " << i << " rank " << r;
        next = s.end;
        owned[static_cast<size_t>(r)] += s.size();
        EXPECT_GE(offset[i] + s.begin, r * S);  // inside rank r's part of the block
        EXPECT_LE(offset[i] + s.end, (r + 1) * S);
      }
      EXPECT_EQ(next, sizes[i]) << "tensor " << i;
    }
    for (int64_t r = 0; r < parts; ++r) {
      EXPECT_LE(owned[static_cast<size_t>(r)], S);
      if (r * S >= block) {
        EXPECT_EQ(owned[static_cast<size_t>(r)], 0) << "rank " << r << " is past the block";
      }
    }
  }
}

TEST(Zero1Shard, RankZeroLayoutSplitsTheKindsOverTheirOwnParts) {
  // dense 1000 | expert 700 | dense 5 | expert 300 | dense 64: blocks dense 1024 + 64 + 64 = 1152, expert 704 + 320.
  const std::vector<int64_t> n = {1000, 700, 5, 300, 64};
  const std::vector<bool> expert = {false, true, false, true, false};
  const Zero1Layout whole = zero1_layout(n, expert, Zero1Parts{});
  EXPECT_EQ(whole.dense_block, 1152);
  EXPECT_EQ(whole.expert_block, 1024);
  EXPECT_EQ(whole.storage(), 1152 + 1024);
  const std::vector<int64_t> whole_offsets = {0, 1152, 1024, 1152 + 704, 1088};
  for (size_t i = 0; i < n.size(); ++i) {
    EXPECT_EQ(whole.slots[i].range, (ShardRange{0, n[i]})) << i;
    EXPECT_EQ(whole.slots[i].storage_offset, whole_offsets[i]) << i;
  }

  // dense over 3 ranks: S = round_up(384, 64) = 384; expert over 2: S = 512.
  const Zero1Layout z = zero1_layout(n, expert, Zero1Parts{3, 2});
  EXPECT_EQ(z.dense_shard, 384);
  EXPECT_EQ(z.expert_shard, 512);
  EXPECT_EQ(z.storage(), 384 + 512);
  EXPECT_EQ(z.slots[0].range, (ShardRange{0, 384}));  // the first dense tensor's first 384 elements
  EXPECT_EQ(z.slots[0].storage_offset, 0);
  EXPECT_EQ(z.slots[1].range, (ShardRange{0, 512}));  // the first expert tensor's first 512
  EXPECT_EQ(z.slots[1].storage_offset, 384);
  for (size_t i : {2u, 3u, 4u}) {  // past rank 0's part of their blocks
    EXPECT_TRUE(z.slots[i].range.empty()) << i;
    EXPECT_EQ(z.slots[i].storage_offset, -1) << i;
  }
  expect_error_with([&] { zero1_layout(n, {false}, Zero1Parts{}); }, {"5 sizes but 1 expert flags"});
  expect_error_with([&] { zero1_layout(n, expert, Zero1Parts{0, 1}); }, {"parts must be >= 1"});
}

TEST(Zero1Shard, RoutedExpertNamesAndTheStoreAndEstimatorAgree) {
  EXPECT_TRUE(is_routed_expert_param("layers.1.moe.experts.fc1"));
  EXPECT_TRUE(is_routed_expert_param("layers.60.moe.experts.fc2"));
  EXPECT_FALSE(is_routed_expert_param("layers.1.moe.shared.fc1"));
  EXPECT_FALSE(is_routed_expert_param("layers.1.moe.router"));
  EXPECT_FALSE(is_routed_expert_param("layers.1.moe.experts."));
  EXPECT_FALSE(is_routed_expert_param("layers..moe.experts.fc1"));
  EXPECT_FALSE(is_routed_expert_param("embed"));
  EXPECT_FALSE(is_routed_expert_param("xlayers.1.moe.experts.fc1"));

  ParamStore store;
  EXPECT_TRUE(store.add("layers.1.moe.experts.fc1", {8, 64, 64}, ParamInit::normal, 0.02f, true).expert);
  EXPECT_FALSE(store.add("layers.1.moe.shared.fc1", {64, 64}, ParamInit::normal, 0.02f, true).expert);
  EXPECT_FALSE(store.sharded());
  expect_error_with([&] { store.set_shard(Zero1Parts{0, 2}); }, {"parts must be >= 1", "dense 0"});
  store.set_shard(Zero1Parts{4, 2});
  EXPECT_TRUE(store.sharded());
  EXPECT_EQ(store.shard_parts().expert, 2);

  const TrainerConfig cfg = tiny();
  int64_t experts = 0;
  for (const ParamTensor& t : parameter_tensors(cfg, single_gpu_layout(cfg), 0)) {
    EXPECT_EQ(t.expert, is_routed_expert_param(t.name)) << t.name;
    experts += t.expert;
  }
  EXPECT_EQ(experts, 2);
}

// tiny (ParamStore pads to 4310080 elements, MemoryEstimate.TinyWeightsGradsOptimizerToTheByte): routed experts
// 8 x 64 x 64 + 8 x 64 x 32 = 49152, the rest 4260928.
TEST(Zero1Shard, EstimatorHoldsTheRuleShardOnTiny) {
  struct Case {
    std::vector<std::string> parallel;
    int64_t dense_shard, expert_shard;
  };
  const Case cases[] = {
      // dp 3: ceil(4260928 / 3) = 1420310 -> 1420352; experts over expert_dp = 3: ceil(49152 / 3) = 16384.
      {{"--parallel.dp", "3", "--parallel.zero1", "true"}, 1420352, 16384},
      // dp 4, ep 2: 1065232 -> 1065280; E / ep = 4 experts (24576 elements) over expert_dp = 4 / 2 = 2: 12288.
      {{"--parallel.dp", "4", "--parallel.ep", "2", "--parallel.zero1", "true"}, 1065280, 12288},
      // not sharded: the whole blocks.
      {{"--parallel.dp", "4"}, 4260928, 49152},
  };
  for (const Case& c : cases) {
    const TrainerConfig cfg = tiny(c.parallel);
    const MemoryEstimate e = estimate_memory(cfg);
    SCOPED_TRACE(e.layout.name + (e.layout.zero1 ? " zero1" : ""));
    const int64_t shard = c.dense_shard + c.expert_shard;
    const int64_t params = 4260928 + (e.layout.ep == 2 ? 24576 : 49152);
    EXPECT_EQ(e.category(MemCategory::optimizer), 8 * shard);
    EXPECT_EQ(e.device_memory[static_cast<int>(MemCategory::optimizer)], 8 * shard);
    EXPECT_EQ(e.category(MemCategory::grads), 4 * params);  // whole
    int64_t masters = -1, bf16 = -1;
    for (const MemoryTerm& t : e.terms) {
      if (t.tensor == "FP32 master weights") masters = t.bytes;
      if (t.tensor == "BF16 parameters") bf16 = t.bytes;
    }
    EXPECT_EQ(masters, 4 * shard);
    EXPECT_EQ(bf16, 2 * params);  // whole
  }
}

TEST(Zero1Shard, EstimatorHoldsTheRuleShardOnDeepSeekV3) {
  // DeepSeek-V3's preset at dp 88 and ep 8 (352 GPUs): 32 experts per GPU, expert_dp = 88 / 8 = 11, so neither
  // block divides evenly.
  const ProductionPreset v3 = production_preset("v3");
  ParallelLayout l = v3.layout;
  l.dp = 88;
  l.ep = 8;
  l.gpus = l.tp * l.pp * l.dp;
  ASSERT_TRUE(l.zero1);
  int64_t dense = 0, expert = 0;
  for (const ParamTensor& t : parameter_tensors(v3.config, l, 1))
    if (!t.state) (t.expert ? expert : dense) += (t.n + 63) / 64 * 64;
  auto shard = [](int64_t block, int64_t parts) { return ((block + parts - 1) / parts + 63) / 64 * 64; };
  ASSERT_NE(dense % (88 * 64), 0);
  ASSERT_NE(expert % (11 * 64), 0);
  EXPECT_EQ(estimate_memory_stage(v3.config, l, 1).category(MemCategory::optimizer),
            8 * (shard(dense, 88) + shard(expert, 11)));
}

TEST(Zero1Shard, CheckpointsRefuseAShardedStore) {
  test::TempDir dir;
  ParamStore store;
  store.add("layers.0.attn_norm", {64}, ParamInit::ones, 0.0f, false);
  store.set_shard(Zero1Parts{2, 1});
  const std::string path = dir.file("step_00000001.ckpt");
  expect_error_with([&] { save_param_checkpoint(path, store, CheckpointState{}, nullptr); },
                    {path, "ZeRO-1 shard", "1/2 of the non-expert", "unset train.checkpoint_dir"});
  expect_error_with([&] { load_param_checkpoint(path, store, 0, nullptr); }, {path, "ZeRO-1 shard"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Zero1Shard, TrainerRefusesCheckpointsUnderZero1BeforeTheDevice) {
  test::TempDir dir;
  TrainerOptions opts;
  opts.synthetic_data = true;
  opts.log = nullptr;
  const std::vector<std::string> zero1 = {"--parallel.dp", "2", "--parallel.zero1", "true"};
  std::vector<std::string> with_dir = zero1;
  with_dir.insert(with_dir.end(), {"--train.checkpoint_dir", dir.file("ckpt")});
  expect_error_with([&] { Trainer t(tiny(with_dir), opts); }, {"train.checkpoint_dir: checkpoints hold whole", "1/2"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt"))) << "refused before creating the folder";
  opts.resume_path = dir.write("some.ckpt", "x");
  expect_error_with([&] { Trainer t(tiny(zero1), opts); }, {"--resume: checkpoints hold whole"});
}

}  // namespace
}  // namespace fp4moe
