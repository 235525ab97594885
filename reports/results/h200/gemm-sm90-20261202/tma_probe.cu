// Standalone TMA probe (results artefact, not part of the build): each case in its own process, since an illegal
// instruction poisons the context. Usage: tma_probe MODE [C0]; MODE bits: 1 the E4M3 tile copy, 2 the FP32 scale
// copy starting at innermost coordinate C0, 4 a 16-byte bulk copy, 8 warpgroup register reallocation, 16 issue from
// thread 256 after the others return.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "kernels/gemm/sm90_ptx.cuh"
using namespace fp4moe::sm90;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

static CUtensorMap encode(void* base, CUtensorMapDataType t, int es, uint64_t inner, uint64_t outer, uint64_t row_bytes,
                          uint32_t bi, uint32_t bo, CUtensorMapSwizzle sw) {
  void* p = nullptr; cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q));
  auto fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  CUtensorMap m; cuuint64_t dims[2] = {inner, outer}; cuuint64_t str[1] = {row_bytes}; cuuint32_t box[2] = {bi, bo};
  cuuint32_t es1[2] = {1, 1};
  CUresult r = fn(&m, t, 2, base, dims, str, box, es1, CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("encode failed %d\n", (int)r); exit(1); }
  return m;
}

// mode bit 0: load A (u8 swizzle 128B box 128x128), bit 1: scales f32 box {128,1}, bit 2: bulk 16 B;
// bit 3: setmaxnreg dec/inc as the kernel; bit 4: issue from thread 256 after others return (else thread 0).
__global__ void __launch_bounds__(384, 1) probe(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap msa,
                                                const float* wsc, int mode, int c0, unsigned char* outa, float* outsa, float* outsb) {
  extern __shared__ uint8_t raw[];
  uint8_t* smem = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
  uint8_t* A = smem; float* SA = reinterpret_cast<float*>(smem + 16384); float* SB = SA + 128;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 16384 + 512 + 16 + 48);
  if (threadIdx.x == 0) { mbar_init(bar, 1); mbar_init_fence(); }
  __syncthreads();
  const int issuer = (mode & 16) ? 256 : 0;
  uint32_t tx = ((mode & 1) ? 16384 : 0) + ((mode & 2) ? 512 : 0) + ((mode & 4) ? 16 : 0);
  if (threadIdx.x >= 256) {
    if (mode & 8) warpgroup_regs_dec<40>();
    if (threadIdx.x != issuer) return;
  } else if (mode & 8) warpgroup_regs_inc<232>();
  if (threadIdx.x == issuer) {
    mbar_arrive_expect_tx(bar, tx);
    if (mode & 1) tma_load_2d(A, &ma, 128, 128, bar);
    if (mode & 2) tma_load_2d(SA, &msa, c0, 3, bar);
    if (mode & 4) bulk_load(SB, wsc + 4, 16, bar);
    if (issuer == 256) return;
  }
  if (threadIdx.x < 256) {
    mbar_wait(bar, 0);
    for (int i = threadIdx.x; i < 16384; i += 256) outa[i] = A[i];
    if (threadIdx.x < 128) outsa[threadIdx.x] = SA[threadIdx.x];
    if (threadIdx.x < 4) outsb[threadIdx.x] = SB[threadIdx.x];
  }
}

int main(int argc, char** argv) {
  int mode = atoi(argv[1]); int c0 = argc > 2 ? atoi(argv[2]) : 128;
  unsigned char *a, *oa; float *sa, *osa, *wsc, *osb;
  const int R = 512, M = 256, ld = 256;
  CK(cudaMalloc(&a, M * R)); CK(cudaMalloc(&oa, 16384)); CK(cudaMalloc(&sa, ld * (R / 128) * 4));
  CK(cudaMalloc(&osa, 512)); CK(cudaMalloc(&wsc, 64)); CK(cudaMalloc(&osb, 16));
  std::vector<unsigned char> ha(M * R); for (int i = 0; i < M * R; ++i) ha[i] = (unsigned char)(i * 7 + i / R);
  std::vector<float> hs(ld * (R / 128)); for (size_t i = 0; i < hs.size(); ++i) hs[i] = (float)i;
  float hw[16]; for (int i = 0; i < 16; ++i) hw[i] = 100.0f + i;
  CK(cudaMemcpy(a, ha.data(), ha.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sa, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(wsc, hw, 64, cudaMemcpyHostToDevice));
  CK(cudaMemset(oa, 0, 16384)); CK(cudaMemset(osa, 0, 512)); CK(cudaMemset(osb, 0, 16));
  CUtensorMap ma = encode(a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, R, M, R, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  CUtensorMap msa = encode(sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, ld, R / 128, ld * 4, 128, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
  const int smem = 1024 + 16384 + 1024;
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  probe<<<1, 384, smem>>>(ma, msa, wsc, mode, c0, oa, osa, osb);
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  std::vector<unsigned char> goa(16384); std::vector<float> gsa(128); float gsb[4];
  CK(cudaMemcpy(goa.data(), oa, 16384, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(gsa.data(), osa, 512, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gsb, osb, 16, cudaMemcpyDeviceToHost));
  long sa_ok = 1, a_ok = 1, b_ok = 1;
  if (mode & 1) { long s1 = 0, s2 = 0; for (int i = 0; i < 16384; ++i) s1 += goa[i];
    for (int r = 128; r < 256; ++r) for (int c = 128; c < 256; ++c) s2 += ha[r * R + c]; a_ok = s1 == s2; }
  if (mode & 2) for (int i = 0; i < 128; ++i) sa_ok &= gsa[i] == (c0 + i < ld ? hs[3 * ld + c0 + i] : 0.0f);
  if (mode & 4) for (int i = 0; i < 4; ++i) b_ok &= gsb[i] == hw[4 + i];
  printf("c0 %d mode %d:", c0, mode); printf(" A %s, SA %s, SB %s\n", a_ok ? "ok" : "WRONG", sa_ok ? "ok" : "WRONG", b_ok ? "ok" : "WRONG");
  return (a_ok && sa_ok && b_ok) ? 0 : 3;
}
