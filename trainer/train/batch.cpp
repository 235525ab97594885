#include "trainer/train/batch.h"

#include <algorithm>

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

void split_rows(std::span<const int32_t> rows, int64_t B, int64_t T, std::span<int32_t> tokens,
                std::span<int32_t> targets) {
  FP4MOE_CHECK(B >= 1 && T >= 1, "split_rows: B and T must be >= 1, got B = {}, T = {}", B, T);
  FP4MOE_CHECK(static_cast<int64_t>(rows.size()) == B * (T + 1), "split_rows: rows holds {} tokens, expected B * (T + 1) = {}",
               rows.size(), B * (T + 1));
  FP4MOE_CHECK(static_cast<int64_t>(tokens.size()) == B * T && static_cast<int64_t>(targets.size()) == B * T,
               "split_rows: tokens and targets hold {} and {} elements, expected B * T = {}", tokens.size(),
               targets.size(), B * T);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = rows.data() + b * (T + 1);
    std::copy(row, row + T, tokens.data() + b * T);
    std::copy(row + 1, row + T + 1, targets.data() + b * T);
  }
}

void synthetic_row(uint64_t seed, uint64_t stream, uint64_t row, int64_t vocab, std::span<int32_t> out) {
  FP4MOE_CHECK(vocab >= 1, "synthetic_row: vocab must be >= 1, got {}", vocab);
  const uint64_t alphabet = static_cast<uint64_t>(std::min(vocab, kSyntheticAlphabet));
  const uint64_t row_key = splitmix64(stream ^ splitmix64(row));
  for (size_t t = 0; t < out.size(); ++t) {
    const uint64_t u = splitmix64(seed ^ splitmix64(row_key ^ splitmix64(t)));
    const bool successor = t > 0 && (u >> 62) != 0;  // probability 3/4
    out[t] = static_cast<int32_t>(successor ? (static_cast<uint64_t>(out[t - 1]) + 1) % alphabet
                                            : (u >> 11) % alphabet);
  }
}

std::unique_ptr<TokenBatches> TokenBatches::from_shards(DataLoaderConfig config) {
  std::unique_ptr<TokenBatches> b(new TokenBatches());
  b->B_ = config.batch_size;
  b->T_ = config.seq_len;
  b->seed_ = config.seed;
  b->loader_.emplace(std::move(config));
  return b;
}

std::unique_ptr<TokenBatches> TokenBatches::synthetic(uint64_t seed, uint64_t stream, int64_t vocab, int64_t B,
                                                      int64_t T) {
  FP4MOE_CHECK(vocab >= 2, "synthetic tokens: vocab must be >= 2, got {}", vocab);
  FP4MOE_CHECK(B >= 1 && T >= 1, "synthetic tokens: B and T must be >= 1, got B = {}, T = {}", B, T);
  std::unique_ptr<TokenBatches> b(new TokenBatches());
  b->seed_ = seed;
  b->stream_ = stream;
  b->vocab_ = vocab;
  b->B_ = B;
  b->T_ = T;
  return b;
}

void TokenBatches::next(std::span<int32_t> rows) {
  FP4MOE_CHECK(static_cast<int64_t>(rows.size()) == B_ * (T_ + 1), "batch: rows holds {} tokens, expected {} x {}",
               rows.size(), B_, T_ + 1);
  if (loader_) {
    loader_->next_batch(rows);
    return;
  }
  const size_t n = static_cast<size_t>(T_ + 1);
  for (int64_t b = 0; b < B_; ++b) synthetic_row(seed_, stream_, offset_++, vocab_, rows.subspan(b * n, n));
}

void TokenBatches::reset() {
  if (loader_)
    loader_->reset();
  else
    offset_ = 0;
}

DataLoaderState TokenBatches::loader_state() const { return loader_ ? loader_->state() : DataLoaderState{}; }

void TokenBatches::restore(const DataLoaderState& loader, const RngState& rng) {
  const bool saved_shards = loader.windows != 0;
  if (loader_) {
    FP4MOE_CHECK(saved_shards, "the checkpoint was written by a run on synthetic tokens (no data loader state); "
                               "resume it with --synthetic-data");
    loader_->restore(loader);
    return;
  }
  FP4MOE_CHECK(!saved_shards, "the checkpoint was written by a run on token shards ({} windows); resume it on the "
                              "same shards, without --synthetic-data",
               loader.windows);
  FP4MOE_CHECK(rng.seed == seed_, "the checkpoint's synthetic tokens were drawn with seed {}, this run has "
                                  "train.seed = {}",
               rng.seed, seed_);
  offset_ = rng.offset;
}

DataLoaderConfig shard_loader_config(const TrainerConfig& cfg, const std::string& split) {
  DataLoaderConfig dc;
  dc.shard_paths = find_token_shards(cfg.train.data_dir, split);
  dc.vocab_size = static_cast<uint32_t>(cfg.model.vocab_size);
  dc.batch_size = cfg.train.micro_batch;
  dc.seq_len = cfg.train.seq_len;
  dc.seed = cfg.train.seed;
  dc.shuffle = split == "train";
  return dc;
}

DataLoaderConfig ValidationWindows::one_reader(DataLoaderConfig c) {
  c.batch_size = 1;
  c.shuffle = false;
  c.rank = 0;
  c.world = 1;
  return c;
}

ValidationWindows::ValidationWindows(DataLoaderConfig config)
    : loader_(one_reader(std::move(config))), T_(loader_.config().seq_len) {}

int64_t ValidationWindows::next(std::span<int32_t> rows, int64_t max_rows) {
  FP4MOE_CHECK(max_rows >= 1, "validation windows: max_rows must be >= 1, got {}", max_rows);
  const size_t row = static_cast<size_t>(T_ + 1);
  FP4MOE_CHECK(rows.size() >= static_cast<size_t>(max_rows) * row,
               "validation windows: rows holds {} tokens, fewer than max_rows {} x {}", rows.size(), max_rows, T_ + 1);
  const uint64_t left = loader_.window_count() - taken_;
  const int64_t n = static_cast<int64_t>(std::min<uint64_t>(left, static_cast<uint64_t>(max_rows)));
  for (int64_t i = 0; i < n; ++i) loader_.next_batch(rows.subspan(static_cast<size_t>(i) * row, row));
  taken_ += static_cast<uint64_t>(n);
  return n;
}

int64_t ValidationWindows::next_share(std::span<int32_t> rows, std::span<int32_t> other, int64_t max_rows, int rank,
                                      int world) {
  FP4MOE_CHECK(world >= 1 && rank >= 0 && rank < world, "validation windows: rank {} of {}, expected 0 <= rank < "
               "world >= 1", rank, world);
  int64_t mine = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t n = next(r == rank ? rows : other, max_rows);
    if (r == 0 && n == 0) return -1;
    if (r == rank) mine = n;
  }
  return mine;
}

double rows_weighted_mean(std::span<const double> losses, std::span<const int64_t> rows) {
  FP4MOE_CHECK(losses.size() == rows.size(), "rows_weighted_mean: {} losses but {} row counts", losses.size(),
               rows.size());
  FP4MOE_CHECK(!rows.empty(), "rows_weighted_mean: no batch");
  double sum = 0;
  int64_t total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    FP4MOE_CHECK(rows[i] >= 1, "rows_weighted_mean: batch {} has {} rows, expected >= 1", i, rows[i]);
    sum += losses[i] * static_cast<double>(rows[i]);
    total += rows[i];
  }
  return sum / static_cast<double>(total);
}

}  // namespace fp4moe
