// Which implementation runs the attention core (the causal forward and backward of flash_attention.h's contract):
// our kernels (flash_attention.h) or cuDNN's fused flash attention (cudnn_sdpa.h). The trainer's option
// model.attention_backend (trainer/config.h) names it; AttentionCore (attention_core.h) resolves it for a model.
//
//   own    our kernels everywhere: deterministic, the reference, the default.
//   cudnn  cuDNN everywhere; an error (fp4moe::Error naming the shape and cuDNN's reason) where it cannot run:
//          not built, its library unusable (no device, older than 9.0, not matching the driver), no plan for the
//          shape and layout, or a plan asking more workspace than was allocated.
//   auto   chosen by measurement at the run's shape (micro_batch x seq_len tokens): where both backends can run
//          it, forward + backward of each is timed on the device (time_attention_backends) and the faster kept;
//          where cuDNN cannot, own. Other row counts (an evaluation with fewer sequences) follow that choice where
//          cuDNN can run them and fall back to own where it cannot. If the timing buffers cannot be allocated,
//          cuDNN is kept untimed and the note says why.
// cuDNN's backward is deterministic or not as model.attention_deterministic says, also while timing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/attention/cudnn_sdpa.h"

namespace fp4moe {

enum class AttentionBackend {
  own,        // flash_attention.h: our kernels, always deterministic; the default
  cudnn,      // cudnn_sdpa.h: required
  automatic,  // "auto": the faster of the two where both run (above)
};

// "own", "cudnn", "auto".
const char* attention_backend_name(AttentionBackend b);
// The backend named `text` (as attention_backend_name writes it). Rejects (fp4moe::Error naming `option` and the
// three names) anything else.
AttentionBackend parse_attention_backend(const std::string& text, const char* option);

// "B=1 T=4096 H=128 192/128" (Dqk/Dv): a shape as notes and errors name it.
std::string attention_shape_text(const AttentionShape& s);

// Milliseconds of one forward + backward call of each backend at one shape (time_attention_backends).
struct AttentionTimes {
  double own_ms = 0;
  double cudnn_ms = 0;
};

// What is known of cuDNN at one shape, the input of choose_attention_backend.
struct CudnnAtShape {
  std::string refusal;                  // why cuDNN cannot run the shape (empty: it can)
  std::optional<AttentionTimes> times;  // both backends timed (auto, where cuDNN can run the shape)
  std::string untimed;                  // why they were not timed, when times is empty
};

// The backend `choice` comes to at shape `s` (own or cudnn, never automatic), from what is known of cuDNN there:
//   own   -> own;
//   cudnn -> cudnn; fp4moe::Error "attention backend cudnn cannot run the attention at <shape>: <refusal>" when
//            cudnn.refusal is set;
//   auto  -> own when cudnn.refusal is set; else with times the faster (own at a tie: the reference), without
//            them cudnn.
// `note` (if given) receives one line saying what was chosen and why: for auto both times in ms, or why untimed.
// Host only: no device is touched.
AttentionBackend choose_attention_backend(AttentionBackend choice, const AttentionShape& s, bool deterministic,
                                          const CudnnAtShape& cudnn, std::string* note);

// Times one forward + backward of our kernels and of `sdpa` (backward with `deterministic`) at shape `s` with the
// strides of `layout`, asynchronously on `stream` then synchronised: 3 untimed calls, then 10 between two CUDA
// events; the mean per call in ms. Inputs are zeros (the time of either backend does not depend on the values).
// The buffers (q, k, v, o, dout, dq, dk, dv spanning their strides, lse, our backward workspace, cuDNN's workspace)
// are cudaMalloc'd for the call, outside any DeviceMemory, and freed before it returns. When they would take more
// than `max_bytes` bytes together, or a cudaMalloc fails, nothing is timed: returns nullopt and `why` (if given)
// says which. `sdpa` must have both plans (CudnnSdpa::supports): a refusal here throws fp4moe::Error, as do the
// launches' own rejections and CUDA errors.
std::optional<AttentionTimes> time_attention_backends(CudnnSdpa& sdpa, const AttentionShape& s,
                                                      const SdpaLayout& layout, bool deterministic, int64_t max_bytes,
                                                      cudaStream_t stream, std::string* why);

}  // namespace fp4moe
