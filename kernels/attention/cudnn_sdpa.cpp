// The cuDNN backend of the attention core (cudnn_sdpa.h): the forward and backward operation graphs of cuDNN 9's
// fused flash attention, built through the backend API, their plans cached per shape and layout.
// Compiled with FP4MOE_WITH_CUDNN (kernels/CMakeLists.txt) when CMake found cuDNN 9; without it, the functions below
// the #else report "not built with cuDNN".
#include "kernels/attention/cudnn_sdpa.h"

#include <fmt/format.h>

#include "kernels/attention/attention_checks.h"
#include "kernels/common/check.h"

#if FP4MOE_WITH_CUDNN
#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <memory>
#include <utility>
#include <vector>
#endif

namespace fp4moe {

SdpaLayout SdpaLayout::dense(const AttentionShape& s) {
  const AttnStrides qk{s.H * s.Dqk, s.Dqk}, v{s.H * s.Dv, s.Dv};
  return SdpaLayout{qk, qk, v, v, v, qk, qk, v};
}

SdpaLayout SdpaLayout::of_forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o) {
  SdpaLayout l = dense(s);
  l.q = strides_of(q);
  l.k = strides_of(k);
  l.v = strides_of(v);
  l.o = strides_of(o);
  return l;
}

SdpaLayout SdpaLayout::of_backward(AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout, AttnOut dq, AttnOut dk,
                                   AttnOut dv) {
  return SdpaLayout{strides_of(q),    strides_of(k),  strides_of(v),  strides_of(o),
                    strides_of(dout), strides_of(dq), strides_of(dk), strides_of(dv)};
}

#if !FP4MOE_WITH_CUDNN

namespace {
constexpr const char* kNotBuilt =
    "not built with cuDNN (CMake found no cuDNN 9, or FP4MOE_WITH_CUDNN=OFF: install libcudnn9-dev-cuda-<CUDA major> "
    "or configure with -DFP4MOE_CUDNN_ROOT=<folder with include/ and lib/>)";
[[noreturn]] void not_built(const char* what) { fail(__FILE__, __LINE__, fmt::format("{}: {}", what, kNotBuilt)); }
}  // namespace

bool cudnn_sdpa_built() { return false; }
std::string cudnn_sdpa_version_text() { return kNotBuilt; }

struct CudnnSdpa::Impl {};
CudnnSdpa::CudnnSdpa() { not_built("CudnnSdpa"); }
CudnnSdpa::~CudnnSdpa() = default;
bool CudnnSdpa::supports(const AttentionShape&, const SdpaLayout&, bool, std::string* why) {
  if (why) *why = kNotBuilt;
  return false;
}
int64_t CudnnSdpa::forward_workspace_bytes(const AttentionShape&, const SdpaLayout&) {
  not_built("CudnnSdpa::forward_workspace_bytes");
}
int64_t CudnnSdpa::backward_workspace_bytes(const AttentionShape&, const SdpaLayout&, bool) {
  not_built("CudnnSdpa::backward_workspace_bytes");
}
void CudnnSdpa::forward(const AttentionShape&, AttnIn, AttnIn, AttnIn, AttnOut, float*, void*, int64_t,
                        cudaStream_t) {
  not_built("CudnnSdpa::forward");
}
void CudnnSdpa::backward(const AttentionShape&, AttnIn, AttnIn, AttnIn, AttnIn, AttnIn, const float*, AttnOut,
                         AttnOut, AttnOut, bool, void*, int64_t, cudaStream_t) {
  not_built("CudnnSdpa::backward");
}
int64_t CudnnSdpa::plans_built() const { return 0; }

#else  // FP4MOE_WITH_CUDNN

namespace {

// The workspace a call was given: at least `need` bytes, 16-byte aligned (null allowed when need is 0).
void check_workspace(const char* what, const void* workspace, int64_t bytes, int64_t need) {
  FP4MOE_CHECK(bytes >= need, "{}: the workspace has {} bytes, the plan needs {} (ask {}_workspace_bytes)", what, bytes,
               need, what);
  FP4MOE_CHECK(need == 0 || (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0),
               "{}: the workspace must be a 16-byte aligned device pointer, got address {:#x}", what,
               reinterpret_cast<uintptr_t>(workspace));
}

// lse for cuDNN: 16-byte aligned (the alignment its stats tensor is declared with).
void check_lse_alignment(const char* what, const float* lse) {
  FP4MOE_CHECK(reinterpret_cast<uintptr_t>(lse) % 16 == 0,
               "{}: lse must be 16-byte aligned for the cuDNN backend, got address {:#x}", what,
               reinterpret_cast<uintptr_t>(lse));
}

// The checks of a workspace query: flash_attention.h's shape rules and the strides of the tensors the pass reads
// and writes. Returns false for an empty shape.
bool check_layout(const char* what, const AttentionShape& s, const SdpaLayout& l, bool backward) {
  if (!attn_detail::check_shape_device(what, s)) return false;
  const struct {
    const char* name;
    AttnStrides st;
    int64_t D;
    bool backward_only;
  } tensors[] = {{"q", l.q, s.Dqk, false},     {"k", l.k, s.Dqk, false},    {"v", l.v, s.Dv, false},
                 {"o", l.o, s.Dv, false},      {"dout", l.dout, s.Dv, true}, {"dq", l.dq, s.Dqk, true},
                 {"dk", l.dk, s.Dqk, true},    {"dv", l.dv, s.Dv, true}};
  for (const auto& t : tensors)
    if (backward || !t.backward_only) attn_detail::check_strides(what, t.name, t.st.token_stride, t.st.head_stride, s, t.D);
  return true;
}

// ---- cuDNN calls and descriptors ---------------------------------------------------------------------------------

// fp4moe::Error for a failed cuDNN call: the status, cuDNN's own last message, the call.
void check_cudnn(cudnnStatus_t st, const char* call, const char* file, int line) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  char detail[2048] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  fail(file, line, fmt::format("cuDNN {} in {}{}{}", cudnnGetErrorString(st), call, detail[0] ? ": " : "", detail));
}
#define CUDNN_CHECK(call) check_cudnn((call), #call, __FILE__, __LINE__)

// One backend descriptor, destroyed with its owner (move-only).
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) { CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc& operator=(Desc&&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  // `count` values of attribute type `type` at `values`.
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  template <typename T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T& value) {
    return set(name, type, 1, &value);
  }
  Desc& finalize() {
    CUDNN_CHECK(cudnnBackendFinalize(d_));
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// ---- the operation graph --------------------------------------------------------------------------------------------

using Dims = std::array<int64_t, 4>;

// A tensor of the graph: its descriptor (owned by the Graph) and its dims.
struct Tensor {
  cudnnBackendDescriptor_t desc = nullptr;
  Dims dims{};
};

// The tensors the variant pack binds (and the scalars passed by value from the host), by unique id. Virtual tensors
// (never in memory) take ids from kFirstVirtual on.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv, kScale, kNegInf, kOne, kRowDot, kDqAccum, kFirstVirtual = 100
};

Dims dense_strides(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// An operation graph under construction: makes the tensors and operations, keeps every descriptor alive.
class Graph {
 public:
  // A tensor the variant pack binds to device memory.
  Tensor memory(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides) {
    return tensor(uid, type, dims, strides, false, false);
  }
  // An FP32 scalar passed by value (the variant pack points at a host float).
  Tensor scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }
  // An intermediate tensor (never in memory), dense unless strides are given.
  Tensor virt(cudnnDataType_t type, Dims dims) { return virt(type, dims, dense_strides(dims)); }
  Tensor virt(cudnnDataType_t type, Dims dims, Dims strides) {
    return tensor(next_virtual_++, type, dims, strides, true, false);
  }

  // y = mode(x[, b][, t]) elementwise (b and t broadcast); `math` the compute type, `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, Tensor x, const Tensor* b, const Tensor* t, Tensor y,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, math);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
    pw.finalize();
    Desc& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, pw.get())
        .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x.desc)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y.desc);
    if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->desc);
    if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, t->desc);
    add_op(op);
  }
  // mode(x[, b]) into a new intermediate of `type` with the broadcast dims of x and b.
  Tensor pointwise(cudnnPointwiseMode_t mode, Tensor x, const Tensor* b, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    Dims d = x.dims;
    if (b)
      for (int i = 0; i < 4; ++i) d[i] = std::max(d[i], b->dims[i]);
    const Tensor y = virt(type, d);
    pointwise(mode, x, b, nullptr, y);
    return y;
  }
  // c = a b over the last two dims, batched over the first two; FP32 accumulation.
  void matmul(Tensor a, Tensor b, Tensor c) {
    Desc& mm = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT).finalize();
    Desc& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, a.desc)
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b.desc)
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, c.desc)
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, mm.get());
    add_op(op);
  }
  Tensor matmul(Tensor a, Tensor b) {
    const Tensor c = virt(CUDNN_DATA_FLOAT, {a.dims[0], a.dims[1], a.dims[2], b.dims[3]});
    matmul(a, b, c);
    return c;
  }
  // y = reduction of x over its last dim (FP32).
  void reduce(cudnnReduceTensorOp_t op_type, Tensor x, Tensor y) {
    Desc& red = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, op_type)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
        .finalize();
    Desc& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x.desc)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y.desc)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, red.get());
    add_op(op);
  }
  Tensor reduce(cudnnReduceTensorOp_t op_type, Tensor x) {
    const Tensor y = virt(CUDNN_DATA_FLOAT, {x.dims[0], x.dims[1], x.dims[2], 1});
    reduce(op_type, x, y);
    return y;
  }
  // y = x viewed with y's dims and strides (here: the transpose of the last two dims).
  void reshape(Tensor x, Tensor y) {
    Desc& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x.desc)
        .set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y.desc);
    add_op(op);
  }
  // S with -inf where key j > query t: S[b, h, t, j] kept where t >= j (GEN_INDEX of the two axes, CMP_GE,
  // BINARY_SELECT: y = mask ? S : -inf), cudnn-frontend's top-left causal mask for cuDNN < 9.21.
  Tensor causal_mask(Tensor s, const Tensor& neg_inf) {
    const Tensor row = virt(CUDNN_DATA_INT32, s.dims), col = virt(CUDNN_DATA_INT32, s.dims);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
    const Tensor keep_mask = virt(CUDNN_DATA_BOOLEAN, s.dims);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep_mask, CUDNN_DATA_BOOLEAN);
    const Tensor out = virt(CUDNN_DATA_FLOAT, s.dims);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &neg_inf, &keep_mask, out);
    return out;
  }

  // The finalized operation graph of everything added, on `handle`; the descriptors stay owned here.
  cudnnBackendDescriptor_t finalize(cudnnHandle_t handle) {
    Desc& g = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()), ops_.data())
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle)
        .finalize();
    return g.get();
  }
  Desc& keep(cudnnBackendDescriptorType_t type) {
    descs_.push_back(std::make_unique<Desc>(type));
    return *descs_.back();
  }

 private:
  Tensor tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides, bool is_virtual, bool by_value) {
    Desc& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, true);
    t.finalize();
    return Tensor{t.get(), dims};
  }
  void add_op(Desc& op) {
    op.finalize();
    ops_.push_back(op.get());
  }

  std::vector<std::unique_ptr<Desc>> descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// [B, H, T, D] view of a [B*T, H, D] tensor with these strides: element (b, h, t, d) at (b T + t) token_stride +
// h head_stride + d. transposed: [B, H, D, T] (K^T, V^T for the products with them).
Tensor bhtd(Graph& g, int64_t uid, const AttentionShape& s, int64_t D, AttnStrides st, bool transposed = false) {
  const int64_t ts = st.token_stride, hs = st.head_stride;
  if (transposed) return g.memory(uid, CUDNN_DATA_BFLOAT16, {s.B, s.H, D, s.T}, {s.T * ts, hs, 1, ts});
  return g.memory(uid, CUDNN_DATA_BFLOAT16, {s.B, s.H, s.T, D}, {s.T * ts, hs, ts, 1});
}
// [B, H, T, 1] FP32, dense: lse (stats) and D.
Tensor rows_f32(Graph& g, int64_t uid, const AttentionShape& s) {
  return g.memory(uid, CUDNN_DATA_FLOAT, {s.B, s.H, s.T, 1}, {s.H * s.T, s.T, 1, 1});
}
// The transpose of the last two dims of a [B, H, T, T] intermediate, as BF16 (the operand of a product).
Tensor transposed_bf16(Graph& g, Tensor x) {
  const int64_t T = x.dims[2];
  const Tensor y = g.virt(CUDNN_DATA_BFLOAT16, {x.dims[0], x.dims[1], T, T}, {x.dims[1] * T * T, T * T, 1, T});
  g.reshape(x, y);
  return y;
}

// Forward (the frontend's graph::sdpa with causal mask, attention scale and stats):
//   S = Q K^T; S *= scale; causal mask; M = rowmax; E = exp(S - M); Z = rowsum E; stats = M + log Z;
//   P = E / Z (BF16); O = P V.
void build_forward(Graph& g, const AttentionShape& s, const SdpaLayout& l) {
  const Tensor q = bhtd(g, kQ, s, s.Dqk, l.q), kt = bhtd(g, kK, s, s.Dqk, l.k, true), v = bhtd(g, kV, s, s.Dv, l.v);
  const Tensor o = bhtd(g, kO, s, s.Dv, l.o), stats = rows_f32(g, kStats, s);
  const Tensor scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf);
  const Tensor scores = g.pointwise(CUDNN_POINTWISE_MUL, g.matmul(q, kt), &scale);
  const Tensor masked = g.causal_mask(scores, neg_inf);
  const Tensor row_max = g.reduce(CUDNN_REDUCE_TENSOR_MAX, masked);
  const Tensor e = g.pointwise(CUDNN_POINTWISE_EXP, g.pointwise(CUDNN_POINTWISE_SUB, masked, &row_max), nullptr);
  const Tensor row_sum = g.reduce(CUDNN_REDUCE_TENSOR_ADD, e);
  const Tensor log_sum = g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr);
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, &log_sum, nullptr, stats);
  const Tensor p = g.pointwise(CUDNN_POINTWISE_DIV, e, &row_sum, CUDNN_DATA_BFLOAT16);
  g.matmul(p, v, o);
}

// Backward (the frontend's graph::sdpa_backward, causal, attention scale):
//   D = rowsum(dO * O) * 1 (kept in the workspace); P = exp(mask(scale Q K^T - stats)); dV = P^T dO;
//   dS = (dO V^T - D) * P * scale; dK = dS^T Q; dQ = dS K, through an FP32 accumulator in the workspace unless
//   deterministic (cuDNN then takes its dP-workspace decomposition).
void build_backward(Graph& g, const AttentionShape& s, const SdpaLayout& l, bool deterministic) {
  const Tensor q = bhtd(g, kQ, s, s.Dqk, l.q), kt = bhtd(g, kK, s, s.Dqk, l.k, true);
  const Tensor vt = bhtd(g, kV, s, s.Dv, l.v, true), o = bhtd(g, kO, s, s.Dv, l.o);
  const Tensor dout = bhtd(g, kDout, s, s.Dv, l.dout), stats = rows_f32(g, kStats, s);
  const Tensor dq = bhtd(g, kDq, s, s.Dqk, l.dq), dk = bhtd(g, kDk, s, s.Dqk, l.dk), dv = bhtd(g, kDv, s, s.Dv, l.dv);
  const Tensor scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf), one = g.scalar(kOne);

  const Tensor row_dot = rows_f32(g, kRowDot, s);
  const Tensor dot_sum = g.reduce(CUDNN_REDUCE_TENSOR_ADD, g.pointwise(CUDNN_POINTWISE_MUL, dout, &o));
  g.pointwise(CUDNN_POINTWISE_MUL, dot_sum, &one, nullptr, row_dot);

  const Tensor scores = g.pointwise(CUDNN_POINTWISE_MUL, g.matmul(q, kt), &scale);
  const Tensor shifted = g.causal_mask(g.pointwise(CUDNN_POINTWISE_SUB, scores, &stats), neg_inf);
  const Tensor p = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr);
  g.matmul(transposed_bf16(g, p), dout, dv);

  const Tensor dp = g.pointwise(CUDNN_POINTWISE_SUB, g.matmul(dout, vt), &row_dot);
  const Tensor ds = g.pointwise(CUDNN_POINTWISE_MUL, g.pointwise(CUDNN_POINTWISE_MUL, dp, &p), &scale);
  g.matmul(transposed_bf16(g, ds), q, dk);

  const Tensor k = g.virt(CUDNN_DATA_FLOAT, {s.B, s.H, s.T, s.Dqk}, {s.T * l.k.token_stride, l.k.head_stride,
                                                                    l.k.token_stride, 1});
  g.reshape(kt, k);
  if (deterministic) {
    g.matmul(ds, k, dq);
  } else {
    const Tensor accum = g.memory(kDqAccum, CUDNN_DATA_FLOAT, {s.B, s.H, s.T, s.Dqk},
                                  dense_strides({s.B, s.H, s.T, s.Dqk}));
    g.matmul(ds, k, accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, accum, nullptr, nullptr, dq);
  }
}

// ---- plans ----------------------------------------------------------------------------------------------------------

constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

enum class Pass : int64_t { forward = 0, backward = 1 };

struct Plan {
  std::unique_ptr<Graph> graph;   // the operation graph's descriptors
  std::unique_ptr<Desc> config;   // the engine configuration chosen
  std::unique_ptr<Desc> plan;     // the execution plan
  int64_t engine_bytes = 0;       // the plan's workspace
  int64_t row_dot_offset = 0;     // backward: D [B, H, T] FP32 in the workspace
  int64_t accum_offset = -1;      // backward, not deterministic: the dQ accumulator [B, H, T, Dqk] FP32
  int64_t workspace_bytes = 0;    // everything above, each part 256-byte aligned
};

std::string shape_text(const AttentionShape& s) {
  return fmt::format("B={} T={} H={} Dqk={} Dv={} scale={}", s.B, s.T, s.H, s.Dqk, s.Dv, s.scale);
}

}  // namespace

bool cudnn_sdpa_built() { return true; }

std::string cudnn_sdpa_version_text() {
  const size_t v = cudnnGetVersion();
  return fmt::format("built against cuDNN {}.{}.{}, running {}.{}.{}", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL,
                     v / 10000, v / 100 % 100, v % 100);
}

struct CudnnSdpa::Impl {
  cudnnHandle_t handle = nullptr;
  size_t runtime_version = 0;
  std::map<std::vector<int64_t>, Plan> plans;

  // The plan for this pass, shape and layout: from the cache, else built (heuristics mode A, the first engine
  // configuration that finalizes). Throws fp4moe::Error with cuDNN's reason when none does.
  Plan& plan_for(Pass pass, const AttentionShape& s, const SdpaLayout& l, bool deterministic) {
    // The scale is a by-value scalar of the variant pack, not part of the plan.
    std::vector<int64_t> key = {static_cast<int64_t>(pass), deterministic, s.B, s.T, s.H, s.Dqk, s.Dv};
    const bool bwd = pass == Pass::backward;
    for (const AttnStrides* t : {&l.q, &l.k, &l.v, &l.o, &l.dout, &l.dq, &l.dk, &l.dv}) {
      if (!bwd && t == &l.dout) break;  // forward: q, k, v, o only
      key.push_back(t->token_stride);
      key.push_back(t->head_stride);
    }
    if (auto it = plans.find(key); it != plans.end()) return it->second;

    Plan p;
    p.graph = std::make_unique<Graph>();
    if (bwd) build_backward(*p.graph, s, l, deterministic);
    else build_forward(*p.graph, s, l);
    const cudnnBackendDescriptor_t graph = p.graph->finalize(handle);

    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_A)
        .finalize();
    int64_t count = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                         &count, nullptr));
    std::vector<std::unique_ptr<Desc>> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    if (count > 0)
      CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                           count, &count, raw.data()));
    std::string refusals;
    for (int64_t i = 0; i < count && !p.plan; ++i) {
      auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, raw[static_cast<size_t>(i)]);
      const cudnnStatus_t st = cudnnBackendFinalize(plan->get());
      if (st != CUDNN_STATUS_SUCCESS) {
        char detail[1024] = {0};
        cudnnGetLastErrorString(detail, sizeof(detail));
        refusals += fmt::format("; configuration {}: {} {}", i, cudnnGetErrorString(st), detail);
        continue;
      }
      int64_t n = 0;
      CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &n, &p.engine_bytes));
      p.plan = std::move(plan);
      p.config = std::move(configs[static_cast<size_t>(i)]);
    }
    FP4MOE_CHECK(p.plan != nullptr,
                 "CudnnSdpa: cuDNN ({}) has no engine for the causal attention {}{} at {} (heuristics mode A "
                 "returned {} configurations{})",
                 cudnn_sdpa_version_text(), bwd ? "backward" : "forward",
                 bwd ? (deterministic ? " (deterministic)" : " (non-deterministic)") : "", shape_text(s), count,
                 refusals.empty() ? std::string() : refusals);
    int64_t bytes = aligned(p.engine_bytes);
    if (bwd) {
      p.row_dot_offset = bytes;
      bytes += aligned(s.B * s.H * s.T * int64_t{sizeof(float)});
      if (!deterministic) {
        p.accum_offset = bytes;
        bytes += aligned(s.B * s.H * s.T * s.Dqk * int64_t{sizeof(float)});
      }
    }
    p.workspace_bytes = bytes;
    return plans.emplace(std::move(key), std::move(p)).first->second;
  }

  // Runs `p` on `stream` with the device tensors and host scalars of `bindings` (uid, pointer).
  void execute(const Plan& p, const std::vector<std::pair<int64_t, void*>>& bindings, void* workspace,
               cudaStream_t stream) {
    std::vector<int64_t> uids;
    std::vector<void*> pointers;
    for (const auto& [uid, ptr] : bindings) {
      uids.push_back(uid);
      pointers.push_back(ptr);
    }
    void* engine_workspace = p.engine_bytes > 0 ? workspace : nullptr;
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
             pointers.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, engine_workspace)
        .finalize();
    CUDNN_CHECK(cudnnSetStream(handle, stream));
    CUDNN_CHECK(cudnnBackendExecute(handle, p.plan->get(), pack.get()));
  }

  // The value the causal mask writes: -inf; cuDNN before 9.10 preferred the lowest finite float (as the frontend).
  float masked_value() const {
    return runtime_version < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
  }
};

CudnnSdpa::CudnnSdpa() : impl_(std::make_unique<Impl>()) {
  impl_->runtime_version = cudnnGetVersion();
  FP4MOE_CHECK(impl_->runtime_version >= 90000, "CudnnSdpa: the cuDNN library loaded is {} ({}), expected 9.0 or later",
               impl_->runtime_version, cudnn_sdpa_version_text());
  CUDNN_CHECK(cudnnCreate(&impl_->handle));
}

CudnnSdpa::~CudnnSdpa() {
  impl_->plans.clear();  // plans before the handle they were built on
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

int64_t CudnnSdpa::plans_built() const { return static_cast<int64_t>(impl_->plans.size()); }

bool CudnnSdpa::supports(const AttentionShape& s, const SdpaLayout& layout, bool deterministic, std::string* why) {
  try {
    forward_workspace_bytes(s, layout);
    backward_workspace_bytes(s, layout, deterministic);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

int64_t CudnnSdpa::forward_workspace_bytes(const AttentionShape& s, const SdpaLayout& layout) {
  if (!check_layout("CudnnSdpa::forward_workspace_bytes", s, layout, false)) return 0;
  return impl_->plan_for(Pass::forward, s, layout, false).workspace_bytes;
}

int64_t CudnnSdpa::backward_workspace_bytes(const AttentionShape& s, const SdpaLayout& layout, bool deterministic) {
  if (!check_layout("CudnnSdpa::backward_workspace_bytes", s, layout, true)) return 0;
  return impl_->plan_for(Pass::backward, s, layout, deterministic).workspace_bytes;
}

void CudnnSdpa::forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse,
                        void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  const char* what = "CudnnSdpa::forward";
  if (!attn_detail::check_forward_call(what, s, q, k, v, o, lse)) return;
  check_lse_alignment(what, lse);
  const Plan& p = impl_->plan_for(Pass::forward, s, SdpaLayout::of_forward(s, q, k, v, o), false);
  check_workspace(what, workspace, workspace_bytes, p.workspace_bytes);
  float scale = s.scale, masked = impl_->masked_value();  // host scalars, read by cudnnBackendExecute
  impl_->execute(p,
                 {{kQ, const_cast<bf16*>(q.data)}, {kK, const_cast<bf16*>(k.data)}, {kV, const_cast<bf16*>(v.data)},
                  {kO, o.data}, {kStats, lse}, {kScale, &scale}, {kNegInf, &masked}},
                 workspace, stream);
}

void CudnnSdpa::backward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout,
                         const float* lse, AttnOut dq, AttnOut dk, AttnOut dv, bool deterministic, void* workspace,
                         int64_t workspace_bytes, cudaStream_t stream) {
  const char* what = "CudnnSdpa::backward";
  if (!attn_detail::check_backward_call(what, s, q, k, v, o, dout, lse, dq, dk, dv, workspace)) return;
  check_lse_alignment(what, lse);
  const Plan& p =
      impl_->plan_for(Pass::backward, s, SdpaLayout::of_backward(q, k, v, o, dout, dq, dk, dv), deterministic);
  check_workspace(what, workspace, workspace_bytes, p.workspace_bytes);
  auto* base = static_cast<unsigned char*>(workspace);
  std::vector<std::pair<int64_t, void*>> bindings = {
      {kQ, const_cast<bf16*>(q.data)},       {kK, const_cast<bf16*>(k.data)},   {kV, const_cast<bf16*>(v.data)},
      {kO, const_cast<bf16*>(o.data)},       {kDout, const_cast<bf16*>(dout.data)},
      {kStats, const_cast<float*>(lse)},     {kDq, dq.data},                     {kDk, dk.data},
      {kDv, dv.data},                        {kRowDot, base + p.row_dot_offset}};
  if (p.accum_offset >= 0) {
    void* accum = base + p.accum_offset;
    bindings.emplace_back(kDqAccum, accum);
    // cuDNN zeroes the accumulator itself from 9.6 on (before, the frontend cleared it).
    if (impl_->runtime_version < 90600)
      CUDA_CHECK(cudaMemsetAsync(accum, 0, static_cast<size_t>(s.B * s.H * s.T * s.Dqk) * sizeof(float), stream));
  }
  float scale = s.scale, masked = impl_->masked_value(), one = 1.0f;  // host scalars, read by cudnnBackendExecute
  bindings.insert(bindings.end(), {{kScale, &scale}, {kNegInf, &masked}, {kOne, &one}});
  impl_->execute(p, bindings, workspace, stream);
}

#endif  // FP4MOE_WITH_CUDNN

}  // namespace fp4moe
