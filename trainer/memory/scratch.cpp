#include "trainer/memory/scratch.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "kernels/common/check.h"

namespace fp4moe {

ScratchArena::ScratchArena(void* base, size_t capacity)
    : measuring_(false), base_(static_cast<unsigned char*>(base)), capacity_(capacity) {
  FP4MOE_CHECK(capacity == 0 || (base != nullptr && reinterpret_cast<uintptr_t>(base) % kAlign == 0),
               "ScratchArena: a capacity of {} bytes needs a non-null base aligned to {} bytes, got {}", capacity,
               kAlign, base);
}

ScratchArena::ScratchArena(DeviceMemory& mem, size_t capacity, const std::string& what)
    : measuring_(false), capacity_(capacity) {
  owned_ = DeviceArray<unsigned char>(mem, static_cast<int64_t>(capacity), MemCategory::workspace, what);
  base_ = owned_.data();
}

size_t ScratchArena::checked_bytes(int64_t n, size_t elem, const char* what) {
  FP4MOE_CHECK(n >= 0 && static_cast<uint64_t>(n) <= std::numeric_limits<size_t>::max() / 2 / elem,
               "ScratchArena: '{}' asks for {} elements of {} bytes (expected 0 <= n, bytes below 2^63)", what, n,
               elem);
  return static_cast<size_t>(n) * elem;
}

void* ScratchArena::take_bytes(size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  const size_t size = rounded(bytes);
  FP4MOE_CHECK(measuring_ || size <= capacity_ - used_,
               "ScratchArena: '{}' needs {} bytes at offset {} but the arena holds {} bytes (sized at construction "
               "from the layers' reported needs: a layer takes more than it planned); live takes:\n{}",
               what, size, used_, capacity_, describe());
  void* p = measuring_ ? nullptr : base_ + used_;
  used_ += size;
  high_water_ = std::max(high_water_, used_);
  live_.push_back(Entry{used_, next_serial_++, what});
  return p;
}

void ScratchArena::release(const Mark& m) {
  FP4MOE_CHECK(m.entries <= live_.size() && m.used <= used_ &&
                   (m.entries == 0 ? m.used == 0 : live_[m.entries - 1].end == m.used),
               "ScratchArena::release: the mark ({} entries, {} bytes) is not on the stack ({} entries, {} bytes): "
               "scopes must end innermost first",
               m.entries, m.used, live_.size(), used_);
  live_.resize(m.entries);
  used_ = m.used;
}

uint64_t ScratchArena::stamp() {
  live_.push_back(Entry{used_, next_serial_, nullptr});
  return next_serial_++;
}

bool ScratchArena::alive(uint64_t stamp) const {
  if (stamp == 0) return false;
  for (auto it = live_.rbegin(); it != live_.rend(); ++it) {
    if (it->serial == stamp) return true;
    if (it->serial < stamp) return false;  // serials grow up the stack
  }
  return false;
}

std::string ScratchArena::describe() const {
  std::string s;
  size_t begin = 0;
  for (const Entry& e : live_) {
    if (e.what) s += fmt::format("  {}: {} bytes at offset {}\n", e.what, e.end - begin, begin);
    begin = e.end;
  }
  return s.empty() ? std::string("  (none)\n") : s;
}

ScratchScope::~ScratchScope() {
  try {
    arena_.release(mark_);
  } catch (...) {
    // A scope ending out of order is a programming error caught by the checks of the scopes around it; a destructor
    // must not throw.
  }
}

}  // namespace fp4moe
