#include "trainer/train/param_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

constexpr const char* kShardCrcs = "shard_header_crc32";  // the replicated file's ranks-section tensor, u64 [W]

// One device tensor of the checkpoint: FP32, or BF16 (the moments under MomentDtype::bf16).
struct Slot {
  CheckpointSection section;
  std::string name;
  std::vector<int64_t> shape;
  void* device;
  int64_t n;
  CheckpointDtype dtype = CheckpointDtype::f32;
  size_t bytes() const { return static_cast<size_t>(n) * checkpoint_dtype_bytes(dtype); }
};

// The tensors of `part`: every one (whole), those that are not routed experts' (replicated: the state tensors
// too), or the routed experts' (expert_shard).
std::vector<Slot> slots_of(ParamStore& params, const std::string& path, CheckpointPart part) {
  require_whole_optimizer_state(params.shard_parts(), fmt::format("checkpoint '{}'", path));
  FP4MOE_CHECK(params.allocated(), "checkpoint: the parameter store is not allocated");
  std::vector<Slot> slots;
  const bool bf16_moments = params.moments() == MomentDtype::bf16;
  const CheckpointDtype moment = bf16_moments ? CheckpointDtype::bf16 : CheckpointDtype::f32;
  for (Param& p : params.params()) {
    if (part != CheckpointPart::whole && p.expert != (part == CheckpointPart::expert_shard)) continue;
    slots.push_back({CheckpointSection::model, p.name, p.shape, p.master, p.n});
    slots.push_back({CheckpointSection::optimizer, p.name + ".m", p.shape,
                     bf16_moments ? static_cast<void*>(p.m_bf16) : static_cast<void*>(p.m), p.n, moment});
    slots.push_back({CheckpointSection::optimizer, p.name + ".v", p.shape,
                     bf16_moments ? static_cast<void*>(p.v_bf16) : static_cast<void*>(p.v), p.n, moment});
  }
  if (part != CheckpointPart::expert_shard)
    for (StateTensor& s : params.states()) slots.push_back({CheckpointSection::model, s.name, s.shape, s.data, s.n});
  return slots;
}

const char* section_text(CheckpointSection s) {
  return s == CheckpointSection::model ? "model" : s == CheckpointSection::optimizer ? "optimizer" : "ranks";
}

// Copies the slots to the host and writes them, with `extra` (host tensors), as `path`; returns its header CRC.
uint32_t write_slots(const std::string& path, const std::vector<Slot>& slots, const CheckpointState& state,
                     const std::vector<CheckpointTensorView>& extra, cudaStream_t stream) {
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::vector<unsigned char>> host(slots.size());
  std::vector<CheckpointTensorView> views;
  views.reserve(slots.size() + extra.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    host[i].resize(slots[i].bytes());
    if (slots[i].n > 0)
      CUDA_CHECK(cudaMemcpyAsync(host[i].data(), slots[i].device, host[i].size(), cudaMemcpyDeviceToHost, stream));
    views.push_back({slots[i].section, slots[i].name, slots[i].dtype, slots[i].shape, host[i].data()});
  }
  views.insert(views.end(), extra.begin(), extra.end());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return write_checkpoint(path, state, views);
}

// Checks that the file's model and optimizer tensors are exactly the slots' (the ranks section is the caller's).
void check_tensor_set(const CheckpointReader& reader, const std::vector<Slot>& slots) {
  std::set<std::pair<int, std::string>> wanted;
  for (const Slot& s : slots) wanted.emplace(static_cast<int>(s.section), s.name);
  for (const CheckpointEntry& e : reader.entries())
    FP4MOE_CHECK(e.section == CheckpointSection::ranks || wanted.count({static_cast<int>(e.section), e.name}) == 1,
                 "checkpoint '{}': tensor '{}' ({} section) is not a tensor of this model", reader.path(), e.name,
                 section_text(e.section));
  for (const Slot& s : slots) {
    const CheckpointEntry* e = reader.find(s.section, s.name);
    FP4MOE_CHECK(e != nullptr, "checkpoint '{}': no tensor '{}' in the {} section", reader.path(), s.name,
                 section_text(s.section));
    // The moments resume in the dtype they were saved in (no conversion): name the option that decides it.
    const bool moment = s.section == CheckpointSection::optimizer;
    auto option = [](CheckpointDtype d) {
      return d == CheckpointDtype::bf16 ? "bf16" : d == CheckpointDtype::f32 ? "fp32" : "(none: not a moment dtype)";
    };
    FP4MOE_CHECK(!moment || e->dtype == s.dtype,
                 "checkpoint '{}': AdamW moment '{}' is stored as {}, but this run keeps the moments in {} "
                 "(train.moments = {}); moments are not converted: resume with --train.moments {}",
                 reader.path(), s.name, option(e->dtype), option(s.dtype), option(s.dtype), option(e->dtype));
  }
}

// Reads every slot from the file (dtype, shape and CRC checked) into its device tensor.
void read_slots(const CheckpointReader& reader, const std::vector<Slot>& slots, cudaStream_t stream) {
  std::vector<unsigned char> host;
  for (const Slot& s : slots) {
    host.resize(s.bytes());
    reader.read(s.section, s.name, s.dtype, s.shape, host.data(), host.size());
    if (s.n > 0) CUDA_CHECK(cudaMemcpyAsync(s.device, host.data(), host.size(), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` is reused for the next tensor
  }
}

// Every rank's `mine` (k values, small non-negative integers: exact in FP32) gathered into [W k], rank r's at
// [r k, (r + 1) k): an FP32 all-reduce of a buffer that is zero but at each rank's own values, taken from `mem`
// (MemCategory::comm) for the call.
std::vector<float> gather_over_ranks(const std::vector<float>& mine, EpTransport& transport, DeviceMemory& mem,
                                     cudaStream_t stream) {
  const size_t k = mine.size(), W = static_cast<size_t>(transport.world_size());
  std::vector<float> all(k * W, 0.0f);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(k * transport.rank()));
  DeviceArray<float> device(mem, static_cast<int64_t>(all.size()), MemCategory::comm,
                            "checkpoint agreement over the ranks");
  CUDA_CHECK(cudaMemcpyAsync(device.data(), all.data(), device.bytes(), cudaMemcpyHostToDevice, stream));
  transport.all_reduce_sum(device.data(), device.size(), stream);
  CUDA_CHECK(cudaMemcpyAsync(all.data(), device.data(), device.bytes(), cudaMemcpyDeviceToHost, stream));
  transport.wait(stream);
  return all;
}

// Runs fn, returning its error message ("" when it succeeded).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// After gather_over_ranks of k values per rank whose first is 1 for a rank that failed: throws on every rank when
// one failed, with its own error on a failed rank and naming the failed ranks on the others; `consequence` says
// what the failure leaves.
void fail_together(const std::vector<float>& gathered, size_t k, const std::string& own_error,
                   const std::string& consequence) {
  std::vector<size_t> failed;
  for (size_t r = 0; r * k < gathered.size(); ++r)
    if (gathered[r * k] != 0.0f) failed.push_back(r);
  if (failed.empty()) return;
  FP4MOE_CHECK(own_error.empty(), "{}; {}", own_error, consequence);
  FP4MOE_CHECK(false, "rank{} {} of {} failed (its own error says why); {}", failed.size() > 1 ? "s" : "",
               fmt::join(failed, ", "), gathered.size() / k, consequence);
}

// Only the ranks' collectives (the all-reduce of each rank's failure) between opening and reading.
void agree(const std::string& own_error, const std::string& consequence, EpTransport& transport, DeviceMemory& mem,
           cudaStream_t stream) {
  fail_together(gather_over_ranks({own_error.empty() ? 0.0f : 1.0f}, transport, mem, stream), 1, own_error,
                consequence);
}

bool same_training_state(const CheckpointState& a, const CheckpointState& b) {
  return a.config_hash == b.config_hash && a.step == b.step && a.optimizer_steps == b.optimizer_steps &&
         a.tokens_seen == b.tokens_seen && a.rng == b.rng && a.data_loader == b.data_loader &&
         a.config_text == b.config_text;
}

}  // namespace

void require_whole_optimizer_state(const Zero1Parts& parts, const std::string& what) {
  FP4MOE_CHECK(!parts.sharded(),
               "{}: checkpoints hold whole FP32 master weights and AdamW moments, but under parallel.zero1 this GPU "
               "holds only its ZeRO-1 shard of them (1/{} of the non-expert tensors', 1/{} of the routed experts'); "
               "unset train.checkpoint_dir and --resume, or parallel.zero1",
               what, parts.dense, parts.expert);
}

void save_param_checkpoint(const std::string& path, ParamStore& params, const CheckpointState& state,
                           cudaStream_t stream) {
  write_slots(path, slots_of(params, path, CheckpointPart::whole), state, {}, stream);
}

CheckpointState load_param_checkpoint(const std::string& path, ParamStore& params, uint64_t expected_config_hash,
                                      cudaStream_t stream) {
  const std::vector<Slot> slots = slots_of(params, path, CheckpointPart::whole);
  const CheckpointReader reader(path, expected_config_hash);
  const CheckpointState& st = reader.state();
  FP4MOE_CHECK(st.part == CheckpointPart::whole, "checkpoint '{}' holds {} (rank {}) of a checkpoint over {} ranks, "
               "but this run is one GPU holding every routed expert: resume it over {} ranks", path,
               checkpoint_part_name(st.part), st.rank, st.world_size, st.world_size);
  check_tensor_set(reader, slots);
  read_slots(reader, slots, stream);
  params.refresh_bf16_from_master(stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return st;
}

void save_ranks_checkpoint(const std::string& path, ParamStore& params, CheckpointState state,
                           EpTransport& transport, DeviceMemory& mem, cudaStream_t stream) {
  const int W = transport.world_size(), rank = transport.rank();
  FP4MOE_CHECK(W >= 2, "checkpoint '{}': a checkpoint over ranks needs >= 2 ranks, the transport has {} (one rank "
               "writes save_param_checkpoint's file)", path, W);
  state.rank = static_cast<uint32_t>(rank);
  state.world_size = static_cast<uint32_t>(W);
  // 1. Every rank's shard; then the barrier: every rank's success and shard header CRC (two 16-bit halves).
  state.part = CheckpointPart::expert_shard;
  uint32_t crc = 0;
  const std::string shard_error = error_of([&] {
    const std::string shard = checkpoint_shard_path(path, state.rank, state.world_size);
    crc = write_slots(shard, slots_of(params, shard, CheckpointPart::expert_shard), state, {}, stream);
  });
  const std::vector<float> shards = gather_over_ranks(
      {shard_error.empty() ? 0.0f : 1.0f, static_cast<float>(crc & 0xFFFFu), static_cast<float>(crc >> 16)},
      transport, mem, stream);
  const std::string incomplete = fmt::format("the checkpoint over {} ranks '{}' is not complete: its replicated "
                                             "file was not written", W, path);
  fail_together(shards, 3, shard_error, incomplete);
  // 2. Every shard is in place: rank 0's replicated file, listing them, completes the checkpoint.
  std::string replicated_error;
  if (rank == 0) {
    std::vector<uint64_t> crcs(static_cast<size_t>(W));
    for (size_t r = 0; r < crcs.size(); ++r)
      crcs[r] = static_cast<uint64_t>(shards[3 * r + 1]) | static_cast<uint64_t>(shards[3 * r + 2]) << 16;
    state.part = CheckpointPart::replicated;
    replicated_error = error_of([&] {
      write_slots(path, slots_of(params, path, CheckpointPart::replicated), state,
                  {{CheckpointSection::ranks, kShardCrcs, CheckpointDtype::u64, {W}, crcs.data()}}, stream);
    });
  }
  agree(replicated_error, incomplete, transport, mem, stream);
}

CheckpointState load_ranks_checkpoint(const std::string& path, ParamStore& params, uint64_t expected_config_hash,
                                      EpTransport& transport, DeviceMemory& mem, cudaStream_t stream) {
  const int W = transport.world_size(), rank = transport.rank();
  FP4MOE_CHECK(W >= 2, "resume: a checkpoint over ranks needs >= 2 ranks, the transport has {}", W);
  const std::vector<Slot> replicated = slots_of(params, path, CheckpointPart::replicated);
  std::optional<CheckpointReader> rep, shard;
  // 1. Every rank opens and checks both files; nothing is read before every rank has.
  const std::string open_error = error_of([&] {
    rep.emplace(path, expected_config_hash);
    const CheckpointState& st = rep->state();
    FP4MOE_CHECK(st.part != CheckpointPart::whole, "resume: checkpoint '{}' holds one GPU's whole model, but this run "
                 "has {} ranks, each holding its own routed experts: it resumes only from a checkpoint written over "
                 "{} ranks", path, W, W);
    FP4MOE_CHECK(st.part == CheckpointPart::replicated, "resume: '{}' is rank {}'s shard of routed experts; give the "
                 "checkpoint's replicated file (step_<step>.ckpt)", path, st.rank);
    FP4MOE_CHECK(st.world_size == static_cast<uint32_t>(W), "resume: checkpoint '{}' was written by {} ranks, this "
                 "run has {}: each rank holds E/W of the routed experts, so the world size must be the same", path,
                 st.world_size, W);
    check_tensor_set(*rep, replicated);
    const CheckpointEntry* listed = rep->find(CheckpointSection::ranks, kShardCrcs);
    FP4MOE_CHECK(listed != nullptr, "checkpoint '{}': no tensor '{}' in the ranks section", path, kShardCrcs);
    std::vector<uint64_t> crcs(static_cast<size_t>(W));
    rep->read(CheckpointSection::ranks, kShardCrcs, CheckpointDtype::u64, {W}, crcs.data(),
              crcs.size() * sizeof(uint64_t));

    const std::string shard_path = checkpoint_shard_path(path, static_cast<uint32_t>(rank), st.world_size);
    std::error_code ec;
    FP4MOE_CHECK(std::filesystem::exists(shard_path, ec), "resume: checkpoint '{}': the shard of rank {} of {}, '{}', "
                 "is missing (the checkpoint is not complete, or the file was removed)", path, rank, W, shard_path);
    shard.emplace(shard_path, expected_config_hash);
    const CheckpointState& sh = shard->state();
    FP4MOE_CHECK(sh.part == CheckpointPart::expert_shard && sh.rank == static_cast<uint32_t>(rank) &&
                     sh.world_size == st.world_size,
                 "resume: '{}' holds {} of rank {} of {}, expected the routed experts of rank {} of {}", shard_path,
                 checkpoint_part_name(sh.part), sh.rank, sh.world_size, rank, W);
    FP4MOE_CHECK(sh.step == st.step, "resume: the shard '{}' is at step {}, the replicated file '{}' at step {}: "
                 "they belong to different checkpoints", shard_path, sh.step, path, st.step);
    FP4MOE_CHECK(same_training_state(sh, st), "resume: the shard '{}' and the replicated file '{}' are both at step "
                 "{} but differ in their training state (updates, tokens, RNG, data position or configuration): "
                 "they belong to different runs", shard_path, path, st.step);
    FP4MOE_CHECK(crcs[static_cast<size_t>(rank)] == shard->header_crc32(), "resume: the shard '{}' (header CRC "
                 "{:08x}) is not the one the replicated file '{}' lists ({:08x}): it was written by another "
                 "checkpoint of step {}", shard_path, shard->header_crc32(), path, crcs[static_cast<size_t>(rank)],
                 st.step);
    check_tensor_set(*shard, slots_of(params, shard_path, CheckpointPart::expert_shard));
  });
  agree(open_error, fmt::format("resume from '{}': nothing was restored", path), transport, mem, stream);
  // 2. The tensors; a CRC mismatch of one tensor on any rank fails every rank.
  const std::string read_error = error_of([&] {
    read_slots(*rep, replicated, stream);
    read_slots(*shard, slots_of(params, shard->path(), CheckpointPart::expert_shard), stream);
  });
  agree(read_error, fmt::format("resume from '{}' failed while reading the tensors", path), transport, mem, stream);
  params.refresh_bf16_from_master(stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return rep->state();
}

}  // namespace fp4moe
