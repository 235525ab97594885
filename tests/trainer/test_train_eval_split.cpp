// The final evaluation's reader of the whole validation split (ValidationWindows), the per-token mean it reports
// (rows_weighted_mean), and what makes a recipe comparison paired: for one seed every recipe reads the same
// batches (shard_loader_config) and draws the same initial weights (parameter names, sizes and the keyed generator).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/data/token_shard.h"
#include "trainer/memory/estimate.h"
#include "trainer/model/params.h"
#include "trainer/train/batch.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

// Shard of n tokens counting up from `first` (modulo vocab - 1, then + 1), the last one the end-of-text token 0.
void write_counting_shard(const std::string& path, uint16_t first, size_t n, uint32_t vocab = 1000) {
  std::vector<uint16_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>((first + i - 1) % (vocab - 1) + 1);
  tokens.back() = 0;
  write_token_shard(path, tokens, vocab, 0);
}

TEST(TrainEvalSplit, EveryWindowOnceInFileOrderWithAShortLastGroup) {
  test::TempDir dir;
  const int64_t T = 4, B = 5;
  write_counting_shard(dir.file("val_000.bin"), 1, 200);   // floor(199 / 4) = 49 windows
  write_counting_shard(dir.file("val_001.bin"), 300, 30);  // floor(29 / 4) = 7 windows
  DataLoaderConfig dc;
  dc.shard_paths = find_token_shards(dir.path().string(), "val");
  dc.vocab_size = 1000;
  dc.batch_size = 3;  // ignored: one reader, any group size
  dc.seq_len = T;
  dc.shuffle = true;  // ignored: file order
  ValidationWindows split(dc);
  ASSERT_EQ(split.window_count(), 56u);

  // The expected windows: shard s, window j covers tokens [j*T, j*T + T] of that shard.
  std::vector<int32_t> expected;
  for (const auto& [first, n] : {std::pair<int32_t, int32_t>{1, 200}, {300, 30}}) {
    std::vector<int32_t> shard(static_cast<size_t>(n));
    std::iota(shard.begin(), shard.end(), first);
    shard.back() = 0;
    for (int32_t j = 0; j < (n - 1) / T; ++j)
      expected.insert(expected.end(), shard.begin() + j * T, shard.begin() + j * T + T + 1);
  }
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass);
    std::vector<int32_t> rows(static_cast<size_t>(B * (T + 1))), seen;
    std::vector<int64_t> groups;
    for (int64_t n; (n = split.next(rows, B)) > 0;) {
      groups.push_back(n);
      seen.insert(seen.end(), rows.begin(), rows.begin() + n * (T + 1));
    }
    EXPECT_EQ(groups, (std::vector<int64_t>{5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 1}));
    EXPECT_EQ(seen, expected);
    EXPECT_EQ(split.next(rows, B), 0);  // stays done until reset
    split.reset();
  }
  std::vector<int32_t> small(static_cast<size_t>(T + 1));
  expect_error_with([&] { split.next(small, 2); }, {"fewer than max_rows 2"});
  expect_error_with([&] { split.next(small, 0); }, {"max_rows must be >= 1"});
}

TEST(TrainEvalSplit, RanksShareEveryWindowOnceInPassesTheyAgreeOn) {
  test::TempDir dir;
  const int64_t T = 4, B = 5;
  write_counting_shard(dir.file("val_000.bin"), 1, 200);   // 49 windows
  write_counting_shard(dir.file("val_001.bin"), 300, 30);  // 7 windows: 56 in all
  DataLoaderConfig dc;
  dc.shard_paths = find_token_shards(dir.path().string(), "val");
  dc.vocab_size = 1000;
  dc.seq_len = T;
  const size_t row = static_cast<size_t>(T + 1);
  // One reader: every window in file order.
  ValidationWindows one(dc);
  std::vector<int32_t> all(static_cast<size_t>(B) * row), expected;
  for (int64_t n; (n = one.next(all, B)) > 0;) expected.insert(expected.end(), all.begin(), all.begin() + n * row);
  ASSERT_EQ(expected.size(), 56 * row);

  for (const int world : {1, 2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    // Each rank's reader: the passes (the same count on every rank), its windows per pass, its windows' tokens.
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(world));
    std::vector<std::vector<int32_t>> seen(static_cast<size_t>(world));
    for (int rank = 0; rank < world; ++rank) {
      ValidationWindows split(dc);
      std::vector<int32_t> rows(static_cast<size_t>(B) * row), other(rows.size());
      for (int64_t n; (n = split.next_share(rows, other, B, rank, world)) >= 0;) {
        counts[static_cast<size_t>(rank)].push_back(n);
        seen[static_cast<size_t>(rank)].insert(seen[static_cast<size_t>(rank)].end(), rows.begin(),
                                               rows.begin() + n * row);
      }
      EXPECT_EQ(split.next_share(rows, other, B, rank, world), -1);  // stays done
    }
    const size_t passes = (11 + static_cast<size_t>(world)) / static_cast<size_t>(world);  // ceil(12 groups / W)
    for (int rank = 0; rank < world; ++rank) EXPECT_EQ(counts[static_cast<size_t>(rank)].size(), passes);
    // Pass p of rank r holds group p W + r of the one reader's groups of B: interleaved back, every window once.
    std::vector<int32_t> joined;
    for (size_t p = 0; p < passes; ++p)
      for (int rank = 0; rank < world; ++rank) {
        const int64_t n = counts[static_cast<size_t>(rank)][p];
        EXPECT_GE(n, 0);
        const auto& s = seen[static_cast<size_t>(rank)];
        size_t before = 0;
        for (size_t q = 0; q < p; ++q) before += static_cast<size_t>(counts[static_cast<size_t>(rank)][q]) * row;
        joined.insert(joined.end(), s.begin() + static_cast<std::ptrdiff_t>(before),
                      s.begin() + static_cast<std::ptrdiff_t>(before + static_cast<size_t>(n) * row));
      }
    EXPECT_EQ(joined, expected);
  }
  // 12 groups over 5 ranks: the last pass gives ranks 2..4 nothing.
  ValidationWindows split(dc);
  std::vector<int32_t> rows(static_cast<size_t>(B) * row), other(rows.size());
  std::vector<int64_t> rank3;
  for (int64_t n; (n = split.next_share(rows, other, B, 3, 5)) >= 0;) rank3.push_back(n);
  EXPECT_EQ(rank3, (std::vector<int64_t>{5, 5, 0}));
  expect_error_with([&] { split.next_share(rows, other, B, 5, 5); }, {"rank 5 of 5"});
}

TEST(TrainEvalSplit, MeanPerTokenWeightsBatchesByTheirRows) {
  const std::vector<double> losses = {2.0, 4.0};
  const std::vector<int64_t> rows = {3, 1};
  EXPECT_DOUBLE_EQ(rows_weighted_mean(losses, rows), 2.5);  // (2*3 + 4*1) / 4, not the batch mean 3
  expect_error_with([] { rows_weighted_mean(std::vector<double>{1.0}, std::vector<int64_t>{}); }, {"1 losses but 0"});
  expect_error_with([] { rows_weighted_mean(std::vector<double>{}, std::vector<int64_t>{}); }, {"no batch"});
  expect_error_with([] { rows_weighted_mean(std::vector<double>{1.0}, std::vector<int64_t>{0}); }, {"0 rows"});
}

TrainerConfig small_with_recipe(const std::string& recipe, const std::string& data_dir, int seed) {
  const std::string dense = recipe == "bf16" ? "bf16" : "fp8";
  return parse_config_args({"--config", test::preset("small"), "--train.data_dir", data_dir, "--train.seed",
                            std::to_string(seed), "--recipe.attention", dense, "--recipe.dense_mlp", dense,
                            "--recipe.shared_experts", dense, "--recipe.routed_experts", recipe});
}

TEST(TrainEvalSplit, OneSeedGivesEveryRecipeTheSameDataOrderAndInitialWeights) {
  test::TempDir dir;
  write_counting_shard(dir.file("train_000.bin"), 1, 40000, 32768);  // 39 windows of the small config's 1024
  write_counting_shard(dir.file("val_000.bin"), 7, 10000, 32768);    // 9 windows: one batch of 8
  const std::string data = dir.path().string();
  const TrainerConfig bf16 = small_with_recipe("bf16", data, 1234), mxfp4 = small_with_recipe("mxfp4", data, 1234);
  ASSERT_NE(bf16.recipe.routed_experts, mxfp4.recipe.routed_experts);
  for (const char* split : {"train", "val"}) {
    SCOPED_TRACE(split);
    const DataLoaderConfig a = shard_loader_config(bf16, split), b = shard_loader_config(mxfp4, split);
    EXPECT_EQ(a.shard_paths, b.shard_paths);
    EXPECT_EQ(a.seed, 1234u);
    EXPECT_EQ(a.seed, b.seed);
    EXPECT_EQ(a.shuffle, std::string(split) == "train");
    auto ra = TokenBatches::from_shards(a), rb = TokenBatches::from_shards(b);
    std::vector<int32_t> xa(static_cast<size_t>(a.batch_size * (a.seq_len + 1))), xb(xa.size());
    for (int i = 0; i < 3; ++i) {
      ra->next(xa);
      rb->next(xb);
      EXPECT_EQ(xa, xb) << "batch " << i;
    }
  }
  // Another seed reads the training windows in another order.
  auto other = TokenBatches::from_shards(shard_loader_config(small_with_recipe("bf16", data, 1235), "train"));
  auto same = TokenBatches::from_shards(shard_loader_config(bf16, "train"));
  std::vector<int32_t> x1(static_cast<size_t>(bf16.train.micro_batch * (bf16.train.seq_len + 1))), x2(x1.size());
  other->next(x1);
  same->next(x2);
  EXPECT_NE(x1, x2);

  // Weights: ParamStore::init draws element i of tensor `name` from param_init_normal(seed, key(name), i), so the
  // same tensors (names, sizes) under one seed start from the same values whatever the recipe.
  const auto pa = parameter_tensors(bf16, single_gpu_layout(bf16), 0);
  const auto pb = parameter_tensors(mxfp4, single_gpu_layout(mxfp4), 0);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].name, pb[i].name);
    EXPECT_EQ(pa[i].n, pb[i].n) << pa[i].name;
  }
}

}  // namespace
}  // namespace fp4moe
