#include "trainer/train/param_checkpoint.h"

#include <fmt/format.h>

#include <set>
#include <utility>
#include <vector>

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

// One device FP32 tensor of the checkpoint.
struct Slot {
  CheckpointSection section;
  std::string name;
  std::vector<int64_t> shape;
  float* device;
  int64_t n;
};

std::vector<Slot> slots_of(ParamStore& params, const std::string& path) {
  require_whole_optimizer_state(params.shard_parts(), fmt::format("checkpoint '{}'", path));
  FP4MOE_CHECK(params.allocated(), "checkpoint: the parameter store is not allocated");
  std::vector<Slot> slots;
  for (Param& p : params.params()) {
    slots.push_back({CheckpointSection::model, p.name, p.shape, p.master, p.n});
    slots.push_back({CheckpointSection::optimizer, p.name + ".m", p.shape, p.m, p.n});
    slots.push_back({CheckpointSection::optimizer, p.name + ".v", p.shape, p.v, p.n});
  }
  for (StateTensor& s : params.states()) slots.push_back({CheckpointSection::model, s.name, s.shape, s.data, s.n});
  return slots;
}

const char* section_text(CheckpointSection s) { return s == CheckpointSection::model ? "model" : "optimizer"; }

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
  const std::vector<Slot> slots = slots_of(params, path);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::vector<float>> host(slots.size());
  std::vector<CheckpointTensorView> views;
  views.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    host[i].resize(static_cast<size_t>(slots[i].n));
    if (slots[i].n > 0)
      CUDA_CHECK(cudaMemcpyAsync(host[i].data(), slots[i].device, host[i].size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream));
    views.push_back({slots[i].section, slots[i].name, CheckpointDtype::f32, slots[i].shape, host[i].data()});
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  write_checkpoint(path, state, views);
}

CheckpointState load_param_checkpoint(const std::string& path, ParamStore& params, uint64_t expected_config_hash,
                                      cudaStream_t stream) {
  const std::vector<Slot> slots = slots_of(params, path);
  const CheckpointReader reader(path, expected_config_hash);
  std::set<std::pair<int, std::string>> wanted;
  for (const Slot& s : slots) wanted.emplace(static_cast<int>(s.section), s.name);
  for (const CheckpointEntry& e : reader.entries())
    FP4MOE_CHECK(wanted.count({static_cast<int>(e.section), e.name}) == 1,
                 "checkpoint '{}': tensor '{}' ({} section) is not a tensor of this model", path, e.name,
                 section_text(e.section));
  std::vector<float> host;
  for (const Slot& s : slots) {
    FP4MOE_CHECK(reader.find(s.section, s.name) != nullptr, "checkpoint '{}': no tensor '{}' in the {} section",
                 path, s.name, section_text(s.section));
    host.resize(static_cast<size_t>(s.n));
    reader.read(s.section, s.name, CheckpointDtype::f32, s.shape, host.data(), host.size() * sizeof(float));
    if (s.n > 0)
      CUDA_CHECK(cudaMemcpyAsync(s.device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` is reused for the next tensor
  }
  params.refresh_bf16_from_master(stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return reader.state();
}

}  // namespace fp4moe
