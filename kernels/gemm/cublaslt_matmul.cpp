#include "kernels/gemm/cublaslt_matmul.h"

#include <fmt/format.h>

#include <bit>

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_32F: return "fp32";
    case CUDA_R_8F_E4M3: return "e4m3";
    default: return "unsupported type";
  }
}

cublasLtMatmulMatrixScale_t lt_scale(LtScaleMode mode) {
  return mode == LtScaleMode::blk128x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                         : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
}

// Largest power of two (<= 256) dividing the address: what cuBLASLt's alignment preferences ask for.
int alignment_of(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  uintptr_t low = a & (~a + 1);
  return static_cast<int>(low > 256 ? 256 : low);
}

int64_t next_pow2(int64_t v) { return v <= 1 ? 1 : static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(v))); }

// Stored (column-major) rows of each matrix for a problem m x n x k.
int64_t rows_a(const LtOperand& a, int64_t m, int64_t k) { return a.transpose ? k : m; }
int64_t rows_b(const LtOperand& b, int64_t n, int64_t k) { return b.transpose ? n : k; }

// A leading dimension for the bucketed problem: tight stays tight, a wider one is kept (at least the rows).
int64_t bucket_ld(int64_t ld, int64_t rows, int64_t rows_bucketed) {
  if (ld == rows) return rows_bucketed;
  return ld > rows_bucketed ? ld : rows_bucketed;
}

void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes,
              const char* what) {
  cublasStatus_t st = cublasLtMatmulDescSetAttribute(desc, attr, v, bytes);
  FP4MOE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmulDescSetAttribute({}) failed: {}", what,
               cublas_status_name(st));
}

}  // namespace

const char* lt_scale_mode_name(LtScaleMode mode) {
  switch (mode) {
    case LtScaleMode::none: return "none";
    case LtScaleMode::vec128: return "VEC128_32F";
    case LtScaleMode::blk128x128: return "BLK128x128_32F";
  }
  return "?";
}

const char* cublas_status_name(cublasStatus_t status) { return cublasLtGetStatusName(status); }

std::string CublasLtMatmul::describe(int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b,
                                     const LtOutput& d) {
  return fmt::format(
      "D[{}x{}] {} (ld {}{}) = op(A)[{}x{}] * op(B)[{}x{}]; A {} {} ld {} scales {}; B {} {} ld {} scales {}", m, n,
      type_name(d.type), d.ld, d.accumulate ? ", accumulate" : "", m, k, k, n, type_name(a.type),
      a.transpose ? "T" : "N", a.ld, lt_scale_mode_name(a.scale_mode), type_name(b.type), b.transpose ? "T" : "N",
      b.ld, lt_scale_mode_name(b.scale_mode));
}

CublasLtMatmul::CublasLtMatmul(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  cublasStatus_t st = cublasLtCreate(&handle_);
  FP4MOE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed: {}", cublas_status_name(st));
  if (workspace_bytes_) CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

CublasLtMatmul::~CublasLtMatmul() {
  for (auto& [key, plan] : plans_)
    if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

CublasLtMatmul::Plan& CublasLtMatmul::plan_for(const Key& key, int64_t m, int64_t n, int64_t k, const LtOperand& a,
                                               const LtOperand& b, const LtOutput& d) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  // The shape the heuristic sees (the bucketed one when the key is bucketed).
  const int64_t hm = std::get<8>(key), hn = std::get<9>(key), hk = std::get<10>(key);
  const int64_t hlda = std::get<11>(key), hldb = std::get<12>(key), hldd = std::get<13>(key);

  Plan plan;
  cublasStatus_t st = cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  FP4MOE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmulDescCreate failed: {}", cublas_status_name(st));
  try {
    cublasOperation_t ta = a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N, tb = b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta, "TRANSA");
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb, "TRANSB");
    if (a.scale_mode != LtScaleMode::none) {
      cublasLtMatmulMatrixScale_t mode = lt_scale(a.scale_mode);
      set_attr(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode, "A_SCALE_MODE");
      set_attr(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.scales, sizeof a.scales, "A_SCALE_POINTER");
    }
    if (b.scale_mode != LtScaleMode::none) {
      cublasLtMatmulMatrixScale_t mode = lt_scale(b.scale_mode);
      set_attr(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode, "B_SCALE_MODE");
      set_attr(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.scales, sizeof b.scales, "B_SCALE_POINTER");
    }

    cublasLtMatrixLayoutOpaque_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&la, a.type, a.transpose ? hk : hm, a.transpose ? hm : hk, hlda));
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&lb, b.type, b.transpose ? hn : hk, b.transpose ? hk : hn, hldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&ld, d.type, hm, hn, hldd));

    cublasLtMatmulPreferenceOpaque_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceInit(&pref));
    uint64_t ws = workspace_bytes_;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al_a = std::get<14>(key), al_b = std::get<15>(key), al_d = std::get<16>(key);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                      sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                      sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                      sizeof al_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                      sizeof al_d));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    ++heuristic_queries_;
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, reinterpret_cast<cublasLtMatrixLayout_t>(&la),
                                        reinterpret_cast<cublasLtMatrixLayout_t>(&lb),
                                        reinterpret_cast<cublasLtMatrixLayout_t>(&ld),
                                        reinterpret_cast<cublasLtMatrixLayout_t>(&ld),
                                        reinterpret_cast<cublasLtMatmulPreference_t>(&pref), 1, &result, &found);
    FP4MOE_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
                 "cuBLASLt has no algorithm for {} (heuristic shape {}x{}x{}): {}{}", describe(m, n, k, a, b, d),
                 hm, hn, hk, cublas_status_name(st), found == 0 && st == CUBLAS_STATUS_SUCCESS ? " (0 results)" : "");
    plan.algo = result.algo;
  } catch (...) {
    cublasLtMatmulDescDestroy(plan.desc);
    throw;
  }
  return plans_.emplace(key, plan).first->second;
}

void CublasLtMatmul::matmul(int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b,
                            const LtOutput& d, RaggedDim ragged, cudaStream_t stream) {
  FP4MOE_CHECK(m >= 1 && n >= 1 && k >= 1, "cuBLASLt matmul: expected m, n, k >= 1, got m={} n={} k={}", m, n, k);
  FP4MOE_CHECK(a.data && b.data && d.data, "cuBLASLt matmul: null operand (A {}, B {}, D {})", a.data, b.data,
               d.data);
  for (const LtOperand* op : {&a, &b}) {
    bool fp8 = op->type == CUDA_R_8F_E4M3;
    FP4MOE_CHECK(fp8 || op->type == CUDA_R_16BF, "cuBLASLt matmul: operands must be bf16 or e4m3, got {}",
                 type_name(op->type));
    FP4MOE_CHECK(fp8 == (op->scale_mode != LtScaleMode::none && op->scales != nullptr),
                 "cuBLASLt matmul: FP8 operands need block scales and BF16 operands take none ({})",
                 describe(m, n, k, a, b, d));
  }
  FP4MOE_CHECK(a.ld >= rows_a(a, m, k) && b.ld >= rows_b(b, n, k) && d.ld >= m,
               "cuBLASLt matmul: leading dimensions smaller than the stored rows ({})", describe(m, n, k, a, b, d));
  FP4MOE_CHECK(d.type == CUDA_R_16BF || d.type == CUDA_R_32F, "cuBLASLt matmul: output must be bf16 or fp32");
  FP4MOE_CHECK(!d.accumulate || d.type == CUDA_R_32F, "cuBLASLt matmul: accumulation needs an FP32 output ({})",
               describe(m, n, k, a, b, d));

  const int64_t nb = ragged == RaggedDim::n ? next_pow2(n) : n;
  const int64_t kb = ragged == RaggedDim::k ? next_pow2(k) : k;
  auto make_key = [&](int64_t hn, int64_t hk) {
    return Key{static_cast<int>(a.type), static_cast<int>(b.type), static_cast<int>(d.type), a.transpose,
               b.transpose, static_cast<int>(a.scale_mode), static_cast<int>(b.scale_mode), d.accumulate, m, hn, hk,
               bucket_ld(a.ld, rows_a(a, m, k), rows_a(a, m, hk)), bucket_ld(b.ld, rows_b(b, n, k), rows_b(b, hn, hk)),
               d.ld, alignment_of(a.data), alignment_of(b.data), alignment_of(d.data)};
  };

  cublasLtMatrixLayoutOpaque_t la, lb, ld;
  CUBLAS_CHECK(cublasLtMatrixLayoutInit(&la, a.type, a.transpose ? k : m, a.transpose ? m : k, a.ld));
  CUBLAS_CHECK(cublasLtMatrixLayoutInit(&lb, b.type, b.transpose ? n : k, b.transpose ? k : n, b.ld));
  CUBLAS_CHECK(cublasLtMatrixLayoutInit(&ld, d.type, m, n, d.ld));
  const float alpha = 1.0f, beta = d.accumulate ? 1.0f : 0.0f;

  auto run = [&](Plan& plan) {
    if (a.scale_mode != LtScaleMode::none)
      set_attr(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.scales, sizeof a.scales, "A_SCALE_POINTER");
    if (b.scale_mode != LtScaleMode::none)
      set_attr(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.scales, sizeof b.scales, "B_SCALE_POINTER");
    return cublasLtMatmul(handle_, plan.desc, &alpha, a.data, reinterpret_cast<cublasLtMatrixLayout_t>(&la), b.data,
                          reinterpret_cast<cublasLtMatrixLayout_t>(&lb), &beta, d.data,
                          reinterpret_cast<cublasLtMatrixLayout_t>(&ld), d.data,
                          reinterpret_cast<cublasLtMatrixLayout_t>(&ld), &plan.algo, workspace_, workspace_bytes_,
                          stream);
  };

  // The bucketed plan first; the exact shape only when cuBLASLt refuses the bucketed algorithm (or has none).
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
  const bool bucketed = nb != n || kb != k;
  if (bucketed) {
    try {
      st = run(plan_for(make_key(nb, kb), m, n, k, a, b, d));
    } catch (const Error&) {
      st = CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  if (!bucketed || st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    if (bucketed) ++exact_shape_fallbacks_;
    st = run(plan_for(make_key(n, k), m, n, k, a, b, d));
  }
  FP4MOE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul failed with {} for {}", cublas_status_name(st),
               describe(m, n, k, a, b, d));
}

}  // namespace fp4moe
