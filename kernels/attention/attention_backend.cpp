// The attention core's backends (attention_backend.h): names, and the choice at one shape from what is known of
// cuDNN there. The timing is in attention_timing.cpp, the per-shape resolution for a model in attention_core.cpp.
#include "kernels/attention/attention_backend.h"

#include <fmt/format.h>

#include "kernels/common/check.h"

namespace fp4moe {

const char* attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::own: return "own";
    case AttentionBackend::cudnn: return "cudnn";
    case AttentionBackend::automatic: return "auto";
  }
  return "?";
}

AttentionBackend parse_attention_backend(const std::string& text, const char* option) {
  for (AttentionBackend b : {AttentionBackend::own, AttentionBackend::cudnn, AttentionBackend::automatic})
    if (text == attention_backend_name(b)) return b;
  FP4MOE_CHECK(false, "{} = '{}': expected own (our flash attention kernels), cudnn (cuDNN's fused attention) or auto "
               "(the faster of the two, timed at the run's shape)", option, text);
  return AttentionBackend::own;
}

std::string attention_shape_text(const AttentionShape& s) {
  return fmt::format("B={} T={} H={} {}/{}", s.B, s.T, s.H, s.Dqk, s.Dv);
}

AttentionBackend choose_attention_backend(AttentionBackend choice, const AttentionShape& s, bool deterministic,
                                          const CudnnAtShape& cudnn, std::string* note) {
  auto say = [&](const std::string& line) {
    if (note) *note = line;
  };
  const std::string shape = attention_shape_text(s);
  if (choice == AttentionBackend::own) {
    say("attention backend: own (flash_attention kernels, deterministic)");
    return AttentionBackend::own;
  }
  if (!cudnn.refusal.empty()) {
    FP4MOE_CHECK(choice == AttentionBackend::automatic, "attention backend cudnn cannot run the attention at {}: {}",
                 shape, cudnn.refusal);
    say(fmt::format("attention backend: own (auto: cuDNN cannot run the attention at {}: {})", shape, cudnn.refusal));
    return AttentionBackend::own;
  }
  const std::string cudnn_text = fmt::format("{}; {} backward", cudnn_sdpa_version_text(),
                                             deterministic ? "deterministic" : "non-deterministic");
  if (choice == AttentionBackend::cudnn) {
    say(fmt::format("attention backend: cudnn ({}) at {}", cudnn_text, shape));
    return AttentionBackend::cudnn;
  }
  if (!cudnn.times) {
    say(fmt::format("attention backend: cudnn (auto, untimed: {}; cuDNN preferred; {}) at {}", cudnn.untimed,
                    cudnn_text, shape));
    return AttentionBackend::cudnn;
  }
  const AttentionTimes& t = *cudnn.times;
  const AttentionBackend faster = t.cudnn_ms < t.own_ms ? AttentionBackend::cudnn : AttentionBackend::own;
  say(fmt::format("attention backend: {} (auto, forward + backward at {}: own {:.4g} ms, cudnn {:.4g} ms; cudnn: {})",
                  attention_backend_name(faster), shape, t.own_ms, t.cudnn_ms, cudnn_text));
  return faster;
}

}  // namespace fp4moe
