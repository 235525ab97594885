// The training data loader: batches of token windows from memory-mapped token shards (trainer/data/token_shard.h).
//
// Windows. Shard s of n_s tokens holds floor((n_s - 1) / T) windows; window j covers tokens [j*T, j*T + T + 1):
// T inputs and, shifted by one, T targets, so consecutive windows share one token and every token but a shard's
// first is a target once per epoch. Windows never straddle shards; they do straddle documents (the end-of-text
// token separates them). Windows are numbered across shards in the order of `shard_paths`.
//
// Order. Epoch e visits the windows in a permutation fixed by (seed, e) (Fisher-Yates driven by splitmix64, the
// same on every platform), or in file order when `shuffle` is false (evaluation). A global step takes the next
// B * world windows of that order: rank r gets rows [r*B, (r+1)*B), so ranks read disjoint windows and together
// read each window at most once per epoch. An epoch ends when fewer than B * world windows remain (those are
// skipped this epoch; the next epoch's permutation differs). Everything is a function of (shards, T, seed, epoch,
// cursor), so a run resumes exactly from the small DataLoaderState saved in its checkpoint, even with a different
// world size or batch size (the cursor counts windows, not steps).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trainer/data/token_shard.h"

namespace fp4moe {

struct DataLoaderConfig {
  std::vector<std::string> shard_paths;  // read in this order (see find_token_shards)
  uint32_t vocab_size = 0;               // the model's vocabulary: every shard must have exactly this one
  int64_t batch_size = 0;                // B: rows per rank per batch
  int64_t seq_len = 0;                   // T: a row holds T + 1 tokens
  uint64_t seed = 0;
  int rank = 0;   // 0 <= rank < world
  int world = 1;  // data-parallel ranks reading disjoint windows
  bool shuffle = true;
  bool verify_checksums = true;  // read every token once at open (payload CRC, token range, document count)
};

// Where a loader stands: saved in checkpoints (48 bytes as to_bytes), restored with DataLoader::restore.
struct DataLoaderState {
  static constexpr uint64_t kVersion = 1;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t cursor = 0;       // windows of this epoch's order already taken by all ranks together
  uint64_t windows = 0;      // windows in the shards, for T (a check on restore)
  uint64_t fingerprint = 0;  // CRC-32 over T, shuffle and each shard's token count, payload CRC and vocabulary

  std::array<uint8_t, 48> to_bytes() const;  // little-endian: version, seed, epoch, cursor, windows, fingerprint
  // Throws fp4moe::Error for a wrong size or version.
  static DataLoaderState from_bytes(std::span<const uint8_t> bytes);
  bool operator==(const DataLoaderState&) const = default;
};

class DataLoader {
 public:
  // Opens and validates every shard (TokenShard rejects a missing, truncated or corrupted shard, a wrong magic or
  // version, and a vocabulary other than config.vocab_size, naming the file). Also throws fp4moe::Error for: no
  // shard; vocab_size 0 or > 65536; B < 1; T < 1; rank outside [0, world); shards whose end-of-text tokens differ;
  // fewer than B * world windows in all.
  explicit DataLoader(DataLoaderConfig config);

  // The next batch for this rank: `out` is [B, T+1] row-major (B * (T+1) elements), tokens as int32 (for the
  // embedding lookup on the device) or as stored (uint16). Rejects an `out` of another size.
  void next_batch(std::span<int32_t> out);
  void next_batch(std::span<uint16_t> out);

  DataLoaderState state() const;
  // Continues from `s` (taken from a loader over the same shards and T, any rank/world/B). Throws fp4moe::Error
  // when the seed, window count or fingerprint differ, or the cursor is past the windows.
  void restore(const DataLoaderState& s);
  void reset() { restore({config_.seed, 0, 0, windows_, fingerprint_}); }  // back to epoch 0, cursor 0

  const DataLoaderConfig& config() const { return config_; }
  uint64_t window_count() const { return windows_; }
  uint64_t batches_per_epoch() const { return windows_ / rows_per_step(); }
  uint64_t epoch() const { return epoch_; }
  uint32_t eot_token() const { return shards_.front().header().eot_token; }
  const std::vector<TokenShard>& shards() const { return shards_; }

 private:
  uint64_t rows_per_step() const { return static_cast<uint64_t>(config_.batch_size) * config_.world; }
  void build_order();                    // order_ for epoch_ (empty when not shuffling)
  uint64_t window_at(uint64_t p) const;  // the window at position p of this epoch's order
  const uint16_t* window_tokens(uint64_t w) const;
  template <typename T>
  void fill(std::span<T> out);

  DataLoaderConfig config_;
  std::vector<TokenShard> shards_;
  std::vector<uint64_t> first_window_;  // [shards + 1]: window numbers where each shard starts
  uint64_t windows_ = 0;
  uint64_t fingerprint_ = 0;
  uint64_t epoch_ = 0;
  uint64_t cursor_ = 0;
  std::vector<uint64_t> order_;
};

// The shards of one split in a folder made by `make data`: DIR/SPLIT_NNN.bin (NNN = 000, 001, ... without gaps),
// in number order; `split` is matched as plain text (not a pattern), NNN as 1 to 9 digits. Throws fp4moe::Error
// when the folder is missing, has none or cannot be listed, when a number is missing, or for an empty split name
// or one with a '/', naming the folder (see folder_for_message) and the pattern.
// When the tokenizer model is beside the shards (tokenizer_model_of_shards), also reads each shard's header
// (TokenShard without the payload) and throws when its tokenizer_crc32, unless 0 (unknown), differs from the
// model's tokenizer_model_crc32: a stale shard of another tokenizer; the message names both checksums and the
// `make data` command that rebuilds the shards.
std::vector<std::string> find_token_shards(const std::string& dir, const std::string& split);

// The sentencepiece model that the shards of folder `dir` were made with, when present: DIR/spm.model, else
// DIR/../tokenizer/spm.model (where `make data` puts it beside DATA_CACHE/shards); "" when neither is a file.
std::string tokenizer_model_of_shards(const std::string& dir);

// A folder or file path quoted for an error message; a relative path also says that it is relative to the working
// directory and gives the absolute path tried: "'data/cache/shards' (relative to the working directory:
// /home/u/run/data/cache/shards)".
std::string folder_for_message(const std::string& path);

}  // namespace fp4moe
