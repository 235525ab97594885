// Asynchronous 16- and 4-byte global -> shared copies (cp.async, sm_80+), so that a thread block can load its next tile
// while it converts the current one without staging the data in registers.
#pragma once

#include <cstdint>

namespace fp4moe::detail {

// Copies 16 bytes from gmem to smem, or writes 16 zero bytes when !valid (gmem is then not read, but must still
// be a valid address). Both addresses 16-byte aligned. Bypasses L1 (.cg): the data is read once.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes) : "memory");
}

// Copies 4 bytes from gmem to smem through L1 (.ca: the only cache mode of copies under 16 bytes), or writes 4 zero
// bytes when !valid (gmem then not read, but a valid address). Both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A producer thread's window of committed cp.async groups, each a unit of work (a block of a tile) to finish once
// its copies have landed: issued() after committing one, which finishes the oldest once more than kLookahead are
// in flight (after waiting for its copies); drain() at the end, which finishes the rest in order. finish() is
// called once per group, oldest first.
template <int kLookahead>
struct CpAsyncWindow {
  static_assert(kLookahead >= 0, "a non-negative number of groups left in flight");
  int in_flight = 0;
  template <class Finish>
  __device__ __forceinline__ void issued(Finish&& finish) {
    if (++in_flight > kLookahead) {
      cp_async_wait<kLookahead>();
      finish();
      --in_flight;
    }
  }
  template <class Finish>
  __device__ __forceinline__ void drain(Finish&& finish) {
    cp_async_wait<0>();
    for (; in_flight > 0; --in_flight) finish();
  }
};

}  // namespace fp4moe::detail
