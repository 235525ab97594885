// MlaAttention (trainer/model/mla.h) on the GPU against an independent FP64 model of the same layer written here
// from DeepSeek's definition (q down/norm/up or q_proj, joint kv down with the decoupled RoPE key, kv norm/up,
// K = [k_nope_h | k_pe], causal softmax(q k^T / sqrt(dqk)) v per sequence, output projection), on the tiny
// model's MLA shape (hidden 64, 4 heads, qk 16 + 16, v 16, latents 32) with B = 2 sequences of T = 64, for
// q_lora_rank = 32 and 0 (q_proj).
//   forward:  y against the FP64 model at the GPU's BF16 weights: relative L2 error <= 3e-2 (a chain of ~8 BF16
//             roundings and the BF16 attention core, each ~2^-9 relative);
//   backward: loss = sum(y * g) for a random g; every parameter's grad and dx at sampled elements (random ones
//             and the largest) against central differences of the FP64 model (step 1e-3, exact to ~1e-6):
//             |gpu - fd| <= 0.05 |fd| + 0.03 rms(fd over the tensor's samples).
// Also with the attention core on the cuDNN backend (skipped where this build has no cuDNN).
// Weights are N(0, 1 / in_features) (norm weights 1 + N(0, 0.1^2)) so that attention is far from uniform and a
// wrong rotation, position or head would show; the inputs x and g are N(0, 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/attention/attention_core.h"
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/nn/rmsnorm.h"
#include "kernels/nn/rope.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/mla.h"

namespace fp4moe {
namespace {

using Vec = std::vector<double>;

ModelConfig tiny_mla(int64_t q_lora) {
  ModelConfig c;
  c.hidden = 64;
  c.layers = 2;
  c.heads = 4;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 16;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-6;
  return c;
}

// y [M, N] = x [M, K] W^T, W [N, K].
Vec linear(const Vec& x, const Vec& w, int64_t M, int64_t K, int64_t N) {
  Vec y(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * w[n * K + k];
      y[m * N + n] = s;
    }
  return y;
}

Vec rmsnorm(const Vec& x, const Vec& w, int64_t M, int64_t C, double eps) {
  Vec y(M * C);
  rmsnorm_forward_f64(x.data(), w.data(), M, C, eps, y.data(), nullptr);
  return y;
}

// The FP64 model: weights by name suffix ("q_down", ...), x [M, d] -> y [M, d].
Vec mla_f64(const ModelConfig& c, int64_t T, const std::map<std::string, Vec>& w, const Vec& x, int64_t M) {
  const int64_t d = c.hidden, H = c.heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t dqk = nope + rope, dv = c.v_head_dim, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
  const RopeConfig rc{static_cast<float>(c.rope_theta), 0, T};
  Vec q = rq > 0 ? linear(rmsnorm(linear(x, w.at("q_down"), M, d, rq), w.at("q_norm"), M, rq, c.norm_eps),
                          w.at("q_up"), M, rq, H * dqk)
                 : linear(x, w.at("q_proj"), M, d, H * dqk);
  Vec q_pe(M * H * rope), q_pe_rot(M * H * rope);
  for (int64_t i = 0; i < M * H; ++i)
    for (int64_t j = 0; j < rope; ++j) q_pe[i * rope + j] = q[i * dqk + nope + j];
  rope_f64(q_pe.data(), M, H, rope, rc, q_pe_rot.data(), false);
  for (int64_t i = 0; i < M * H; ++i)
    for (int64_t j = 0; j < rope; ++j) q[i * dqk + nope + j] = q_pe_rot[i * rope + j];

  const Vec kvd = linear(x, w.at("kv_down"), M, d, rkv + rope);
  Vec c_kv(M * rkv), k_pe(M * rope), k_pe_rot(M * rope);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < rkv; ++j) c_kv[m * rkv + j] = kvd[m * (rkv + rope) + j];
    for (int64_t j = 0; j < rope; ++j) k_pe[m * rope + j] = kvd[m * (rkv + rope) + rkv + j];
  }
  rope_f64(k_pe.data(), M, 1, rope, rc, k_pe_rot.data(), false);
  const Vec kv = linear(rmsnorm(c_kv, w.at("kv_norm"), M, rkv, c.norm_eps), w.at("kv_up"), M, rkv, H * (nope + dv));
  Vec k(M * H * dqk), v(M * H * dv), o(M * H * dv);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t src = (m * H + h) * (nope + dv);
      for (int64_t j = 0; j < nope; ++j) k[(m * H + h) * dqk + j] = kv[src + j];
      for (int64_t j = 0; j < rope; ++j) k[(m * H + h) * dqk + nope + j] = k_pe_rot[m * rope + j];
      for (int64_t j = 0; j < dv; ++j) v[(m * H + h) * dv + j] = kv[src + nope + j];
    }
  const AttentionShape s{M / T, T, H, dqk, dv, static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)))};
  attention_forward_ref<double>(s, q.data(), k.data(), v.data(), o.data(), nullptr);
  return linear(o, w.at("out"), M, H * dv, d);
}

// The layer with its attention core on our kernels, or on cuDNN (kernels/attention/attention_core.h: `cudnn`, its
// non-deterministic backward, the workspace it asks at M tokens) as the model sets it up.
struct Fixture {
  explicit Fixture(int64_t q_lora, bool cudnn = false) : cfg(tiny_mla(q_lora)) {
    CUDA_CHECK(cudaStreamCreate(&stream));
    mla = std::make_unique<MlaAttention>(store, "attn", cfg, Recipe::bf16, T, M, mem);
    scratch = std::make_unique<ScratchArena>(mem, mla->scratch_bytes(), "test scratch");
    store.allocate(mem);
    store.init(7, stream);
    ctx = ModelContext{stream, &lt, &mem, scratch.get()};
    if (cudnn) {
      core = std::make_unique<AttentionCore>(AttentionBackend::cudnn, false,
                                             MlaAttention::core_shape(cfg, M, cfg.heads, T),
                                             MlaAttention::core_layout(cfg, cfg.heads), 0, stream);
      const int64_t bytes = core->workspace_bytes();
      sdpa_ws = std::make_unique<test::DeviceBuffer<unsigned char>>(static_cast<size_t>(bytes));
      core->set_workspace(sdpa_ws->ptr, bytes);
      ctx.attention = core.get();
    }
    // Weights N(0, 1 / in) (norms 1 + N(0, 0.01)), rounded to BF16; master = param exactly.
    std::mt19937 rng(11);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (Param& p : store.params()) {
      const bool norm = p.shape.size() == 1;
      const double std_dev = norm ? 0.1 : 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
      std::vector<float> master(p.n);
      std::vector<bf16> param(p.n);
      for (int64_t i = 0; i < p.n; ++i) {
        param[i] = bf16_from_bits(f32_to_bf16_bits(static_cast<float>((norm ? 1.0 : 0.0) + std_dev * normal(rng))));
        master[i] = bf16_bits_to_f32(bf16_bits(param[i]));
      }
      CUDA_CHECK(cudaMemcpy(p.master, master.data(), p.n * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(p.param, param.data(), p.n * sizeof(bf16), cudaMemcpyHostToDevice));
      const std::string suffix = p.name.substr(p.name.rfind('.') + 1);
      weights[suffix] = Vec(master.begin(), master.end());
      names[suffix] = &p;
    }
  }
  ~Fixture() {
    core.reset();  // its cuDNN handle uses the stream
    cudaStreamDestroy(stream);
  }

  static constexpr int64_t B = 2, T = 64, M = B * T;
  ModelConfig cfg;
  DeviceMemory mem;
  ParamStore store;
  CublasLtMatmul lt;
  cudaStream_t stream = nullptr;
  ModelContext ctx;
  std::unique_ptr<MlaAttention> mla;
  std::unique_ptr<ScratchArena> scratch;
  std::unique_ptr<AttentionCore> core;
  std::unique_ptr<test::DeviceBuffer<unsigned char>> sdpa_ws;
  std::map<std::string, Vec> weights;
  std::map<std::string, Param*> names;
};

double rel_l2(const Vec& a, const Vec& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

Vec to_f64(const std::vector<bf16>& v) {
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = test::value_of(v[i]);
  return out;
}

// Sampled gradient check of `analytic` (the GPU's) against central differences of loss() in `values`.
void check_gradient(const std::string& what, Vec& values, const std::vector<float>& analytic,
                    const std::function<double()>& loss, uint32_t seed) {
  std::vector<size_t> idx;
  std::mt19937 rng(seed);
  for (int i = 0; i < 8; ++i) idx.push_back(rng() % values.size());
  size_t largest = 0;
  for (size_t i = 0; i < analytic.size(); ++i)
    if (std::fabs(analytic[i]) > std::fabs(analytic[largest])) largest = i;
  idx.push_back(largest);
  Vec fd(idx.size());
  double ms = 0;
  for (size_t j = 0; j < idx.size(); ++j) {
    const double saved = values[idx[j]], h = 1e-3;
    values[idx[j]] = saved + h;
    const double up = loss();
    values[idx[j]] = saved - h;
    const double down = loss();
    values[idx[j]] = saved;
    fd[j] = (up - down) / (2 * h);
    ms += fd[j] * fd[j];
  }
  const double rms = std::sqrt(ms / static_cast<double>(idx.size()));
  for (size_t j = 0; j < idx.size(); ++j)
    EXPECT_NEAR(analytic[idx[j]], fd[j], 0.05 * std::fabs(fd[j]) + 0.03 * rms)
        << what << "[" << idx[j] << "] (finite difference " << fd[j] << ", rms of the samples " << rms << ")";
}

void run_against_f64(int64_t q_lora, bool cudnn = false) {
  Fixture f(q_lora, cudnn);
  const int64_t M = Fixture::M, d = f.cfg.hidden;
  const auto x = test::random_bf16(M * d, 21), g = test::random_bf16(M * d, 22);
  test::Guarded<bf16> x_d(M * d), y_d(M * d), g_d(M * d), dx_d(M * d);
  x_d.upload(x);
  g_d.upload(g);
  f.mla->forward(f.ctx, x_d.ptr(), M, y_d.ptr());
  f.mla->backward(f.ctx, g_d.ptr(), x_d.ptr(), M, dx_d.ptr());
  CUDA_CHECK(cudaStreamSynchronize(f.stream));
  EXPECT_TRUE(y_d.guards_intact() && dx_d.guards_intact());

  Vec xd = to_f64(x);
  const Vec gd = to_f64(g);
  const Vec y_ref = mla_f64(f.cfg, Fixture::T, f.weights, xd, M);
  EXPECT_LE(rel_l2(to_f64(y_d.download()), y_ref), 3e-2) << "forward y";

  auto loss = [&] {
    const Vec y = mla_f64(f.cfg, Fixture::T, f.weights, xd, M);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * gd[i];
    return s;
  };
  const Vec dx = to_f64(dx_d.download());
  check_gradient("dx", xd, std::vector<float>(dx.begin(), dx.end()), loss, 31);
  uint32_t seed = 40;
  for (auto& [name, p] : f.names) {
    std::vector<float> grad(p->n);
    CUDA_CHECK(cudaMemcpy(grad.data(), p->grad, p->n * sizeof(float), cudaMemcpyDeviceToHost));
    check_gradient(p->name, f.weights[name], grad, loss, seed++);
  }
}

TEST(ModelMla, MatchesFp64ModelWithQLora) {
  FP4MOE_REQUIRE_DEVICE();
  run_against_f64(32);
}

TEST(ModelMla, MatchesFp64ModelWithDirectQueryProjection) {
  FP4MOE_REQUIRE_DEVICE();
  run_against_f64(0);
}

// The attention core on cuDNN (model.attention_backend = cudnn): the same checks; v read from and dv written into
// the kv / d kv buffers with head stride nope + dv, as for our kernels.
TEST(ModelMla, MatchesFp64ModelOnTheCudnnBackend) {
  FP4MOE_REQUIRE_DEVICE();
  if (!cudnn_sdpa_built()) GTEST_SKIP() << cudnn_sdpa_version_text();
  run_against_f64(32, true);
  run_against_f64(0, true);
}

TEST(ModelMla, ParameterNamesAndShapes) {
  FP4MOE_REQUIRE_DEVICE();
  Fixture f(32);
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"attn.q_down", {32, 64}}, {"attn.q_norm", {32}},    {"attn.q_up", {4 * 32, 32}}, {"attn.kv_down", {32 + 16, 64}},
      {"attn.kv_norm", {32}},    {"attn.kv_up", {4 * 32, 32}}, {"attn.out", {64, 4 * 16}}};
  EXPECT_EQ(f.store.params().size(), expected.size());
  for (const auto& [name, shape] : expected) {
    const Param* p = f.store.find(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->shape, shape) << name;
  }
  Fixture g(0);
  EXPECT_NE(g.store.find("attn.q_proj"), nullptr);
  EXPECT_EQ(g.store.find("attn.q_down"), nullptr);
}

TEST(ModelMla, RejectsTokenCountsThatAreNotWholeSequences) {
  FP4MOE_REQUIRE_DEVICE();
  Fixture f(32);
  test::Guarded<bf16> x_d(Fixture::M * 64), y_d(Fixture::M * 64);
  EXPECT_THROW(f.mla->forward(f.ctx, x_d.ptr(), Fixture::T + 1, y_d.ptr()), Error);
  EXPECT_THROW(f.mla->forward(f.ctx, x_d.ptr(), Fixture::M + Fixture::T, y_d.ptr()), Error);
  f.mla->forward(f.ctx, x_d.ptr(), 0, y_d.ptr());  // M = 0: nothing to do
  EXPECT_THROW(f.mla->backward(f.ctx, x_d.ptr(), x_d.ptr(), Fixture::T, y_d.ptr()), Error);  // M differs
}

}  // namespace
}  // namespace fp4moe
