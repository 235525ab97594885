// The attention core's backends (attention_backend.h): names and the resolution of `auto`.
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
               "(cudnn where built and supported, else own)", option, text);
  return AttentionBackend::own;
}

AttentionBackend resolve_attention_backend(AttentionBackend choice, CudnnSdpa* sdpa, const AttentionShape& s,
                                           const SdpaLayout& layout, bool deterministic, std::string* note) {
  auto say = [&](const std::string& line) {
    if (note) *note = line;
  };
  const std::string shape = fmt::format("B={} T={} H={} {}/{}", s.B, s.T, s.H, s.Dqk, s.Dv);
  if (choice == AttentionBackend::own) {
    say("attention backend: own (flash_attention kernels, deterministic)");
    return AttentionBackend::own;
  }
  std::string why = sdpa ? std::string() : cudnn_sdpa_version_text();
  if (sdpa && sdpa->supports(s, layout, deterministic, &why)) {
    say(fmt::format("attention backend: cudnn ({}; {} backward) at {}{}", cudnn_sdpa_version_text(),
                    deterministic ? "deterministic" : "non-deterministic", shape,
                    choice == AttentionBackend::automatic ? ", chosen by auto" : ""));
    return AttentionBackend::cudnn;
  }
  FP4MOE_CHECK(choice == AttentionBackend::automatic, "attention backend cudnn cannot run the attention at {}: {}",
               shape, why);
  say(fmt::format("attention backend: own (auto: cuDNN cannot run the attention at {}: {})", shape, why));
  return AttentionBackend::own;
}

}  // namespace fp4moe
