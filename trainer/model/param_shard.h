// The ZeRO-1 shard rule (DESIGN.md "Trainer", "Memory"): which elements of the FP32 master weights and AdamW moments
// one GPU holds when the optimizer state is split over a data-parallel group (ZeRO stage 1, Rajbhandari et al.
// 2020; Megatron-Core's distributed optimizer). One statement, read by ParamStore::allocate (trainer/model/params.h)
// and by the memory estimator (trainer/memory/estimate.cpp), so that the two agree to the byte.
//
// Two kinds of parameter tensors, each split over its own group:
//   non-expert      every tensor but the routed experts', over `dense` ranks (dp);
//   routed experts  the tensors named "layers.<l>.moe.experts.*" (is_routed_expert_param), over `expert` ranks
//                   (expert_dp = dp x tp / ep: the GPUs of a stage that hold the same experts).
// The tensors of one kind lie end to end in registration order, each padded to kParamAlignElems elements, as a flat
// block of B elements (as Megatron-Core shards its contiguous gradient buffer). Every rank of `parts` owns
// S = round_up(ceil(B / parts), kParamAlignElems) elements of it (zero1_shard_elems): rank r the elements
// [r S, min((r + 1) S, B)); so S = B for parts = 1, later ranks own fewer (or none) when parts does not divide B,
// and a tensor may lie in one rank's shard, straddle two or more, or (smaller than S) belong to one rank wholly.
// A tensor at block offset o with n elements has on rank r its elements zero1_tensor_shard(o, n, S, r). A rank
// stores S elements of FP32 master, m and v (m and v BF16 under train.moments = bf16) per kind (the last ranks' tails are padding, as in Megatron-Core).
//
// The trainer emulates rank 0 of both groups (zero1_layout): one GPU of the run, the other ranks' shards absent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe {

// ParamStore pads every tensor to this many elements (256 bytes of FP32; 128-byte aligned BF16).
inline constexpr int64_t kParamAlignElems = 64;
// n rounded up to kParamAlignElems (n >= 0).
int64_t param_padded(int64_t n);

// Ranks over which the optimizer state is split: `dense` for the non-expert tensors, `expert` for the routed
// experts'. {1, 1}: not sharded (every rank holds everything).
struct Zero1Parts {
  int64_t dense = 1;
  int64_t expert = 1;
  bool sharded() const { return dense > 1 || expert > 1; }
};

// The routed experts' tensors: names "layers.<l>.moe.experts.<anything>" (the shared experts' are
// "layers.<l>.moe.shared.*" and are not).
bool is_routed_expert_param(const std::string& name);

// S above: the elements each of `parts` ranks owns of a flat block of `block` elements. Rejects (fp4moe::Error)
// block < 0 or not a multiple of kParamAlignElems, parts < 1.
int64_t zero1_shard_elems(int64_t block, int64_t parts);

// Elements [begin, end) of a tensor (0 <= begin <= end <= n; begin == end: none).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end == begin; }
  bool operator==(const ShardRange&) const = default;
};

// The elements of a tensor of n elements at block offset `offset` that rank `rank` owns when every rank owns
// `shard_elems` (zero1_shard_elems) of the block: [clamp(rank S - offset, 0, n), clamp((rank + 1) S - offset, 0, n)).
// Rejects offset < 0, n < 1, shard_elems < 0, rank < 0.
ShardRange zero1_tensor_shard(int64_t offset, int64_t n, int64_t shard_elems, int64_t rank);

// Rank 0's part of a whole store, the tensors (n elements each, `expert` by is_routed_expert_param) in registration
// order. Its storage (per copy: master, m, v; FP32, m and v BF16 under train.moments = bf16) is [the non-expert shard: dense_shard elements | the routed
// experts' shard: expert_shard elements]; a tensor's owned elements [range.begin, range.end) lie at
// storage_offset.. (a multiple of kParamAlignElems; -1 when the range is empty).
struct Zero1Slot {
  ShardRange range;
  int64_t storage_offset = -1;
};
struct Zero1Layout {
  int64_t dense_block = 0, expert_block = 0;  // B of each kind (padded elements)
  int64_t dense_shard = 0, expert_shard = 0;  // S of each kind
  std::vector<Zero1Slot> slots;               // one per tensor, in the order given
  int64_t storage() const { return dense_shard + expert_shard; }  // FP32 elements per copy
};
// Rejects (fp4moe::Error) n and expert of different lengths, an n < 1, parts < 1.
Zero1Layout zero1_layout(const std::vector<int64_t>& n, const std::vector<bool>& expert, Zero1Parts parts);

}  // namespace fp4moe
