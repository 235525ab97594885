#include "trainer/data/loader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound), bound >= 1: Lemire's multiply-shift with rejection (exact, platform independent).
uint64_t below(uint64_t& state, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const unsigned __int128 m = static_cast<unsigned __int128>(splitmix64(state)) * bound;
    if (static_cast<uint64_t>(m) >= threshold) return static_cast<uint64_t>(m >> 64);
  }
}

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::array<uint8_t, 48> DataLoaderState::to_bytes() const {
  std::array<uint8_t, 48> b{};
  const uint64_t fields[6] = {kVersion, seed, epoch, cursor, windows, fingerprint};
  for (int i = 0; i < 6; ++i) put_u64(b.data() + 8 * i, fields[i]);
  return b;
}

DataLoaderState DataLoaderState::from_bytes(std::span<const uint8_t> bytes) {
  FP4MOE_CHECK(bytes.size() == 48, "data loader state: {} bytes, expected 48", bytes.size());
  const uint64_t version = get_u64(bytes.data());
  FP4MOE_CHECK(version == kVersion, "data loader state: version {}, expected {}", version, kVersion);
  DataLoaderState s;
  s.seed = get_u64(bytes.data() + 8);
  s.epoch = get_u64(bytes.data() + 16);
  s.cursor = get_u64(bytes.data() + 24);
  s.windows = get_u64(bytes.data() + 32);
  s.fingerprint = get_u64(bytes.data() + 40);
  return s;
}

DataLoader::DataLoader(DataLoaderConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  FP4MOE_CHECK(!c.shard_paths.empty(), "data loader: no token shard given (expected the files of `make data`)");
  FP4MOE_CHECK(c.vocab_size >= 1 && c.vocab_size <= 65536,
               "data loader: model vocab_size {} must be in [1, 65536] (uint16 tokens)", c.vocab_size);
  FP4MOE_CHECK(c.batch_size >= 1, "data loader: batch size B must be >= 1, got {}", c.batch_size);
  FP4MOE_CHECK(c.seq_len >= 1, "data loader: sequence length T must be >= 1, got {}", c.seq_len);
  FP4MOE_CHECK(c.world >= 1 && c.rank >= 0 && c.rank < c.world, "data loader: rank {} outside [0, world={})", c.rank,
               c.world);

  const auto T = static_cast<uint64_t>(c.seq_len);
  std::vector<uint8_t> fp;  // what the fingerprint covers
  auto add = [&fp](uint64_t v) {
    for (int i = 0; i < 8; ++i) fp.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  add(T);
  add(c.shuffle ? 1 : 0);
  first_window_.push_back(0);
  for (const auto& path : c.shard_paths) {
    shards_.emplace_back(path, c.vocab_size, c.verify_checksums);
    const TokenShardHeader& h = shards_.back().header();
    FP4MOE_CHECK(h.eot_token == shards_.front().header().eot_token,
                 "data loader: token shard '{}' has end-of-text token {}, '{}' has {} (shards of different "
                 "tokenizers)", path, h.eot_token, shards_.front().path(), shards_.front().header().eot_token);
    const uint64_t n = h.token_count;
    windows_ += n >= 1 ? (n - 1) / T : 0;
    first_window_.push_back(windows_);
    add(n);
    add(h.payload_crc32);
    add(h.vocab_size);
  }
  fingerprint_ = crc32(fp.data(), fp.size());
  FP4MOE_CHECK(windows_ >= rows_per_step(),
               "data loader: the {} shard(s) hold {} windows of T+1={} tokens, fewer than one global batch of "
               "B*world = {}*{} rows", shards_.size(), windows_, T + 1, c.batch_size, c.world);
  build_order();
}

void DataLoader::build_order() {
  order_.clear();
  if (!config_.shuffle) return;
  order_.resize(windows_);
  for (uint64_t i = 0; i < windows_; ++i) order_[i] = i;
  // The stream for (seed, epoch): one splitmix64 state derived from both.
  uint64_t state = config_.seed;
  state = splitmix64(state) ^ (epoch_ * 0xD1B54A32D192ED03ull);
  for (uint64_t i = windows_; i > 1; --i) std::swap(order_[i - 1], order_[below(state, i)]);
}

uint64_t DataLoader::window_at(uint64_t p) const { return config_.shuffle ? order_[p] : p; }

const uint16_t* DataLoader::window_tokens(uint64_t w) const {
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), w);
  const auto s = static_cast<size_t>(it - first_window_.begin()) - 1;
  return shards_[s].tokens().data() + (w - first_window_[s]) * static_cast<uint64_t>(config_.seq_len);
}

template <typename T>
void DataLoader::fill(std::span<T> out) {
  const auto B = static_cast<uint64_t>(config_.batch_size);
  const auto row = static_cast<uint64_t>(config_.seq_len) + 1;
  FP4MOE_CHECK(out.size() == B * row, "data loader: batch buffer holds {} tokens, expected B*(T+1) = {}*{} = {}",
               out.size(), B, row, B * row);
  if (cursor_ + rows_per_step() > windows_) {  // not enough windows left for a whole global step: next epoch
    ++epoch_;
    cursor_ = 0;
    build_order();
  }
  const uint64_t first = cursor_ + static_cast<uint64_t>(config_.rank) * B;
  for (uint64_t b = 0; b < B; ++b) {
    const uint16_t* src = window_tokens(window_at(first + b));
    T* dst = out.data() + b * row;
    for (uint64_t t = 0; t < row; ++t) dst[t] = static_cast<T>(src[t]);
  }
  cursor_ += rows_per_step();
}

void DataLoader::next_batch(std::span<int32_t> out) { fill(out); }
void DataLoader::next_batch(std::span<uint16_t> out) { fill(out); }

DataLoaderState DataLoader::state() const { return {config_.seed, epoch_, cursor_, windows_, fingerprint_}; }

void DataLoader::restore(const DataLoaderState& s) {
  FP4MOE_CHECK(s.seed == config_.seed, "data loader: saved state has seed {}, this loader was configured with {}",
               s.seed, config_.seed);
  FP4MOE_CHECK(s.windows == windows_ && s.fingerprint == fingerprint_,
               "data loader: saved state is for {} windows (fingerprint {:#x}), these shards and T give {} "
               "(fingerprint {:#x}): different shards, sequence length or shuffle setting",
               s.windows, s.fingerprint, windows_, fingerprint_);
  FP4MOE_CHECK(s.cursor <= windows_, "data loader: saved cursor {} is past the {} windows", s.cursor, windows_);
  const bool rebuild = s.epoch != epoch_ || (config_.shuffle && order_.empty());
  epoch_ = s.epoch;
  cursor_ = s.cursor;
  if (rebuild) build_order();
}

// NNN of "SPLIT_NNN.bin", or -1 when `name` is not a shard of `split` (compared as plain text: a split name is not
// a pattern). At most 9 digits, so that the number always fits.
static int64_t shard_number(const std::string& name, const std::string& split) {
  const std::string prefix = split + "_", suffix = ".bin";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::string folder_for_message(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::path(path).is_absolute()) return fmt::format("'{}'", path);
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return ec ? fmt::format("'{}' (relative to the working directory)", path)
            : fmt::format("'{}' (relative to the working directory: {})", path,
                          absolute.lexically_normal().string());
}

std::string tokenizer_model_of_shards(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const fs::path& model : {fs::path(dir) / "spm.model", fs::path(dir) / ".." / "tokenizer" / "spm.model"})
    if (fs::is_regular_file(model, ec)) return model.lexically_normal().string();
  return "";
}

// Rejects a shard of `shard_paths` whose header names another tokenizer than the model beside them, if any.
static void check_shards_tokenizer(const std::string& dir, const std::vector<std::string>& shard_paths) {
  const std::string model = tokenizer_model_of_shards(dir);
  if (model.empty()) return;
  const uint32_t model_crc = tokenizer_model_crc32(model);
  for (const std::string& path : shard_paths) {
    const uint32_t shard_crc = TokenShard(path, 0, /*verify_payload=*/false).header().tokenizer_crc32;
    FP4MOE_CHECK(shard_crc == 0 || shard_crc == model_crc,
                 "token shard '{}': made with the tokenizer of CRC-32 {:#010x}, but the tokenizer model '{}' beside "
                 "the shards has CRC-32 {:#010x} (stale shards of another tokenizer); rebuild them with {}",
                 path, shard_crc, model, model_crc, make_data_command(dir));
  }
}

std::vector<std::string> find_token_shards(const std::string& dir, const std::string& split) {
  namespace fs = std::filesystem;
  std::error_code ec;
  FP4MOE_CHECK(fs::is_directory(dir, ec), "token shards: {} is not a folder (make them with {})",
               folder_for_message(dir), make_data_command(dir));
  FP4MOE_CHECK(!split.empty() && split.find('/') == std::string::npos,
               "token shards: split name '{}' must be a non-empty file name prefix such as train or val", split);
  std::map<int64_t, std::string> found;
  fs::directory_iterator it(dir, ec), end;
  FP4MOE_CHECK(!ec, "token shards: cannot list '{}': {}", dir, ec.message());
  for (; it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t index = shard_number(name, split);
    if (index >= 0 && it->is_regular_file(ec)) found.emplace(index, it->path().string());
  }
  FP4MOE_CHECK(!ec, "token shards: cannot list '{}': {}", dir, ec.message());
  FP4MOE_CHECK(!found.empty(), "token shards: no {}_NNN.bin in {} (make them with {})", split,
               folder_for_message(dir), make_data_command(dir));
  std::vector<std::string> paths;
  for (const auto& [index, path] : found) {
    FP4MOE_CHECK(index == static_cast<int64_t>(paths.size()),
                 "token shards: {}_{:03d}.bin is missing from '{}' (the next one present is {}); rebuild them with {}",
                 split, paths.size(), dir, path, make_data_command(dir));
    paths.push_back(path);
  }
  check_shards_tokenizer(dir, paths);
  return paths;
}

}  // namespace fp4moe
