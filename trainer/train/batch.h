// Where the trainer's batches come from (DESIGN.md "Trainer", "Data"): the token shards through the DataLoader
// (trainer/data/loader.h), or seeded synthetic tokens that need no shards (throughput runs and tests); and the
// split of a batch's rows into the model's inputs and targets.
//
// A batch is B rows of T + 1 tokens, [B, T+1] row-major int32: row b holds T inputs and, shifted by one, T targets.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/data/loader.h"

namespace fp4moe {

// rows [B, T+1] -> tokens [B*T] and targets [B*T], both row-major [B, T]:
//   tokens[b*T + t] = rows[b*(T+1) + t],  targets[b*T + t] = rows[b*(T+1) + t + 1].
// Throws fp4moe::Error for B < 1, T < 1, or a span of another size (rows: B*(T+1), tokens and targets: B*T).
void split_rows(std::span<const int32_t> rows, int64_t B, int64_t T, std::span<int32_t> tokens,
                std::span<int32_t> targets);

// Synthetic tokens: rows over the alphabet of the first A = min(vocab, kSyntheticAlphabet) token ids, each row
// starting at a random token and then following the successor rule next = (token + 1) mod A with probability 3/4,
// or a uniform draw from the alphabet otherwise. A model learns this fast (the successor through the residual
// stream, the alphabet through the LM head): the loss falls from about ln(vocab) towards about 1.9 nats, so a
// short run shows training working; uniform draws over the whole vocabulary would already sit at their optimum.
inline constexpr int64_t kSyntheticAlphabet = 256;

// Row number `row` of the synthetic stream `stream` under `seed`, out.size() tokens: with
// k = splitmix64(stream ^ splitmix64(row)) and u(t) = splitmix64(seed ^ splitmix64(k ^ splitmix64(t))),
//   out[0] = (u(0) >> 11) mod A;   out[t] = (out[t-1] + 1) mod A if (u(t) >> 62) != 0, else (u(t) >> 11) mod A.
// A counter-based draw: the same on every platform, rows independent of each other. Throws for vocab < 1.
void synthetic_row(uint64_t seed, uint64_t stream, uint64_t row, int64_t vocab, std::span<int32_t> out);

// The synthetic streams of a run: training and validation draw from different streams of the same seed.
inline constexpr uint64_t kSyntheticTrainStream = 1;
inline constexpr uint64_t kSyntheticValStream = 2;

// Batches of [B, T+1] rows from token shards or from a synthetic stream, with a position that checkpoints save:
// DataLoaderState for shards, RngState (seed, next row number) for synthetic tokens.
class TokenBatches {
 public:
  // Shards: `config` as for DataLoader (its batch_size and seq_len are B and T).
  static std::unique_ptr<TokenBatches> from_shards(DataLoaderConfig config);
  // Synthetic: rows of stream `stream` of `seed` (synthetic_row). Throws for vocab < 2, B < 1, T < 1.
  static std::unique_ptr<TokenBatches> synthetic(uint64_t seed, uint64_t stream, int64_t vocab, int64_t B, int64_t T);

  // The next batch into rows [B*(T+1)] (rejects another size). Synthetic batches take the stream's next B rows.
  void next(std::span<int32_t> rows);
  // Back to the first batch (validation: every evaluation sees the same batches).
  void reset();

  bool is_synthetic() const { return !loader_.has_value(); }
  int64_t batch_rows() const { return B_; }
  int64_t seq_len() const { return T_; }
  // The shard loader's position (a default-constructed state for synthetic batches).
  DataLoaderState loader_state() const;
  // The synthetic stream's position: {seed, rows drawn so far} ({seed, 0} for shards, which draw nothing here).
  RngState rng_state() const { return {seed_, offset_}; }
  // Continues from a saved position: shards restore `loader` (DataLoader::restore's checks), synthetic batches
  // take `rng`, whose seed must be this stream's. Throws fp4moe::Error naming what differs, including a state
  // saved by the other kind of source (a shard run resumed on synthetic data or the reverse).
  void restore(const DataLoaderState& loader, const RngState& rng);

 private:
  TokenBatches() = default;
  std::optional<DataLoader> loader_;
  uint64_t seed_ = 0, stream_ = 0, offset_ = 0;
  int64_t vocab_ = 0, B_ = 0, T_ = 0;
};

// The DataLoader configuration of a run's `split` ("train": shuffled; "val": file order) under `cfg`: its shards
// (find_token_shards of train.data_dir), vocabulary, B = train.micro_batch, T = train.seq_len and train.seed. Only
// these enter it, never the recipe or the recompute policy, so two runs with one seed read the same batches.
DataLoaderConfig shard_loader_config(const TrainerConfig& cfg, const std::string& split);

// Every window of the validation shards once, in file order (the final evaluation over the whole split): the
// windows of DataLoader with shuffle off, handed out up to max_rows at a time, so that the last group may be
// shorter than B. `config`: as for DataLoader; its batch_size, shuffle, rank and world are ignored (one reader).
class ValidationWindows {
 public:
  explicit ValidationWindows(DataLoaderConfig config);

  // Fills the first n rows [n, T+1] of `rows` with the next n = min(max_rows, windows left) windows and returns n
  // (0 once every window was handed out, until reset). Throws fp4moe::Error for max_rows < 1 or a `rows` that
  // cannot hold max_rows rows.
  int64_t next(std::span<int32_t> rows, int64_t max_rows);
  // One pass of the split over `world` ranks, each rank reading every window through its own ValidationWindows so
  // that all agree on the passes: the next `world` groups of up to max_rows windows, the rank-th into `rows`, the
  // others read past into `other`. Returns this rank's windows: 1..max_rows, 0 when the split ended before its
  // group (the rank still takes part in the pass), -1 when it had ended before the first group (no pass left).
  // With world 1: next(rows, max_rows), or -1 for its 0. Throws fp4moe::Error for rank outside [0, world) and
  // what next() throws.
  int64_t next_share(std::span<int32_t> rows, std::span<int32_t> other, int64_t max_rows, int rank, int world);
  void reset() { loader_.reset(), taken_ = 0; }
  uint64_t window_count() const { return loader_.window_count(); }
  int64_t seq_len() const { return T_; }

 private:
  static DataLoaderConfig one_reader(DataLoaderConfig c);
  DataLoader loader_;
  int64_t T_ = 0;
  uint64_t taken_ = 0;
};

// Mean cross-entropy per token of an evaluation from its batches' mean losses and row counts (every row holds
// the same number of targets): sum(loss_i x rows_i) / sum(rows_i). Throws fp4moe::Error for different lengths, no
// rows, or a row count < 1.
double rows_weighted_mean(std::span<const double> losses, std::span<const int64_t> rows);

}  // namespace fp4moe
