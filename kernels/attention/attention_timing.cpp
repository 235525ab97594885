// time_attention_backends (attention_backend.h): forward + backward of our kernels and of cuDNN at one shape, on
// temporary device buffers, timed with CUDA events.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "kernels/attention/attention_backend.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"

namespace fp4moe {

namespace {

constexpr int kWarmupCalls = 3, kTimedCalls = 10;
constexpr double kMiB = 1048576.0;

// Elements a [B*T, H, D] tensor with strides `st` spans from its first element.
int64_t span_elements(const AttentionShape& s, AttnStrides st, int64_t D) {
  return (s.B * s.T - 1) * st.token_stride + (s.H - 1) * st.head_stride + D;
}

// Device buffers cudaMalloc'd for one timing, freed together.
struct TimingBuffers {
  std::vector<void*> held;
  TimingBuffers() = default;
  TimingBuffers(const TimingBuffers&) = delete;
  TimingBuffers& operator=(const TimingBuffers&) = delete;
  ~TimingBuffers() {
    for (void* p : held) cudaFree(p);
  }
};

// Two CUDA events, destroyed together.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

// Mean ms per call of `run` on `stream`: warm-up calls, then timed calls between the two events.
template <typename Run>
double mean_ms(const Run& run, const EventPair& ev, cudaStream_t stream) {
  for (int i = 0; i < kWarmupCalls; ++i) run();
  CUDA_CHECK(cudaEventRecord(ev.start, stream));
  for (int i = 0; i < kTimedCalls; ++i) run();
  CUDA_CHECK(cudaEventRecord(ev.stop, stream));
  CUDA_CHECK(cudaEventSynchronize(ev.stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
  return static_cast<double>(ms) / kTimedCalls;
}

}  // namespace

std::optional<AttentionTimes> time_attention_backends(CudnnSdpa& sdpa, const AttentionShape& s,
                                                      const SdpaLayout& layout, bool deterministic, int64_t max_bytes,
                                                      cudaStream_t stream, std::string* why) {
  FP4MOE_CHECK(s.B >= 1 && s.T >= 1 && s.H >= 1, "time_attention_backends: expected a non-empty shape, got {}",
               attention_shape_text(s));
  const int64_t cudnn_ws = std::max(sdpa.forward_workspace_bytes(s, layout),
                                    sdpa.backward_workspace_bytes(s, layout, deterministic));
  const int64_t bf16_bytes = int64_t{sizeof(bf16)};
  enum Part { q, k, v, o, dout, dq, dk, dv, lse, own_ws, cudnn_ws_part, parts };
  const int64_t bytes[parts] = {span_elements(s, layout.q, s.Dqk) * bf16_bytes,
                                span_elements(s, layout.k, s.Dqk) * bf16_bytes,
                                span_elements(s, layout.v, s.Dv) * bf16_bytes,
                                span_elements(s, layout.o, s.Dv) * bf16_bytes,
                                span_elements(s, layout.dout, s.Dv) * bf16_bytes,
                                span_elements(s, layout.dq, s.Dqk) * bf16_bytes,
                                span_elements(s, layout.dk, s.Dqk) * bf16_bytes,
                                span_elements(s, layout.dv, s.Dv) * bf16_bytes,
                                s.B * s.H * s.T * int64_t{sizeof(float)},
                                flash_attention_backward_workspace_bytes(s),
                                cudnn_ws};
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  auto untimed = [&](const std::string& reason) -> std::optional<AttentionTimes> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (total > max_bytes)
    return untimed(fmt::format("its {:.1f} MiB of buffers exceed the {:.1f} MiB allowed", total / kMiB,
                               max_bytes / kMiB));
  TimingBuffers buf;
  void* ptr[parts] = {};
  for (int i = 0; i < parts; ++i) {
    if (bytes[i] == 0) continue;
    const cudaError_t err = cudaMalloc(&ptr[i], static_cast<size_t>(bytes[i]));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clears the failed allocation's error
      return untimed(fmt::format("cudaMalloc of {:.1f} MiB (of {:.1f} MiB of buffers) failed: {}", bytes[i] / kMiB,
                                 total / kMiB, cudaGetErrorString(err)));
    }
    buf.held.push_back(ptr[i]);
    CUDA_CHECK(cudaMemsetAsync(ptr[i], 0, static_cast<size_t>(bytes[i]), stream));
  }
  auto in = [&](Part p, AttnStrides st) { return attn_in(static_cast<const bf16*>(ptr[p]), st); };
  auto out = [&](Part p, AttnStrides st) { return attn_out(static_cast<bf16*>(ptr[p]), st); };
  float* lse_ptr = static_cast<float*>(ptr[lse]);
  const auto own = [&] {
    flash_attention_forward(s, in(q, layout.q), in(k, layout.k), in(v, layout.v), out(o, layout.o), lse_ptr, stream);
    flash_attention_backward(s, in(q, layout.q), in(k, layout.k), in(v, layout.v), in(o, layout.o),
                             in(dout, layout.dout), lse_ptr, out(dq, layout.dq), out(dk, layout.dk),
                             out(dv, layout.dv), ptr[own_ws], stream);
  };
  const auto cudnn = [&] {
    sdpa.forward(s, in(q, layout.q), in(k, layout.k), in(v, layout.v), out(o, layout.o), lse_ptr, ptr[cudnn_ws_part],
                 cudnn_ws, stream);
    sdpa.backward(s, in(q, layout.q), in(k, layout.k), in(v, layout.v), in(o, layout.o), in(dout, layout.dout),
                  lse_ptr, out(dq, layout.dq), out(dk, layout.dk), out(dv, layout.dv), deterministic,
                  ptr[cudnn_ws_part], cudnn_ws, stream);
  };
  const EventPair events;
  AttentionTimes t;
  t.own_ms = mean_ms(own, events, stream);
  t.cudnn_ms = mean_ms(cudnn, events, stream);
  return t;
}

}  // namespace fp4moe
