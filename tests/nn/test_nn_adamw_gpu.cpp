// GPU AdamW step and global gradient norm (kernels/nn/adamw.h) against their CPU references: several steps over
// tensors of 1, prime, 7168 x 2048-scale and tiny-model sizes, vector and scalar (shifted) paths, with the clip
// scale taken on the device from grad_global_norm; the norm over many tensors (deterministic, clipping on and
// off, NaN gradients, no tensors). Outputs are NaN-poisoned and guarded.
// Tolerances (FP32 against the double reference), per step: master within 2^-22 |master| + 1e-5 lr (the update
// term is at most a few lr and carries a few FP32 roundings); m within 1e-6 (|m| + |g|), v within 1e-6 (|v| + g^2)
// (one FP32 rounding per term); param is exactly BF16(master) of the GPU; the norm within 1e-9 relative (double
// sums in another order), rounded to FP32; the clip scale within 2^-22 relative.
// BF16 moments (DeepSeek-V3 sec. 3.3.3), several steps on fresh random tensors of the same kinds of sizes, on the
// vector path (moments 8-byte aligned: also at a 4-element offset) and the scalar path (everything shifted by one
// element, or only the moments by two): against the FP32-moment kernel run on the same values (the BF16 moments
// widened), master and param bit for bit and each BF16 moment the nearest-even rounding of the FP32 kernel's
// moment, bit for bit; against the CPU reference, master within the FP32 tolerance above, and each BF16 moment equal
// to the reference's (the nearest BF16 of the double moment) except where the double moment lies within the FP32
// tolerance above of a BF16 rounding boundary, where it may be the neighbour across that boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iterator>
#include <sstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/nn/adamw.h"

namespace fp4moe {
namespace {

using test::Guarded;
using test::TinyShapes;

struct DeviceParam {
  Guarded<float> master, grad, m, v;
  Guarded<bf16> param;
  DeviceParam(int64_t n, size_t shift) : master(n, shift), grad(n, shift), m(n, shift), v(n, shift), param(n, shift) {}
  AdamWTensor view() {
    return {master.ptr(), param.ptr(), grad.ptr(), m.ptr(), v.ptr(), static_cast<int64_t>(master.n)};
  }
  bool guards_intact() {
    return master.guards_intact() && grad.guards_intact() && m.guards_intact() && v.guards_intact() &&
           param.guards_intact();
  }
};

struct HostParam {
  std::vector<float> master, grad, m, v;
  std::vector<bf16> param;
  AdamWTensor view() {
    return {master.data(), param.data(), grad.data(), m.data(), v.data(), static_cast<int64_t>(master.size())};
  }
};

TEST(NnAdamW, StepsMatchReference) {
  FP4MOE_REQUIRE_DEVICE();
  // Sizes: 1, primes, a tiny-model matrix, an expert-sized slice; the last two shifted (scalar path, tails).
  const int64_t sizes[] = {1, 7, 4099, TinyShapes::hidden * TinyShapes::ffn, 7168 * 257, 13, 7168 + 3};
  const size_t shifts[] = {0, 0, 0, 0, 0, 1, 1};
  const int count = 7;
  std::vector<HostParam> host(count);
  std::vector<std::unique_ptr<DeviceParam>> dev;
  for (int k = 0; k < count; ++k) {
    const int64_t n = sizes[k];
    HostParam& h = host[k];
    h.master = test::random_f32(n, 800 + k, 0.0, 0.02);
    h.m = test::random_f32(n, 900 + k, 0.0, 1e-3);
    // A consistent history: v >= m^2, so that |m| / sqrt(v) <= 1 as in a real run (the update stays O(lr)).
    h.v = test::random_f32(n, 1000 + k, 0.0, 1e-6);
    for (int64_t i = 0; i < n; ++i) h.v[i] = h.m[i] * h.m[i] + std::fabs(h.v[i]);
    h.param.assign(n, bf16_from_bits(0));
    dev.push_back(std::make_unique<DeviceParam>(n, shifts[k]));
    dev[k]->master.upload(h.master);
    dev[k]->m.upload(h.m);
    dev[k]->v.upload(h.v);
  }
  Guarded<double> ws(kGradNormSlots);
  Guarded<float> norm_d(1), scale_d(1);
  AdamWConfig cfg;
  for (int64_t step = 5; step <= 7; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    cfg.step = step;
    cfg.lr = 3e-4f * static_cast<float>(step);  // the schedule's value for this step
    std::vector<GradTensor> grads;
    for (int k = 0; k < count; ++k) {
      host[k].grad = test::random_f32(sizes[k], 1100 + 10 * step + k, 0.0, k == 4 ? 1e-2 : 1e-3);
      dev[k]->grad.upload(host[k].grad);
      grads.push_back({dev[k]->grad.ptr(), sizes[k]});
      dev[k]->param.poison();
    }
    grad_global_norm(grads.data(), count, 1.0f, ws.ptr(), norm_d.ptr(), scale_d.ptr(), nullptr);
    std::vector<GradTensor> host_grads;
    for (int k = 0; k < count; ++k) host_grads.push_back({host[k].grad.data(), sizes[k]});
    const double norm_ref = grad_global_norm_ref(host_grads.data(), count);
    CUDA_CHECK(cudaDeviceSynchronize());
    const float norm = norm_d.download()[0], scale = scale_d.download()[0];
    EXPECT_NEAR(norm, norm_ref, 1e-9 * norm_ref + std::ldexp(norm_ref, -24));
    EXPECT_NEAR(scale, grad_clip_scale(norm_ref, 1.0f), std::ldexp(1.0, -22));
    EXPECT_LT(scale, 1.0f) << "the case is meant to clip (norm " << norm << ")";

    for (int k = 0; k < count; ++k) adamw_step(dev[k]->view(), cfg, scale_d.ptr(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int k = 0; k < count; ++k) {
      SCOPED_TRACE("tensor " + std::to_string(k) + " n=" + std::to_string(sizes[k]));
      const std::vector<float> g = host[k].grad;
      adamw_step_ref(host[k].view(), cfg, scale);  // the GPU's scale: both sides scale the same gradient
      const auto master = dev[k]->master.download(), m = dev[k]->m.download(), v = dev[k]->v.download();
      const auto param = dev[k]->param.download();
      test::expect_close(master, host[k].master, std::ldexp(1.0, -22), [&](size_t) { return 1e-5 * cfg.lr; },
                         "master");
      test::expect_close(m, host[k].m, 1e-6, [&](size_t i) { return 1e-6 * std::fabs(g[i] * scale) + 1e-30; }, "m");
      test::expect_close(v, host[k].v, 1e-6,
                         [&](size_t i) { return 1e-6 * double(g[i] * scale) * double(g[i] * scale) + 1e-30; }, "v");
      std::vector<bf16> param_of_master(master.size());
      for (size_t i = 0; i < master.size(); ++i) param_of_master[i] = bf16_from_bits(f32_to_bf16_bits(master[i]));
      test::expect_bitwise_equal(param, param_of_master, "param = BF16(master)");
      EXPECT_TRUE(dev[k]->guards_intact());
      // Continue from the GPU state, so that the next step compares one step's arithmetic again.
      host[k].master = master;
      host[k].m = m;
      host[k].v = v;
    }
  }
  EXPECT_TRUE(ws.guards_intact());
}

// A parameter tensor with BF16 moments on the device: master, grad, param shifted by `shift` elements, m and v by
// `moment_shift` (from a 128-byte aligned start).
struct DeviceParamBf16Moments {
  Guarded<float> master, grad;
  Guarded<bf16> param, m, v;
  DeviceParamBf16Moments(int64_t n, size_t shift, size_t moment_shift)
      : master(n, shift), grad(n, shift), param(n, shift), m(n, moment_shift), v(n, moment_shift) {}
  AdamWTensorBf16Moments view() {
    return {master.ptr(), param.ptr(), grad.ptr(), m.ptr(), v.ptr(), static_cast<int64_t>(master.n)};
  }
  bool guards_intact() {
    return master.guards_intact() && grad.guards_intact() && m.guards_intact() && v.guards_intact() &&
           param.guards_intact();
  }
};

struct HostParamBf16Moments {
  std::vector<float> master, grad;
  std::vector<bf16> m, v, param;
  AdamWTensorBf16Moments view() {
    return {master.data(), param.data(), grad.data(), m.data(), v.data(), static_cast<int64_t>(master.size())};
  }
};

std::vector<float> widened(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_bits_to_f32(bf16_bits(x[i]));
  return out;
}

std::vector<bf16> rounded(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_from_bits(f32_to_bf16_bits(x[i]));
  return out;
}

// Each gpu[i] equals ref[i], or lies between the BF16 roundings of exact[i] -+ tol(i) (a rounding boundary within
// the FP32 tolerance of the double moment exact[i]); reports the count of each.
void expect_bf16_moment(const std::vector<bf16>& gpu, const std::vector<bf16>& ref, const std::vector<double>& exact,
                        const std::function<double(size_t)>& tol, const std::string& what) {
  size_t bad = 0, at_boundary = 0;
  std::ostringstream first;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (bf16_bits(gpu[i]) == bf16_bits(ref[i])) continue;
    const double g = test::value_of(gpu[i]);
    const double lo = test::value_of(bf16_from_bits(f32_to_bf16_bits(static_cast<float>(exact[i] - tol(i)))));
    const double hi = test::value_of(bf16_from_bits(f32_to_bf16_bits(static_cast<float>(exact[i] + tol(i)))));
    if (lo <= g && g <= hi) {
      ++at_boundary;
      continue;
    }
    if (bad++ < 5)
      first << "\n  [" << i << "] gpu " << g << " ref " << test::value_of(ref[i]) << " exact " << exact[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " elements differ" << first.str();
  EXPECT_LE(at_boundary, gpu.size() / 1000 + 2) << what << ": BF16 rounding boundaries are rare";
}

TEST(NnAdamW, Bf16MomentsStepsMatchReferenceAndTheFp32MomentKernel) {
  FP4MOE_REQUIRE_DEVICE();
  struct Case {
    int64_t n;
    size_t shift, moment_shift;
  };
  // Vector path: the first six (the sixth with its moments 8-byte but not 16-byte aligned); scalar path: the last
  // two (pointers one or two elements off their vector alignment; the moments 4-byte aligned only). Case 4 has the larger gradients.
  const Case cases[] = {{1, 0, 0},          {7, 0, 0},    {4099, 0, 0}, {TinyShapes::hidden * TinyShapes::ffn, 0, 0},
                        {7168 * 257, 0, 0}, {4099, 0, 4}, {13, 1, 1},   {7168 + 3, 0, 2}};
  const int count = static_cast<int>(std::size(cases));
  std::vector<HostParamBf16Moments> host(static_cast<size_t>(count));
  std::vector<std::unique_ptr<DeviceParamBf16Moments>> dev;
  std::vector<std::unique_ptr<DeviceParam>> twin;  // the FP32-moment kernel on the same values
  for (int k = 0; k < count; ++k) {
    const int64_t n = cases[k].n;
    HostParamBf16Moments& h = host[k];
    h.master = test::random_f32(n, 1300 + k, 0.0, 0.02);
    h.m = test::random_bf16(n, 1400 + k, 0.0, 1e-3);
    const std::vector<float> r = test::random_f32(n, 1500 + k, 0.0, 1e-6);
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) {  // v >= m^2, as in a real run
      const float m = bf16_bits_to_f32(bf16_bits(h.m[i]));
      v[i] = m * m + std::fabs(r[i]);
    }
    h.v = rounded(v);
    h.param.assign(n, bf16_from_bits(0));
    dev.push_back(std::make_unique<DeviceParamBf16Moments>(n, cases[k].shift, cases[k].moment_shift));
    dev[k]->master.upload(h.master);
    dev[k]->m.upload(h.m);
    dev[k]->v.upload(h.v);
    twin.push_back(std::make_unique<DeviceParam>(n, 0));
  }
  Guarded<float> scale_d(1);
  AdamWConfig cfg;
  for (int64_t step = 9; step <= 11; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    cfg.step = step;
    cfg.lr = 2e-4f * static_cast<float>(step - 7);
    const float scale = 0.8125f;  // a clip scale, on the device
    scale_d.upload({scale});
    for (int k = 0; k < count; ++k) {
      host[k].grad = test::random_f32(cases[k].n, 1600 + 10 * step + k, 0.0, k == 4 ? 1e-2 : 1e-3);
      dev[k]->grad.upload(host[k].grad);
      dev[k]->param.poison();
      twin[k]->master.upload(host[k].master);
      twin[k]->m.upload(widened(host[k].m));
      twin[k]->v.upload(widened(host[k].v));
      twin[k]->grad.upload(host[k].grad);
      twin[k]->param.poison();
    }
    for (int k = 0; k < count; ++k) {
      adamw_step(dev[k]->view(), cfg, scale_d.ptr(), nullptr);
      adamw_step(twin[k]->view(), cfg, scale_d.ptr(), nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const double b1 = cfg.beta1, b2 = cfg.beta2;
    for (int k = 0; k < count; ++k) {
      SCOPED_TRACE("case " + std::to_string(k) + " n=" + std::to_string(cases[k].n));
      HostParamBf16Moments& h = host[k];
      const std::vector<float> master = dev[k]->master.download();
      const std::vector<bf16> param_of = dev[k]->param.download(), m = dev[k]->m.download(), v = dev[k]->v.download();
      // The FP32-moment kernel on the same values.
      test::expect_bitwise_equal(master, twin[k]->master.download(), "master = the FP32-moment kernel's");
      test::expect_bitwise_equal(param_of, twin[k]->param.download(), "param = the FP32-moment kernel's");
      test::expect_bitwise_equal(m, rounded(twin[k]->m.download()), "m = BF16(the FP32-moment kernel's m)");
      test::expect_bitwise_equal(v, rounded(twin[k]->v.download()), "v = BF16(the FP32-moment kernel's v)");
      test::expect_bitwise_equal(param_of, rounded(master), "param = BF16(master)");
      // The CPU reference, with the double moments it rounds.
      std::vector<double> m_exact(h.m.size()), v_exact(h.v.size()), gs(h.m.size());
      for (size_t i = 0; i < gs.size(); ++i) {
        gs[i] = static_cast<double>(h.grad[i]) * scale;
        m_exact[i] = b1 * test::value_of(h.m[i]) + (1.0 - b1) * gs[i];
        v_exact[i] = b2 * test::value_of(h.v[i]) + (1.0 - b2) * gs[i] * gs[i];
      }
      adamw_step_ref(h.view(), cfg, scale);
      test::expect_close(master, h.master, std::ldexp(1.0, -22), [&](size_t) { return 1e-5 * cfg.lr; }, "master");
      expect_bf16_moment(m, h.m, m_exact, [&](size_t i) { return 1e-6 * (std::fabs(m_exact[i]) + std::fabs(gs[i])); },
                         "m");
      expect_bf16_moment(v, h.v, v_exact, [&](size_t i) { return 1e-6 * (v_exact[i] + gs[i] * gs[i]); }, "v");
      EXPECT_TRUE(dev[k]->guards_intact());
      EXPECT_TRUE(twin[k]->guards_intact());
      // Continue from the GPU state, so that the next step compares one step's arithmetic again.
      h.master = master;
      h.m = m;
      h.v = v;
    }
  }
}

TEST(NnAdamW, GlobalNormCases) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t sizes[] = {1, 0, 7, 4099, 7168 * 2048, 5, 1 << 20};
  const size_t shifts[] = {0, 0, 1, 0, 0, 1, 0};
  std::vector<std::unique_ptr<Guarded<float>>> bufs;
  std::vector<std::vector<float>> values;
  std::vector<GradTensor> dev, host;
  for (int k = 0; k < 7; ++k) {
    values.push_back(test::random_f32(sizes[k], 1200 + k, 0.0, k == 6 ? 100.0 : 1e-2));
    bufs.push_back(std::make_unique<Guarded<float>>(sizes[k], shifts[k]));
    bufs[k]->upload(values[k]);
    dev.push_back({bufs[k]->ptr(), sizes[k]});
    host.push_back({values[k].data(), sizes[k]});
  }
  Guarded<double> ws(kGradNormSlots);
  Guarded<float> norm_d(1), scale_d(1);
  auto run = [&](int count, float max_norm) {
    norm_d.poison();
    scale_d.poison();
    grad_global_norm(dev.data(), count, max_norm, ws.ptr(), norm_d.ptr(), scale_d.ptr(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return std::make_pair(norm_d.download()[0], scale_d.download()[0]);
  };
  for (int count : {1, 2, 4, 6, 7}) {
    SCOPED_TRACE("tensors " + std::to_string(count));
    const double ref = grad_global_norm_ref(host.data(), count);
    for (float max_norm : {1.0f, 1e6f, std::numeric_limits<float>::infinity()}) {
      const auto [norm, scale] = run(count, max_norm);
      EXPECT_NEAR(norm, ref, 1e-9 * ref + std::ldexp(ref, -24));
      EXPECT_NEAR(scale, grad_clip_scale(ref, max_norm), std::ldexp(1.0, -22));
      const auto again = run(count, max_norm);
      EXPECT_EQ(f32_bits(again.first), f32_bits(norm)) << "deterministic";
    }
  }
  const auto [zero_norm, one_scale] = run(0, 1.0f);
  EXPECT_EQ(zero_norm, 0.0f);
  EXPECT_EQ(one_scale, 1.0f);
  // A NaN gradient: NaN norm and NaN scale (the trainer skips the step).
  values[3][4000] = std::numeric_limits<float>::quiet_NaN();
  bufs[3]->upload(values[3]);
  const auto [nan_norm, nan_scale] = run(7, 1.0f);
  EXPECT_TRUE(std::isnan(nan_norm));
  EXPECT_TRUE(std::isnan(nan_scale));
  // Null clip_scale_out: only the norm.
  grad_global_norm(dev.data(), 2, 1.0f, ws.ptr(), norm_d.ptr(), nullptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_NEAR(norm_d.download()[0], grad_global_norm_ref(host.data(), 2), 1e-6 * grad_global_norm_ref(host.data(), 2));
  for (auto& b : bufs) EXPECT_TRUE(b->guards_intact());
}

}  // namespace
}  // namespace fp4moe
