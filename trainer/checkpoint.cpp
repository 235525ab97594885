#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>
#include <utility>

#include "kernels/common/check.h"
#include "trainer/data/token_shard.h"

namespace fp4moe {

const char* checkpoint_dtype_name(CheckpointDtype t) {
  switch (t) {
    case CheckpointDtype::u8: return "u8";
    case CheckpointDtype::bf16: return "bf16";
    case CheckpointDtype::f32: return "f32";
    case CheckpointDtype::i32: return "i32";
    case CheckpointDtype::i64: return "i64";
    case CheckpointDtype::u64: return "u64";
  }
  return "unknown";
}

size_t checkpoint_dtype_bytes(CheckpointDtype t) {
  switch (t) {
    case CheckpointDtype::u8: return 1;
    case CheckpointDtype::bf16: return 2;
    case CheckpointDtype::f32: case CheckpointDtype::i32: return 4;
    case CheckpointDtype::i64: case CheckpointDtype::u64: return 8;
  }
  return 0;
}

const char* checkpoint_part_name(CheckpointPart p) {
  switch (p) {
    case CheckpointPart::whole: return "the whole model";
    case CheckpointPart::replicated: return "the ranks' replicated state";
    case CheckpointPart::expert_shard: return "one rank's routed experts";
  }
  return "unknown";
}

std::string checkpoint_file_name(uint64_t step) { return fmt::format("step_{:08d}.ckpt", step); }

std::string checkpoint_shard_path(const std::string& path, uint32_t rank, uint32_t world_size) {
  constexpr std::string_view suffix = ".ckpt";
  FP4MOE_CHECK(std::string_view(path).ends_with(suffix) && path.size() > suffix.size(),
               "checkpoint '{}': the replicated file of a checkpoint over ranks must be named <name>.ckpt", path);
  return fmt::format("{}.rank_{}_of_{}.ckpt", path.substr(0, path.size() - suffix.size()), rank, world_size);
}

namespace {

constexpr uint64_t kAlign = 64;
constexpr size_t kMaxName = 4096;
constexpr size_t kHeaderCrcOffset = 252;

const char* section_name(CheckpointSection s) {
  return s == CheckpointSection::model ? "model" : s == CheckpointSection::optimizer ? "optimizer" : "ranks";
}

// Whether (part, rank, world_size) is the whole model of one GPU or a part of a checkpoint over ranks.
bool valid_part(CheckpointPart part, uint64_t rank, uint64_t world_size) {
  if (part == CheckpointPart::whole) return rank == 0 && world_size == 1;
  return (part == CheckpointPart::replicated || part == CheckpointPart::expert_shard) && world_size >= 2 &&
         rank < world_size;
}

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Little-endian byte building and parsing.
void put(std::vector<uint8_t>& b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_at(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_at(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Elements of `shape`, or -1 for a negative dimension or an overflow past 2^62.
int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > (int64_t{1} << 62) / d) return -1;
    n *= d;
  }
  return n;
}

// Writes all of `bytes` at the current position; false (errno set) on failure.
bool write_all(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const size_t chunk = bytes < (size_t{1} << 30) ? bytes : (size_t{1} << 30);
    const ssize_t n = ::write(fd, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t bytes, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const size_t chunk = bytes < (size_t{1} << 30) ? bytes : (size_t{1} << 30);
    const ssize_t n = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Closes the descriptor and removes the temporary file unless committed.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  void commit() { committed_ = true; }

 private:
  std::string path_;
  int fd_;
  bool committed_ = false;
};

}  // namespace

uint32_t write_checkpoint(const std::string& path, const CheckpointState& state,
                          std::span<const CheckpointTensorView> tensors) {
  namespace fs = std::filesystem;
  // Every check before the first byte is written.
  const bool over_ranks = state.part != CheckpointPart::whole;
  FP4MOE_CHECK(valid_part(state.part, state.rank, state.world_size),
               "checkpoint '{}': part {}, rank {} of {}: expected the whole model (rank 0 of 1) or a part over >= 2 "
               "ranks (replicated or expert_shard, rank < world size)",
               path, static_cast<uint32_t>(state.part), state.rank, state.world_size);
  std::set<std::pair<int, std::string>> names;
  std::vector<CheckpointEntry> entries;
  std::vector<uint8_t> index;
  for (const CheckpointTensorView& t : tensors) {
    const size_t esize = checkpoint_dtype_bytes(t.dtype);
    FP4MOE_CHECK(esize != 0, "checkpoint '{}': tensor '{}' has unknown dtype {}", path, t.name,
                 static_cast<int>(t.dtype));
    FP4MOE_CHECK(!t.name.empty() && t.name.size() <= kMaxName,
                 "checkpoint '{}': tensor names must have 1..{} bytes, got {} bytes", path, kMaxName, t.name.size());
    FP4MOE_CHECK(t.section == CheckpointSection::model || t.section == CheckpointSection::optimizer ||
                     (over_ranks && t.section == CheckpointSection::ranks),
                 "checkpoint '{}': tensor '{}' has section {}, expected model or optimizer (or ranks in a part of a "
                 "checkpoint over ranks)", path, t.name, static_cast<int>(t.section));
    FP4MOE_CHECK(names.insert({static_cast<int>(t.section), t.name}).second,
                 "checkpoint '{}': tensor '{}' appears twice in section {}", path, t.name, section_name(t.section));
    FP4MOE_CHECK(t.shape.size() <= 16, "checkpoint '{}': tensor '{}' has rank {}, at most 16", path, t.name,
                 t.shape.size());
    const int64_t n = element_count(t.shape);
    FP4MOE_CHECK(n >= 0, "checkpoint '{}': tensor '{}' has shape {}: dimensions must be >= 0 (and the size finite)",
                 path, t.name, shape_text(t.shape));
    const uint64_t bytes = static_cast<uint64_t>(n) * esize;
    FP4MOE_CHECK(bytes == 0 || t.data != nullptr, "checkpoint '{}': tensor '{}' of {} bytes has no data", path,
                 t.name, bytes);
    CheckpointEntry e{t.section, t.name, t.dtype, t.shape, 0, bytes, crc32(t.data, bytes)};
    put(index, static_cast<uint8_t>(e.section), 1);
    put(index, static_cast<uint8_t>(e.dtype), 1);
    put(index, e.shape.size(), 2);
    put(index, e.name.size(), 4);
    index.insert(index.end(), e.name.begin(), e.name.end());
    for (int64_t d : e.shape) put(index, static_cast<uint64_t>(d), 8);
    put(index, 0, 8);  // offset, filled below
    put(index, e.bytes, 8);
    put(index, e.crc32, 4);
    entries.push_back(std::move(e));
  }
  FP4MOE_CHECK(state.config_text.size() < (uint64_t{1} << 31), "checkpoint '{}': configuration text too long",
               path);
  const uint64_t meta_end = kCheckpointHeaderBytes + state.config_text.size() + index.size();
  const uint64_t data_offset = align_up(meta_end);
  uint64_t offset = data_offset;
  // Offsets into the index entries, in order.
  size_t pos = 0;
  for (CheckpointEntry& e : entries) {
    e.offset = offset;
    offset += align_up(e.bytes);
    pos += 1 + 1 + 2 + 4 + e.name.size() + 8 * e.shape.size();
    put_at(index.data() + pos, e.offset, 8);
    pos += 8 + 8 + 4;
  }
  const uint64_t file_bytes = offset;

  std::vector<uint8_t> head(kCheckpointHeaderBytes, 0);
  std::memcpy(head.data(), kCheckpointMagic, 8);
  put_at(&head[8], over_ranks ? kCheckpointRanksVersion : kCheckpointVersion, 4);
  put_at(&head[12], kCheckpointHeaderBytes, 4);
  put_at(&head[16], state.config_hash, 8);
  put_at(&head[24], state.step, 8);
  put_at(&head[32], state.optimizer_steps, 8);
  put_at(&head[40], state.tokens_seen, 8);
  put_at(&head[48], state.rng.seed, 8);
  put_at(&head[56], state.rng.offset, 8);
  const auto loader = state.data_loader.to_bytes();
  std::memcpy(&head[64], loader.data(), loader.size());
  put_at(&head[112], entries.size(), 4);
  put_at(&head[116], state.config_text.size(), 4);
  put_at(&head[120], index.size(), 8);
  put_at(&head[128], data_offset, 8);
  put_at(&head[136], file_bytes, 8);
  const uint32_t meta_crc = crc32(index.data(), index.size(), crc32(state.config_text.data(), state.config_text.size()));
  put_at(&head[144], meta_crc, 4);
  if (over_ranks) {  // version 1 keeps these bytes zero
    put_at(&head[148], static_cast<uint32_t>(state.part), 4);
    put_at(&head[152], state.rank, 4);
    put_at(&head[156], state.world_size, 4);
  }
  const uint32_t header_crc = crc32(head.data(), kHeaderCrcOffset);
  put_at(&head[kHeaderCrcOffset], header_crc, 4);

  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  FP4MOE_CHECK(fs::is_directory(dir, ec), "checkpoint '{}': folder '{}' does not exist", path, dir.string());
  FP4MOE_CHECK(!fs::is_directory(target, ec), "checkpoint '{}' is a folder, expected a file path", path);

  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FP4MOE_CHECK(fd >= 0, "checkpoint '{}': cannot create the temporary file '{}': {}", path, tmp, std::strerror(errno));
  TempFile file(tmp, fd);
  auto fail_io = [&](const char* what) {
    const int err = errno;
    FP4MOE_CHECK(false, "checkpoint '{}': {} failed ({}); the previous checkpoint, if any, is unchanged", path, what,
                 std::strerror(err));
  };
  static const uint8_t zeros[kAlign] = {};
  if (!write_all(fd, head.data(), head.size()) ||
      !write_all(fd, state.config_text.data(), state.config_text.size()) ||
      !write_all(fd, index.data(), index.size()) || !write_all(fd, zeros, data_offset - meta_end))
    fail_io("writing the header");
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!write_all(fd, tensors[i].data, entries[i].bytes) ||
        !write_all(fd, zeros, align_up(entries[i].bytes) - entries[i].bytes))
      fail_io(fmt::format("writing tensor '{}'", entries[i].name).c_str());
  }
  if (::fsync(fd) != 0) fail_io("fsync");
  if (file.close() != 0) fail_io("close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail_io("renaming the temporary file over it");
  file.commit();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // make the rename durable
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return header_crc;
}

CheckpointReader::CheckpointReader(const std::string& path, uint64_t expected_config_hash) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FP4MOE_CHECK(fd >= 0, "checkpoint '{}': cannot open: {}", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  FP4MOE_CHECK(::fstat(fd, &st) == 0, "checkpoint '{}': cannot stat: {}", path, std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  FP4MOE_CHECK(size >= kCheckpointHeaderBytes, "checkpoint '{}': {} bytes, shorter than the {}-byte header (truncated)",
               path, size, kCheckpointHeaderBytes);
  uint8_t h[kCheckpointHeaderBytes];
  FP4MOE_CHECK(read_all(fd, h, sizeof h, 0), "checkpoint '{}': cannot read the header: {}", path,
               std::strerror(errno));
  FP4MOE_CHECK(std::memcmp(h, kCheckpointMagic, 8) == 0, "checkpoint '{}': wrong magic, expected \"FP4MCKPT\" (not a "
               "checkpoint)", path);
  const uint64_t version = get_at(h + 8, 4), header_bytes = get_at(h + 12, 4);
  FP4MOE_CHECK(version == kCheckpointVersion || version == kCheckpointRanksVersion,
               "checkpoint '{}': format version {}, this build reads versions {} and {}", path, version,
               kCheckpointVersion, kCheckpointRanksVersion);
  FP4MOE_CHECK(header_bytes == kCheckpointHeaderBytes, "checkpoint '{}': header size {}, expected {}", path,
               header_bytes, kCheckpointHeaderBytes);
  header_crc32_ = static_cast<uint32_t>(get_at(h + kHeaderCrcOffset, 4));
  FP4MOE_CHECK(header_crc32_ == crc32(h, kHeaderCrcOffset), "checkpoint '{}': header CRC mismatch (corrupted)", path);
  const bool over_ranks = version == kCheckpointRanksVersion;
  if (over_ranks) {
    const uint64_t part = get_at(h + 148, 4), rank = get_at(h + 152, 4), world_size = get_at(h + 156, 4);
    FP4MOE_CHECK(part != 0 && valid_part(static_cast<CheckpointPart>(part), rank, world_size),
                 "checkpoint '{}': format version 2 (a part of a checkpoint over ranks) with part {}, rank {} of {}: "
                 "not a valid part (corrupted)", path,
                 part, rank, world_size);
    state_.part = static_cast<CheckpointPart>(part);
    state_.rank = static_cast<uint32_t>(rank);
    state_.world_size = static_cast<uint32_t>(world_size);
  }
  const uint64_t file_bytes = get_at(h + 136, 8);
  FP4MOE_CHECK(size == file_bytes, "checkpoint '{}': {} bytes, the header says {} ({})", path, size, file_bytes,
               size < file_bytes ? "truncated" : "trailing bytes");
  state_.config_hash = get_at(h + 16, 8);
  if (expected_config_hash != 0)
    FP4MOE_CHECK(state_.config_hash == expected_config_hash,
                 "checkpoint '{}' was written for configuration hash {:016x}, this run's is {:016x}: the model shape, "
                 "MoE settings or recipe differ",
                 path, state_.config_hash, expected_config_hash);
  state_.step = get_at(h + 24, 8);
  state_.optimizer_steps = get_at(h + 32, 8);
  state_.tokens_seen = get_at(h + 40, 8);
  state_.rng = {get_at(h + 48, 8), get_at(h + 56, 8)};
  try {
    state_.data_loader = DataLoaderState::from_bytes(std::span<const uint8_t>(h + 64, 48));
  } catch (const Error& err) {
    FP4MOE_CHECK(false, "checkpoint '{}': {}", path, err.what());
  }
  const uint64_t entry_count = get_at(h + 112, 4), config_bytes = get_at(h + 116, 4), index_bytes = get_at(h + 120, 8);
  const uint64_t data_offset = get_at(h + 128, 8);
  const uint64_t meta_end = kCheckpointHeaderBytes + config_bytes + index_bytes;
  FP4MOE_CHECK(index_bytes <= file_bytes && meta_end <= data_offset && data_offset <= file_bytes,
               "checkpoint '{}': index of {} bytes and data at {} do not fit in {} bytes (corrupted)", path,
               index_bytes, data_offset, file_bytes);
  std::vector<uint8_t> meta(config_bytes + index_bytes);
  FP4MOE_CHECK(read_all(fd, meta.data(), meta.size(), kCheckpointHeaderBytes), "checkpoint '{}': cannot read the "
               "index: {}", path, std::strerror(errno));
  FP4MOE_CHECK(crc32(meta.data(), meta.size()) == get_at(h + 144, 4),
               "checkpoint '{}': configuration/index CRC mismatch (corrupted)", path);
  state_.config_text.assign(reinterpret_cast<const char*>(meta.data()), config_bytes);

  const uint8_t* p = meta.data() + config_bytes;
  const uint8_t* end = meta.data() + meta.size();
  auto need = [&](uint64_t n) {
    FP4MOE_CHECK(static_cast<uint64_t>(end - p) >= n, "checkpoint '{}': index ends inside entry {} of {} (corrupted)",
                 path, entries_.size(), entry_count);
  };
  for (uint64_t i = 0; i < entry_count; ++i) {
    need(8);
    CheckpointEntry e;
    e.section = static_cast<CheckpointSection>(p[0]);
    e.dtype = static_cast<CheckpointDtype>(p[1]);
    const uint64_t rank = get_at(p + 2, 2), name_bytes = get_at(p + 4, 4);
    p += 8;
    FP4MOE_CHECK(p[-8] <= (over_ranks ? 2 : 1) && checkpoint_dtype_bytes(e.dtype) != 0 && rank <= 16 && name_bytes >= 1 &&
                     name_bytes <= kMaxName,
                 "checkpoint '{}': index entry {} is malformed (section {}, dtype {}, rank {}, name of {} bytes)", path,
                 i, p[-8], p[-7], rank, name_bytes);
    need(name_bytes + 8 * rank + 20);
    e.name.assign(reinterpret_cast<const char*>(p), name_bytes);
    p += name_bytes;
    for (uint64_t r = 0; r < rank; ++r, p += 8) e.shape.push_back(static_cast<int64_t>(get_at(p, 8)));
    e.offset = get_at(p, 8);
    e.bytes = get_at(p + 8, 8);
    e.crc32 = static_cast<uint32_t>(get_at(p + 16, 4));
    p += 20;
    const int64_t n = element_count(e.shape);
    FP4MOE_CHECK(n >= 0 && static_cast<uint64_t>(n) * checkpoint_dtype_bytes(e.dtype) == e.bytes &&
                     e.offset >= data_offset && e.offset <= file_bytes && e.bytes <= file_bytes - e.offset,
                 "checkpoint '{}': tensor '{}' (shape {}, {} bytes at {}) does not fit the file (corrupted)", path,
                 e.name, shape_text(e.shape), e.bytes, e.offset);
    FP4MOE_CHECK(find(e.section, e.name) == nullptr, "checkpoint '{}': tensor '{}' appears twice in section {}", path,
                 e.name, section_name(e.section));
    entries_.push_back(std::move(e));
  }
  FP4MOE_CHECK(p == end, "checkpoint '{}': {} bytes after the last index entry (corrupted)", path, end - p);
}

const CheckpointEntry* CheckpointReader::find(CheckpointSection section, const std::string& name) const {
  for (const CheckpointEntry& e : entries_)
    if (e.section == section && e.name == name) return &e;
  return nullptr;
}

void CheckpointReader::read(CheckpointSection section, const std::string& name, CheckpointDtype dtype,
                            const std::vector<int64_t>& shape, void* dst, size_t dst_bytes) const {
  const CheckpointEntry* e = find(section, name);
  FP4MOE_CHECK(e != nullptr, "checkpoint '{}': no tensor '{}' in section {}", path_, name, section_name(section));
  FP4MOE_CHECK(e->dtype == dtype && e->shape == shape,
               "checkpoint '{}': tensor '{}' is {} {}, expected {} {}", path_, name, checkpoint_dtype_name(e->dtype),
               shape_text(e->shape), checkpoint_dtype_name(dtype), shape_text(shape));
  FP4MOE_CHECK(dst_bytes == e->bytes, "checkpoint '{}': tensor '{}' has {} bytes, the buffer {}", path_, name,
               e->bytes, dst_bytes);
  FP4MOE_CHECK(e->bytes == 0 || dst != nullptr, "checkpoint '{}': tensor '{}': null destination", path_, name);
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  FP4MOE_CHECK(fd >= 0, "checkpoint '{}': cannot open: {}", path_, std::strerror(errno));
  const bool ok = read_all(fd, dst, e->bytes, e->offset);
  const int err = errno;
  ::close(fd);
  FP4MOE_CHECK(ok, "checkpoint '{}': cannot read tensor '{}': {}", path_, name, std::strerror(err));
  FP4MOE_CHECK(crc32(dst, e->bytes) == e->crc32, "checkpoint '{}': tensor '{}' CRC mismatch (corrupted)", path_,
               name);
}

}  // namespace fp4moe
