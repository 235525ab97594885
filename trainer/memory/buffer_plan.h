// One statement of every buffer a layer holds (DESIGN.md "Memory"). A layer's plan function lists, for the shapes
// it is given (the tokens of one micro-batch on one GPU, the heads and experts that GPU holds), its recipe and its
// recompute policy, each of its device buffers as data: a name, an element count and type, the DeviceMemory category
// it is counted under, when it is allocated, and whether the recipe and the policy hold it at all. Three readers use
// the same plan:
//   - the layer allocates its buffers from it (BufferPlan::allocate) and sizes the ones that grow with the batch
//     from it (Group Linear, Linear);
//   - the layer's accounting (kept bytes per layer and module, Model::layer_memory) sums it;
//   - the analytic estimator (trainer/memory/estimate.h) evaluates the same plan functions at the shapes of one GPU
//     of any parallel layout, without a device.
// So the estimate agrees with the allocator by construction on one GPU; the GPU test MemoryEstimateModel* measures it.
//
// Sizes are elements and bytes; DeviceMemory rounds each allocation up to 256 bytes (counted_bytes). Buffers the
// policy does not hold are listed with held = false: the layer takes them from the shared scratch
// (trainer/memory/scratch.h) when a pass needs them, and the estimator counts them as that pass's workspace, beside
// the pass's own scratch buffers (Lifetime::forward_scratch, backward_scratch). Tensors a recipe or policy never
// makes are listed with no elements, so that the layer's code can name them under every recipe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "trainer/memory/device_memory.h"

namespace fp4moe {

// Element types of the buffers: BF16, FP32, int32, FP8 E4M3 codes, packed E2M1 codes (two per byte: elements are
// bytes), UE8M0 scales (one byte each), plain bytes (a kernel's workspace).
enum class ElemType { bf16, fp32, int32, e4m3, e2m1x2, ue8m0, byte };
int64_t elem_bytes(ElemType t);
const char* elem_type_name(ElemType t);

// When a buffer exists. Held in DeviceMemory: allocated with the layer (kept from each forward to its backward), or
// by the first forward (a Linear's or Group Linear's own copies and scratch, whose sizes follow the first batch;
// kept from then on). Taken from the shared scratch arena (trainer/memory/scratch.h, MemCategory::workspace): by a
// forward (or the rerun of one in backward), or by a backward, and given back when the call returns.
enum class Lifetime { construction, first_forward, forward_scratch, backward_scratch };

struct PlannedBuffer {
  std::string tensor;  // "xs MXFP4 codes", "q_norm rstd"
  int64_t elems = 0;   // at the plan's shapes
  ElemType type = ElemType::bf16;
  MemCategory category = MemCategory::activations;
  Lifetime lifetime = Lifetime::construction;
  bool held = true;    // false: the recipe or the recompute policy does not keep it (not allocated)

  int64_t bytes() const { return elems * elem_bytes(type); }
  // What DeviceMemory counts for it: the bytes rounded up to 256, 0 when not held or empty.
  int64_t counted_bytes() const;
};

class BufferPlan {
 public:
  // module: the owner's part of the model in the estimator's reports ("layer", "mla", "moe.experts", ...).
  explicit BufferPlan(std::string module) : module_(std::move(module)) {}

  // Adds one buffer. Rejects (fp4moe::Error) elems < 0 and a tensor name already in the plan.
  BufferPlan& add(const std::string& tensor, int64_t elems, ElemType type, bool held = true,
                  MemCategory category = MemCategory::activations, Lifetime lifetime = Lifetime::construction);
  // Adds every buffer of `part` (a sub-layer's plan), its names prefixed with `prefix` ("q_norm ").
  BufferPlan& append(const BufferPlan& part, const std::string& prefix = "");

  // The buffer named `tensor`; throws fp4moe::Error naming the module and the tensor when there is none.
  const PlannedBuffer& at(const std::string& tensor) const;
  const std::string& module() const { return module_; }
  const std::vector<PlannedBuffer>& buffers() const { return buffers_; }

  // Sum of counted_bytes() over the held buffers of `category` and `lifetime`.
  int64_t counted_bytes(MemCategory category, Lifetime lifetime = Lifetime::construction) const;

  // The buffer `tensor` from `mem`, named "<owner> <tensor>" in mem's reports: an empty array when it is not held or
  // has no elements. The owner calls it with the layer (Lifetime::construction) or at its first forward, from the
  // plan of that forward's shapes (Lifetime::first_forward). Rejects (fp4moe::Error) a T whose size is not the
  // planned element type's, and a held activation (MemCategory::activations: allocate_kept's).
  template <typename T>
  DeviceArray<T> allocate(DeviceMemory& mem, const std::string& tensor, const std::string& owner) const {
    const PlannedBuffer& b = at(tensor);
    check_allocation(b, sizeof(T), false);
    if (!b.held || b.elems == 0) return DeviceArray<T>();
    return DeviceArray<T>(mem, b.elems, b.category, owner + " " + tensor);
  }
  // A held activation (MemCategory::activations): what a forward writes and the same micro-batch's backward reads,
  // one copy per in-flight micro-batch (mem.slots().count(), trainer/memory/device_memory.h), as allocate does it
  // otherwise. Rejects (fp4moe::Error) a T whose size is not the planned element type's and a buffer of another
  // category (allocate's).
  template <typename T>
  KeptArray<T> allocate_kept(DeviceMemory& mem, const std::string& tensor, const std::string& owner) const {
    const PlannedBuffer& b = at(tensor);
    check_allocation(b, sizeof(T), true);
    if (!b.held || b.elems == 0) return KeptArray<T>();
    return KeptArray<T>(mem, b.elems, b.category, owner + " " + tensor);
  }

 private:
  // The element size, then the category: activations through allocate_kept (kept = true), the rest through allocate.
  void check_allocation(const PlannedBuffer& b, size_t elem_size, bool kept) const;

  std::string module_;
  std::vector<PlannedBuffer> buffers_;
};

}  // namespace fp4moe
