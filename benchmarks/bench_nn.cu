// bench_nn: the trainer's memory-bound kernels of kernels/nn/ (what a step-time breakdown needs besides the GEMMs
// and attention) against the device-to-device copy of the same byte count measured in the same run (the ceiling).
//
//   bench_nn [--h5 PATH] [Google Benchmark flags, e.g. --benchmark_filter=v3]
//
// Shapes, the trainer's (configs/small.toml, configs/v3.toml):
//   small  8 x 1024 = 8192 tokens, hidden 768, 12 heads with RoPE dim 32 (sequences of 1024), dense SwiGLU of 2048
//          on the 8192 tokens, router 32 experts top-4, vocabulary 32768, AdamW over the dense FFN's 768x2048x3
//   v3     4096 tokens, hidden 7168, 128 heads with RoPE dim 64 (one sequence), SwiGLU of the routed experts
//          (4096 x 8 = 32768 rows, expert FFN 2048), router 16 experts top-8, vocabulary 32768, AdamW over one
//          expert's 3 x 2048 x 7168
// Case names <kernel>/<shape>/<dims>, e.g. rmsnorm_fwd/v3/4096x7168.
//
// Bytes (gbps) count the minimal traffic of one call, every input read once and every output written once, with
// T tokens, d hidden, H heads, D the RoPE dim, F the SwiGLU width over M rows, E experts, k top-k, V vocabulary,
// n parameters (the result table's `traffic` column repeats the formula per row):
//   rmsnorm_fwd        x 2Td + weight 2d -> y 2Td + rstd 4T
//   rmsnorm_bwd        dy, x 4Td + weight 2d + rstd 4T -> dx 2Td + dweight 4d (the FP32 partial sums of the
//                      workspace are not counted)
//   rope_fwd/_bwd      x 2THD -> y 2THD
//   swiglu_fwd         input 4MF -> y 2MF
//   swiglu_bwd         dy 2MF + input 4MF -> dinput 4MF
//   router_fwd         logits 4TE + bias 4E -> probs 4TE + topk_idx, topk_weight 8Tk + counts 4E + offsets 4(E+1)
//                      (v3 style: sigmoid scores, top-k by score + bias)
//   router_bwd         probs 4TE + topk_idx 4Tk + counts 4E + dweights 4Tk -> dlogits 4TE
//   permute_map        topk_idx 4Tk + offsets 4(E+1) -> row_of, assignment_of 8Tk
//   permute_fwd        x 2Td + assignment_of 4Tk -> xs 2Tkd (each row of x counted once, though read k times)
//   permute_bwd        dxs 2Tkd + row_of 4Tk -> dx 2Td
//   unpermute_fwd      ys 2Tkd + w, row_of 8Tk -> y 2Td
//   unpermute_bwd      dy 2Td + ys 2Tkd + w, row_of 8Tk -> dys 2Tkd + dw 4Tk
//   embedding_fwd      tokens 4T + the T gathered rows 2Td -> out 2Td
//   embedding_bwd      tokens 4T + dout 2Td + the U distinct tokens' rows of grad read and written 8Ud (the sort's
//                      keys and cub's storage are not counted)
//   cross_entropy_fwd  logits 4TV + targets 4T -> lse, loss_per_token 8T + loss_mean, n_valid 8 (the chunked
//                      online softmax of LmHeadCrossEntropy over chunks of 8192: init, one update per chunk,
//                      finalize; the running max, sum and target logit are not counted)
//   cross_entropy_bwd  logits 4TV + targets, lse 8T + n_valid 4 -> dlogits 2TV (one launch per chunk)
//   adamw              master, grad, m, v 16n -> master, m, v 12n + param 2n
//   adamw_bf16_moments the same update with BF16 m and v (DeepSeek-V3 sec. 3.3.3): master, grad 8n + m, v 4n ->
//                      master 4n + m, v 4n + param 2n
// The LM head's GEMMs around the cross-entropy kernels are not included (they are GEMMs: bench_grouped_gemm).
//
// Inputs: seeded random, never zeros: BF16 activations with a realistic spread (bench_util.cuh's Spread), FP32
// router logits N(0, 1) and bias N(0, 0.01^2), cross-entropy logits N(0, 2^2), targets and token ids uniform over
// the vocabulary (the embedding's U counted on the host), routing from the router on random logits (so the
// permutation maps are a real top-k's), AdamW state N(0, 1) master, N(0, 1e-3) grad and m, |N(0, 1e-6)| v (BF16
// moments: those values rounded to BF16).
// Timing (benchmarks/bench_rotated.cuh): CUDA events around a batch of one call per rotated input copy (enough
// copies that together they exceed twice the L2, so each call reads from HBM), after a warm-up call on each copy;
// Google Benchmark's manual time, at least 0.05 s per case; time_us is the median per call over the iterations.
// After the run: a table `case | shape | us | GB/s | x copy` (x copy: the fraction of the copy bandwidth at the
// closest byte count) with a geometric-mean summary, and with --h5 the table /bench/nn of an HDF5 result file
// (bench_util.cuh's columns, then `traffic`).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "benchmarks/bench_rotated.cuh"
#include "benchmarks/bench_util.cuh"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/nn/embedding.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/rmsnorm.h"
#include "kernels/nn/rope.h"
#include "kernels/nn/router.h"
#include "kernels/nn/swiglu.h"

namespace fp4moe::bench {
namespace {

constexpr double kMinTimeS = 0.05;
constexpr int64_t kCrossEntropyChunk = 8192;  // LmHeadCrossEntropy's default chunk

// The trainer's dimensions at one scale (the file's header).
struct Scale {
  const char* name;
  int64_t tokens, hidden, seq_len;
  int64_t heads, rope_dim;
  int64_t swiglu_rows, swiglu_width;
  int64_t experts, top_k;
  int64_t vocab;
  int64_t adamw_params;
};

const Scale kScales[] = {
    {"small", 8192, 768, 1024, 12, 32, 8192, 2048, 32, 4, 32768, 768 * 2048 * 3},
    {"v3", 4096, 7168, 4096, 128, 64, 4096 * 8, 2048, 16, 8, 32768, int64_t{3} * 2048 * 7168},
};

RotatedCases g_cases;

// ---- inputs ---------------------------------------------------------------------------------------------------

// The seed of input `salt` of rotated copy `copy`: every tensor of every copy has its own values.
uint64_t seed_of(int copy, uint64_t salt) {
  return 0xB0BAull + 7919ull * static_cast<uint64_t>(copy) + 104729ull * salt;
}

__device__ __forceinline__ void store_value(float* p, float z) { *p = z; }
__device__ __forceinline__ void store_value(bf16* p, float z) { *p = __float2bfloat16_rn(z); }

template <typename T>
__global__ void fill_random_kernel(T* x, int64_t n, uint64_t seed, float sigma, bool magnitude) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    // Box-Muller on two counter-based uniforms: the values depend on (seed, index) only.
    const float u1 = uniform_from_counter(seed, 2 * static_cast<uint64_t>(i)) + 0x1p-25f;
    const float u2 = uniform_from_counter(seed, 2 * static_cast<uint64_t>(i) + 1);
    const float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2) * sigma;
    store_value(x + i, magnitude ? fabsf(z) : z);
  }
}

// n values on the device: N(0, sigma^2), or their magnitudes when `magnitude` (never all zeros for sigma > 0); FP32,
// or BF16 (the FP32 values rounded to nearest even).
template <typename T>
T* random_values(DevicePool& pool, int64_t n, uint64_t seed, float sigma, bool magnitude = false) {
  T* x = pool.alloc<T>(n);
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  fill_random_kernel<T><<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), 256>>>(x, n, seed, sigma, magnitude);
  CUDA_CHECK_LAUNCH();
  return x;
}

float* random_f32(DevicePool& pool, int64_t n, uint64_t seed, float sigma, bool magnitude = false) {
  return random_values<float>(pool, n, seed, sigma, magnitude);
}

bf16* random_bf16(DevicePool& pool, int64_t M, int64_t K, uint64_t seed, const Spread& s) {
  bf16* x = pool.alloc<bf16>(M * K);
  fill_bf16_random(x, M, K, seed, s);
  return x;
}

// `n` ids uniform over [0, V) from a generator seeded with `seed` (host memory; the same seed, the same ids).
std::vector<int32_t> uniform_ids(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = pick(rng);
  return ids;
}

// uniform_ids(n, V, seed) on the device.
int32_t* random_ids(DevicePool& pool, int64_t n, int64_t V, uint64_t seed) {
  const std::vector<int32_t> ids = uniform_ids(n, V, seed);
  int32_t* d = pool.alloc<int32_t>(n);
  CUDA_CHECK(cudaMemcpy(d, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return d;
}

// The router's v3 configuration at scale `s`.
RouterConfig router_config(const Scale& s) {
  RouterConfig cfg;
  cfg.style = RouterStyle::v3_sigmoid;
  cfg.top_k = s.top_k;
  return cfg;
}

// A real top-k routing of T tokens (the router on random logits) and its permutation maps, on the device.
struct Routing {
  float *logits, *bias, *probs, *topk_weight;
  int32_t *topk_idx, *counts, *offsets, *row_of, *assignment_of;
};
Routing make_routing(DevicePool& pool, const Scale& s, uint64_t seed) {
  const int64_t T = s.tokens, E = s.experts, k = s.top_k;
  Routing r{};
  r.logits = random_f32(pool, T * E, seed, 1.0f);
  r.bias = random_f32(pool, E, seed + 1, 0.01f);
  r.probs = pool.alloc<float>(T * E);
  r.topk_weight = pool.alloc<float>(T * k);
  r.topk_idx = pool.alloc<int32_t>(T * k);
  r.counts = pool.alloc<int32_t>(E);
  r.offsets = pool.alloc<int32_t>(E + 1);
  r.row_of = pool.alloc<int32_t>(T * k);
  r.assignment_of = pool.alloc<int32_t>(T * k);
  router_forward(r.logits, r.bias, T, E, router_config(s), r.probs, r.topk_idx, r.topk_weight, r.counts, r.offsets,
                 nullptr, nullptr);
  permute_map(r.topk_idx, r.offsets, T, k, E, r.row_of, r.assignment_of, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return r;
}

// ---- cases ----------------------------------------------------------------------------------------------------

// Registers a case: `traffic` states what its `bytes` count; `build` fills `copies` inputs and sets the launch.
void add(const char* kernel, const Scale& s, std::string dims, const char* recipe, int64_t bytes,
         int64_t working_set, const char* traffic, std::function<void(RotatedWorkload&, int)> build) {
  g_cases.cases().push_back(
      {kernel, fmt::format("{}/{}", s.name, dims), recipe, bytes, working_set, std::move(build), traffic});
}

void add_rmsnorm(const Scale& s) {
  const int64_t T = s.tokens, d = s.hidden;
  const std::string dims = fmt::format("{}x{}", T, d);
  const int64_t fwd = 2 * T * d + 2 * d + 2 * T * d + 4 * T;
  add("rmsnorm_fwd", s, dims, "bf16", fwd, fwd, "x 2Td + weight 2d -> y 2Td + rstd 4T",
      [=](RotatedWorkload& w, int copies) {
        std::vector<bf16*> x, y;
        std::vector<float*> rstd;
        bf16* weight = random_bf16(w.pool, 1, d, seed_of(0, 1), weight_spread());
        for (int c = 0; c < copies; ++c) {
          x.push_back(random_bf16(w.pool, T, d, seed_of(c, 2), activation_spread()));
          y.push_back(w.pool.alloc<bf16>(T * d));
          rstd.push_back(w.pool.alloc<float>(T));
        }
        w.launch = [=](int c, cudaStream_t st) { rmsnorm_forward(x[c], weight, T, d, 1e-6f, y[c], rstd[c], st); };
      });
  const int64_t bwd = 4 * T * d + 2 * d + 4 * T + 2 * T * d + 4 * d;
  add("rmsnorm_bwd", s, dims, "bf16", bwd, bwd, "dy, x 4Td + weight 2d + rstd 4T -> dx 2Td + dweight 4d",
      [=](RotatedWorkload& w, int copies) {
        std::vector<bf16*> dy, x, dx;
        std::vector<float*> rstd;
        bf16* weight = random_bf16(w.pool, 1, d, seed_of(0, 3), weight_spread());
        float* dweight = w.pool.alloc<float>(d);
        float* workspace = w.pool.alloc<float>(rmsnorm_backward_workspace_floats(T, d));
        for (int c = 0; c < copies; ++c) {
          dy.push_back(random_bf16(w.pool, T, d, seed_of(c, 4), activation_spread()));
          x.push_back(random_bf16(w.pool, T, d, seed_of(c, 5), activation_spread()));
          dx.push_back(w.pool.alloc<bf16>(T * d));
          rstd.push_back(random_f32(w.pool, T, seed_of(c, 6), 1.0f, true));
        }
        w.launch = [=](int c, cudaStream_t st) {
          rmsnorm_backward(dy[c], x[c], weight, rstd[c], T, d, dx[c], dweight, false, workspace, st);
        };
      });
}

void add_rope(const Scale& s) {
  const int64_t T = s.tokens, H = s.heads, D = s.rope_dim;
  const int64_t bytes = 4 * T * H * D;
  RopeConfig cfg;
  cfg.seq_len = s.seq_len;
  for (bool backward : {false, true})
    add(backward ? "rope_bwd" : "rope_fwd", s, fmt::format("{}x{}x{}", T, H, D), "bf16", bytes, bytes,
        "x 2THD -> y 2THD", [=](RotatedWorkload& w, int copies) {
          std::vector<bf16*> x, y;
          for (int c = 0; c < copies; ++c) {
            x.push_back(random_bf16(w.pool, T, H * D, seed_of(c, 7), activation_spread()));
            y.push_back(w.pool.alloc<bf16>(T * H * D));
          }
          w.launch = [=](int c, cudaStream_t st) {
            const RopeTensor in{x[c], H * D, D};
            const RopeTensorOut out{y[c], H * D, D};
            if (backward)
              rope_backward(in, T, H, D, cfg, out, st);
            else
              rope_forward(in, T, H, D, cfg, out, st);
          };
        });
}

void add_swiglu(const Scale& s) {
  const int64_t M = s.swiglu_rows, F = s.swiglu_width;
  const std::string dims = fmt::format("{}x{}", M, F);
  add("swiglu_fwd", s, dims, "bf16", 6 * M * F, 6 * M * F, "input 4MF -> y 2MF", [=](RotatedWorkload& w, int copies) {
    std::vector<bf16*> in, y;
    for (int c = 0; c < copies; ++c) {
      in.push_back(random_bf16(w.pool, M, 2 * F, seed_of(c, 8), activation_spread()));
      y.push_back(w.pool.alloc<bf16>(M * F));
    }
    w.launch = [=](int c, cudaStream_t st) { swiglu_forward(in[c], M, F, y[c], st); };
  });
  add("swiglu_bwd", s, dims, "bf16", 10 * M * F, 10 * M * F, "dy 2MF + input 4MF -> dinput 4MF",
      [=](RotatedWorkload& w, int copies) {
        std::vector<bf16*> dy, in, din;
        for (int c = 0; c < copies; ++c) {
          dy.push_back(random_bf16(w.pool, M, F, seed_of(c, 9), activation_spread()));
          in.push_back(random_bf16(w.pool, M, 2 * F, seed_of(c, 10), activation_spread()));
          din.push_back(w.pool.alloc<bf16>(2 * M * F));
        }
        w.launch = [=](int c, cudaStream_t st) { swiglu_backward(dy[c], in[c], M, F, din[c], st); };
      });
}

void add_router(const Scale& s) {
  const int64_t T = s.tokens, E = s.experts, k = s.top_k;
  const std::string dims = fmt::format("{}x{}/top{}", T, E, k);
  const int64_t fwd = 4 * T * E + 4 * E + 4 * T * E + 8 * T * k + 4 * E + 4 * (E + 1);
  add("router_fwd", s, dims, "fp32", fwd, fwd,
      "logits 4TE + bias 4E -> probs 4TE + topk_idx, topk_weight 8Tk + counts 4E + offsets 4(E+1)",
      [=](RotatedWorkload& w, int copies) {
        std::vector<Routing> r;
        for (int c = 0; c < copies; ++c) r.push_back(make_routing(w.pool, s, seed_of(c, 11)));
        w.launch = [=](int c, cudaStream_t st) {
          router_forward(r[c].logits, r[c].bias, T, E, router_config(s), r[c].probs, r[c].topk_idx, r[c].topk_weight,
                         r[c].counts, r[c].offsets, nullptr, st);
        };
      });
  const int64_t bwd = 4 * T * E + 4 * T * k + 4 * E + 4 * T * k + 4 * T * E;
  add("router_bwd", s, dims, "fp32", bwd, bwd, "probs 4TE + topk_idx 4Tk + counts 4E + dweights 4Tk -> dlogits 4TE",
      [=](RotatedWorkload& w, int copies) {
        std::vector<Routing> r;
        std::vector<float*> dweights, dlogits;
        for (int c = 0; c < copies; ++c) {
          r.push_back(make_routing(w.pool, s, seed_of(c, 12)));
          dweights.push_back(random_f32(w.pool, T * k, seed_of(c, 13), 1e-3f));
          dlogits.push_back(w.pool.alloc<float>(T * E));
        }
        w.launch = [=](int c, cudaStream_t st) {
          router_backward(r[c].probs, r[c].topk_idx, r[c].counts, dweights[c], T, E, router_config(s), 0.0f,
                          dlogits[c], st);
        };
      });
}

void add_permute(const Scale& s) {
  const int64_t T = s.tokens, E = s.experts, k = s.top_k, d = s.hidden;
  const std::string dims = fmt::format("{}x{}/top{}of{}", T, d, k, E);
  const int64_t map = 4 * T * k + 4 * (E + 1) + 8 * T * k;
  add("permute_map", s, fmt::format("{}/top{}of{}", T, k, E), "int32", map, map,
      "topk_idx 4Tk + offsets 4(E+1) -> row_of, assignment_of 8Tk", [=](RotatedWorkload& w, int copies) {
        std::vector<Routing> r;
        for (int c = 0; c < copies; ++c) r.push_back(make_routing(w.pool, s, seed_of(c, 14)));
        w.launch = [=](int c, cudaStream_t st) {
          permute_map(r[c].topk_idx, r[c].offsets, T, k, E, r[c].row_of, r[c].assignment_of, st);
        };
      });
  // The four passes share one routing (its maps are 8Tk bytes, a small part of each pass's traffic).
  const int64_t rows = T * k;
  add("permute_fwd", s, dims, "bf16", 2 * T * d + 4 * rows + 2 * rows * d, 2 * T * d + 4 * rows + 2 * rows * d,
      "x 2Td + assignment_of 4Tk -> xs 2Tkd", [=](RotatedWorkload& w, int copies) {
        const Routing r = make_routing(w.pool, s, seed_of(0, 15));
        std::vector<bf16*> x, xs;
        for (int c = 0; c < copies; ++c) {
          x.push_back(random_bf16(w.pool, T, d, seed_of(c, 16), activation_spread()));
          xs.push_back(w.pool.alloc<bf16>(rows * d));
        }
        w.launch = [=](int c, cudaStream_t st) { permute_forward(x[c], r.assignment_of, T, k, d, xs[c], st); };
      });
  add("permute_bwd", s, dims, "bf16", 2 * rows * d + 4 * rows + 2 * T * d, 2 * rows * d + 4 * rows + 2 * T * d,
      "dxs 2Tkd + row_of 4Tk -> dx 2Td", [=](RotatedWorkload& w, int copies) {
        const Routing r = make_routing(w.pool, s, seed_of(0, 17));
        std::vector<bf16*> dxs, dx;
        for (int c = 0; c < copies; ++c) {
          dxs.push_back(random_bf16(w.pool, rows, d, seed_of(c, 18), activation_spread()));
          dx.push_back(w.pool.alloc<bf16>(T * d));
        }
        w.launch = [=](int c, cudaStream_t st) { permute_backward(dxs[c], r.row_of, T, k, d, dx[c], st); };
      });
  add("unpermute_fwd", s, dims, "bf16", 2 * rows * d + 8 * rows + 2 * T * d, 2 * rows * d + 8 * rows + 2 * T * d,
      "ys 2Tkd + w, row_of 8Tk -> y 2Td", [=](RotatedWorkload& w, int copies) {
        const Routing r = make_routing(w.pool, s, seed_of(0, 19));
        std::vector<bf16*> ys, y;
        for (int c = 0; c < copies; ++c) {
          ys.push_back(random_bf16(w.pool, rows, d, seed_of(c, 20), activation_spread()));
          y.push_back(w.pool.alloc<bf16>(T * d));
        }
        w.launch = [=](int c, cudaStream_t st) {
          unpermute_forward(ys[c], r.topk_weight, r.row_of, T, k, d, y[c], st);
        };
      });
  const int64_t ubwd = 2 * T * d + 2 * rows * d + 8 * rows + 2 * rows * d + 4 * rows;
  add("unpermute_bwd", s, dims, "bf16", ubwd, ubwd, "dy 2Td + ys 2Tkd + w, row_of 8Tk -> dys 2Tkd + dw 4Tk",
      [=](RotatedWorkload& w, int copies) {
        const Routing r = make_routing(w.pool, s, seed_of(0, 21));
        std::vector<bf16*> dy, ys, dys;
        std::vector<float*> dw;
        for (int c = 0; c < copies; ++c) {
          dy.push_back(random_bf16(w.pool, T, d, seed_of(c, 22), activation_spread()));
          ys.push_back(random_bf16(w.pool, rows, d, seed_of(c, 23), activation_spread()));
          dys.push_back(w.pool.alloc<bf16>(rows * d));
          dw.push_back(w.pool.alloc<float>(rows));
        }
        w.launch = [=](int c, cudaStream_t st) {
          unpermute_backward(dy[c], ys[c], r.topk_weight, r.row_of, T, k, d, dys[c], dw[c], st);
        };
      });
}

void add_embedding(const Scale& s) {
  const int64_t T = s.tokens, V = s.vocab, d = s.hidden;
  const std::string dims = fmt::format("{}x{}/V{}", T, d, V);
  const int64_t fwd = 4 * T + 4 * T * d;
  add("embedding_fwd", s, dims, "bf16", fwd, fwd + 2 * V * d, "tokens 4T + the T gathered rows 2Td -> out 2Td",
      [=](RotatedWorkload& w, int copies) {
        std::vector<int32_t*> tokens;
        std::vector<bf16*> table, out;
        for (int c = 0; c < copies; ++c) {
          tokens.push_back(random_ids(w.pool, T, V, seed_of(c, 24)));
          table.push_back(random_bf16(w.pool, V, d, seed_of(c, 25), weight_spread()));
          out.push_back(w.pool.alloc<bf16>(T * d));
        }
        w.launch = [=](int c, cudaStream_t st) {
          embedding_forward(tokens[c], T, table[c], V, d, out[c], nullptr, st);
        };
      });
  // Every copy's tokens are drawn with the same seed, so U is the same for all of them and known before the build.
  const uint64_t token_seed = seed_of(0, 26);
  const std::vector<int32_t> ids = uniform_ids(T, V, token_seed);
  const int64_t U = static_cast<int64_t>(std::set<int32_t>(ids.begin(), ids.end()).size());
  const int64_t bwd = 4 * T + 2 * T * d + 8 * U * d;
  add("embedding_bwd", s, dims, "bf16", bwd, 4 * T + 2 * T * d + 4 * V * d,
      "tokens 4T + dout 2Td + grad rows of the U distinct tokens read and written 8Ud",
      [=](RotatedWorkload& w, int copies) {
        std::vector<int32_t*> tokens;
        std::vector<bf16*> dout;
        std::vector<float*> grad;
        const int64_t ws_bytes = embedding_backward_workspace_bytes(T, V);
        void* workspace = w.pool.alloc<char>(ws_bytes);
        for (int c = 0; c < copies; ++c) {
          tokens.push_back(random_ids(w.pool, T, V, token_seed));
          dout.push_back(random_bf16(w.pool, T, d, seed_of(c, 27), activation_spread()));
          grad.push_back(random_f32(w.pool, V * d, seed_of(c, 28), 1e-3f));
        }
        w.launch = [=](int c, cudaStream_t st) {
          embedding_backward(tokens[c], T, dout[c], V, d, grad[c], workspace, ws_bytes, st);
        };
      });
}

void add_cross_entropy(const Scale& s) {
  const int64_t T = s.tokens, V = s.vocab, chunk = kCrossEntropyChunk;
  const int64_t chunks = (V + chunk - 1) / chunk;
  const std::string dims = fmt::format("{}/V{}/chunk{}", T, V, chunk);
  // logits [chunks][T, chunk] FP32 as the LM head's GEMM writes them, one chunk after another; the last chunk's
  // width is what is left of V.
  auto width_of = [=](int64_t c) { return std::min(chunk, V - c * chunk); };
  const int64_t fwd = 4 * T * V + 4 * T + 8 * T + 8;
  add("cross_entropy_fwd", s, dims, "fp32", fwd, fwd + 12 * T,
      "logits 4TV + targets 4T -> lse, loss_per_token 8T + loss_mean, n_valid 8", [=](RotatedWorkload& w, int copies) {
        std::vector<float*> logits, m, sum, z, lse, loss;
        std::vector<int32_t*> targets, n_valid;
        float* loss_mean = w.pool.alloc<float>(1);
        for (int c = 0; c < copies; ++c) {
          logits.push_back(random_f32(w.pool, T * chunks * chunk, seed_of(c, 29), 2.0f));
          targets.push_back(random_ids(w.pool, T, V, seed_of(c, 30)));
          for (auto* v : {&m, &sum, &z, &lse, &loss}) v->push_back(w.pool.alloc<float>(T));
          n_valid.push_back(w.pool.alloc<int32_t>(1));
        }
        w.launch = [=](int c, cudaStream_t st) {
          cross_entropy_init(T, m[c], sum[c], z[c], st);
          for (int64_t i = 0; i < chunks; ++i)
            cross_entropy_chunk_update(logits[c] + i * T * chunk, chunk, T, i * chunk, width_of(i), targets[c], m[c],
                                       sum[c], z[c], st);
          cross_entropy_finalize(m[c], sum[c], z[c], targets[c], T, V, lse[c], loss[c], loss_mean, n_valid[c], st);
        };
      });
  const int64_t bwd = 4 * T * V + 8 * T + 4 + 2 * T * V;
  add("cross_entropy_bwd", s, dims, "fp32", bwd, bwd, "logits 4TV + targets, lse 8T + n_valid 4 -> dlogits 2TV",
      [=](RotatedWorkload& w, int copies) {
        std::vector<float*> logits, lse;
        std::vector<int32_t*> targets, n_valid;
        std::vector<bf16*> dlogits;
        for (int c = 0; c < copies; ++c) {
          logits.push_back(random_f32(w.pool, T * chunks * chunk, seed_of(c, 31), 2.0f));
          targets.push_back(random_ids(w.pool, T, V, seed_of(c, 32)));
          // lse of the forward on these logits, so that the dlogits are the real ones (none overflows).
          float* m = w.pool.alloc<float>(T);
          float* sum = w.pool.alloc<float>(T);
          float* z = w.pool.alloc<float>(T);
          float* loss_mean = w.pool.alloc<float>(1);
          lse.push_back(w.pool.alloc<float>(T));
          n_valid.push_back(w.pool.alloc<int32_t>(1));
          cross_entropy_init(T, m, sum, z, nullptr);
          for (int64_t i = 0; i < chunks; ++i)
            cross_entropy_chunk_update(logits[c] + i * T * chunk, chunk, T, i * chunk, width_of(i), targets[c], m, sum,
                                       z, nullptr);
          cross_entropy_finalize(m, sum, z, targets[c], T, V, lse[c], nullptr, loss_mean, n_valid[c], nullptr);
          dlogits.push_back(w.pool.alloc<bf16>(T * chunks * chunk));
        }
        w.launch = [=](int c, cudaStream_t st) {
          for (int64_t i = 0; i < chunks; ++i)
            cross_entropy_chunk_dlogits(logits[c] + i * T * chunk, chunk, T, i * chunk, width_of(i), targets[c],
                                        lse[c], n_valid[c], 1.0f, dlogits[c] + i * T * chunk, st);
        };
      });
}

void add_adamw(const Scale& s) {
  const int64_t n = s.adamw_params;
  const int64_t bytes = 16 * n + 14 * n;
  add("adamw", s, fmt::format("{}", n), "fp32", bytes, bytes, "master, grad, m, v 16n -> master, m, v 12n + param 2n",
      [=](RotatedWorkload& w, int copies) {
        std::vector<AdamWTensor> t;
        for (int c = 0; c < copies; ++c) {
          AdamWTensor x;
          x.n = n;
          x.master = random_f32(w.pool, n, seed_of(c, 33), 1.0f);
          x.param = w.pool.alloc<bf16>(n);
          x.grad = random_f32(w.pool, n, seed_of(c, 34), 1e-3f);
          x.m = random_f32(w.pool, n, seed_of(c, 35), 1e-3f);
          x.v = random_f32(w.pool, n, seed_of(c, 36), 1e-6f, true);
          t.push_back(x);
        }
        AdamWConfig cfg;
        cfg.lr = 1e-4f;
        cfg.step = 10;
        w.launch = [=](int c, cudaStream_t st) { adamw_step(t[c], cfg, nullptr, st); };
      });
  // The same update with the moments stored in BF16 (DeepSeek-V3 sec. 3.3.3), same n: the row beside the FP32 one.
  const int64_t bf16_bytes = 12 * n + 10 * n;
  add("adamw_bf16_moments", s, fmt::format("{}", n), "bf16", bf16_bytes, bf16_bytes,
      "master, grad 8n + m, v 4n -> master 4n + m, v 4n + param 2n", [=](RotatedWorkload& w, int copies) {
        std::vector<AdamWTensorBf16Moments> t;
        for (int c = 0; c < copies; ++c) {
          AdamWTensorBf16Moments x;
          x.n = n;
          x.master = random_f32(w.pool, n, seed_of(c, 33), 1.0f);
          x.param = w.pool.alloc<bf16>(n);
          x.grad = random_f32(w.pool, n, seed_of(c, 34), 1e-3f);
          x.m = random_values<bf16>(w.pool, n, seed_of(c, 35), 1e-3f);
          x.v = random_values<bf16>(w.pool, n, seed_of(c, 36), 1e-6f, true);
          t.push_back(x);
        }
        AdamWConfig cfg;
        cfg.lr = 1e-4f;
        cfg.step = 10;
        w.launch = [=](int c, cudaStream_t st) { adamw_step(t[c], cfg, nullptr, st); };
      });
}

void define_cases() {
  for (const Scale& s : kScales) {
    add_rmsnorm(s);
    add_rope(s);
    add_swiglu(s);
    add_router(s);
    add_permute(s);
    add_embedding(s);
    add_cross_entropy(s);
    add_adamw(s);
  }
  g_cases.add_copy_ceilings();
}

// ---- summary --------------------------------------------------------------------------------------------------

void print_table(const std::vector<RotatedRow>& rows) {
  fmt::print("\n{:<18} | {:<32} | {:>10} | {:>8} | {:>6}\n", "case", "shape", "us", "GB/s", "x copy");
  fmt::print("{:-<18}-+-{:-<32}-+-{:->10}-+-{:->8}-+-{:->6}\n", "", "", "", "", "");
  std::vector<double> fractions;
  for (const auto& r : rows) {
    if (r.spec->recipe == "copy") continue;
    fmt::print("{:<18} | {:<32} | {:>10.2f} | {:>8.1f} | {:>6}\n", r.spec->kase, r.spec->shape, r.us, r.gbps,
               std::isnan(r.fraction) ? "-" : fmt::format("{:.2f}", r.fraction));
    if (!std::isnan(r.fraction) && r.fraction > 0) fractions.push_back(r.fraction);
  }
  fmt::print("geomean: {:.2f} x copy over {} cases\n", geomean(fractions), fractions.size());
  if (g_cases.failed()) fmt::print("{} case(s) failed: see the errors above\n", g_cases.failed());
}

// The /bench/nn table: bench_util.cuh's columns (tflops and speedup NaN: no FLOP count, no peer), then `traffic`.
Table result_table(const std::vector<RotatedRow>& rows) {
  Table t = bench_table();
  t.add_column("traffic", ColumnType::str);
  for (const auto& r : rows)
    t.add_row({r.spec->kase, r.spec->shape, r.spec->recipe, r.us, NAN, r.gbps, r.fraction, NAN, r.spec->traffic});
  t.set_attribute("gbps_counts", "minimal traffic: every input read once, every output written once (see traffic)");
  t.set_attribute("fraction_of_copy_bw", "gbps over the device-to-device copy's at the closest byte count");
  t.set_attribute("time_us", "median over iterations of one call's time (a batch over rotated input copies)");
  t.set_attribute("l2_bytes", g_cases.l2_bytes());
  t.set_attribute("min_time_s", kMinTimeS);
  return t;
}

}  // namespace
}  // namespace fp4moe::bench

int main(int argc, char** argv) {
  using namespace fp4moe;
  using namespace fp4moe::bench;
  Program program;
  program.name = "bench_nn";
  program.needs = "the nn kernel benchmarks";
  program.help.summary =
      "the trainer's memory-bound kernels of kernels/nn (RMSNorm, RoPE, SwiGLU, router, permute, embedding, "
      "cross-entropy, AdamW) at the small and v3 shapes, against the device-to-device copy of the same bytes";
  program.help.example = "--benchmark_filter=/v3/";
  program.min_time_s = kMinTimeS;
  program.cases = [] {
    define_cases();
    std::vector<std::string> names;
    for (const auto& c : g_cases.cases()) names.push_back(c.name());
    return names;
  };
  program.run_case = [](benchmark::State& st, size_t i) { g_cases.run_case(st, i); };
  program.on_device = [](int dev, const cudaDeviceProp& p) {
    int l2 = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    g_cases.set_device_limits(l2, static_cast<int64_t>(free_b) / 10 * 7);
    fmt::print("bench_nn on {} (L2 {:.0f} MiB): inputs rotated over >= 2x L2, min time {} s per case\n", p.name,
               l2 / 1048576.0, kMinTimeS);
  };
  program.after_cases = [] { g_cases.release(); };
  program.report = [](const std::string& h5_path, const std::string& command) {
    const std::vector<RotatedRow> rows = g_cases.summarize();
    print_table(rows);
    int rc = g_cases.all_ok() ? 0 : 1;
    if (!h5_path.empty() && write_bench_result("bench_nn", h5_path, "nn", result_table(rows), command) != 0) rc = 1;
    return rc;
  };
  return run_program(argc, argv, program);
}
