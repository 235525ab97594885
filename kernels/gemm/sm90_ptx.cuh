// Inline PTX for Hopper (sm_90a) kernels: mbarriers, the bulk tensor copy engine (TMA), warpgroup matrix multiply
// (WGMMA), warpgroup register reallocation, a 16-byte global store. Device code only; each wrapper is one PTX
// instruction (or a spin on one) as the PTX ISA 8.x describes it (sections "Parallel Synchronization and
// Communication Instructions: mbarrier", "Data Movement: cp.async.bulk / cp.async.bulk.tensor", "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Instructions", "setmaxnreg", "st"). Shared-memory addresses are 32-bit
// `.shared::cta` addresses (smem_addr); global addresses and tensor maps are generic pointers.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fp4moe::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier (64-bit barrier object in shared memory) -----------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the other threads and to the async proxy (TMA) before first use.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival (release semantics at CTA scope: this thread's earlier shared-memory accesses happen before the phase
// completes for a waiter).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// One arrival that also raises the phase's expected transaction count by `bytes` (the TMA copies that follow
// complete it).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Waits until the phase of parity `parity` (0 or 1) has completed (acquire semantics). A fresh barrier is in phase
// 0: waiting for parity 1 returns at once (the phase "before" it counts as complete), for parity 0 it blocks until
// the first phase completes.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Orders this thread's earlier ordinary (generic proxy) shared-memory writes before later accesses of the async
// proxy (WGMMA operand reads, bulk copies): a thread that fills an operand tile with st.shared runs it before the
// mbarrier arrival that hands the tile to WGMMA (PTX ISA, "Memory Consistency Model: proxies"; fence.proxy.async).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- bulk copies (TMA), completing on an mbarrier -----------------------------------------------------------------

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The box of a 2-D tiled tensor map at coordinates (c0 innermost, c1) into shared memory at `dst` (128-byte
// aligned; 1024 for the 128-byte swizzle). Elements outside the tensor are filled with zeros and still count
// towards the transaction bytes (the whole box arrives).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned) from global to shared memory.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// The box of a 4-D tiled tensor map at coordinates (c0 innermost, c1, c2, c3) into shared memory at `dst`, as
// tma_load_2d (elements outside the tensor arrive as zeros and count towards the transaction bytes).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                            int32_t c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_addr(bar))
      : "memory");
}

// ---- global stores ------------------------------------------------------------------------------------------------

// *p += (a, b) as one FP32 pair reduction in global memory (red.global.add.v2.f32, sm_90): performed at the L2,
// fire and forget (the thread does not wait for it). Each add rounds to nearest even, and the L2's FP32 add flushes
// subnormal inputs and results to sign-preserving zero (PTX ISA, red/atom .add.f32). p: 8-byte aligned, global.
__device__ __forceinline__ void red_add_global_v2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(__cvta_generic_to_global(p)), "f"(a), "f"(b)
               : "memory");
}

// 16 bytes to a 16-byte aligned global address as one vector store (the compiler may otherwise split a uint4 store).
__device__ __forceinline__ void st_global_v4(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(p)), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}

// ---- warpgroup register reallocation ------------------------------------------------------------------------------
// A thread block of `threads` launched with one block per SM holds threads x (65536 / threads rounded down to the
// allocation granularity of 8) registers (384 threads: 168 each, 64512 in all). setmaxnreg.dec gives registers back
// to that pool and setmaxnreg.inc waits until the pool has what it asks for (PTX ISA, setmaxnreg): if the counts
// after reallocation sum to more than the pool, the increasing warpgroups wait forever. Each count must also be a
// multiple of 8 in [24, 256] (setmaxnreg's operand). The pool assumes the kernel is compiled to that count per
// thread (ptxas -v: "Used 168 registers" for 384 threads); a kernel compiled to fewer holds fewer, which
// check_setmaxnreg_pool (kernels/gemm/setmaxnreg_check.h) refuses before the launch.
constexpr bool setmaxnreg_fits(uint32_t threads, uint32_t producer_threads, uint32_t producer_regs,
                               uint32_t consumer_regs) {
  const auto valid = [](uint32_t r) { return r % 8 == 0 && r >= 24 && r <= 256; };
  return valid(producer_regs) && valid(consumer_regs) &&
         producer_threads * producer_regs + (threads - producer_threads) * consumer_regs <=
             threads * (65536 / threads / 8 * 8);
}

template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- WGMMA ----------------------------------------------------------------------------------------------------------

// Shared-memory matrix descriptor of a K-major operand tile stored as the 128-byte swizzle writes it (TMA
// CU_TENSOR_MAP_SWIZZLE_128B with a 128-byte inner box): rows of 128 bytes, 8-row atoms of 1024 bytes, the tile's
// start 1024-byte aligned. Fields: start address >> 4 (bits 0-13), leading byte offset >> 4 (bits 16-29; unused
// when the instruction's K extent lies inside one 128-byte row, set to 1), stride byte offset >> 4 (bits 32-45:
// 1024 bytes from one 8-row atom to the next), base offset 0 (bits 49-51), swizzle mode 1 = 128B (bits 62-63).
// A step of 32 bytes along K inside the row adds 2 to the start address field (the swizzle is applied by the
// hardware on the absolute address bits).
__device__ __forceinline__ uint64_t smem_desc_k_major_sw128(const void* tile) {
  const uint64_t start = (smem_addr(tile) & 0x3FFFFu) >> 4;
  return start | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// Shared-memory matrix descriptor of an MN-major operand (B of D = A B stored as rows of K, N contiguous: wgmma's
// transpose bit set) written by the 128-byte swizzle: each 8-row atom (8 values of K, 1024 bytes) holds 64 BF16 of N
// per 128-byte row; the atoms of the next 8 values of K follow 1024 bytes on (stride byte offset), the next 64 of N
// lie `n_block_bytes` on (leading byte offset: PTX ISA, "Leading Dimension Byte Offset", MN-major swizzled layouts).
// The tile's start is 1024-byte aligned; a step of 16 along K adds 2048 bytes (two atoms), keeping it so.
__device__ __forceinline__ uint64_t smem_desc_mn_major_sw128(const void* tile, uint32_t n_block_bytes) {
  const uint64_t start = (smem_addr(tile) & 0x3FFFFu) >> 4;
  return start | (uint64_t{(n_block_bytes & 0x3FFFFu) >> 4} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of an accumulator register across a wgmma fence or wait (the registers
// are written asynchronously, which the compiler cannot see).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// D[64 x 128] (+)= A[64 x 32] B[32 x 128]: E4M3 x E4M3 with FP32 accumulation, both operands K-major in shared
// memory (descriptors above), D = A B when `accumulate` is 0. Fragment of D in thread t of the warpgroup (warp
// w = t / 32, lane l = t % 32): d[i] is row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The 64 FP32 accumulator registers of an m64n128 product as asm operands %0..%63 (read and written).
#define FP4MOE_SM90_D64_TEXT                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FP4MOE_SM90_D64_OPERANDS(d)                                                                                 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),      \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),      \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),      \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),      \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D[64 x 128] (+)= A[64 x 16] B[16 x 128]: BF16 x BF16 with FP32 accumulation, both operands K-major in shared
// memory (smem_desc_k_major_sw128), D = A B when `accumulate` is 0. D's fragment as in wgmma_m64n128k32_e4m3.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FP4MOE_SM90_D64_TEXT ", %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : FP4MOE_SM90_D64_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 128] += A[64 x 16] B[16 x 128]: BF16 x BF16 with FP32 accumulation, A from registers, B MN-major in shared
// memory (smem_desc_mn_major_sw128; the instruction's transpose bit for B). A's fragment in thread t of the
// warpgroup (warp w = t / 32, lane l = t % 32, g = l / 4, c = l % 4), two BF16 per register, the lower column in the
// low half: a[0] = row 16 w + g, columns 2c, 2c + 1; a[1] = row 16 w + g + 8, the same columns; a[2], a[3] = the
// same rows, columns 2c + 8, 2c + 9. That is D's fragment of an m64n16 product, rounded to BF16 in pairs.
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FP4MOE_SM90_D64_TEXT
      ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : FP4MOE_SM90_D64_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

#undef FP4MOE_SM90_D64_OPERANDS
#undef FP4MOE_SM90_D64_TEXT

// The 32 FP32 accumulator registers of an m64n64 product as asm operands %0..%31 (read and written).
#define FP4MOE_SM90_D32_TEXT                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FP4MOE_SM90_D32_OPERANDS(d)                                                                                 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]: as wgmma_m64n128k16_bf16 with N = 64 (B's descriptor spans 64 rows of N).
// D's fragment: d[i] is row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2.
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                     uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FP4MOE_SM90_D32_TEXT ", %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : FP4MOE_SM90_D32_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 64] += A[64 x 16] B[16 x 64]: as wgmma_m64n128k16_bf16_rs_tb with N = 64 (A from registers in the same
// fragment, B MN-major in shared memory); D's fragment as in wgmma_m64n64k16_bf16.
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FP4MOE_SM90_D32_TEXT
      ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : FP4MOE_SM90_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

#undef FP4MOE_SM90_D32_OPERANDS
#undef FP4MOE_SM90_D32_TEXT

}  // namespace fp4moe::sm90
