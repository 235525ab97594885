#include "trainer/memory/buffer_plan.h"

#include <algorithm>

#include "trainer/memory/scratch.h"

namespace fp4moe {

int64_t elem_bytes(ElemType t) {
  switch (t) {
    case ElemType::bf16: return 2;
    case ElemType::fp32:
    case ElemType::int32: return 4;
    case ElemType::e4m3:
    case ElemType::e2m1x2:
    case ElemType::ue8m0:
    case ElemType::byte: return 1;
  }
  return 0;
}

const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::bf16: return "bf16";
    case ElemType::fp32: return "fp32";
    case ElemType::int32: return "int32";
    case ElemType::e4m3: return "e4m3";
    case ElemType::e2m1x2: return "e2m1x2";
    case ElemType::ue8m0: return "ue8m0";
    case ElemType::byte: return "byte";
  }
  return "?";
}

int64_t PlannedBuffer::counted_bytes() const {
  if (!held || elems == 0) return 0;
  return static_cast<int64_t>(ScratchArena::rounded(static_cast<size_t>(bytes())));
}

BufferPlan& BufferPlan::add(const std::string& tensor, int64_t elems, ElemType type, bool held, MemCategory category,
                            Lifetime lifetime) {
  FP4MOE_CHECK(elems >= 0, "buffer plan {}: {} has {} elements (expected >= 0)", module_, tensor, elems);
  const bool listed =
      std::any_of(buffers_.begin(), buffers_.end(), [&](const PlannedBuffer& b) { return b.tensor == tensor; });
  FP4MOE_CHECK(!listed, "buffer plan {}: {} is listed twice", module_, tensor);
  buffers_.push_back(PlannedBuffer{tensor, elems, type, category, lifetime, held});
  return *this;
}

BufferPlan& BufferPlan::append(const BufferPlan& part, const std::string& prefix) {
  for (const PlannedBuffer& b : part.buffers_) add(prefix + b.tensor, b.elems, b.type, b.held, b.category, b.lifetime);
  return *this;
}

const PlannedBuffer& BufferPlan::at(const std::string& tensor) const {
  for (const PlannedBuffer& b : buffers_)
    if (b.tensor == tensor) return b;
  FP4MOE_CHECK(false, "buffer plan {}: no buffer named {}", module_, tensor);
  return buffers_.front();  // not reached
}

int64_t BufferPlan::counted_bytes(MemCategory category, Lifetime lifetime) const {
  int64_t sum = 0;
  for (const PlannedBuffer& b : buffers_)
    if (b.category == category && b.lifetime == lifetime) sum += b.counted_bytes();
  return sum;
}

void BufferPlan::check_allocation(const PlannedBuffer& b, size_t elem_size, bool kept) const {
  FP4MOE_CHECK(static_cast<int64_t>(elem_size) == elem_bytes(b.type),
               "buffer plan {}: {} holds {} elements ({} bytes), allocated with {}-byte elements", module_, b.tensor,
               elem_type_name(b.type), elem_bytes(b.type), elem_size);
  const bool activation = b.category == MemCategory::activations;
  FP4MOE_CHECK(activation == kept,
               "buffer plan {}: {} is {} and goes through {} (one copy per in-flight micro-batch for the held "
               "activations only)",
               module_, b.tensor, mem_category_name(b.category), activation ? "allocate_kept" : "allocate");
}

}  // namespace fp4moe
