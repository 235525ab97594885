// Helpers of the GPU tests of the trainer's MoE layer and SwiGLU MLP (test_moe_layer_gpu.cpp): a device context
// (allocator, cuBLASLt, stream), parameter upload/download by name, and BF16 tensors as doubles.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/common/moe_layer_ref.h"
#include "tests/common/gpu_test_util.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/params.h"

namespace fp4moe::test {

// Declared first, destroyed last: layers built on it must be declared after it. Call fit_scratch with the layer's
// scratch_bytes() once it is built (ModelContext::scratch).
struct LayerHarness {
  DeviceMemory mem;
  CublasLtMatmul lt;
  ParamStore store;
  cudaStream_t stream = nullptr;
  ModelContext ctx;
  std::unique_ptr<ScratchArena> scratch;
  LayerHarness() {
    CUDA_CHECK(cudaStreamCreate(&stream));  // a blocking stream: cudaMemcpy on the legacy stream orders with it
    ctx = ModelContext{stream, &lt, &mem};
  }
  // A scratch arena of `bytes` from mem (MemCategory::workspace) for ctx.
  void fit_scratch(size_t bytes) {
    scratch.reset();
    scratch = std::make_unique<ScratchArena>(mem, bytes, "test scratch");
    ctx.scratch = scratch.get();
  }
  ~LayerHarness() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  void sync() { CUDA_CHECK(cudaStreamSynchronize(stream)); }
  Param& param(const std::string& name) {
    for (auto& p : store.params())
      if (p.name == name) return p;
    throw Error("no parameter named " + name);
  }
  StateTensor& state(const std::string& name) {
    for (auto& s : store.states())
      if (s.name == name) return s;
    throw Error("no state tensor named " + name);
  }
  // Draws N(0, stddev^2) values rounded to BF16, writes them to the parameter (BF16 copy; master alike) and returns
  // them as doubles for the reference.
  Vec set_param(const std::string& name, double stddev, uint32_t seed) {
    Param& p = param(name);
    std::mt19937 rng(seed);
    std::normal_distribution<double> dist(0.0, stddev);
    std::vector<bf16> b(p.n);
    std::vector<float> f(p.n);
    Vec v(p.n);
    for (int64_t i = 0; i < p.n; ++i) {
      b[i] = bf16_from_bits(f32_to_bf16_bits(static_cast<float>(dist(rng))));
      f[i] = bf16_bits_to_f32(bf16_bits(b[i]));
      v[i] = f[i];
    }
    CUDA_CHECK(cudaMemcpy(p.param, b.data(), p.n * sizeof(bf16), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p.master, f.data(), p.n * sizeof(float), cudaMemcpyHostToDevice));
    return v;
  }
  Vec grad(const std::string& name) {
    sync();
    const Param& p = param(name);
    std::vector<float> g(p.n);
    CUDA_CHECK(cudaMemcpy(g.data(), p.grad, p.n * sizeof(float), cudaMemcpyDeviceToHost));
    return Vec(g.begin(), g.end());
  }
};

// n BF16 values from N(0, stddev^2), seeded; `values` receives them as doubles.
inline std::vector<bf16> random_bf16_values(size_t n, uint32_t seed, double stddev, Vec& values) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<bf16> b(n);
  values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    b[i] = bf16_from_bits(f32_to_bf16_bits(static_cast<float>(dist(rng))));
    values[i] = bf16_bits_to_f32(bf16_bits(b[i]));
  }
  return b;
}

inline Vec as_doubles(const std::vector<bf16>& v) {
  Vec d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = bf16_bits_to_f32(bf16_bits(v[i]));
  return d;
}

// Relative L2 error within `tol` (NaN from an unwritten, poisoned element fails).
inline void expect_rel_l2(const Vec& gpu, const Vec& ref, double tol, const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  const double err = relative_l2(gpu, ref);
  EXPECT_TRUE(err <= tol) << what << ": relative L2 error " << err << " > " << tol;
}

// Rows [e * rows_per_expert, (e+1) * rows_per_expert) of a stacked expert tensor are all exactly zero.
inline bool expert_slice_is_zero(const Vec& g, int64_t e, int64_t elems_per_expert) {
  for (int64_t i = e * elems_per_expert; i < (e + 1) * elems_per_expert; ++i)
    if (g[i] != 0.0) return false;
  return true;
}

}  // namespace fp4moe::test
