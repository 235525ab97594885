// Checkpoints of the reference trainer: named tensors (parameters, optimizer state) as raw bytes with dtype and
// shape, plus the step counters, the RNG state, the data loader's state and the configuration, in one file
// written atomically. Host-side: the trainer copies its device tensors to host buffers and passes views.
//
// File format version 1 (one GPU's whole model) or 2 (one part of a checkpoint over ranks, below), integers
// little-endian:
//
//   header, 256 bytes
//     offset size field
//          0    8 magic            "FP4MCKPT"
//          8    4 format_version   1, or 2 for a part of a checkpoint over ranks
//         12    4 header_bytes     256
//         16    8 config_hash      model_config_hash (trainer/config.h) of the run that wrote it
//         24    8 step             training steps completed
//         32    8 optimizer_steps  AdamW updates applied (fewer than step when non-finite steps were skipped)
//         40    8 tokens_seen      training tokens consumed
//         48    8 rng_seed         counter-based generator: key ...
//         56    8 rng_offset       ... and the next unused counter
//         64   48 data_loader      DataLoaderState::to_bytes (trainer/data/loader.h)
//        112    4 entry_count      tensors in the index
//        116    4 config_bytes     length of the configuration text
//        120    8 index_bytes      length of the index
//        128    8 data_offset      first tensor byte (a multiple of 64)
//        136    8 file_bytes       the exact file size
//        144    4 meta_crc32       CRC-32 of the configuration text and the index (bytes 256 .. 256 + config_bytes
//                                  + index_bytes)
//        148    4 part             version 2: CheckpointPart (1 the ranks' replicated state, 2 a rank's experts);
//                                  version 1: zero (the whole model)
//        152    4 rank             version 2: the rank that wrote the part; version 1: zero
//        156    4 world_size       version 2: the ranks of the run (>= 2); version 1: zero (one GPU)
//        160   92 reserved         zero
//        252    4 header_crc32     CRC-32 of bytes 0..251
//   configuration text (config_bytes, UTF-8: model_config_text or the whole TOML, for provenance)
//   index: entry_count entries, each
//        u8 section (0 model, 1 optimizer, 2 ranks: version 2 only), u8 dtype (CheckpointDtype), u16 rank, u32 name_bytes, name,
//        i64 shape[rank], u64 offset (from the file start, a multiple of 64), u64 bytes, u32 crc32 of the bytes
//   zero padding to data_offset, then each tensor's bytes at its offset, each padded with zeros to 64 bytes.
// CRC-32 is trainer/data/token_shard.h's (ISO-HDLC, zlib's).
//
// Writing goes to "<path>.tmp.<pid>" in the same folder, fsync, rename over <path>, then fsync of the folder: a
// crash or an I/O error leaves either the previous file or the new one, never a mix; on error the temporary
// file is removed.
//
// A checkpoint over W >= 2 ranks (trainer/train/param_checkpoint.h, save_ranks_checkpoint) is W + 1 such files in
// one folder: each rank r's routed experts, "step_<8 digits>.rank_<r>_of_<W>.ckpt" (part expert_shard,
// checkpoint_shard_path), written first by every rank; then, once every rank's is renamed into place, rank 0's
// "step_<8 digits>.ckpt" (part replicated: every tensor that is not a routed expert's, and in the ranks section the
// u64 tensor "shard_header_crc32" [W], each shard's header_crc32), the completion marker: a file that
// latest_checkpoint finds and --resume opens. A shard whose header CRC is not the one listed belongs to another
// write and is refused; shards without their replicated file are not a checkpoint.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trainer/data/loader.h"

namespace fp4moe {

inline constexpr char kCheckpointMagic[8] = {'F', 'P', '4', 'M', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointVersion = 1;       // one GPU's whole model
inline constexpr uint32_t kCheckpointRanksVersion = 2;  // a part of a checkpoint over ranks
inline constexpr uint32_t kCheckpointHeaderBytes = 256;

enum class CheckpointDtype : uint8_t { u8 = 1, bf16 = 2, f32 = 3, i32 = 4, i64 = 5, u64 = 6 };
const char* checkpoint_dtype_name(CheckpointDtype t);
size_t checkpoint_dtype_bytes(CheckpointDtype t);  // 0 for an unknown value

enum class CheckpointSection : uint8_t { model = 0, optimizer = 1, ranks = 2 };

// What one file holds: the whole model (version 1), or one part of a checkpoint over ranks (version 2).
enum class CheckpointPart : uint32_t { whole = 0, replicated = 1, expert_shard = 2 };
const char* checkpoint_part_name(CheckpointPart p);

// A host tensor to write: `data` points to product(shape) elements of `dtype` (a scalar has an empty shape).
struct CheckpointTensorView {
  CheckpointSection section = CheckpointSection::model;
  std::string name;  // unique within its section, 1..4096 bytes
  CheckpointDtype dtype = CheckpointDtype::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// A counter-based generator's state (as stochastic rounding's: keyed by a seed, advanced by a counter).
struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  bool operator==(const RngState&) const = default;
};

// Everything but the tensors.
struct CheckpointState {
  uint64_t config_hash = 0;
  uint64_t step = 0;
  uint64_t optimizer_steps = 0;
  uint64_t tokens_seen = 0;
  RngState rng;
  DataLoaderState data_loader;
  std::string config_text;
  // A part of a checkpoint over ranks (world_size >= 2, part not whole) or the whole model of one GPU (part whole,
  // rank 0, world_size 1: written as version 1, exactly as before ranks existed).
  CheckpointPart part = CheckpointPart::whole;
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

// Writes the checkpoint atomically (see above) and returns its header_crc32. Throws fp4moe::Error, naming the
// file, before writing anything for: an empty or duplicate name within a section, an unknown dtype, a negative
// dimension, a null `data` with a non-zero size, a path whose folder does not exist; a state whose part, rank and
// world_size are neither the whole model's (whole, 0, 1) nor a part over ranks (replicated or expert_shard, rank <
// world_size, world_size >= 2), a ranks-section tensor in a whole model's file; and for any I/O error (the
// previous file, if any, is left as it was and the temporary file removed).
uint32_t write_checkpoint(const std::string& path, const CheckpointState& state,
                      std::span<const CheckpointTensorView> tensors);

struct CheckpointEntry {
  CheckpointSection section;
  std::string name;
  CheckpointDtype dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Opens and validates a checkpoint, then reads tensors on demand into the caller's host buffers. Opening throws
// fp4moe::Error naming the file for: a missing or unreadable file; a file shorter than the header (truncated);
// a wrong magic, version or header size; a header CRC mismatch; a file size other than file_bytes (truncated or
// trailing bytes); a configuration or index CRC mismatch or an index that does not parse or points outside the
// data; a version 2 header whose part, rank or world_size is not a part over ranks; and, when
// expected_config_hash is not 0, a config_hash that differs (a checkpoint of another model shape or recipe).
class CheckpointReader {
 public:
  CheckpointReader(const std::string& path, uint64_t expected_config_hash);

  const std::string& path() const { return path_; }
  const CheckpointState& state() const { return state_; }
  uint32_t header_crc32() const { return header_crc32_; }  // the file's fingerprint (what write_checkpoint returned)
  const std::vector<CheckpointEntry>& entries() const { return entries_; }
  const CheckpointEntry* find(CheckpointSection section, const std::string& name) const;  // null if absent

  // Reads tensor `name` of `section` into dst (dst_bytes bytes), checking that it exists with exactly this dtype
  // and shape, that dst_bytes equals its size, and its CRC. Throws fp4moe::Error naming the file and tensor.
  void read(CheckpointSection section, const std::string& name, CheckpointDtype dtype,
            const std::vector<int64_t>& shape, void* dst, size_t dst_bytes) const;

 private:
  std::string path_;
  CheckpointState state_;
  uint32_t header_crc32_ = 0;
  std::vector<CheckpointEntry> entries_;
};

// "step_00001234.ckpt": the file name of step's checkpoint in train.checkpoint_dir (sorts by step).
std::string checkpoint_file_name(uint64_t step);
// The path of rank's routed-expert shard beside the replicated file `path` of a checkpoint over world_size ranks:
// `path` without its ".ckpt" suffix, then ".rank_<rank>_of_<world_size>.ckpt" ("dir/step_00001234.ckpt" ->
// "dir/step_00001234.rank_3_of_8.ckpt", a name latest_checkpoint, trainer/train/resume.h, never takes for a
// checkpoint). Throws fp4moe::Error for a path that does not end in ".ckpt".
std::string checkpoint_shard_path(const std::string& path, uint32_t rank, uint32_t world_size);

}  // namespace fp4moe
