// Token shards and the data loader (trainer/data/): the on-disk header layout, rejection of every kind of bad shard
// (each message must name the file, the fault and the `make data` command that rebuilds it), shards of another
// tokenizer than the one beside them, window geometry, determinism per seed, disjoint ranks, resume from a saved
// state, and, when `make data` has run, the real shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "trainer/config.h"
#include "trainer/data/loader.h"
#include "trainer/data/token_shard.h"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test under the system temporary folder, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("fp4moe_data_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
uint32_t u32_at(const std::vector<uint8_t>& b, size_t off) {
  return b[off] | (b[off + 1] << 8) | (b[off + 2] << 16) | (static_cast<uint32_t>(b[off + 3]) << 24);
}
uint64_t u64_at(const std::vector<uint8_t>& b, size_t off) {
  return u32_at(b, off) | (static_cast<uint64_t>(u32_at(b, off + 4)) << 32);
}
void put_u32(std::vector<uint8_t>& b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(std::vector<uint8_t>& b, size_t off, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
// Re-seals a hand-edited header so that only the edited field is wrong.
void reseal_header(std::vector<uint8_t>& b) { put_u32(b, 52, crc32(b.data(), 52)); }

// Seeded random tokens below `vocab`, with the end-of-text token `eot` after documents of random length.
std::vector<uint16_t> random_tokens(size_t n, uint32_t vocab, uint16_t eot, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> tok(0, vocab - 1), doc_len(1, 200);
  std::vector<uint16_t> t;
  size_t left = doc_len(rng);
  while (t.size() < n) {
    if (left-- == 0) {
      t.push_back(eot);
      left = doc_len(rng);
      continue;
    }
    uint16_t v = static_cast<uint16_t>(tok(rng));
    t.push_back(v == eot ? static_cast<uint16_t>((v + 1) % vocab) : v);
  }
  return t;
}

// The message of the fp4moe::Error thrown by f, or "" when nothing is thrown.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REJECTED(stmt, path, fault)                                   \
  do {                                                                       \
    const std::string msg_ = error_of([&] { stmt; });                        \
    EXPECT_NE(msg_.find(path), std::string::npos) << "message: " << msg_;    \
    EXPECT_NE(msg_.find(fault), std::string::npos) << "message: " << msg_;   \
  } while (0)

// ---------------------------------------------------------------------------------------------------------------
// CRC-32 and the header layout

TEST(Crc32, MatchesTheIsoHdlcCheckValueAndContinues) {
  const char* check = "123456789";  // the catalogue check input of CRC-32/ISO-HDLC, whose check value is 0xCBF43926
  EXPECT_EQ(crc32(check, 9), 0xCBF43926u);
  EXPECT_EQ(crc32(check + 4, 5, crc32(check, 4)), crc32(check, 9));
  EXPECT_EQ(crc32(check, 0), 0u);
}

TEST(TokenShard, HeaderRoundTripsAndMatchesTheDocumentedByteLayout) {
  TempDir dir;
  const auto tokens = random_tokens(5003, 32768, 2, 7);
  const auto path = dir.file("train_000.bin");
  const TokenShardHeader written = write_token_shard(path, tokens, 32768, 2, 0xA1B2C3D4u);
  const auto expected_docs = static_cast<uint64_t>(std::count(tokens.begin(), tokens.end(), uint16_t{2}));
  ASSERT_GT(expected_docs, 0u);

  const auto b = read_bytes(path);
  ASSERT_EQ(b.size(), 64 + 2 * tokens.size());
  EXPECT_EQ(std::memcmp(b.data(), "FP4MTOK\0", 8), 0);
  EXPECT_EQ(u32_at(b, 8), 1u);       // format_version
  EXPECT_EQ(u32_at(b, 12), 64u);     // header_bytes
  EXPECT_EQ(u32_at(b, 16), 32768u);  // vocab_size
  EXPECT_EQ(u32_at(b, 20), 2u);      // eot_token
  EXPECT_EQ(u64_at(b, 24), tokens.size());
  EXPECT_EQ(u64_at(b, 32), expected_docs);
  EXPECT_EQ(u32_at(b, 40), 2u);  // token_bytes
  EXPECT_EQ(u32_at(b, 44), crc32(b.data() + 64, 2 * tokens.size()));
  EXPECT_EQ(u32_at(b, 48), 0xA1B2C3D4u);
  EXPECT_EQ(u32_at(b, 52), crc32(b.data(), 52));
  for (int i = 56; i < 64; ++i) EXPECT_EQ(b[i], 0) << "reserved byte " << i;
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(b[64 + 2 * i] | (b[65 + 2 * i] << 8), tokens[i]) << i;

  const TokenShard shard(path, 32768);
  EXPECT_EQ(std::memcmp(&shard.header(), &written, sizeof written), 0);
  EXPECT_EQ(shard.header().document_count, expected_docs);
  ASSERT_EQ(shard.tokens().size(), tokens.size());
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens().begin()));
  EXPECT_EQ(shard.path(), path);
}

TEST(TokenShard, EmptyShardOpens) {
  TempDir dir;
  const auto path = dir.file("empty.bin");
  write_token_shard(path, {}, 100, 2);
  const TokenShard shard(path, 100);
  EXPECT_EQ(shard.tokens().size(), 0u);
  EXPECT_EQ(shard.header().document_count, 0u);
}

TEST(TokenShard, WriterRejectsTokensOutsideTheVocabulary) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {5, 7, 100, 2};
  EXPECT_REJECTED(write_token_shard(dir.file("a.bin"), tokens, 100, 2), "a.bin", "not below vocab_size 100");
  EXPECT_REJECTED(write_token_shard(dir.file("b.bin"), tokens, 200, 200), "b.bin", "eot_token 200");
  EXPECT_REJECTED(write_token_shard(dir.file("c.bin"), tokens, 70000, 2), "c.bin", "[1, 65536]");
  EXPECT_FALSE(fs::exists(dir.file("a.bin")));
}

// ---------------------------------------------------------------------------------------------------------------
// Rejection of bad shards: one fault at a time, the rest of the file kept valid.

class BadShard : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("train_003.bin");
    write_token_shard(path_, random_tokens(4000, 1000, 2, 11), 1000, 2);
    bytes_ = read_bytes(path_);
  }
  std::string open_error(uint32_t expected_vocab = 1000) {
    write_bytes(path_, bytes_);
    return error_of([&] { TokenShard s(path_, expected_vocab); });
  }
  TempDir dir_;
  std::string path_;
  std::vector<uint8_t> bytes_;
};

#define EXPECT_OPEN_FAILS(fault, ...)                                                   \
  do {                                                                                \
    const std::string msg_ = open_error(__VA_ARGS__);                                 \
    EXPECT_NE(msg_.find(path_), std::string::npos) << "message: " << msg_;            \
    EXPECT_NE(msg_.find(fault), std::string::npos) << "message: " << msg_;            \
    EXPECT_NE(msg_.find("rebuild it with `make data`"), std::string::npos)            \
        << "the message must name the repair; message: " << msg_;                     \
  } while (0)

TEST_F(BadShard, ValidShardOpens) { EXPECT_EQ(open_error(), ""); }

TEST_F(BadShard, MissingFile) {
  const auto missing = dir_.file("train_004.bin");
  EXPECT_REJECTED(TokenShard(missing, 1000), missing, "cannot open");
  EXPECT_REJECTED(TokenShard(missing, 1000), missing, "rebuild it with `make data`");
}

TEST_F(BadShard, TruncatedHeader) {
  bytes_.resize(40);
  EXPECT_OPEN_FAILS("shorter than the 64-byte header");
}

TEST_F(BadShard, EmptyFile) {
  bytes_.clear();
  EXPECT_OPEN_FAILS("truncated");
}

TEST_F(BadShard, TruncatedPayload) {
  bytes_.resize(bytes_.size() - 2);
  EXPECT_OPEN_FAILS("truncated");
  bytes_.resize(bytes_.size() - 1);  // an odd byte count
  EXPECT_OPEN_FAILS("truncated");
}

TEST_F(BadShard, TrailingBytes) {
  bytes_.push_back(0);
  bytes_.push_back(0);
  EXPECT_OPEN_FAILS("trailing bytes");
}

TEST_F(BadShard, WrongMagic) {
  std::memcpy(bytes_.data(), "GPT2TOK\0", 8);
  reseal_header(bytes_);
  EXPECT_OPEN_FAILS("not a token shard");
}

TEST_F(BadShard, WrongVersion) {
  put_u32(bytes_, 8, 2);
  reseal_header(bytes_);
  EXPECT_OPEN_FAILS("format version 2");
}

TEST_F(BadShard, WrongTokenWidth) {
  put_u32(bytes_, 40, 4);
  reseal_header(bytes_);
  EXPECT_OPEN_FAILS("token_bytes 4");
}

TEST_F(BadShard, CorruptedHeader) {
  put_u64(bytes_, 32, u64_at(bytes_, 32) + 1);  // document_count changed, header CRC not updated
  EXPECT_OPEN_FAILS("corrupted header");
}

TEST_F(BadShard, CorruptedPayload) {
  bytes_[64 + 2 * 1234] ^= 0x01;
  EXPECT_OPEN_FAILS("corrupted tokens");
}

TEST_F(BadShard, CorruptedPayloadPassesWithoutVerification) {
  bytes_[64 + 2 * 1234] ^= 0x01;
  write_bytes(path_, bytes_);
  EXPECT_EQ(error_of([&] { TokenShard s(path_, 1000, /*verify_payload=*/false); }), "");
}

TEST_F(BadShard, VocabularyMismatchWithTheModel) {
  EXPECT_REJECTED(TokenShard(path_, 32768), path_, "the model expects 32768");
}

TEST_F(BadShard, TokenOutsideTheVocabulary) {
  // A consistent file (CRCs right) whose header claims a smaller vocabulary than its tokens use.
  put_u32(bytes_, 16, 500);
  reseal_header(bytes_);
  EXPECT_OPEN_FAILS("is not below vocab_size 500", 500);
}

TEST_F(BadShard, DocumentCountMismatch) {
  put_u64(bytes_, 32, u64_at(bytes_, 32) + 1);
  reseal_header(bytes_);
  EXPECT_OPEN_FAILS("documents");
}

TEST_F(BadShard, EotTokenOutsideTheVocabulary) {
  put_u32(bytes_, 20, 1000);
  reseal_header(bytes_);
  EXPECT_OPEN_FAILS("eot_token 1000");
}

// ---------------------------------------------------------------------------------------------------------------
// The repair command, the tokenizer checksum, relative folders

TEST(TokenShardRepair, MessagesNameTheMakeDataCommandOfTheirCache) {
  EXPECT_EQ(make_data_command("data/cache/shards"), "`make data`");
  EXPECT_EQ(make_data_command("./data/cache/shards/"), "`make data`");
  EXPECT_EQ(make_data_command("/scratch/c/shards"), "`make data DATA_CACHE=/scratch/c`");
  EXPECT_EQ(make_data_command("other/shards"),
            fmt::format("`make data DATA_CACHE={}`", (fs::current_path() / "other").string()));
  EXPECT_EQ(make_data_command("/scratch/tokens"), "`make data` (it writes DATA_CACHE/shards)");

  // A truncated and a corrupted shard of a cache elsewhere: the message names that cache.
  TempDir dir;
  fs::create_directories(dir.file("cache/shards"));
  const std::string path = dir.file("cache/shards/train_000.bin");
  const std::string cache = fs::path(dir.file("cache")).lexically_normal().string();
  write_token_shard(path, random_tokens(3000, 1000, 2, 5), 1000, 2);
  auto bytes = read_bytes(path);
  bytes[64 + 2 * 7] ^= 0x10;
  write_bytes(path, bytes);
  EXPECT_REJECTED(TokenShard(path, 1000), path, "(corrupted tokens); rebuild it with `make data DATA_CACHE=" + cache);
  bytes.resize(bytes.size() - 6);
  write_bytes(path, bytes);
  EXPECT_REJECTED(TokenShard(path, 1000), path, "(truncated); rebuild it with `make data DATA_CACHE=" + cache);
}

TEST(TokenizerChecksum, IsTheCrc32OfTheWholeModelFile) {
  TempDir dir;
  write_bytes(dir.file("check.model"), std::vector<uint8_t>{'1', '2', '3', '4', '5', '6', '7', '8', '9'});
  EXPECT_EQ(tokenizer_model_crc32(dir.file("check.model")), 0xCBF43926u);  // zlib.crc32(b"123456789")
  std::vector<uint8_t> big(3 * (1 << 20) + 17);  // more than one 1 MiB read
  std::mt19937 rng(3);
  for (auto& b : big) b = static_cast<uint8_t>(rng());
  write_bytes(dir.file("big.model"), big);
  EXPECT_EQ(tokenizer_model_crc32(dir.file("big.model")), crc32(big.data(), big.size()));
  EXPECT_REJECTED(tokenizer_model_crc32(dir.file("none.model")), "none.model", "cannot open");
}

// A `make data` layout under a temporary folder: cache/shards/{train,val}_000.bin and cache/tokenizer/spm.model.
struct CacheLayout {
  TempDir dir;
  std::string shards = dir.file("cache/shards"), model = dir.file("cache/tokenizer/spm.model");
  std::vector<uint8_t> model_bytes = std::vector<uint8_t>(5000, 0x5A);
  uint32_t model_crc = crc32(model_bytes.data(), model_bytes.size());

  CacheLayout() {
    fs::create_directories(shards);
    fs::create_directories(fs::path(model).parent_path());
    write_bytes(model, model_bytes);
    write_shards(model_crc);
  }
  void write_shards(uint32_t tokenizer_crc) const {
    for (const char* name : {"train_000.bin", "val_000.bin"})
      write_token_shard((fs::path(shards) / name).string(), random_tokens(500, 1000, 2, 1), 1000, 2, tokenizer_crc);
  }
};

TEST(FindTokenShards, RefusesShardsOfAnotherTokenizerThanTheOneBesideThem) {
  CacheLayout c;
  EXPECT_EQ(find_token_shards(c.shards, "train").size(), 1u);  // made with the model beside them
  c.write_shards(0);                                            // made with an unknown tokenizer: accepted
  EXPECT_EQ(find_token_shards(c.shards, "val").size(), 1u);

  const uint32_t stale = c.model_crc ^ 0x00FF00FFu;
  c.write_shards(stale);
  const std::string msg = error_of([&] { find_token_shards(c.shards, "train"); });
  for (const std::string& part : {std::string("train_000.bin"), fmt::format("{:#010x}", stale),
                                  fmt::format("{:#010x}", c.model_crc), std::string("stale shards"),
                                  std::string("`make data DATA_CACHE=")})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;

  // The model in the shard folder itself is used as well; without any model nothing is compared.
  fs::rename(c.model, fs::path(c.shards) / "spm.model");
  EXPECT_NE(error_of([&] { find_token_shards(c.shards, "val"); }).find("stale shards"), std::string::npos);
  fs::remove(fs::path(c.shards) / "spm.model");
  EXPECT_EQ(error_of([&] { find_token_shards(c.shards, "val"); }), "");
}

TEST(FindTokenShards, ARelativeFolderIsNamedWithTheWorkingDirectory) {
  const std::string relative = "no_such_folder_of_shards/shards";
  const std::string tried = (fs::current_path() / relative).string();
  for (const std::string& msg : {error_of([&] { find_token_shards(relative, "train"); }), error_of([&] {
         TrainerConfig cfg;
         cfg.train.data_dir = relative;
         validate_data(cfg);
       })}) {
    EXPECT_NE(msg.find("relative to the working directory"), std::string::npos) << msg;
    EXPECT_NE(msg.find(tried), std::string::npos) << msg;
    EXPECT_NE(msg.find("make data DATA_CACHE="), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The loader

constexpr uint32_t kVocab = 65536;
constexpr uint16_t kEot = 0;

// Shards whose tokens tell their global position: token at global position p is 1 + p, except every 37th, which is
// the end-of-text token; so any row can be located in the stream.
struct NumberedShards {
  std::vector<std::string> paths;
  std::vector<uint64_t> sizes;
  std::vector<uint16_t> all;  // the concatenation
};

NumberedShards numbered_shards(const TempDir& dir, const std::vector<uint64_t>& sizes, const std::string& split) {
  NumberedShards s;
  uint64_t p = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint16_t> t;
    for (uint64_t k = 0; k < sizes[i]; ++k, ++p) t.push_back(p % 37 == 36 ? kEot : static_cast<uint16_t>(1 + p));
    s.all.insert(s.all.end(), t.begin(), t.end());
    s.paths.push_back(dir.file(fmt::format("{}_{:03d}.bin", split, i)));
    write_token_shard(s.paths.back(), t, kVocab, kEot);
  }
  s.sizes = sizes;
  return s;
}

DataLoaderConfig config_for(const NumberedShards& s, int64_t B, int64_t T, uint64_t seed, int rank = 0,
                            int world = 1) {
  DataLoaderConfig c;
  c.shard_paths = s.paths;
  c.vocab_size = kVocab;
  c.batch_size = B;
  c.seq_len = T;
  c.seed = seed;
  c.rank = rank;
  c.world = world;
  return c;
}

// The window (global number, counted as the loader documents) a row is, checking that the row is that window
// exactly; -1 when it is not a window.
int64_t window_of(const NumberedShards& s, int64_t T, std::span<const int32_t> row) {
  int64_t start = -1;
  for (int64_t k = 0; k < static_cast<int64_t>(row.size()); ++k)
    if (row[k] != kEot) {
      start = row[k] - 1 - k;
      break;
    }
  if (start < 0) return -1;
  uint64_t shard_begin = 0;
  int64_t windows_before = 0;
  for (uint64_t n : s.sizes) {
    if (static_cast<uint64_t>(start) < shard_begin + n) {
      const uint64_t off = start - shard_begin;
      if (off % T != 0 || off + T + 1 > n) return -1;
      for (int64_t k = 0; k <= T; ++k)
        if (row[k] != s.all[start + k]) return -1;
      return windows_before + static_cast<int64_t>(off / T);
    }
    shard_begin += n;
    windows_before += static_cast<int64_t>((n - 1) / T);
  }
  return -1;
}

std::vector<int32_t> batch(DataLoader& l) {
  std::vector<int32_t> out(l.config().batch_size * (l.config().seq_len + 1), -7);  // poisoned
  l.next_batch(out);
  return out;
}

TEST(DataLoader, CountsWindowsPerShardAndReturnsWholeWindows) {
  TempDir dir;
  const auto s = numbered_shards(dir, {1000, 17, 512, 8}, "train");
  const int64_t T = 16;
  DataLoader l(config_for(s, 4, T, 1));
  EXPECT_EQ(l.window_count(), (999 / 16) + (16 / 16) + (511 / 16) + (7 / 16));
  EXPECT_EQ(l.batches_per_epoch(), l.window_count() / 4);
  EXPECT_EQ(l.eot_token(), kEot);
  std::set<int64_t> seen;
  for (uint64_t step = 0; step < l.batches_per_epoch(); ++step) {
    const auto b = batch(l);
    for (int r = 0; r < 4; ++r) {
      const int64_t w = window_of(s, T, std::span<const int32_t>(b).subspan(r * (T + 1), T + 1));
      ASSERT_GE(w, 0) << "step " << step << " row " << r << " is not a window of the shards";
      EXPECT_TRUE(seen.insert(w).second) << "window " << w << " read twice in one epoch";
    }
  }
  EXPECT_EQ(seen.size(), l.batches_per_epoch() * 4);
  EXPECT_EQ(l.epoch(), 0u);
  batch(l);
  EXPECT_EQ(l.epoch(), 1u);
}

TEST(DataLoader, Int32AndUint16BatchesAgree) {
  TempDir dir;
  const auto s = numbered_shards(dir, {3000}, "train");
  DataLoader a(config_for(s, 3, 32, 5)), b(config_for(s, 3, 32, 5));
  for (int step = 0; step < 10; ++step) {
    const auto wide = batch(a);
    std::vector<uint16_t> narrow(wide.size(), 0xFFFF);
    b.next_batch(narrow);
    ASSERT_TRUE(std::equal(wide.begin(), wide.end(), narrow.begin())) << "step " << step;
  }
}

TEST(DataLoader, SameSeedSameBatchesOtherSeedOtherOrder) {
  TempDir dir;
  const auto s = numbered_shards(dir, {2000, 2000}, "train");
  DataLoader a(config_for(s, 2, 20, 42)), b(config_for(s, 2, 20, 42)), c(config_for(s, 2, 20, 43));
  bool differs = false;
  for (int step = 0; step < 250; ++step) {  // about 2.5 epochs
    const auto x = batch(a), y = batch(b), z = batch(c);
    ASSERT_EQ(x, y) << "step " << step;
    differs |= x != z;
  }
  EXPECT_TRUE(differs);
  EXPECT_GE(a.epoch(), 2u);
}

TEST(DataLoader, EpochsUseDifferentPermutations) {
  TempDir dir;
  const auto s = numbered_shards(dir, {4000}, "train");
  DataLoader l(config_for(s, 1, 10, 9));
  std::vector<int64_t> first, second;
  const uint64_t n = l.batches_per_epoch();
  for (uint64_t i = 0; i < 2 * n; ++i) (i < n ? first : second).push_back(window_of(s, 10, batch(l)));
  EXPECT_NE(first, second);
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  EXPECT_EQ(first, second);  // B*world = 1: every window in each epoch
}

TEST(DataLoader, UnshuffledReadsWindowsInFileOrder) {
  TempDir dir;
  const auto s = numbered_shards(dir, {300, 301}, "val");
  auto c = config_for(s, 4, 10, 0);
  c.shuffle = false;
  DataLoader l(c);
  for (int step = 0; step < 20; ++step) {
    const auto b = batch(l);
    for (int r = 0; r < 4; ++r) {
      const int64_t expect = (static_cast<int64_t>(step) * 4 + r) % static_cast<int64_t>(l.batches_per_epoch() * 4);
      EXPECT_EQ(window_of(s, 10, std::span<const int32_t>(b).subspan(r * 11, 11)), expect) << step << "," << r;
    }
  }
}

TEST(DataLoader, RanksReadDisjointSlicesOfTheGlobalBatch) {
  TempDir dir;
  const auto s = numbered_shards(dir, {5000, 3000}, "train");
  const int world = 3, B = 2, T = 24;
  DataLoader global(config_for(s, B * world, T, 77));
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(config_for(s, B, T, 77, r, world));
  std::set<int64_t> seen;
  for (uint64_t step = 0; step < global.batches_per_epoch() + 3; ++step) {
    const auto g = batch(global);
    for (int r = 0; r < world; ++r) {
      const auto part = batch(ranks[r]);
      ASSERT_TRUE(std::equal(part.begin(), part.end(), g.begin() + r * B * (T + 1)))
          << "step " << step << " rank " << r;
      if (step >= global.batches_per_epoch()) continue;
      for (int b = 0; b < B; ++b) {
        const auto row = std::span<const int32_t>(part).subspan(b * (T + 1), T + 1);
        EXPECT_TRUE(seen.insert(window_of(s, T, row)).second) << "a window read twice in one epoch";
      }
    }
  }
}

TEST(DataLoader, ResumesFromASavedStateAcrossEpochs) {
  TempDir dir;
  const auto s = numbered_shards(dir, {1500, 700}, "train");
  const auto cfg = config_for(s, 3, 16, 2024);
  DataLoader original(cfg);
  for (int i = 0; i < 30; ++i) batch(original);
  const auto saved = original.state().to_bytes();
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 60; ++i) expected.push_back(batch(original));  // crosses at least one epoch end
  EXPECT_GE(original.epoch(), 1u);

  DataLoader resumed(cfg);
  batch(resumed);  // a loader that has moved on must still land exactly on the saved point
  resumed.restore(DataLoaderState::from_bytes(saved));
  for (int i = 0; i < 60; ++i) ASSERT_EQ(batch(resumed), expected[i]) << "batch " << i << " after resume";

  resumed.reset();
  DataLoader fresh(cfg);
  EXPECT_EQ(batch(resumed), batch(fresh));
}

TEST(DataLoader, ResumesWithAnotherWorldSize) {
  TempDir dir;
  const auto s = numbered_shards(dir, {4000}, "train");
  DataLoader one(config_for(s, 4, 16, 3));
  for (int i = 0; i < 5; ++i) batch(one);
  const DataLoaderState st = one.state();
  const auto next_global = batch(one);  // 4 rows = what 2 ranks of B = 2 read next
  for (int r = 0; r < 2; ++r) {
    DataLoader rank(config_for(s, 2, 16, 3, r, 2));
    rank.restore(st);
    const auto part = batch(rank);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), next_global.begin() + r * 2 * 17)) << "rank " << r;
  }
}

TEST(DataLoader, RestoreRejectsAStateOfOtherDataOrSeed) {
  TempDir dir;
  const auto s = numbered_shards(dir, {3000}, "train");
  DataLoader l(config_for(s, 2, 16, 1));
  batch(l);
  const DataLoaderState st = l.state();
  DataLoader other_seed(config_for(s, 2, 16, 2));
  EXPECT_NE(error_of([&] { other_seed.restore(st); }).find("seed"), std::string::npos);
  DataLoader other_T(config_for(s, 2, 32, 1));
  EXPECT_NE(error_of([&] { other_T.restore(st); }).find("different shards, sequence length"), std::string::npos);
  TempDir dir2;
  const auto s2 = numbered_shards(dir2, {3001}, "train");
  DataLoader other_data(config_for(s2, 2, 16, 1));
  EXPECT_NE(error_of([&] { other_data.restore(st); }).find("different shards"), std::string::npos);
  auto bytes = st.to_bytes();
  bytes[0] = 9;
  EXPECT_NE(error_of([&] { DataLoaderState::from_bytes(bytes); }).find("version 9"), std::string::npos);
  EXPECT_EQ(DataLoaderState::from_bytes(st.to_bytes()), st);
}

TEST(DataLoader, RejectsBadConfigurations) {
  TempDir dir;
  const auto s = numbered_shards(dir, {200}, "train");
  auto c = config_for(s, 2, 16, 1);
  c.vocab_size = 32768;  // shard says 65536
  EXPECT_REJECTED(DataLoader{c}, s.paths[0], "the model expects 32768");
  c = config_for(s, 2, 16, 1, 2, 2);
  EXPECT_NE(error_of([&] { DataLoader l(c); }).find("rank 2 outside"), std::string::npos);
  c = config_for(s, 7, 16, 1);  // 12 windows < 7 * 2
  c.world = 2;
  EXPECT_NE(error_of([&] { DataLoader l(c); }).find("fewer than one global batch"), std::string::npos);
  c = config_for(s, 2, 16, 1);
  c.shard_paths.push_back(dir.file("train_009.bin"));
  EXPECT_REJECTED(DataLoader{c}, "train_009.bin", "cannot open");
  DataLoader l(config_for(s, 2, 16, 1));
  std::vector<int32_t> wrong(2 * 16);
  EXPECT_NE(error_of([&] { l.next_batch(wrong); }).find("expected B*(T+1)"), std::string::npos);
}

TEST(FindTokenShards, ListsInNumberOrderAndRejectsGaps) {
  TempDir dir;
  for (const char* name : {"train_002.bin", "train_000.bin", "train_001.bin", "val_000.bin", "train_000.bin.tmp"})
    write_token_shard(dir.file(name), std::vector<uint16_t>{1, 2, 3}, 10, 2);
  const auto dir_path = fs::path(dir.file("")).parent_path().string();
  const auto train = find_token_shards(dir_path, "train");
  ASSERT_EQ(train.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(fs::path(train[i]).filename().string(), fmt::format("train_{:03d}.bin", i));
  EXPECT_EQ(find_token_shards(dir_path, "val").size(), 1u);
  EXPECT_NE(error_of([&] { find_token_shards(dir_path, "test"); }).find("no test_NNN.bin"), std::string::npos);
  fs::remove(dir.file("train_001.bin"));
  EXPECT_NE(error_of([&] { find_token_shards(dir_path, "train"); }).find("train_001.bin is missing"),
            std::string::npos);
}

TEST(FindTokenShards, SplitIsPlainTextAndOddNamesAreIgnored) {
  TempDir dir;
  for (const char* name : {"a.b_000.bin", "aXb_000.bin", "aXb_001.bin", "a.b_99999999999999999999999.bin",
                           "a.b_.bin", "a.b_01x.bin", "a.b_001.bin.tmp"})
    write_token_shard(dir.file(name), std::vector<uint16_t>{1, 2, 3}, 10, 2);
  const auto dir_path = fs::path(dir.file("")).parent_path().string();
  const auto got = find_token_shards(dir_path, "a.b");  // '.' is a character here, not "any character"
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(fs::path(got[0]).filename().string(), "a.b_000.bin");
  EXPECT_NE(error_of([&] { find_token_shards(dir_path, "a("); }).find("no a(_NNN.bin"), std::string::npos);
  EXPECT_NE(error_of([&] { find_token_shards(dir_path, ""); }).find("split name '' must be"), std::string::npos);
  EXPECT_NE(error_of([&] { find_token_shards(dir_path, "x/y"); }).find("split name 'x/y' must be"),
            std::string::npos);
}

// The shards `make data` wrote, when present (FP4MOE_TOKEN_SHARDS, else data/cache/shards of this source tree):
// every shard validates and batches are windows of the 32768-token vocabulary.
TEST(MakeDataShards, ValidateAndBatch) {
  const char* env = std::getenv("FP4MOE_TOKEN_SHARDS");
  const fs::path dir = env ? fs::path(env) : fs::path(FP4MOE_SOURCE_DIR) / "data" /
                                                 "cache" / "shards";
  if (!fs::exists(dir / "train_000.bin") || !fs::exists(dir / "val_000.bin"))
    GTEST_SKIP() << "no shards in " << dir << " (run `make data` first)";
  for (const char* split : {"train", "val"}) {
    DataLoaderConfig c;
    c.shard_paths = find_token_shards(dir.string(), split);
    c.vocab_size = 32768;
    c.batch_size = 4;
    c.seq_len = 1024;
    c.seed = 1;
    DataLoader l(c);
    std::vector<int32_t> out(4 * 1025, -1);
    l.next_batch(out);
    for (int32_t t : out) ASSERT_TRUE(t >= 0 && t < 32768);
    uint64_t documents = 0;
    for (const auto& shard : l.shards()) documents += shard.header().document_count;
    EXPECT_GT(documents, 0u) << split;
  }
}

}  // namespace
}  // namespace fp4moe
