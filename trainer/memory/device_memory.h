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
//
// In-flight micro-batches (DESIGN.md "Memory"; the 1F1B schedule, trainer/train/pipeline_schedule.h): a pipeline
// stage runs several forwards before the first backward, so every buffer a forward writes and the same
// micro-batch's backward reads (the held activations) exists once per in-flight micro-batch. DeviceMemory carries
// the cursor over those copies (slots(): how many, and which one the current pass uses); KeptArray below is a held
// activation buffer with one copy per slot, KeptValue a host value kept from a forward to its backward. The model
// sets the count once, at its construction, before its layers allocate (one model per DeviceMemory), and selects
// the slot before each forward and backward; with one slot (the default) a KeptArray is one DeviceArray.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/common/check.h"

namespace fp4moe {

enum class MemCategory : int { weights = 0, grads, optimizer, activations, comm, workspace };
inline constexpr int kMemCategories = 6;
const char* mem_category_name(MemCategory c);

// The in-flight micro-batches' slots: count() copies of every held activation, active() the one in use.
class ActivationSlots {
 public:
  int64_t count() const { return count_; }
  int64_t active() const { return active_; }
  // Copies each KeptArray and KeptValue made from now on holds. Rejects n < 1; the active slot goes back to 0.
  void set_count(int64_t n) {
    FP4MOE_CHECK(n >= 1, "activation slots: the count must be >= 1, got {}", n);
    count_ = n;
    active_ = 0;
  }
  // The slot the next forward or backward reads and writes. Rejects s outside [0, count()).
  void set_active(int64_t s) {
    FP4MOE_CHECK(s >= 0 && s < count_, "activation slots: slot {} is outside [0, {})", s, count_);
    active_ = s;
  }

 private:
  int64_t count_ = 1, active_ = 0;
};

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
  // Buffers freed so far (release of a non-null pointer): a CUDA graph that captured addresses of this allocator's
  // buffers may hold a freed one once this count has changed (trainer/train/step_graph.h).
  uint64_t releases() const { return releases_; }
  // One line per category: current and peak in GiB, then the totals and the budget.
  std::string report() const;

  // The in-flight slots of the held activations allocated here (above).
  ActivationSlots& slots() { return slots_; }
  const ActivationSlots& slots() const { return slots_; }

 private:
  struct Block {
    size_t bytes;
    MemCategory category;
  };
  size_t budget_;
  std::array<size_t, kMemCategories> current_{}, peak_{};
  size_t current_total_ = 0, peak_total_ = 0;
  uint64_t releases_ = 0;
  std::unordered_map<void*, Block> blocks_;
  ActivationSlots slots_;
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

// Reads slot `s` of `copies` copies; throws when the cursor points past them (a count changed after allocation).
inline int64_t checked_slot(const ActivationSlots* slots, size_t copies, const char* what) {
  const int64_t s = slots ? slots->active() : 0;
  FP4MOE_CHECK(s >= 0 && static_cast<size_t>(s) < (copies ? copies : 1),
               "{}: the active slot {} is outside the {} copies it was made with", what, s, copies);
  return s;
}

// A held activation buffer: one DeviceArray of n elements per in-flight slot (mem.slots().count() of them, all
// allocated here, counted under `category`), of which data() gives the active slot's. The interface of
// DeviceArray, so that layer code calls data() at the time of use and follows the slot; a pointer taken from it
// belongs to the slot that was active then. Move-only. BufferPlan::allocate_kept makes one from a plan.
template <typename T>
class KeptArray {
 public:
  KeptArray() = default;
  // `what` names the buffer; with several slots each copy is "<what> [slot i]".
  KeptArray(DeviceMemory& mem, int64_t n, MemCategory category, const std::string& what) : slots_(&mem.slots()) {
    const int64_t count = mem.slots().count();
    for (int64_t s = 0; s < count; ++s)
      copies_.emplace_back(mem, n, category, count == 1 ? what : what + " [slot " + std::to_string(s) + "]");
  }
  void reset() { copies_.clear(); }
  T* data() const {
    if (copies_.empty()) return nullptr;
    return copies_[static_cast<size_t>(checked_slot(slots_, copies_.size(), "KeptArray"))].data();
  }
  int64_t size() const { return copies_.empty() ? 0 : copies_.front().size(); }  // elements of one copy
  size_t bytes() const { return copies_.empty() ? 0 : copies_.front().bytes(); }  // bytes of one copy
  int64_t copies() const { return static_cast<int64_t>(copies_.size()); }

 private:
  const ActivationSlots* slots_ = nullptr;
  std::vector<DeviceArray<T>> copies_;
};

// A host value kept from a forward to the same micro-batch's backward (a token count, the routing's host offsets):
// one T per in-flight slot, get() the active slot's. Default: one value, no cursor.
template <typename T>
class KeptValue {
 public:
  KeptValue() : values_(1) {}
  KeptValue(const ActivationSlots& slots, const T& init)
      : slots_(&slots), values_(static_cast<size_t>(slots.count()), init) {}
  // Default-constructed values (move-only T: PinnedHost), for the owner to fill through all().
  explicit KeptValue(const ActivationSlots& slots) : slots_(&slots) {
    values_.resize(static_cast<size_t>(slots.count()));
  }
  T& get() { return values_[static_cast<size_t>(checked_slot(slots_, values_.size(), "KeptValue"))]; }
  const T& get() const { return values_[static_cast<size_t>(checked_slot(slots_, values_.size(), "KeptValue"))]; }
  std::vector<T>& all() { return values_; }

 private:
  const ActivationSlots* slots_ = nullptr;
  std::vector<T> values_;
};

}  // namespace fp4moe
