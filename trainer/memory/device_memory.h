// One device allocator for the trainer, with per-category accounting (DESIGN.md "Trainer", "Memory").
//
// Every device buffer the trainer owns (weights, gradients, optimizer state, activations kept for backward,
// communication buffers, workspaces) comes from one DeviceMemory and is counted under its category: current bytes
// and the peak since the last reset_peaks(). A budget (bytes, 0 = none) emulates a smaller card: an allocation
// that would take the total over it throws fp4moe::Error with a report of what is held per category and which
// category asked, instead of crashing later; so does a failing cudaMalloc.
//
// Sizes are bytes. Allocations are rounded up to 256 bytes (what cudaMalloc guarantees for alignment) and
// counted as rounded. Not thread-safe: one per process, used from the host thread that drives the stream.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace fp4moe {

enum class MemCategory : int { weights = 0, grads, optimizer, activations, comm, workspace };
inline constexpr int kMemCategories = 6;
const char* mem_category_name(MemCategory c);

class DeviceMemory {
 public:
  explicit DeviceMemory(size_t budget_bytes = 0);
  ~DeviceMemory();  // frees whatever is still held
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Device memory of `bytes` (0 gives nullptr and counts nothing), counted under `category`; `what` names the
  // buffer in error messages ("layers.3.attn.q_up activations").
  void* allocate(size_t bytes, MemCategory category, const std::string& what);
  // Returns a pointer from allocate (nullptr is ignored); anything else throws.
  void release(void* p);

  size_t current(MemCategory c) const { return current_[static_cast<int>(c)]; }
  size_t peak(MemCategory c) const { return peak_[static_cast<int>(c)]; }
  size_t current_total() const { return current_total_; }
  size_t peak_total() const { return peak_total_; }
  size_t budget() const { return budget_; }
  void reset_peaks();  // peaks := current values
  // One line per category: current and peak in GiB, then the totals and the budget.
  std::string report() const;

 private:
  struct Block {
    size_t bytes;
    MemCategory category;
  };
  size_t budget_;
  std::array<size_t, kMemCategories> current_{}, peak_{};
  size_t current_total_ = 0, peak_total_ = 0;
  std::unordered_map<void*, Block> blocks_;
};

// An owning, typed device array from a DeviceMemory (move-only). Shape comments go where it is declared.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(DeviceMemory& mem, int64_t n, MemCategory category, const std::string& what)
      : mem_(&mem), n_(n), data_(static_cast<T*>(mem.allocate(static_cast<size_t>(n) * sizeof(T), category, what))) {}
  ~DeviceArray() { reset(); }
  DeviceArray(DeviceArray&& o) noexcept : mem_(o.mem_), n_(o.n_), data_(o.data_) { o.data_ = nullptr; o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      mem_ = o.mem_; n_ = o.n_; data_ = o.data_;
      o.data_ = nullptr; o.n_ = 0;
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void reset() {
    if (data_ && mem_) mem_->release(data_);
    data_ = nullptr;
    n_ = 0;
  }
  T* data() const { return data_; }
  int64_t size() const { return n_; }
  size_t bytes() const { return static_cast<size_t>(n_) * sizeof(T); }

 private:
  DeviceMemory* mem_ = nullptr;
  int64_t n_ = 0;
  T* data_ = nullptr;
};

}  // namespace fp4moe
