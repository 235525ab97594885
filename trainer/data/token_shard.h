// Token shards: the training data on disk, written by `make data` (scripts/data/token_shard.py) and read here.
//
// Format version 1. A shard is a 64-byte header followed by token_count tokens, each a little-endian uint16.
// Documents are concatenated, each followed by the end-of-text token, so document_count = number of eot_token in
// the payload. File size = 64 + 2 * token_count exactly. Header, integers little-endian:
//
//   offset size field
//        0    8 magic            "FP4MTOK\0"
//        8    4 format_version   1
//       12    4 header_bytes     64
//       16    4 vocab_size       tokenizer vocabulary; every token < vocab_size <= 65536
//       20    4 eot_token        end-of-text id (sentencepiece's </s>, id 2 in `make data`'s tokenizer)
//       24    8 token_count
//       32    8 document_count   number of eot_token in the payload
//       40    4 token_bytes      2 (uint16 tokens)
//       44    4 payload_crc32    CRC-32 (ISO-HDLC, zlib's crc32) of the token bytes
//       48    4 tokenizer_crc32  CRC-32 of the sentencepiece .model file the shard was made with (0: unknown), as
//                                tokenizer_model_crc32 computes it
//       52    4 header_crc32     CRC-32 of header bytes 0..51
//       56    8 reserved         zero
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace fp4moe {

inline constexpr char kTokenShardMagic[8] = {'F', 'P', '4', 'M', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr uint32_t kTokenShardHeaderBytes = 64;
inline constexpr uint32_t kTokenShardTokenBytes = 2;

// The header as laid out on disk (this struct is only ever read from / written to little-endian bytes).
struct TokenShardHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t header_bytes;
  uint32_t vocab_size;
  uint32_t eot_token;
  uint64_t token_count;
  uint64_t document_count;
  uint32_t token_bytes;
  uint32_t payload_crc32;
  uint32_t tokenizer_crc32;
  uint32_t header_crc32;
  uint8_t reserved[8];
};
static_assert(sizeof(TokenShardHeader) == kTokenShardHeaderBytes, "token shard header must be 64 bytes");
static_assert(offsetof(TokenShardHeader, token_count) == 24 && offsetof(TokenShardHeader, header_crc32) == 52,
              "token shard header layout");

// CRC-32/ISO-HDLC (polynomial 0xEDB88320 reflected, init and final xor 0xFFFFFFFF), the CRC of zlib and PNG.
// `crc` continues a previous result: crc32(b, nb, crc32(a, na)) == crc32(a ++ b).
uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

// CRC-32 of header bytes 0..51 (the header_crc32 field covers everything before it).
uint32_t token_shard_header_crc32(const TokenShardHeader& h);

// CRC-32 of the whole file at `path`, read in 1 MiB chunks: the tokenizer_crc32 of shards made with the
// sentencepiece model at `path` (scripts/data/token_shard.py's tokenizer_crc32 is the same function). Throws
// fp4moe::Error naming the file when it cannot be opened or read.
uint32_t tokenizer_model_crc32(const std::string& path);

// The command that makes, or rebuilds, the token shards of folder `shard_dir`, for error messages:
// "`make data`" for data/cache/shards (the Makefile's default DATA_CACHE, relative to the repository root),
// "`make data DATA_CACHE=<absolute parent>`" for another folder named shards (make data writes DATA_CACHE/shards),
// and "`make data` (it writes DATA_CACHE/shards)" for a folder of any other name.
std::string make_data_command(const std::string& shard_dir);

// Writes a shard at `path` (to path + ".tmp-<pid>", one temporary per writer process, then renamed): tokens
// [token_count] uint16, documents delimited by eot_token. Fills document_count and the CRCs. Throws fp4moe::Error
// for vocab_size outside [1, 65536], an eot_token or a token not below vocab_size, or an I/O failure. Returns the
// header written.
TokenShardHeader write_token_shard(const std::string& path, std::span<const uint16_t> tokens, uint32_t vocab_size,
                                   uint32_t eot_token, uint32_t tokenizer_crc32 = 0);

// A read-only, memory-mapped shard. Opening validates, and throws fp4moe::Error naming the file and what was
// wrong for: a missing or unreadable file; a file shorter than the header or whose size is not
// 64 + 2 * token_count (truncated, or trailing bytes); a wrong magic, format version, header size or token width;
// a header CRC mismatch; vocab_size outside [1, 65536] or eot_token not below it; a vocabulary different from
// `expected_vocab_size` (the model's; 0 accepts any). With `verify_payload` (default), it also reads every token
// once: payload CRC mismatch, a token not below vocab_size, or an end-of-text count different from
// document_count are rejected. The message of a missing or damaged shard ends with the command that rebuilds it
// (make_data_command).
class TokenShard {
 public:
  TokenShard(const std::string& path, uint32_t expected_vocab_size, bool verify_payload = true);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const TokenShardHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  // The tokens [token_count], uint16, in the mapped file (valid while this object lives).
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(header_.token_count)}; }

 private:
  void unmap() noexcept;

  std::string path_;
  TokenShardHeader header_{};
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
};

}  // namespace fp4moe
