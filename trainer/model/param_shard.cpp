#include "trainer/model/param_shard.h"

#include <algorithm>
#include <string_view>

#include "kernels/common/check.h"
#include "kernels/common/types.h"

namespace fp4moe {

int64_t param_padded(int64_t n) { return round_up(n, kParamAlignElems); }

bool is_routed_expert_param(const std::string& name) {
  constexpr std::string_view kLayers = "layers.", kExperts = ".moe.experts.";
  const std::string_view s = name;
  if (!s.starts_with(kLayers)) return false;
  size_t i = kLayers.size();
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  const std::string_view rest = s.substr(i);
  return i > kLayers.size() && rest.starts_with(kExperts) && rest.size() > kExperts.size();
}

int64_t zero1_shard_elems(int64_t block, int64_t parts) {
  FP4MOE_CHECK(block >= 0 && block % kParamAlignElems == 0,
               "zero1_shard_elems: the block must be a non-negative multiple of {} elements, got {}", kParamAlignElems,
               block);
  FP4MOE_CHECK(parts >= 1, "zero1_shard_elems: parts must be >= 1, got {}", parts);
  return param_padded(ceil_div(block, parts));
}

ShardRange zero1_tensor_shard(int64_t offset, int64_t n, int64_t shard_elems, int64_t rank) {
  FP4MOE_CHECK(offset >= 0 && n >= 1 && shard_elems >= 0 && rank >= 0,
               "zero1_tensor_shard: needs offset >= 0, n >= 1, shard_elems >= 0 and rank >= 0, got {}, {}, {}, {}",
               offset, n, shard_elems, rank);
  auto clamp = [&](int64_t x) { return std::clamp<int64_t>(x, 0, n); };
  return ShardRange{clamp(rank * shard_elems - offset), clamp((rank + 1) * shard_elems - offset)};
}

Zero1Layout zero1_layout(const std::vector<int64_t>& n, const std::vector<bool>& expert, Zero1Parts parts) {
  FP4MOE_CHECK(n.size() == expert.size(), "zero1_layout: {} sizes but {} expert flags", n.size(), expert.size());
  FP4MOE_CHECK(parts.dense >= 1 && parts.expert >= 1, "zero1_layout: parts must be >= 1, got {} and {}", parts.dense,
               parts.expert);
  Zero1Layout out;
  std::vector<int64_t> offset(n.size());
  for (size_t i = 0; i < n.size(); ++i) {
    FP4MOE_CHECK(n[i] >= 1, "zero1_layout: tensor {} has {} elements, expected >= 1", i, n[i]);
    int64_t& block = expert[i] ? out.expert_block : out.dense_block;
    offset[i] = block;
    block += param_padded(n[i]);
  }
  out.dense_shard = zero1_shard_elems(out.dense_block, parts.dense);
  out.expert_shard = zero1_shard_elems(out.expert_block, parts.expert);
  out.slots.resize(n.size());
  for (size_t i = 0; i < n.size(); ++i) {
    Zero1Slot& s = out.slots[i];
    s.range = zero1_tensor_shard(offset[i], n[i], expert[i] ? out.expert_shard : out.dense_shard, /*rank=*/0);
    // Rank 0 owns block elements [0, S): a tensor's owned elements start at its own first one (range.begin = 0).
    if (!s.range.empty()) s.storage_offset = (expert[i] ? out.dense_shard : 0) + offset[i] + s.range.begin;
  }
  return out;
}

}  // namespace fp4moe
