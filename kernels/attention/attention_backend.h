// Which implementation runs the attention core (the causal forward and backward of flash_attention.h's contract):
// our kernels (flash_attention.h) or cuDNN's fused flash attention (cudnn_sdpa.h). The trainer's option
// model.attention_backend (trainer/config.h) names it; the model resolves it once, at construction.
#pragma once

#include <string>

#include "kernels/attention/cudnn_sdpa.h"

namespace fp4moe {

enum class AttentionBackend {
  own,        // flash_attention.h: our kernels, always deterministic; the default
  cudnn,      // cudnn_sdpa.h: required (an error where cuDNN is not built or has no plan for the shape)
  automatic,  // "auto": cudnn where this build has cuDNN and cuDNN has plans for the shape and layout, else own
};

// "own", "cudnn", "auto".
const char* attention_backend_name(AttentionBackend b);
// The backend named `text` (as attention_backend_name writes it). Rejects (fp4moe::Error naming `option` and the
// three names) anything else.
AttentionBackend parse_attention_backend(const std::string& text, const char* option);

// The backend `choice` comes to for this shape and layout (own or cudnn, never automatic):
//   own   -> own;
//   cudnn -> cudnn, or fp4moe::Error when this build has no cuDNN or `sdpa` has no plan (cuDNN's reason);
//   auto  -> cudnn when `sdpa` is given and has both plans (forward; backward with `deterministic`), else own.
// `sdpa` may be null (not built, or not wanted); `note` (if given) receives one line saying what was chosen and why.
AttentionBackend resolve_attention_backend(AttentionBackend choice, CudnnSdpa* sdpa, const AttentionShape& s,
                                           const SdpaLayout& layout, bool deterministic, std::string* note);

}  // namespace fp4moe
