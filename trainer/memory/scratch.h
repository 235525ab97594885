// The shared scratch of the model's layers (DESIGN.md "Trainer", "Memory"): one block of device memory, counted once
// under MemCategory::workspace, that the layers' forwards and backwards borrow from in turn. Layers run one after
// another on one stream, so they can share it: a call takes what it needs (its backward's gradients, FP32 sums,
// kernel workspaces, the activations its recompute policy does not keep) and gives it back when it returns.
//
// A stack (bump) allocator: take() hands out the next piece, 256-byte aligned and rounded up to 256 bytes (as
// DeviceMemory counts); a ScratchScope records the top and restores it when it ends, so a call's takes go back at
// once and the calls it makes (a norm inside MLA, the shared experts inside the MoE block) stack above it. The model
// opens one scope per decoder layer forward and backward, so every layer starts from an empty arena.
//
// Tensors left in a caller's scope: a layer that recomputes its forward for a backward in the same scope (MLA under
// `full`, a norm whose rstd is not kept, the routed experts under `moe`) takes them without a scope of its own, then
// stamp()s: alive(stamp) stays true until the scope they were taken in ends, and the layer's backward checks it before
// it reads them (a stale pointer into reused scratch would give wrong gradients silently).
//
// Sizing: every layer states the most its passes take (PassScratch, below) in one static function of the
// configuration and the shapes (RmsNorm::scratch, MlaAttention::scratch, SwigluMlp::scratch, MoeRouter::scratch,
// MoeRoutedExperts::scratch, MoeLayer::scratch, DecoderLayer::scratch): each take rounded as the arena rounds it,
// the scopes nested as the passes nest them (MLA and the routed experts count their takes by running their binding
// code on a measuring arena: no memory, take() returns null and only counts). The layer's constructor reads its
// numbers from that function, and Model::scratch_arena_bytes sizes the arena from the same functions (the maximum
// over the layers, the LM head, the final norm and the embedding backward), once; the memory estimator
// (trainer/memory/estimate.h) calls it at one GPU's shapes of any layout. A take beyond the capacity throws
// fp4moe::Error listing the live takes (a layer's plan disagrees with what it takes).
//
// Contents are not initialised and not kept from one scope to the next. Host-side bookkeeping only: giving a piece
// back while the stream still reads it is safe, because the next user's kernels are queued on the same stream.
// Not thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"

namespace fp4moe {

class ScratchArena {
 public:
  static constexpr size_t kAlign = 256;
  // bytes rounded up to kAlign (what a take of `bytes` uses, and what DeviceMemory counts for an allocation).
  static size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  // A measuring arena: no memory and no capacity limit; take() returns null and counts.
  ScratchArena() = default;
  // An arena over memory the caller owns: [base, base + capacity), base aligned to 256 bytes. Rejects a null or
  // misaligned base with capacity > 0.
  ScratchArena(void* base, size_t capacity);
  // An arena owning `capacity` bytes from `mem` (MemCategory::workspace, named `what` in mem's reports).
  ScratchArena(DeviceMemory& mem, size_t capacity, const std::string& what);
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;

  // n >= 0 elements of T (n = 0: null, nothing taken), until the enclosing scope ends. `what` (a string literal,
  // kept by pointer) names the piece in error messages. Rejects n < 0 and, in a real arena, a take beyond capacity.
  template <typename T>
  T* take(int64_t n, const char* what) {
    return static_cast<T*>(take_bytes(checked_bytes(n, sizeof(T), what), what));
  }
  void* take_bytes(size_t bytes, const char* what);

  // The top of the stack: live takes and stamps, and bytes in use.
  struct Mark {
    size_t entries = 0;
    size_t used = 0;
  };
  Mark mark() const { return Mark{live_.size(), used_}; }
  // Gives back everything taken (and stamped) after `m`. Rejects a mark above the current top (already released).
  void release(const Mark& m);

  // A zero-byte entry on the stack: alive(s) is true until the scope it was made in ends. Stamps are never 0.
  uint64_t stamp();
  bool alive(uint64_t stamp) const;

  bool measuring() const { return measuring_; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }       // 0 for a measuring arena
  size_t high_water() const { return high_water_; }   // the most in use at once since construction or the reset
  void reset_high_water() { high_water_ = used_; }
  // The live takes, innermost last ("name: bytes" per line), for error messages.
  std::string describe() const;

 private:
  struct Entry {
    size_t end;          // used_ after this entry
    uint64_t serial;     // stamp number (takes get one too)
    const char* what;    // null for a stamp
  };
  static size_t checked_bytes(int64_t n, size_t elem, const char* what);

  bool measuring_ = true;
  unsigned char* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
  uint64_t next_serial_ = 1;
  std::vector<Entry> live_;
  DeviceArray<unsigned char> owned_;
};

// The most of the arena one layer's passes take for its largest batch (bytes, each take ScratchArena::rounded):
//   forward                   one forward, in its own scope (or, for a layer that takes in its caller's scope, what
//                             it leaves there: the router's logits, the routed experts' tensors);
//   backward                  one backward after a normal forward (what it rebuilds included);
//   recompute                 what a rerun of the forward for a backward in the caller's scope leaves there (RmsNorm's
//                             rstd, MlaAttention::recompute_forward, MoeRoutedExperts::recompute; 0 for the others);
//   backward_after_recompute  what backward takes above such a rerun.
struct PassScratch {
  size_t forward = 0, backward = 0, recompute = 0, backward_after_recompute = 0;
  // The most the layer takes at once when called on its own (forward; backward; rerun, then backward).
  size_t high_water() const {
    return std::max({forward, backward, recompute + backward_after_recompute});
  }
};

// The planned buffer `b` (trainer/memory/buffer_plan.h) from the arena: b.elems elements of T, whatever b's lifetime
// (a pass's scratch, or a tensor the policy does not keep). `what` as for take(). Rejects a T whose size is not b's
// element size.
template <typename T>
T* take_planned(ScratchArena& arena, const PlannedBuffer& b, const char* what) {
  FP4MOE_CHECK(static_cast<int64_t>(sizeof(T)) == elem_bytes(b.type),
               "scratch: {} is planned as {} elements, taken with {}-byte elements", b.tensor, elem_type_name(b.type),
               sizeof(T));
  return arena.take<T>(b.elems, what);
}

// Restores the arena's top when it ends: everything taken inside goes back.
class ScratchScope {
 public:
  explicit ScratchScope(ScratchArena& arena) : arena_(arena), mark_(arena.mark()) {}
  ~ScratchScope();
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  ScratchArena& arena_;
  ScratchArena::Mark mark_;
};

// Bytes a DeviceArray holds as DeviceMemory counts them (rounded up to 256; 0 when empty): the kept-activation
// numbers the layers report (Model::layer_memory).
template <typename T>
size_t counted_bytes(const DeviceArray<T>& a) {
  return a.size() > 0 ? ScratchArena::rounded(a.bytes()) : 0;
}
// The same for one copy of a held activation (one micro-batch; DeviceMemory holds KeptArray::copies() of them).
template <typename T>
size_t counted_bytes(const KeptArray<T>& a) {
  return a.size() > 0 ? ScratchArena::rounded(a.bytes()) : 0;
}

}  // namespace fp4moe
