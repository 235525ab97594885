// bench_grouped_gemm: the grouped expert GEMMs of kernels/gemm/grouped_gemm.h (Fprop, Dgrad, Wgrad; BF16 and
// block-scaled FP8) against the same library's dense GEMM over the same total tokens (one group, the ceiling).
//
//   bench_grouped_gemm [--h5 PATH] [Google Benchmark flags, e.g. --benchmark_filter=fp8]
//
// Shapes: DeepSeek-V3 routed experts, fused gate/up (N = 4096, K = 7168) and down (N = 7168, K = 2048), 16384
// routed tokens per GPU split over 8, 16 or 32 experts (about 2048, 1024 or 512 each: they place the threshold of
// grouped_gemm_heuristics.h); the split is seeded, ragged (+-25 %, sizes not multiples of 4) and never empty; "8x2048 even": exactly 2048 each. Every
// grouped case runs on one stream (case names without '@') and on 2 and 4 concurrent streams (suffix @s2, @s4;
// GroupedGemmTuning). Operands: seeded random codes and power-of-two
// scales (FP8), seeded random values (BF16), never zeros; weights alone exceed twice the 60 MB L2 except for the
// 32 x 512 down case (117 MB), so launches read from HBM.
// Timing: CUDA events around one grouped call (all its cuBLASLt launches), Google Benchmark's manual time, after a
// warm-up call that also fills the plan cache. FLOPs: 2 * M * N * K with M the routed tokens.
// MXFP4 on FP8 tensor cores (kernels/gemm/mxfp4_gemm.h, paper 2's ladder), one stream: the dense Fprop
// (mxfp4_gemm, "fprop mxfp4 up 1x16384") and the grouped Wgrad from MXFP4 column tensors (mxfp4_wgrad_grouped), as
// recipe mxfp4 (the MXFP4 -> FP8 conversions included) and mxfp4_gemm (the cuBLASLt step alone, on operands
// converted before timing); FLOPs count the GEMM only.
// Hopper grouped FP8 Wgrad (kernels/gemm/grouped_wgrad_sm90.h, recipe fp8_sm90, op wgrad): GroupedGemm::wgrad_fp8
// with Sm90Path::always, one launch from the device offsets, FP32 accumulated output, beside the wgrad fp8 rows;
// its variants beside them (Sm90WgradConfig): @serial (each block's WGMMAs waited for before the promotion) and
// @rmw (the accumulation read, added and written back by the thread instead of reductions at the L2).
// Hopper grouped FP8 kernel (kernels/gemm/grouped_gemm_sm90.h, recipe fp8_sm90), Fprop and Dgrad: one launch per
// call from the device offsets (no host copy), beside the cuBLASLt path (recipe fp8) on the same shapes and splits;
// its tile width chosen automatically (tuning none) and forced to 128 and 256 columns (tunings n128, n256), and its
// variants (Sm90GemmConfig): overlapped promotion (n128o) and the direct epilogue instead of the coalesced one at
// the automatic width (direct).
// MXFP4 Fprop through the Hopper kernel, one stream, default config: recipe mxfp4_sm90 reads the MXFP4 row operand
// directly (grouped_fprop_mxfp4_sm90: the conversion in shared memory), recipe mxfp4_cvt_sm90 converts first
// (mxfp4_row_to_fp8_row into an FP8 copy of X, then grouped_fprop_fp8_sm90; both in the timed call), on the
// grouped shapes 8x2048, 16x1024, 32x512; the summary prints mxfp4_sm90's speed over mxfp4_cvt_sm90's.
// After the run: `case | shape | us | TFLOP/s | x dense | x bf16 | x none | x fp8` (x dense: TFLOP/s over the dense
// GEMM's of the same recipe, op and shape measured in the same run; x bf16: the BF16 time of the same op and shape
// over this row's time; x fp8: the cuBLASLt FP8 time over this row's time, MXFP4 and fp8_sm90 rows, the latter of
// every tuning against the one-stream FP8 row) with
// geometric-mean summaries, and
// with --h5 the table /bench/grouped_gemm of an HDF5 result file
// (bench_util.cuh's columns, then fraction_of_dense, experts, n, k; gbps and fraction_of_copy_bw are NaN).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/gemm/grouped_wgrad_sm90.h"
#include "kernels/gemm/mxfp4_gemm.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"

namespace fp4moe::bench_gemm {
namespace {

constexpr double kMinTimeS = 0.05;
constexpr int64_t kTokens = 16384;

// ---- device inputs ----------------------------------------------------------------------------------------------

__global__ void fill_codes_kernel(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint8_t c = static_cast<uint8_t>(mix64(seed ^ static_cast<uint64_t>(i)) >> 56);
    p[i] = (c & 0x7F) == 0x7F ? 0x38 : c;  // any finite E4M3 code (NaN -> 1.0)
  }
}
__global__ void fill_scales_kernel(float* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = exp2_exact(static_cast<int>(mix64(seed ^ static_cast<uint64_t>(i)) % 9) - 6);
}
__global__ void fill_mx_scales_kernel(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<uint8_t>(123 + mix64(seed ^ static_cast<uint64_t>(i)) % 9);
}
__global__ void fill_bf16_kernel(bf16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16_rn(2.0f * uniform_from_counter(seed, static_cast<uint64_t>(i)) - 1.0f);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)); }

// Device allocations of one case, freed together.
class Pool {
 public:
  ~Pool() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(int64_t count) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  uint8_t* codes(int64_t n, uint64_t seed) {
    uint8_t* p = alloc<uint8_t>(n);
    fill_codes_kernel<<<grid_for(n), 256>>>(p, n, seed);
    CUDA_CHECK_LAUNCH();
    return p;
  }
  float* scales(int64_t n, uint64_t seed) {
    float* p = alloc<float>(n);
    fill_scales_kernel<<<grid_for(n), 256>>>(p, n, seed);
    CUDA_CHECK_LAUNCH();
    return p;
  }
  // UE8M0 scale bytes of MX blocks: 2^-4 .. 2^4.
  uint8_t* mx_scales(int64_t n, uint64_t seed) {
    uint8_t* p = alloc<uint8_t>(n);
    fill_mx_scales_kernel<<<grid_for(n), 256>>>(p, n, seed);
    CUDA_CHECK_LAUNCH();
    return p;
  }
  bf16* values(int64_t n, uint64_t seed) {
    bf16* p = alloc<bf16>(n);
    fill_bf16_kernel<<<grid_for(n), 256>>>(p, n, seed);
    CUDA_CHECK_LAUNCH();
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

// ---- cases --------------------------------------------------------------------------------------------------------

struct Case {
  // op: fprop/dgrad/wgrad; recipe: bf16/fp8/fp8_sm90/mxfp4/mxfp4_gemm/mxfp4_sm90/mxfp4_cvt_sm90; shape: "up 8x2048"
  std::string op, recipe, shape;
  int64_t N = 0, K = 0, G = 0;
  bool dense = false;
  bool even = false;  // G groups of exactly kTokens / G tokens (else ragged +-25 %)
  GroupedGemmTuning tuning{};
  Sm90GemmConfig sm90{};  // fp8_sm90: the kernel's variant (default: automatic width, coalesced epilogue)
  Sm90WgradConfig wgrad_sm90{};  // fp8_sm90 wgrad: the Wgrad kernel's variant (default: overlapped promotion)
  std::string tuning_label() const {
    if (recipe != "fp8_sm90") return label_of(tuning);
    if (op == "wgrad") {  // serial: promotion after waiting for the block's WGMMAs; rmw: accumulation read-add-write
      std::string label = wgrad_sm90.overlap_promotion ? "" : "serial";
      if (!wgrad_sm90.reduce_accumulate) label += label.empty() ? "rmw" : "_rmw";
      return label.empty() ? std::string("none") : label;
    }
    // nW: width forced to W columns; o: overlapped promotion; d (direct alone): the direct epilogue
    std::string label = sm90.block_n != 0 ? fmt::format("n{}", sm90.block_n) : std::string();
    if (sm90.overlap_promotion) label += "o";
    if (!sm90.coalesced_epilogue) label += label.empty() ? "direct" : "d";
    return label.empty() ? std::string("none") : label;
  }
  std::string name() const {
    return fmt::format("{}/{}/{}{}{}", op, recipe, shape, dense ? "/dense" : "",
                       tuning_label() == "none" ? std::string() : "@" + tuning_label());
  }
  // "none" (one stream), "s2" (2 streams), ...
  static std::string label_of(const GroupedGemmTuning& t) {
    return t.streams > 1 ? fmt::format("s{}", t.streams) : std::string("none");
  }
};

// Sizes around kTokens / G summing to kTokens, none empty: ragged +-25 % (seeded), or all equal when `even`.
std::vector<int32_t> ragged_split(int64_t G, uint64_t seed, bool even) {
  std::vector<int32_t> sizes(G);
  int64_t left = kTokens;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t base = kTokens / G, jitter = even ? 0 : base / 4;
    int64_t s = base - jitter + static_cast<int64_t>(mix64(seed + g) % static_cast<uint64_t>(2 * jitter + 1));
    if (g == G - 1) s = left;
    sizes[g] = static_cast<int32_t>(s);
    left -= s;
  }
  return sizes;
}

// One grouped call of the case, ready to launch repeatedly.
struct Workload {
  Pool pool;
  GroupedGemm gemm;
  std::vector<int32_t> host_offsets;
  GroupSplit split;
  std::function<void()> launch;
  int64_t flops = 0;
};

std::unique_ptr<Workload> build(const Case& c) {
  auto w = std::make_unique<Workload>();
  const std::vector<int32_t> sizes = c.dense ? std::vector<int32_t>{static_cast<int32_t>(kTokens)}
                                             : ragged_split(c.G, static_cast<uint64_t>(c.G * 1000 + c.N), c.even);
  const int64_t G = static_cast<int64_t>(sizes.size()), N = c.N, K = c.K;
  w->host_offsets.assign(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) w->host_offsets[g + 1] = w->host_offsets[g] + sizes[g];
  const int64_t M = w->host_offsets[G];
  int32_t* d_offsets = w->pool.alloc<int32_t>(G + 1);
  CUDA_CHECK(cudaMemcpy(d_offsets, w->host_offsets.data(), sizeof(int32_t) * (G + 1), cudaMemcpyHostToDevice));
  w->split = GroupSplit{d_offsets, w->host_offsets.data(), G};
  w->flops = 2 * M * N * K;
  Pool& p = w->pool;
  GroupedGemm& gemm = w->gemm;
  gemm.set_tuning(c.tuning);
  const GroupSplit split = w->split;
  if (c.recipe == "bf16") {
    if (c.op == "fprop") {
      bf16 *x = p.values(M * K, 1), *wt = p.values(G * N * K, 2);
      GemmOutput y{p.alloc<bf16>(M * N), GemmOutType::bf16, false};
      w->launch = [=, &gemm] { gemm.fprop_bf16(x, wt, N, K, split, y, nullptr); };
    } else if (c.op == "dgrad") {
      bf16 *dy = p.values(M * N, 3), *wt = p.values(G * N * K, 2);
      GemmOutput dx{p.alloc<bf16>(M * K), GemmOutType::bf16, false};
      w->launch = [=, &gemm] { gemm.dgrad_bf16(dy, wt, N, K, split, dx, nullptr); };
    } else {
      bf16 *dy = p.values(M * N, 3), *x = p.values(M * K, 1);
      GemmOutput dw{p.alloc<float>(G * N * K), GemmOutType::fp32, true};
      CUDA_CHECK(cudaMemset(dw.data, 0, sizeof(float) * G * N * K));
      w->launch = [=, &gemm] { gemm.wgrad_bf16(dy, x, N, K, split, dw, nullptr); };
    }
  } else if (c.recipe == "mxfp4" || c.recipe == "mxfp4_gemm") {
    // MXFP4 operands (random codes, block scales 2^-4 .. 2^4; any byte is a valid pair of E2M1 codes); mxfp4: the
    // conversions and the GEMM; mxfp4_gemm: the GEMM step alone on operands converted once before timing.
    const bool convert = c.recipe == "mxfp4";
    if (c.op == "fprop") {  // dense: Y = X W^T
      const Mxfp4RowOperand x{p.codes(M * K / 2, 4), p.mx_scales(M * K / kMxBlock, 5)};
      const Mxfp4RowOperand wt{p.codes(N * K / 2, 6), p.mx_scales(N * K / kMxBlock, 7)};
      const size_t bytes = mxfp4_gemm_workspace_bytes(M, N, K);
      void* ws = p.alloc<uint8_t>(static_cast<int64_t>(bytes));
      GemmOutput y{p.alloc<bf16>(M * N), GemmOutType::bf16, false};
      mxfp4_gemm(gemm.lt(), x, wt, M, N, K, ws, bytes, y, nullptr);
      const Fp8RowPair f = mxfp4_gemm_fp8_operands(ws, M, N, K);
      if (convert)
        w->launch = [=, &gemm] { mxfp4_gemm(gemm.lt(), x, wt, M, N, K, ws, bytes, y, nullptr); };
      else
        w->launch = [=, &gemm] { fp8_row_gemm(gemm.lt(), f.a, f.b, M, N, K, y, nullptr); };
    } else {  // wgrad over the experts, from MXFP4 column tensors
      const Mxfp4ColOperand dy{p.codes(mxfp4_col_codes_capacity(M, N, G), 10),
                               p.mx_scales(mxfp4_col_scales_capacity(M, N, G), 11)};
      const Mxfp4ColOperand x{p.codes(mxfp4_col_codes_capacity(M, K, G), 12),
                              p.mx_scales(mxfp4_col_scales_capacity(M, K, G), 13)};
      const size_t bytes = mxfp4_wgrad_workspace_bytes(M, N, K, G);
      void* ws = p.alloc<uint8_t>(static_cast<int64_t>(bytes));
      GemmOutput dw{p.alloc<float>(G * N * K), GemmOutType::fp32, true};
      CUDA_CHECK(cudaMemset(dw.data, 0, sizeof(float) * G * N * K));
      mxfp4_wgrad_grouped(gemm, dy, x, N, K, split, ws, bytes, dw, nullptr);
      const Fp8ColPair f = mxfp4_wgrad_fp8_operands(ws, M, N, K, G);
      if (convert)
        w->launch = [=, &gemm] { mxfp4_wgrad_grouped(gemm, dy, x, N, K, split, ws, bytes, dw, nullptr); };
      else
        w->launch = [=, &gemm] { gemm.wgrad_fp8(f.dy, f.x, N, K, split, dw, nullptr, kMxBlock); };
    }
  } else if (c.recipe == "mxfp4_sm90" || c.recipe == "mxfp4_cvt_sm90") {  // Fprop, MXFP4 X, FP8 block weights
    const int32_t* offsets = split.offsets;
    const Mxfp4RowOperand x{p.codes(M * K / 2, 4), p.mx_scales(M * K / kMxBlock, 5)};
    Fp8BlockStack wt{p.codes(G * N * K, 6), p.scales(G * fp8_block_scale_count(N, K), 7)};
    bf16* y = p.alloc<bf16>(M * N);
    if (c.recipe == "mxfp4_sm90") {
      w->launch = [=] { grouped_fprop_mxfp4_sm90(x, wt, M, N, K, offsets, G, y, nullptr); };
    } else {
      uint8_t* x8 = p.alloc<uint8_t>(M * K);
      float* x8_scales = p.alloc<float>(fp8_row_scale_count(M, K));
      w->launch = [=] {
        mxfp4_row_to_fp8_row(x.codes, x.scales, M, K, x8, x8_scales, nullptr);
        grouped_fprop_fp8_sm90({x8, x8_scales}, wt, M, N, K, offsets, G, y, nullptr);
      };
    }
  } else if (c.recipe == "fp8_sm90") {  // the same operands as the fp8 rows, through the Hopper kernel
    const int32_t* offsets = split.offsets;
    const Sm90GemmConfig config = c.sm90;
    if (c.op == "wgrad") {  // through GroupedGemm (Sm90Path::always: the Wgrad kernel), the fp8 rows' output
      Fp8ColOperand dy{p.codes(fp8_col_codes_capacity(M, N, G), 10), p.scales(fp8_col_scales_capacity(M, N, G), 11)};
      Fp8ColOperand x{p.codes(fp8_col_codes_capacity(M, K, G), 12), p.scales(fp8_col_scales_capacity(M, K, G), 13)};
      GemmOutput dw{p.alloc<float>(G * N * K), GemmOutType::fp32, true};
      CUDA_CHECK(cudaMemset(dw.data, 0, sizeof(float) * G * N * K));
      gemm.set_tuning({1, Sm90Path::always});
      FP4MOE_CHECK(grouped_wgrad_sm90_unsupported(N, K, G, kColAlign).empty(), "wgrad fp8_sm90: {}",
                   grouped_wgrad_sm90_unsupported(N, K, G, kColAlign));
      if (c.wgrad_sm90.overlap_promotion && c.wgrad_sm90.reduce_accumulate) {
        w->launch = [=, &gemm] { gemm.wgrad_fp8(dy, x, N, K, split, dw, nullptr); };
      } else {  // a variant, called directly (GroupedGemm runs the default)
        const Sm90WgradConfig wc = c.wgrad_sm90;
        w->launch = [=] { grouped_wgrad_fp8_sm90(dy, x, M, N, K, offsets, G, dw, nullptr, kColAlign, wc); };
      }
    } else if (c.op == "fprop") {
      Fp8RowOperand x{p.codes(M * K, 4), p.scales(fp8_row_scale_count(M, K), 5)};
      Fp8BlockStack wt{p.codes(G * N * K, 6), p.scales(G * fp8_block_scale_count(N, K), 7)};
      bf16* y = p.alloc<bf16>(M * N);
      w->launch = [=] { grouped_fprop_fp8_sm90(x, wt, M, N, K, offsets, G, y, nullptr, config); };
    } else {
      Fp8RowOperand dy{p.codes(M * N, 8), p.scales(fp8_row_scale_count(M, N), 9)};
      Fp8BlockStack wt{p.codes(G * N * K, 6), p.scales(G * fp8_block_scale_count(K, N), 7)};
      bf16* dx = p.alloc<bf16>(M * K);
      w->launch = [=] { grouped_dgrad_fp8_sm90(dy, wt, M, N, K, offsets, G, dx, nullptr, config); };
    }
  } else {
    if (c.op == "fprop") {
      Fp8RowOperand x{p.codes(M * K, 4), p.scales(fp8_row_scale_count(M, K), 5)};
      Fp8BlockStack wt{p.codes(G * N * K, 6), p.scales(G * fp8_block_scale_count(N, K), 7)};
      GemmOutput y{p.alloc<bf16>(M * N), GemmOutType::bf16, false};
      gemm.reserve(M, K, N, G);
      w->launch = [=, &gemm] { gemm.fprop_fp8(x, wt, N, K, split, y, nullptr); };
    } else if (c.op == "dgrad") {
      Fp8RowOperand dy{p.codes(M * N, 8), p.scales(fp8_row_scale_count(M, N), 9)};
      Fp8BlockStack wt{p.codes(G * N * K, 6), p.scales(G * fp8_block_scale_count(K, N), 7)};
      GemmOutput dx{p.alloc<bf16>(M * K), GemmOutType::bf16, false};
      gemm.reserve(M, N, K, G);
      w->launch = [=, &gemm] { gemm.dgrad_fp8(dy, wt, N, K, split, dx, nullptr); };
    } else {
      Fp8ColOperand dy{p.codes(fp8_col_codes_capacity(M, N, G), 10), p.scales(fp8_col_scales_capacity(M, N, G), 11)};
      Fp8ColOperand x{p.codes(fp8_col_codes_capacity(M, K, G), 12), p.scales(fp8_col_scales_capacity(M, K, G), 13)};
      GemmOutput dw{p.alloc<float>(G * N * K), GemmOutType::fp32, true};
      CUDA_CHECK(cudaMemset(dw.data, 0, sizeof(float) * G * N * K));
      w->launch = [=, &gemm] { gemm.wgrad_fp8(dy, x, N, K, split, dw, nullptr); };
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

std::vector<Case> g_cases;
struct Measured {
  bool ok = false;
  double seconds = 0;
  int64_t calls = 0, flops = 0, heuristic_queries = 0, fallbacks = 0;
};
std::map<std::string, Measured> g_measured;

void define_cases() {
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  // The splits every op of a table is timed on, over kTokens tokens: 8, 16 and 32 ragged groups, 8 even ones and,
  // with_dense, one group; `proto` gives the op, recipe, tuning and variant, the split fills in the rest.
  const auto add_splits = [](Case proto, Shape s, bool with_dense) {
    const auto add = [&](std::string shape, int64_t G, bool dense, bool even) {
      Case c = proto;
      c.shape = std::move(shape);
      c.N = s.N;
      c.K = s.K;
      c.G = G;
      c.dense = dense;
      c.even = even;
      g_cases.push_back(std::move(c));
    };
    for (int64_t G : {8, 16, 32}) add(fmt::format("{} {}x{}", s.name, G, kTokens / G), G, false, false);
    add(fmt::format("{} 8x{} even", s.name, kTokens / 8), 8, false, true);
    if (with_dense) add(fmt::format("{} 1x{}", s.name, kTokens), 1, true, false);
  };
  const Shape shapes[] = {{"up", 4096, 7168}, {"down", 7168, 2048}};
  // Tunings beside the default: concurrent runs of groups (GroupedGemmTuning), always the per-expert cuBLASLt
  // calls (the Hopper kernel has rows of its own below).
  const GroupedGemmTuning tunings[] = {{1, Sm90Path::never}, {2, Sm90Path::never}, {4, Sm90Path::never}};
  for (const GroupedGemmTuning& t : tunings)
    for (const char* op : {"fprop", "dgrad", "wgrad"})
      for (const char* recipe : {"bf16", "fp8"})
        for (Shape s : shapes) {
          Case proto{op, recipe, {}};
          proto.tuning = t;
          add_splits(proto, s, t.streams == 1);  // one group: streams change nothing
        }
  // The Hopper grouped FP8 kernel, Fprop and Dgrad, beside the fp8 (cuBLASLt) rows of the same shapes: tile width
  // automatic, forced to 128 and 256 columns; the variants: overlapped promotion (n128o), the direct epilogue at the
  // automatic width (direct).
  const Sm90GemmConfig sm90_variants[] = {{0}, {128}, {256}, {128, true}, {0, false, false}};
  for (const Sm90GemmConfig& variant : sm90_variants)
    for (const char* op : {"fprop", "dgrad"})
      for (Shape s : shapes) {
        Case proto{op, "fp8_sm90", {}};
        proto.sm90 = variant;
        add_splits(proto, s, true);
      }
  // The Hopper grouped Wgrad (grouped_wgrad_sm90.h, through GroupedGemm with Sm90Path::always) beside the fp8
  // (cuBLASLt) wgrad rows of the same shapes and splits; FP32 accumulated output as those.
  for (Shape s : shapes) add_splits(Case{"wgrad", "fp8_sm90", {}}, s, true);
  for (const Sm90WgradConfig variant : {Sm90WgradConfig{false, true}, Sm90WgradConfig{true, false}})
    for (Shape s : shapes) {  // its variants: serial promotion; accumulation by reading, adding and writing
      Case proto{"wgrad", "fp8_sm90", {}};
      proto.wgrad_sm90 = variant;
      add_splits(proto, s, true);
    }
  // MXFP4 Fprop through the Hopper kernel: the operand read directly, and converted first.
  for (const char* recipe : {"mxfp4_sm90", "mxfp4_cvt_sm90"})
    for (Shape s : shapes)
      for (int64_t G : {8, 16, 32})
        g_cases.push_back(
            Case{"fprop", recipe, fmt::format("{} {}x{}", s.name, G, kTokens / G), s.N, s.K, G, false, false, {}});
  // MXFP4 on FP8 tensor cores (mxfp4_gemm.h), one stream: the dense Fprop GEMM and the grouped Wgrad, with and
  // without the MXFP4 -> FP8 conversions, beside the FP8 rows of the same op and shape.
  for (const char* recipe : {"mxfp4", "mxfp4_gemm"})
    for (Shape s : shapes) {
      g_cases.push_back(Case{"fprop", recipe, fmt::format("{} 1x{}", s.name, kTokens), s.N, s.K, 1, true, false, {}});
      for (int64_t G : {8, 32})
        g_cases.push_back(
            Case{"wgrad", recipe, fmt::format("{} {}x{}", s.name, G, kTokens / G), s.N, s.K, G, false, false, {}});
    }
}

void run_case(benchmark::State& state, const Case* c) {
  Measured& m = g_measured[c->name()];
  m = Measured{};
  std::unique_ptr<Workload> w;
  cudaEvent_t start = nullptr, stop = nullptr;
  try {
    w = build(*c);
    w->launch();  // warm-up: plans and scratch
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (auto _ : state) {
      CUDA_CHECK(cudaEventRecord(start, nullptr));
      w->launch();
      CUDA_CHECK(cudaEventRecord(stop, nullptr));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      state.SetIterationTime(ms * 1e-3);
      m.seconds += ms * 1e-3;
      ++m.calls;
    }
    m.flops = w->flops;
    if (c->recipe.find("sm90") == std::string::npos) {  // no cuBLASLt call there (lt() would make a handle)
      m.heuristic_queries = w->gemm.lt().heuristic_queries();
      m.fallbacks = w->gemm.lt().exact_shape_fallbacks();
    }
    m.ok = true;
    state.counters["TFLOP/s"] = m.seconds > 0 ? static_cast<double>(m.flops) * m.calls / m.seconds * 1e-12 : 0.0;
    state.counters["heuristic_queries"] = static_cast<double>(m.heuristic_queries);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
}

// ---- summary ------------------------------------------------------------------------------------------------------

struct Row {
  const Case* c;
  double us = 0, tflops = 0;
  double fraction_of_dense = NAN;  // TFLOP/s over the dense GEMM's of the same op, recipe, N and K (grouped rows)
  double speedup = NAN;            // BF16 time over this row's time, same op and shape (FP8, fp8_sm90 and MXFP4 rows)
  double vs_fp8 = NAN;             // FP8 time over this row's time, same op and shape (MXFP4, fp8_sm90 rows; the
                                   // latter of every tuning against the one-stream FP8 row)
};

// One row per measured case, in definition order, with the ratios to the cases measured beside it.
std::vector<Row> summarize() {
  std::vector<Row> rows;
  for (const Case& c : g_cases) {
    auto it = g_measured.find(c.name());
    if (it == g_measured.end() || !it->second.ok || it->second.calls == 0) continue;
    const Measured& m = it->second;
    Row r{&c};
    r.us = m.seconds / static_cast<double>(m.calls) * 1e6;
    r.tflops = static_cast<double>(m.flops) / r.us * 1e-6;
    rows.push_back(r);
  }
  for (Row& r : rows)
    for (const Row& o : rows) {
      const Case &c = *r.c, &d = *o.c;
      // The dense ceiling (one group: streams do not apply; fp8_sm90 compares within its tile width).
      if (!c.dense && d.dense && d.op == c.op && d.recipe == c.recipe && d.N == c.N && d.K == c.K &&
          (c.recipe != "fp8_sm90" || d.tuning_label() == c.tuning_label()))
        r.fraction_of_dense = r.tflops / o.tflops;
      const bool same_case = d.op == c.op && d.shape == c.shape && d.dense == c.dense;
      const bool same = same_case && d.tuning_label() == c.tuning_label();
      if (c.recipe != "bf16" && d.recipe == "bf16" && same) r.speedup = o.us / r.us;
      // fp8_sm90 rows of every tile width and variant against the one-stream cuBLASLt row
      const bool fp8_peer = c.recipe == "fp8_sm90" ? same_case && d.tuning_label() == "none" : same;
      if (c.recipe != "bf16" && c.recipe != "fp8" && d.recipe == "fp8" && fp8_peer) r.vs_fp8 = o.us / r.us;
    }
  return rows;
}

std::string ratio_cell(double v, const char* suffix) {
  return std::isnan(v) ? std::string("-") : fmt::format("{:.2f}{}", v, suffix);
}

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<22} | {:<14} | {:<7} | {:>9} | {:>8} | {:>7} | {:>7} | {:>7} | {:>7}\n", "case", "shape", "tuning",
             "us", "TFLOP/s", "x dense", "x bf16", "x none", "x fp8");
  fmt::print("{:-<22}-+-{:-<14}-+-{:-<7}-+-{:->9}-+-{:->8}-+-{:->7}-+-{:->7}-+-{:->7}-+-{:->7}\n", "", "", "", "", "",
             "", "", "", "");
  std::map<std::string, std::vector<double>> fractions, speedups, over_none;  // by tuning label
  std::map<std::string, std::vector<double>> vs_fp8;  // by recipe (MXFP4 rows), recipe@tuning (fp8_sm90 rows)
  for (const Row& r : rows) {
    double vs_none = NAN;  // the untuned time of the same case over this one's
    for (const Row& o : rows)
      if (o.c->tuning_label() == "none" && o.c->op == r.c->op && o.c->recipe == r.c->recipe &&
          o.c->shape == r.c->shape && o.c->dense == r.c->dense)
        vs_none = o.us / r.us;
    const std::string label = r.c->tuning_label();
    fmt::print("{:<22} | {:<14} | {:<7} | {:>9.1f} | {:>8.1f} | {:>7} | {:>7} | {:>7} | {:>7}\n",
               fmt::format("{} {}", r.c->op, r.c->recipe), r.c->shape, label, r.us, r.tflops,
               r.c->dense ? std::string("ceiling") : ratio_cell(r.fraction_of_dense, ""), ratio_cell(r.speedup, "x"),
               label == "none" ? std::string("-") : ratio_cell(vs_none, "x"), ratio_cell(r.vs_fp8, "x"));
    if (!std::isnan(r.vs_fp8))
      vs_fp8[r.c->recipe == "fp8_sm90" ? r.c->recipe + "@" + label : r.c->recipe].push_back(r.vs_fp8);
    if (!std::isnan(r.fraction_of_dense)) fractions[label].push_back(r.fraction_of_dense);
    if (!std::isnan(r.speedup) && !r.c->dense && r.c->recipe == "fp8") speedups[label].push_back(r.speedup);
    if (!std::isnan(vs_none) && label != "none") over_none[label].push_back(vs_none);
  }
  for (const auto& [label, f] : fractions)
    fmt::print("geomean, tuning {}: {:.3f} x dense over {} grouped cases; FP8 over BF16 {:.3f}x over {} pairs{}\n",
               label, bench::geomean(f), f.size(), bench::geomean(speedups[label]), speedups[label].size(),
               over_none[label].empty() ? std::string()
                                        : fmt::format("; {:.3f}x the untuned time", bench::geomean(over_none[label])));
  for (const auto& [recipe, v] : vs_fp8)
    fmt::print("geomean, {}: {:.3f} x the FP8 speed over {} cases (FP8 time over its time)\n", recipe,
               bench::geomean(v), v.size());
  std::vector<double> direct_over_converted;  // mxfp4_cvt_sm90 time over mxfp4_sm90 time, same op and shape
  for (const Row& r : rows)
    for (const Row& o : rows)
      if (r.c->recipe == "mxfp4_sm90" && o.c->recipe == "mxfp4_cvt_sm90" && o.c->op == r.c->op &&
          o.c->shape == r.c->shape)
        direct_over_converted.push_back(o.us / r.us);
  if (!direct_over_converted.empty())
    fmt::print("geomean, mxfp4_sm90: {:.3f} x the speed of mxfp4_cvt_sm90 over {} cases (converted first)\n",
               bench::geomean(direct_over_converted), direct_over_converted.size());
}

// The /bench/grouped_gemm table: case = op ("fprop", "dgrad", "wgrad"; "_dense" appended for the one-group
// ceiling), shape as printed ("up 8x2048": V3 fused gate/up, 8 experts of about 2048 tokens), recipe bf16/fp8.
Table result_table(const std::vector<Row>& rows) {
  Table t = bench::bench_table();
  t.add_column("fraction_of_dense", ColumnType::f64)
      .add_column("experts", ColumnType::i64)
      .add_column("n", ColumnType::i64)
      .add_column("k", ColumnType::i64)
      .add_column("tuning", ColumnType::str);
  const double not_measured = NAN;  // gbps and fraction_of_copy_bw do not apply to GEMMs
  for (const Row& r : rows)
    t.add_row({r.c->op + (r.c->dense ? "_dense" : ""), r.c->shape, r.c->recipe, r.us, r.tflops, not_measured,
               not_measured, r.speedup, r.fraction_of_dense, r.c->G, r.c->N, r.c->K, r.c->tuning_label()});
  t.set_attribute("tflops", fmt::format("2 * M * N * K over the time of one grouped call, M = {} routed tokens",
                                        kTokens));
  t.set_attribute("speedup", "BF16 time over this row's time, same op and shape (NaN on BF16 rows and where no BF16 "
                             "row matches); FP8 over MXFP4: divide the rows' us");
  t.set_attribute("fraction_of_dense",
                  "TFLOP/s over the dense GEMM's (one group of all tokens) of the same op, recipe, N and K measured "
                  "in the same run (NaN on dense rows)");
  t.set_attribute("recipe", "bf16, fp8 (cuBLASLt through GroupedGemm), fp8_sm90 (the Hopper grouped kernel, "
                            "grouped_gemm_sm90.h: same operands as fp8), mxfp4, mxfp4_gemm, mxfp4_sm90 (Fprop "
                            "reading MXFP4 X in the Hopper kernel), mxfp4_cvt_sm90 (mxfp4_row_to_fp8_row, then "
                            "fp8_sm90)");
  t.set_attribute("shape", "up: N=4096, K=7168 (DeepSeek-V3 fused gate/up); down: N=7168, K=2048; GxM: G experts "
                           "of about M tokens each (ragged +-25 %), 'even': exactly M each");
  t.set_attribute("tuning", "GroupedGemmTuning: none (one stream: the default, what the trainer runs), sS (S "
                            "concurrent runs of groups); fp8_sm90 rows: none (tile width chosen by the kernel's "
                            "launcher), nW (tile width forced to W columns), suffix o (overlapped promotion), e or "
                            "epi alone (coalesced epilogue): Sm90GemmConfig; speedup compares rows of the same tuning, "
                            "fraction_of_dense divides by the dense (one-group) row");
  t.set_attribute("gbps", "not measured for GEMMs (NaN)");
  t.set_attribute("min_time_s", kMinTimeS);
  return t;
}

}  // namespace
}  // namespace fp4moe::bench_gemm

int main(int argc, char** argv) {
  using namespace fp4moe;
  using namespace fp4moe::bench_gemm;
  bench::Program program;
  program.name = "bench_grouped_gemm";
  program.needs = "the grouped GEMM benchmarks";
  program.help.summary =
      "the grouped expert GEMMs of kernels/gemm/grouped_gemm.h (Fprop, Dgrad, Wgrad; BF16 and block-scaled FP8) on "
      "DeepSeek-V3 expert shapes against the dense GEMM over the same tokens measured in the same run";
  program.help.example = "--benchmark_filter=fp8";
  program.min_time_s = kMinTimeS;
  program.cases = [] {
    define_cases();
    return bench::case_names(g_cases);
  };
  program.run_case = [](benchmark::State& st, size_t i) { run_case(st, &g_cases[i]); };
  program.report = [](const std::string& h5_path, const std::string& command) {
    const std::vector<Row> rows = summarize();
    print_table(rows);
    int rc = std::all_of(g_measured.begin(), g_measured.end(), [](const auto& kv) { return kv.second.ok; }) ? 0 : 1;
    if (!h5_path.empty() &&
        bench::write_bench_result("bench_grouped_gemm", h5_path, "grouped_gemm", result_table(rows), command) != 0)
      rc = 1;
    return rc;
  };
  return bench::run_program(argc, argv, program);
}
