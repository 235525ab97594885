#include "trainer/memory/device_memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/common/check.h"

namespace fp4moe {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::weights: return "weights";
    case MemCategory::grads: return "grads";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::comm: return "comm";
    case MemCategory::workspace: return "workspace";
  }
  return "unknown";
}

namespace {
double gib(size_t b) { return static_cast<double>(b) / static_cast<double>(size_t{1} << 30); }
}  // namespace

DeviceMemory::DeviceMemory(size_t budget_bytes) : budget_(budget_bytes) {}

DeviceMemory::~DeviceMemory() {
  for (auto& [p, b] : blocks_) cudaFree(p);  // no throw from a destructor; errors are already reported elsewhere
}

void* DeviceMemory::allocate(size_t bytes, MemCategory category, const std::string& what) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + 255) / 256 * 256;
  const int c = static_cast<int>(category);
  FP4MOE_CHECK(budget_ == 0 || current_total_ + rounded <= budget_,
               "out of the memory budget: {} needs {:.3f} GiB of {} but {:.3f} of {:.3f} GiB are held\n{}", what,
               gib(rounded), mem_category_name(category), gib(current_total_), gib(budget_), report());
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, rounded);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    FP4MOE_CHECK(false, "cudaMalloc failed ({}) for {}: {:.3f} GiB of {} with {:.3f} GiB held\n{}",
                 cudaGetErrorString(err), what, gib(rounded), mem_category_name(category), gib(current_total_),
                 report());
  }
  blocks_.emplace(p, Block{rounded, category});
  current_[c] += rounded;
  current_total_ += rounded;
  peak_[c] = std::max(peak_[c], current_[c]);
  peak_total_ = std::max(peak_total_, current_total_);
  return p;
}

void DeviceMemory::release(void* p) {
  if (p == nullptr) return;
  auto it = blocks_.find(p);
  FP4MOE_CHECK(it != blocks_.end(), "DeviceMemory::release: {} was not allocated here (or released twice)", p);
  CUDA_CHECK(cudaFree(p));
  current_[static_cast<int>(it->second.category)] -= it->second.bytes;
  current_total_ -= it->second.bytes;
  blocks_.erase(it);
  ++releases_;
}

void DeviceMemory::reset_peaks() {
  peak_ = current_;
  peak_total_ = current_total_;
}

std::string DeviceMemory::report() const {
  std::string s;
  for (int c = 0; c < kMemCategories; ++c)
    s += fmt::format("  {:<12} {:9.3f} GiB now, {:9.3f} GiB peak\n", mem_category_name(static_cast<MemCategory>(c)),
                     gib(current_[c]), gib(peak_[c]));
  s += fmt::format("  {:<12} {:9.3f} GiB now, {:9.3f} GiB peak", "total", gib(current_total_), gib(peak_total_));
  if (budget_) s += fmt::format(", budget {:.3f} GiB", gib(budget_));
  return s;
}

}  // namespace fp4moe
