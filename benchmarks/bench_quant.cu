// bench_quant: the conversion kernels of kernels/quant/ against the device-to-device copy of the same byte
// count (the ceiling) and the direct MXFP4 -> FP8 conversions against the naive MXFP4 -> BF16 -> FP8 path.
//
//   bench_quant [--h5 PATH] [Google Benchmark flags, e.g. --benchmark_filter=fp8_col]
//
// Timing (benchmarks/bench_rotated.cuh): CUDA events around a batch of launches, one per rotated input copy (enough
// copies that together they exceed twice the L2, so every launch reads from HBM), after a warm-up launch on each
// copy; Google Benchmark's manual time, at least 0.05 s per case; a case's time is the median over iterations. Inputs are seeded random BF16 with a realistic spread (a normal times
// per-token powers of two in 2^[-4, 4] and 1/64 outlier channels x32; weights N(0, 0.02^2)); MXFP4 inputs are
// those quantized by bf16_to_mxfp4_row. Bytes count the minimal traffic: what a launch must read plus write (for
// the naive paths, the BF16 intermediate written and read back too; their speedup compares times, not GB/s).
// After the run: a table `case | shape | us | GB/s | x copy | speedup` (x copy: the fraction of the copy
// bandwidth measured in the same run at the closest byte count; speedup: naive time over direct time) with a
// geometric-mean summary, and with --h5 the table /bench/quant of an HDF5 result file (results/h5_file.h).
//
// bf16_to_mxfp4_row runs in the quantizer options of paper 2's ladder (bf16_to_mxfp4_row.h): scale mode floor or
// ceil, rounding rne or sr (stochastic), transform none, h16, h32 or rht (mx_transform.h); the case names them,
// e.g. bf16_to_mxfp4_row/floor_sr_rht. bf16_to_mxfp4_col (along tokens, bf16_to_mxfp4_col.h) runs in RNE, SR, each
// transform, SR with h16 and SR with rht, dense and ragged over 32 balanced experts (shape .../g32), with each of its
// four kernels (bf16_to_mxfp4_col.h detail::MxColKernel; bf16_to_mxfp4_col/ the one the quantizer runs,
// _col_regs/ and _col_shared/ the others; _col_blocks/ and _col_staged/ name block_per_thread and block_staged
// wherever they are not the default).
// Shapes: activations tokens {4096, 16384, 65536} x K {7168, 5120, 2048, 1536} (DeepSeek-V3 and V2 hidden and
// expert sizes); ragged groups of 8/16/32 balanced experts; weights of DeepSeek-V3 experts 4096x7168 (fused
// gate/up) and 7168x2048 (down), DeepSeek-V2 3072x5120 and 5120x1536, each also transposed (for Dgrad).
// After the table, a geometric mean per case (x copy, speedup). The MXFP4 conversions at 65536 tokens and
// 16384x7168 (every case moving >= 150 MB) with the copies and naive paths they are compared with:
//   bench_quant --benchmark_filter='^(bf16_to_mxfp4_row/[a-z_0-9]+|mxfp4_row_to_fp8_(row|col)(_naive)?)/(65536x|16384x7168)|^copy/[0-9]{9,}B'
// The quantizer options alone on inputs of >= 64 MiB (the ladder's target: >= 0.80 x copy), row and column, dense
// and ragged over 32 experts, each with all of its kernels (row: bf16_to_mxfp4_row/ and _row_lanes/ or
// _row_blocks/; column: bf16_to_mxfp4_col/ and _col_blocks/ or _col_staged/, _col_regs/, _col_shared/):
//   bench_quant --benchmark_filter='^bf16_to_mxfp4_(row|col)[a-z_]*/[a-z_0-9]+/(16384|65536)x7168(/g32)?/|^copy/[0-9]{9,}B'
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "benchmarks/bench_rotated.cuh"
#include "benchmarks/bench_util.cuh"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "kernels/quant/mxfp4_to_bf16.h"
#include "results/h5_file.h"

namespace fp4moe::bench {
namespace {

constexpr double kMinTimeS = 0.05;

// The cases, their rotated inputs, the copy ceilings and the measurements (bench_rotated.cuh).
RotatedCases g_cases;

void add_case(RotatedCase c) { g_cases.cases().push_back(std::move(c)); }

// ---- inputs ---------------------------------------------------------------------------------------------------

uint64_t seed_of(int copy) { return 0xC0FFEEull + 7919ull * static_cast<uint64_t>(copy); }

bf16* random_bf16(DevicePool& pool, int64_t M, int64_t K, int copy, const Spread& s) {
  bf16* x = pool.alloc<bf16>(M * K);
  fill_bf16_random(x, M, K, seed_of(copy), s);
  return x;
}

struct MxTensor {
  uint8_t* codes;
  uint8_t* scales;
};

// An MXFP4 row tensor quantized (floor, RNE) from random activations.
MxTensor random_mxfp4(DevicePool& pool, int64_t M, int64_t K, int copy) {
  MxTensor t{pool.alloc<uint8_t>(M * K / 2), pool.alloc<uint8_t>(M * K / kMxBlock)};
  DevicePool scratch;
  bf16* x = random_bf16(scratch, M, K, copy, activation_spread());
  bf16_to_mxfp4_row(x, M, K, t.codes, t.scales, MxQuantConfig{}, nullptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return t;
}

// Balanced expert groups: offsets [G+1], sizes floor or ceil of M/G.
std::vector<int32_t> balanced_offsets(int64_t M, int64_t G) {
  std::vector<int32_t> off(G + 1);
  for (int64_t g = 0; g <= G; ++g) off[g] = static_cast<int32_t>(g * M / G);
  return off;
}

struct ColBytes {
  int64_t codes = 0, scales = 0;  // bytes of an FP8 column tensor over the groups
};
ColBytes col_bytes(const std::vector<int32_t>& off, int64_t K) {
  ColBytes b;
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    int64_t m_g = off[g + 1] - off[g];
    b.codes += K * fp8_col_group_ld(m_g);
    b.scales += 4 * K * ceil_div(m_g, kFp8Block);
  }
  return b;
}

int32_t* device_offsets(DevicePool& pool, const std::vector<int32_t>& off) {
  int32_t* d = pool.alloc<int32_t>(static_cast<int64_t>(off.size()));
  CUDA_CHECK(cudaMemcpy(d, off.data(), off.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return d;
}

// ---- cases ----------------------------------------------------------------------------------------------------

std::string shape_of(int64_t M, int64_t K) { return fmt::format("{}x{}", M, K); }

MxQuantConfig quant_config(MxScaleMode mode, Rounding rounding, HadamardTransform transform) {
  MxQuantConfig cfg;
  cfg.scale_mode = mode;
  cfg.rounding = rounding;
  cfg.seed = 1234;
  cfg.transform = transform;
  cfg.rht_seed = 5678;
  return cfg;
}

void add_bf16_to_mxfp4_with(int64_t M, int64_t K, MxScaleMode mode, Rounding rounding, HadamardTransform transform,
                            const std::string& name, detail::MxRowKernel kernel);

// variant: the options, e.g. "floor_sr_rht" (scale mode, rounding, transform when not none). Two cases per option:
// bf16_to_mxfp4_row/<variant> runs the kernel bf16_to_mxfp4_row runs for it (bf16_to_mxfp4_row.h
// mx_row_default_kernel), bf16_to_mxfp4_row_lanes/<variant> or bf16_to_mxfp4_row_blocks/<variant> the other one
// (chunk_per_lane or block_per_thread; the same bits), side by side.
void add_bf16_to_mxfp4(int64_t M, int64_t K, MxScaleMode mode, Rounding rounding, HadamardTransform transform,
                       const char* variant) {
  const detail::MxRowKernel used = detail::mx_row_default_kernel(transform);
  const detail::MxRowKernel other = used == detail::MxRowKernel::chunk_per_lane ? detail::MxRowKernel::block_per_thread
                                                                               : detail::MxRowKernel::chunk_per_lane;
  for (detail::MxRowKernel kernel : {used, other}) {
    const char* name = kernel == used ? "bf16_to_mxfp4_row"
                       : kernel == detail::MxRowKernel::chunk_per_lane ? "bf16_to_mxfp4_row_lanes"
                                                                       : "bf16_to_mxfp4_row_blocks";
    add_bf16_to_mxfp4_with(M, K, mode, rounding, transform, fmt::format("{}/{}", name, variant), kernel);
  }
}

void add_bf16_to_mxfp4_with(int64_t M, int64_t K, MxScaleMode mode, Rounding rounding, HadamardTransform transform,
                            const std::string& name, detail::MxRowKernel kernel) {
  int64_t bytes = 2 * M * K + M * K / 2 + M * K / kMxBlock;
  const MxQuantConfig cfg = quant_config(mode, rounding, transform);
  add_case({name, shape_of(M, K), "mxfp4", bytes, bytes,
                     [=](RotatedWorkload& w, int copies) {
                       std::vector<bf16*> x;
                       std::vector<MxTensor> out;
                       for (int c = 0; c < copies; ++c) {
                         x.push_back(random_bf16(w.pool, M, K, c, activation_spread()));
                         out.push_back({w.pool.alloc<uint8_t>(M * K / 2), w.pool.alloc<uint8_t>(M * K / kMxBlock)});
                       }
                       w.launch = [=](int c, cudaStream_t s) {
                         detail::bf16_to_mxfp4_row_using(kernel, x[c], M, K, out[c].codes, out[c].scales, cfg,
                                                         nullptr, s);
                       };
                     }});
}

// The column quantizer (bf16_to_mxfp4_col.h) in the same options: dense (G = 0, shape MxK) or ragged over G balanced
// groups (shape MxK/gG, groups padded to 32 tokens). Cases bf16_to_mxfp4_col/... run the kernel the quantizer runs
// for the option (detail::mx_col_default_kernel), the others the other kernels (the same bits), side by side:
// bf16_to_mxfp4_col_blocks/ and bf16_to_mxfp4_col_staged/ (block_per_thread and block_staged, where not the
// default), bf16_to_mxfp4_col_regs/ (register_tile) and bf16_to_mxfp4_col_shared/ (shared_tile, the earliest).
const char* col_case_name(detail::MxColKernel kernel, Rounding rounding, HadamardTransform transform) {
  if (kernel == detail::mx_col_default_kernel(rounding, transform)) return "bf16_to_mxfp4_col";
  switch (kernel) {
    case detail::MxColKernel::block_per_thread:
      return "bf16_to_mxfp4_col_blocks";
    case detail::MxColKernel::block_staged:
      return "bf16_to_mxfp4_col_staged";
    case detail::MxColKernel::register_tile:
      return "bf16_to_mxfp4_col_regs";
    default:
      return "bf16_to_mxfp4_col_shared";
  }
}

void add_bf16_to_mxfp4_col(int64_t M, int64_t K, int64_t G, Rounding rounding, HadamardTransform transform,
                           const char* variant, detail::MxColKernel kernel) {
  const char* name = col_case_name(kernel, rounding, transform);
  const std::vector<int32_t> off = G > 0 ? balanced_offsets(M, G) : std::vector<int32_t>{};
  int64_t padded = 0;
  for (size_t g = 0; g + 1 < off.size(); ++g) padded += mxfp4_col_group_ld(off[g + 1] - off[g]);
  if (G == 0) padded = M;
  const int64_t bytes = 2 * M * K + K * padded / 2 + K * padded / kMxBlock + (G > 0 ? 4 * (G + 1) : 0);
  const MxQuantConfig cfg = quant_config(MxScaleMode::floor, rounding, transform);
  add_case({fmt::format("{}/{}", name, variant), G > 0 ? fmt::format("{}/g{}", shape_of(M, K), G)
                                                                : shape_of(M, K),
            "mxfp4", bytes, bytes, [=](RotatedWorkload& w, int copies) {
              int32_t* d_off = G > 0 ? device_offsets(w.pool, off) : nullptr;
              const int64_t groups = G > 0 ? G : 1;
              std::vector<bf16*> x;
              std::vector<MxTensor> out;
              for (int c = 0; c < copies; ++c) {
                x.push_back(random_bf16(w.pool, M, K, c, activation_spread()));
                out.push_back({w.pool.alloc<uint8_t>(mxfp4_col_codes_capacity(M, K, groups)),
                               w.pool.alloc<uint8_t>(mxfp4_col_scales_capacity(M, K, groups))});
              }
              w.launch = [=](int c, cudaStream_t s) {
                if (G > 0)
                  detail::bf16_to_mxfp4_col_ragged_using(kernel, x[c], M, K, d_off, G, off.data(), out[c].codes,
                                                         out[c].scales, cfg, nullptr, s);
                else
                  detail::bf16_to_mxfp4_col_using(kernel, x[c], M, K, out[c].codes, out[c].scales, cfg, nullptr, s);
              };
            }});
}

void add_mxfp4_to_fp8_row(int64_t M, int64_t K, bool naive) {
  int64_t in = M * K / 2 + M * K / kMxBlock, out = M * K + 4 * fp8_row_scale_count(M, K);
  // The naive path writes the BF16 tensor and reads it back.
  int64_t bytes = in + out + (naive ? 4 * M * K : 0);
  add_case({naive ? "mxfp4_row_to_fp8_row_naive" : "mxfp4_row_to_fp8_row", shape_of(M, K), "mxfp4", bytes,
                     in + out + (naive ? 2 * M * K : 0), [=](RotatedWorkload& w, int copies) {
                       std::vector<MxTensor> x;
                       std::vector<uint8_t*> codes;
                       std::vector<float*> scales;
                       std::vector<bf16*> ws;
                       for (int c = 0; c < copies; ++c) {
                         x.push_back(random_mxfp4(w.pool, M, K, c));
                         codes.push_back(w.pool.alloc<uint8_t>(M * K));
                         scales.push_back(w.pool.alloc<float>(fp8_row_scale_count(M, K)));
                         if (naive) ws.push_back(w.pool.alloc<bf16>(M * K));
                       }
                       w.launch = [=](int c, cudaStream_t s) {
                         if (naive)
                           mxfp4_row_to_fp8_row_naive(x[c].codes, x[c].scales, M, K, ws[c], codes[c], scales[c], s);
                         else
                           mxfp4_row_to_fp8_row(x[c].codes, x[c].scales, M, K, codes[c], scales[c], s);
                       };
                     }});
}

void add_mxfp4_to_fp8_col(int64_t M, int64_t K, int64_t G, bool naive) {
  std::vector<int32_t> off = balanced_offsets(M, G);
  ColBytes cb = col_bytes(off, K);
  int64_t in = M * K / 2 + M * K / kMxBlock + 4 * (G + 1), out = cb.codes + cb.scales;
  int64_t bytes = in + out + (naive ? 4 * M * K : 0);
  add_case(
      {naive ? "mxfp4_row_to_fp8_col_naive" : "mxfp4_row_to_fp8_col", fmt::format("{}/g{}", shape_of(M, K), G),
       "mxfp4", bytes, in + out + (naive ? 2 * M * K : 0), [=](RotatedWorkload& w, int copies) {
         int32_t* d_off = device_offsets(w.pool, off);
         std::vector<MxTensor> x;
         std::vector<uint8_t*> codes;
         std::vector<float*> scales;
         std::vector<bf16*> ws;
         for (int c = 0; c < copies; ++c) {
           x.push_back(random_mxfp4(w.pool, M, K, c));
           codes.push_back(w.pool.alloc<uint8_t>(fp8_col_codes_capacity(M, K, G)));
           scales.push_back(w.pool.alloc<float>(fp8_col_scales_capacity(M, K, G)));
           if (naive) ws.push_back(w.pool.alloc<bf16>(M * K));
         }
         w.launch = [=](int c, cudaStream_t s) {
           if (naive) {
             mxfp4_to_bf16(x[c].codes, x[c].scales, M, K, ws[c], s);
             bf16_to_fp8_col(ws[c], M, K, d_off, G, off.data(), Fp8ScaleMode::pow2, codes[c], scales[c], nullptr, s);
           } else {
             mxfp4_row_to_fp8_col(x[c].codes, x[c].scales, M, K, d_off, G, off.data(), codes[c], scales[c], s);
           }
         };
       }});
}

void add_bf16_to_fp8_row(int64_t M, int64_t K) {
  int64_t bytes = 2 * M * K + M * K + 4 * fp8_row_scale_count(M, K);
  add_case({"bf16_to_fp8_row", shape_of(M, K), "fp8", bytes, bytes, [=](RotatedWorkload& w, int copies) {
                       std::vector<bf16*> x;
                       std::vector<uint8_t*> codes;
                       std::vector<float*> scales;
                       for (int c = 0; c < copies; ++c) {
                         x.push_back(random_bf16(w.pool, M, K, c, activation_spread()));
                         codes.push_back(w.pool.alloc<uint8_t>(M * K));
                         scales.push_back(w.pool.alloc<float>(fp8_row_scale_count(M, K)));
                       }
                       w.launch = [=](int c, cudaStream_t s) {
                         bf16_to_fp8_row(x[c], M, K, Fp8ScaleMode::pow2, codes[c], scales[c], nullptr, s);
                       };
                     }});
}

void add_bf16_to_fp8_col(int64_t M, int64_t K, int64_t G) {
  std::vector<int32_t> off = balanced_offsets(M, G);
  ColBytes cb = col_bytes(off, K);
  int64_t bytes = 2 * M * K + 4 * (G + 1) + cb.codes + cb.scales;
  add_case({"bf16_to_fp8_col", fmt::format("{}/g{}", shape_of(M, K), G), "fp8", bytes, bytes,
                     [=](RotatedWorkload& w, int copies) {
                       int32_t* d_off = device_offsets(w.pool, off);
                       std::vector<bf16*> x;
                       std::vector<uint8_t*> codes;
                       std::vector<float*> scales;
                       for (int c = 0; c < copies; ++c) {
                         x.push_back(random_bf16(w.pool, M, K, c, activation_spread()));
                         codes.push_back(w.pool.alloc<uint8_t>(fp8_col_codes_capacity(M, K, G)));
                         scales.push_back(w.pool.alloc<float>(fp8_col_scales_capacity(M, K, G)));
                       }
                       w.launch = [=](int c, cudaStream_t s) {
                         bf16_to_fp8_col(x[c], M, K, d_off, G, off.data(), Fp8ScaleMode::pow2, codes[c], scales[c],
                                         nullptr, s);
                       };
                     }});
}

void add_bf16_to_fp8_block128(int64_t N, int64_t K, bool transpose) {
  int64_t scale_count = transpose ? fp8_block_scale_count(K, N) : fp8_block_scale_count(N, K);
  int64_t bytes = 2 * N * K + N * K + 4 * scale_count;
  add_case({transpose ? "bf16_to_fp8_block128_t" : "bf16_to_fp8_block128", shape_of(N, K), "fp8", bytes,
                     bytes, [=](RotatedWorkload& w, int copies) {
                       std::vector<bf16*> x;
                       std::vector<uint8_t*> codes;
                       std::vector<float*> scales;
                       for (int c = 0; c < copies; ++c) {
                         x.push_back(random_bf16(w.pool, N, K, c, weight_spread()));
                         codes.push_back(w.pool.alloc<uint8_t>(N * K));
                         scales.push_back(w.pool.alloc<float>(scale_count));
                       }
                       w.launch = [=](int c, cudaStream_t s) {
                         bf16_to_fp8_block128(x[c], N, K, Fp8ScaleMode::pow2, transpose, codes[c], scales[c], nullptr,
                                              s);
                       };
                     }});
}

void add_mxfp4_to_bf16(int64_t M, int64_t K) {
  int64_t bytes = M * K / 2 + M * K / kMxBlock + 2 * M * K;
  add_case({"mxfp4_to_bf16", shape_of(M, K), "mxfp4", bytes, bytes, [=](RotatedWorkload& w, int copies) {
                       std::vector<MxTensor> x;
                       std::vector<bf16*> y;
                       for (int c = 0; c < copies; ++c) {
                         x.push_back(random_mxfp4(w.pool, M, K, c));
                         y.push_back(w.pool.alloc<bf16>(M * K));
                       }
                       w.launch = [=](int c, cudaStream_t s) { mxfp4_to_bf16(x[c].codes, x[c].scales, M, K, y[c], s); };
                     }});
}

void define_cases() {
  const int64_t tokens[] = {4096, 16384, 65536};
  const int64_t hidden[] = {7168, 5120, 2048, 1536};
  const int64_t experts[] = {8, 16, 32};
  for (int64_t M : tokens)
    for (int64_t K : hidden) {
      add_bf16_to_mxfp4(M, K, MxScaleMode::floor, Rounding::rne, HadamardTransform::none, "floor_rne");
      add_bf16_to_mxfp4(M, K, MxScaleMode::ceil, Rounding::stochastic, HadamardTransform::none, "ceil_sr");
      add_bf16_to_mxfp4(M, K, MxScaleMode::floor, Rounding::stochastic, HadamardTransform::none, "floor_sr");
      add_bf16_to_mxfp4(M, K, MxScaleMode::floor, Rounding::rne, HadamardTransform::h16, "floor_rne_h16");
      add_bf16_to_mxfp4(M, K, MxScaleMode::floor, Rounding::rne, HadamardTransform::h32, "floor_rne_h32");
      add_bf16_to_mxfp4(M, K, MxScaleMode::floor, Rounding::rne, HadamardTransform::rht, "floor_rne_rht");
      add_bf16_to_mxfp4(M, K, MxScaleMode::floor, Rounding::stochastic, HadamardTransform::h16, "floor_sr_h16");
      add_bf16_to_mxfp4(M, K, MxScaleMode::floor, Rounding::stochastic, HadamardTransform::rht, "floor_sr_rht");
      for (detail::MxColKernel kc : {detail::MxColKernel::block_per_thread, detail::MxColKernel::block_staged,
                                     detail::MxColKernel::register_tile, detail::MxColKernel::shared_tile})
        for (int64_t G : {int64_t{0}, int64_t{32}}) {  // dense, and ragged over 32 experts
          add_bf16_to_mxfp4_col(M, K, G, Rounding::rne, HadamardTransform::none, "floor_rne", kc);
          add_bf16_to_mxfp4_col(M, K, G, Rounding::stochastic, HadamardTransform::none, "floor_sr", kc);
          add_bf16_to_mxfp4_col(M, K, G, Rounding::rne, HadamardTransform::h16, "floor_rne_h16", kc);
          add_bf16_to_mxfp4_col(M, K, G, Rounding::rne, HadamardTransform::h32, "floor_rne_h32", kc);
          add_bf16_to_mxfp4_col(M, K, G, Rounding::rne, HadamardTransform::rht, "floor_rne_rht", kc);
          add_bf16_to_mxfp4_col(M, K, G, Rounding::stochastic, HadamardTransform::h16, "floor_sr_h16", kc);
          add_bf16_to_mxfp4_col(M, K, G, Rounding::stochastic, HadamardTransform::rht, "floor_sr_rht", kc);
        }
      add_mxfp4_to_fp8_row(M, K, false);
      add_mxfp4_to_fp8_row(M, K, true);
      for (int64_t G : experts) {
        add_mxfp4_to_fp8_col(M, K, G, false);
        add_mxfp4_to_fp8_col(M, K, G, true);
      }
      add_bf16_to_fp8_row(M, K);
      for (int64_t G : experts) add_bf16_to_fp8_col(M, K, G);
      add_mxfp4_to_bf16(M, K);
    }
  const int64_t weights[][2] = {{4096, 7168}, {7168, 2048}, {3072, 5120}, {5120, 1536}};
  for (const auto& w : weights) {
    add_bf16_to_fp8_block128(w[0], w[1], false);
    add_bf16_to_fp8_block128(w[0], w[1], true);
  }
  g_cases.add_copy_ceilings();
}

// ---- summary --------------------------------------------------------------------------------------------------

// A measured row and, for a direct MXFP4 -> FP8 conversion, its speedup: the naive path's time over its own.
struct Row {
  RotatedRow m;
  double speedup = NAN;
};

std::vector<Row> summarize() {
  std::vector<Row> rows;
  for (const RotatedRow& r : g_cases.summarize()) rows.push_back({r});
  for (auto& r : rows) {
    const std::string& kase = r.m.spec->kase;
    if (kase == "mxfp4_row_to_fp8_row" || kase == "mxfp4_row_to_fp8_col")
      for (const auto& n : rows)
        if (n.m.spec->kase == kase + "_naive" && n.m.spec->shape == r.m.spec->shape) r.speedup = n.m.us / r.m.us;
  }
  return rows;
}

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<30} | {:<16} | {:>10} | {:>8} | {:>6} | {:>7}\n", "case", "shape", "us", "GB/s", "x copy",
             "speedup");
  fmt::print("{:-<30}-+-{:-<16}-+-{:->10}-+-{:->8}-+-{:->6}-+-{:->7}\n", "", "", "", "", "", "");
  std::vector<double> fractions, speedups;
  for (const auto& r : rows) {
    if (r.m.spec->recipe == "copy") continue;
    fmt::print("{:<30} | {:<16} | {:>10.2f} | {:>8.1f} | {:>6} | {:>7}\n", r.m.spec->kase, r.m.spec->shape, r.m.us,
               r.m.gbps, std::isnan(r.m.fraction) ? "-" : fmt::format("{:.2f}", r.m.fraction),
               std::isnan(r.speedup) ? "-" : fmt::format("{:.2f}x", r.speedup));
    if (!std::isnan(r.m.fraction) && r.m.fraction > 0) fractions.push_back(r.m.fraction);
    if (!std::isnan(r.speedup) && r.speedup > 0) speedups.push_back(r.speedup);
  }
  fmt::print("geomean: {:.2f} x copy over {} conversions; direct over naive {:.2f}x over {} pairs\n",
             geomean(fractions), fractions.size(), geomean(speedups), speedups.size());
  if (g_cases.failed()) fmt::print("{} case(s) failed: see the errors above\n", g_cases.failed());

  // Per case, in the order of the table.
  std::vector<std::string> kases;
  for (const auto& r : rows)
    if (r.m.spec->recipe != "copy" && std::find(kases.begin(), kases.end(), r.m.spec->kase) == kases.end())
      kases.push_back(r.m.spec->kase);
  fmt::print("\n{:<34} | {:>5} | {:>6} | {:>7}\n", "geomean per case", "rows", "x copy", "speedup");
  for (const auto& k : kases) {
    std::vector<double> f, sp;
    for (const auto& r : rows) {
      if (r.m.spec->kase != k) continue;
      if (!std::isnan(r.m.fraction) && r.m.fraction > 0) f.push_back(r.m.fraction);
      if (!std::isnan(r.speedup) && r.speedup > 0) sp.push_back(r.speedup);
    }
    fmt::print("{:<34} | {:>5} | {:>6} | {:>7}\n", k, f.size(), f.empty() ? "-" : fmt::format("{:.3f}", geomean(f)),
               sp.empty() ? "-" : fmt::format("{:.2f}x", geomean(sp)));
  }
}

// The /bench/quant table (bench_util.cuh's columns).
Table result_table(const std::vector<Row>& rows) {
  Table t = bench_table();
  for (const auto& r : rows)
    t.add_row({r.m.spec->kase, r.m.spec->shape, r.m.spec->recipe, r.m.us, 0.0, r.m.gbps, r.m.fraction, r.speedup});
  t.set_attribute("time_us", "median over iterations of one launch's time (a batch over rotated input copies)");
  t.set_attribute("gbps_counts", "minimal traffic: bytes read + bytes written by one launch");
  t.set_attribute("fraction_of_copy_bw", "gbps over the device-to-device copy's at the closest byte count");
  t.set_attribute("speedup", "naive MXFP4 -> BF16 -> FP8 time over the direct conversion's (NaN: not a direct case)");
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
  program.name = "bench_quant";
  program.needs = "the conversion benchmarks";
  program.help.summary =
      "the conversion kernels of kernels/quant against the device-to-device copy of the same bytes, and the direct "
      "MXFP4 -> FP8 conversions against the naive MXFP4 -> BF16 -> FP8 path";
  program.help.example = "--benchmark_filter=fp8_col";
  program.min_time_s = kMinTimeS;
  program.cases = [] {
    define_cases();
    return case_names(g_cases.cases());
  };
  program.run_case = [](benchmark::State& st, size_t i) { g_cases.run_case(st, i); };
  program.on_device = [](int dev, const cudaDeviceProp& p) {
    int l2 = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    g_cases.set_device_limits(l2, static_cast<int64_t>(free_b) / 10 * 7);
    fmt::print("bench_quant on {} (L2 {:.0f} MiB): inputs rotated over >= 2x L2, min time {} s per case\n", p.name,
               l2 / 1048576.0, kMinTimeS);
  };
  program.after_cases = [] { g_cases.release(); };
  program.report = [](const std::string& h5_path, const std::string& command) {
    const std::vector<Row> rows = summarize();
    print_table(rows);
    int rc = g_cases.all_ok() ? 0 : 1;
    if (!h5_path.empty() && write_bench_result("bench_quant", h5_path, "quant", result_table(rows), command) != 0)
      rc = 1;
    return rc;
  };
  return run_program(argc, argv, program);
}
