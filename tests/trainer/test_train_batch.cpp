// Batches of the trainer (trainer/train/batch.h): the split of [B, T+1] rows into inputs and targets, synthetic
// tokens (range, determinism, streams, resumption, reset) and token shards through the same interface.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/data/token_shard.h"
#include "trainer/train/batch.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

TEST(TrainBatch, SplitRowsShiftsTargetsByOne) {
  const int64_t B = 2, T = 3;
  const std::vector<int32_t> rows = {10, 11, 12, 13, 20, 21, 22, 23};  // [2, 4]
  std::vector<int32_t> tokens(B * T, -1), targets(B * T, -1);
  split_rows(rows, B, T, tokens, targets);
  EXPECT_EQ(tokens, (std::vector<int32_t>{10, 11, 12, 20, 21, 22}));
  EXPECT_EQ(targets, (std::vector<int32_t>{11, 12, 13, 21, 22, 23}));

  std::vector<int32_t> one_row = {5, 6}, t1(1), g1(1);
  split_rows(one_row, 1, 1, t1, g1);
  EXPECT_EQ(t1[0], 5);
  EXPECT_EQ(g1[0], 6);
}

TEST(TrainBatch, SplitRowsRejectsWrongSizes) {
  std::vector<int32_t> rows(8), tokens(6), targets(6), short_tokens(5);
  expect_error_with([&] { split_rows(std::span<const int32_t>(rows).first(7), 2, 3, tokens, targets); },
                    {"rows holds 7", "8"});
  expect_error_with([&] { split_rows(rows, 2, 3, short_tokens, targets); }, {"B * T = 6"});
  expect_error_with([&] { split_rows(rows, 0, 3, tokens, targets); }, {"B and T must be >= 1"});
}

// Row `row` of a synthetic stream.
std::vector<int32_t> row_of(uint64_t seed, uint64_t stream, uint64_t row, int64_t vocab, size_t n) {
  std::vector<int32_t> out(n, -1);
  synthetic_row(seed, stream, row, vocab, out);
  return out;
}

TEST(TrainBatch, SyntheticRowsFollowTheDocumentedRule) {
  std::set<int32_t> seen;
  int64_t successors = 0, transitions = 0;
  for (uint64_t row = 0; row < 200; ++row) {
    const std::vector<int32_t> r = row_of(7, kSyntheticTrainStream, row, 32768, 65);
    EXPECT_EQ(r, row_of(7, kSyntheticTrainStream, row, 32768, 65));  // seeded: the same again
    for (size_t t = 0; t < r.size(); ++t) {
      ASSERT_GE(r[t], 0);
      ASSERT_LT(r[t], kSyntheticAlphabet);
      seen.insert(r[t]);
      if (t > 0) {
        ++transitions;
        successors += r[t] == (r[t - 1] + 1) % kSyntheticAlphabet;
      }
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kSyntheticAlphabet));  // every id of the alphabet shows up
  const double fraction = static_cast<double>(successors) / static_cast<double>(transitions);
  EXPECT_GT(fraction, 0.72);  // 3/4 + 1/4 * 1/256 expected, over 12800 transitions (sd 0.004)
  EXPECT_LT(fraction, 0.78);

  // A small vocabulary is the whole alphabet; a shorter row is a prefix of a longer one.
  for (int32_t t : row_of(7, 1, 3, 10, 100)) EXPECT_LT(t, 10);
  const std::vector<int32_t> longer = row_of(7, 1, 3, 32768, 100), shorter = row_of(7, 1, 3, 32768, 40);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), longer.begin()));
  // Other streams, seeds and rows differ.
  EXPECT_NE(row_of(7, 1, 0, 32768, 64), row_of(7, 2, 0, 32768, 64));
  EXPECT_NE(row_of(7, 1, 0, 32768, 64), row_of(8, 1, 0, 32768, 64));
  EXPECT_NE(row_of(7, 1, 0, 32768, 64), row_of(7, 1, 1, 32768, 64));
  std::vector<int32_t> none;
  synthetic_row(7, 1, 0, 32768, none);  // an empty row is fine
  expect_error_with([&] { synthetic_row(7, 1, 0, 0, none); }, {"vocab must be >= 1"});
}

TEST(TrainBatch, SyntheticBatchesResumeAndReset) {
  const int64_t B = 2, T = 5;
  auto a = TokenBatches::synthetic(3, kSyntheticTrainStream, 32768, B, T);
  EXPECT_TRUE(a->is_synthetic());
  std::vector<int32_t> first(B * (T + 1)), second(B * (T + 1)), again(B * (T + 1));
  a->next(first);
  const RngState after_first = a->rng_state();
  EXPECT_EQ(after_first, (RngState{3, static_cast<uint64_t>(B)}));  // rows drawn
  a->next(second);
  EXPECT_NE(first, second);
  const std::vector<int32_t> row1 = row_of(3, kSyntheticTrainStream, 1, 32768, T + 1);
  EXPECT_TRUE(std::equal(row1.begin(), row1.end(), first.begin() + (T + 1)));

  auto b = TokenBatches::synthetic(3, kSyntheticTrainStream, 32768, B, T);
  b->restore(DataLoaderState{}, after_first);
  b->next(again);
  EXPECT_EQ(again, second);
  b->reset();
  b->next(again);
  EXPECT_EQ(again, first);

  expect_error_with([&] { b->restore(DataLoaderState{}, RngState{4, 0}); }, {"seed 4", "train.seed = 3"});
  DataLoaderState shards_state;
  shards_state.windows = 100;
  expect_error_with([&] { b->restore(shards_state, after_first); }, {"token shards", "without --synthetic-data"});
  std::vector<int32_t> wrong(3);
  expect_error_with([&] { b->next(wrong); }, {"rows holds 3"});
  expect_error_with([] { TokenBatches::synthetic(1, 1, 1, 1, 1); }, {"vocab must be >= 2"});
}

TEST(TrainBatch, ShardsInFileOrderResetAndRefuseSyntheticState) {
  test::TempDir dir;
  std::vector<uint16_t> tokens(200);
  std::iota(tokens.begin(), tokens.end(), uint16_t{1});
  tokens.back() = 0;  // end of text
  write_token_shard(dir.file("val_000.bin"), tokens, 1000, 0);
  DataLoaderConfig dc;
  dc.shard_paths = find_token_shards(dir.path().string(), "val");
  dc.vocab_size = 1000;
  dc.batch_size = 2;
  dc.seq_len = 4;
  dc.seed = 9;
  dc.shuffle = false;
  auto val = TokenBatches::from_shards(dc);
  EXPECT_FALSE(val->is_synthetic());
  std::vector<int32_t> rows(2 * 5), again(2 * 5);
  val->next(rows);
  EXPECT_EQ(rows, (std::vector<int32_t>{1, 2, 3, 4, 5, 5, 6, 7, 8, 9}));  // windows share one token
  val->next(again);
  EXPECT_NE(again, rows);
  EXPECT_GT(val->loader_state().cursor, 0u);
  val->reset();
  val->next(again);
  EXPECT_EQ(again, rows);
  expect_error_with([&] { val->restore(DataLoaderState{}, RngState{9, 0}); }, {"synthetic", "--synthetic-data"});
}

}  // namespace
}  // namespace fp4moe
