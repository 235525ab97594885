#include "trainer/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "kernels/common/check.h"

namespace fp4moe {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian; this reader maps them");

namespace {

constexpr std::array<uint32_t, 256> make_crc32_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32Table = make_crc32_table();

std::string magic_text(const char* m) {
  std::string s;
  for (int i = 0; i < 8; ++i) {
    unsigned char c = static_cast<unsigned char>(m[i]);
    s += (c >= 0x20 && c < 0x7F) ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return s;
}

}  // namespace

uint32_t crc32(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < bytes; ++i) c = kCrc32Table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t tokenizer_model_crc32(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  FP4MOE_CHECK(f != nullptr, "tokenizer model '{}': cannot open: {}", path, std::strerror(errno));
  std::vector<uint8_t> chunk(1 << 20);
  uint32_t crc = 0;
  size_t got = 0;
  while ((got = std::fread(chunk.data(), 1, chunk.size(), f)) > 0) crc = crc32(chunk.data(), got, crc);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  FP4MOE_CHECK(!failed, "tokenizer model '{}': read failed", path);
  return crc;
}

std::string make_data_command(const std::string& shard_dir) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(shard_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "a/shards/" -> "a/shards"
  if (dir == fs::path("data/cache/shards")) return "`make data`";
  if (dir.filename() != "shards") return "`make data` (it writes DATA_CACHE/shards)";
  std::error_code ec;
  const fs::path absolute = fs::absolute(dir, ec);
  return fmt::format("`make data DATA_CACHE={}`", (ec ? dir : absolute).parent_path().string());
}

uint32_t token_shard_header_crc32(const TokenShardHeader& h) {
  return crc32(&h, offsetof(TokenShardHeader, header_crc32));
}

TokenShardHeader write_token_shard(const std::string& path, std::span<const uint16_t> tokens, uint32_t vocab_size,
                                   uint32_t eot_token, uint32_t tokenizer_crc32) {
  FP4MOE_CHECK(vocab_size >= 1 && vocab_size <= 65536,
               "token shard '{}': vocab_size must be in [1, 65536] for uint16 tokens, got {}", path, vocab_size);
  FP4MOE_CHECK(eot_token < vocab_size, "token shard '{}': eot_token {} is not below vocab_size {}", path, eot_token,
               vocab_size);
  TokenShardHeader h{};
  std::memcpy(h.magic, kTokenShardMagic, 8);
  h.format_version = kTokenShardVersion;
  h.header_bytes = kTokenShardHeaderBytes;
  h.vocab_size = vocab_size;
  h.eot_token = eot_token;
  h.token_count = tokens.size();
  h.token_bytes = kTokenShardTokenBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    FP4MOE_CHECK(tokens[i] < vocab_size, "token shard '{}': token {} at position {} is not below vocab_size {}",
                 path, tokens[i], i, vocab_size);
    h.document_count += tokens[i] == eot_token;
  }
  h.payload_crc32 = crc32(tokens.data(), tokens.size_bytes());
  h.tokenizer_crc32 = tokenizer_crc32;
  h.header_crc32 = token_shard_header_crc32(h);

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());  // one temporary per writer
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  FP4MOE_CHECK(f != nullptr, "token shard '{}': cannot create: {}", tmp, std::strerror(errno));
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1 &&
            (tokens.empty() || std::fwrite(tokens.data(), tokens.size_bytes(), 1, f) == 1);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) std::remove(tmp.c_str());
  FP4MOE_CHECK(ok, "token shard '{}': write failed", tmp);
  FP4MOE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "token shard '{}': cannot rename from '{}': {}", path,
               tmp, std::strerror(errno));
  return h;
}

TokenShard::TokenShard(const std::string& path, uint32_t expected_vocab_size, bool verify_payload) : path_(path) {
  // What every message of a missing or damaged shard ends with.
  const std::string fix = "rebuild it with " + make_data_command(std::filesystem::path(path).parent_path().string());
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FP4MOE_CHECK(fd >= 0, "token shard '{}': cannot open: {}; {}", path, std::strerror(errno), fix);
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    FP4MOE_CHECK(false, "token shard '{}': cannot stat: {}", path, std::strerror(err));
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kTokenShardHeaderBytes) {
    ::close(fd);
    FP4MOE_CHECK(false, "token shard '{}': {} bytes, shorter than the {}-byte header (truncated); {}", path,
                 file_bytes, kTokenShardHeaderBytes, fix);
  }
  map_ = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    FP4MOE_CHECK(false, "token shard '{}': mmap of {} bytes failed: {}", path, file_bytes, std::strerror(map_err));
  }
  map_bytes_ = file_bytes;
  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    std::memcpy(&header_, bytes, sizeof header_);
    const TokenShardHeader& h = header_;
    FP4MOE_CHECK(std::string_view(h.magic, 8) == std::string_view(kTokenShardMagic, 8),
                 "token shard '{}': magic \"{}\", expected \"{}\" (not a token shard); {}", path,
                 magic_text(h.magic), magic_text(kTokenShardMagic), fix);
    FP4MOE_CHECK(h.format_version == kTokenShardVersion,
                 "token shard '{}': format version {}, this reader reads version {}; {}", path, h.format_version,
                 kTokenShardVersion, fix);
    FP4MOE_CHECK(h.header_bytes == kTokenShardHeaderBytes, "token shard '{}': header_bytes {}, expected {}; {}",
                 path, h.header_bytes, kTokenShardHeaderBytes, fix);
    FP4MOE_CHECK(token_shard_header_crc32(h) == h.header_crc32,
                 "token shard '{}': header CRC-32 {:#010x} does not match the stored {:#010x} (corrupted header); {}",
                 path, token_shard_header_crc32(h), h.header_crc32, fix);
    FP4MOE_CHECK(h.token_bytes == kTokenShardTokenBytes, "token shard '{}': token_bytes {}, expected {} (uint16); {}",
                 path, h.token_bytes, kTokenShardTokenBytes, fix);
    const uint64_t expected_bytes = kTokenShardHeaderBytes + uint64_t{kTokenShardTokenBytes} * h.token_count;
    FP4MOE_CHECK(h.token_count <= (UINT64_MAX - kTokenShardHeaderBytes) / 2 && file_bytes == expected_bytes,
                 "token shard '{}': {} bytes, expected {} for {} tokens ({}); {}", path, file_bytes, expected_bytes,
                 h.token_count, file_bytes < expected_bytes ? "truncated" : "trailing bytes", fix);
    FP4MOE_CHECK(h.vocab_size >= 1 && h.vocab_size <= 65536 && h.eot_token < h.vocab_size,
                 "token shard '{}': vocab_size {} and eot_token {} are invalid (expected eot_token < vocab_size "
                 "<= 65536); {}", path, h.vocab_size, h.eot_token, fix);
    FP4MOE_CHECK(expected_vocab_size == 0 || h.vocab_size == expected_vocab_size,
                 "token shard '{}': vocabulary of {} tokens, the model expects {} (shards and model must come from "
                 "the same tokenizer)", path, h.vocab_size, expected_vocab_size);
    tokens_ = reinterpret_cast<const uint16_t*>(bytes + kTokenShardHeaderBytes);
    if (verify_payload) {
      const auto toks = tokens();
      const uint32_t crc = crc32(toks.data(), toks.size_bytes());
      FP4MOE_CHECK(crc == h.payload_crc32,
                   "token shard '{}': payload CRC-32 {:#010x} does not match the header's {:#010x} (corrupted "
                   "tokens); {}", path, crc, h.payload_crc32, fix);
      uint64_t eot = 0;
      uint16_t max_token = 0;
      for (uint16_t t : toks) {
        eot += t == h.eot_token;
        max_token = t > max_token ? t : max_token;
      }
      FP4MOE_CHECK(toks.empty() || max_token < h.vocab_size,
                   "token shard '{}': token {} is not below vocab_size {}; {}", path, max_token, h.vocab_size, fix);
      FP4MOE_CHECK(eot == h.document_count,
                   "token shard '{}': {} end-of-text tokens ({}), header says {} documents; {}", path, eot,
                   h.eot_token, h.document_count, fix);
    }
  } catch (...) {
    unmap();
    throw;
  }
}

TokenShard::~TokenShard() { unmap(); }

void TokenShard::unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)), header_(other.header_), map_(other.map_), map_bytes_(other.map_bytes_),
      tokens_(other.tokens_) {
  other.map_ = nullptr;
  other.map_bytes_ = 0;
  other.tokens_ = nullptr;
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    header_ = other.header_;
    map_ = other.map_;
    map_bytes_ = other.map_bytes_;
    tokens_ = other.tokens_;
    other.map_ = nullptr;
    other.map_bytes_ = 0;
    other.tokens_ = nullptr;
  }
  return *this;
}

}  // namespace fp4moe
