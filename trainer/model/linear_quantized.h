// The fp8 and mxfp4 recipes of Linear (linear.h, DESIGN.md "Recipes"): Group Linear with one group
// (trainer/model/group_linear.h) whose buffers come from the model's DeviceMemory, the MXFP4 copy of X that the
// mxfp4 recipe keeps instead of X, and the FP32 Dgrad through a BF16 scratch. Used by Linear only; linear.h
// documents the behaviour and the memory. In-flight micro-batches (trainer/memory/device_memory.h): the MXFP4 copy
// of X, the Group Linear's FP8 column copy and the token count have one copy per slot of ctx.mem; the device
// offsets {0, M} (workspace) are rewritten by a backward whose M is not the last forward's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/context.h"
#include "trainer/model/group_linear.h"

namespace fp4moe {

struct LinearGradOut;  // linear.h

// The DeviceMemory category a Group Linear buffer is counted under (linear.h): weight copies under weights, the
// held FP8 column copy under activations, scratch under workspace.
MemCategory linear_buffer_category(GroupLinearBuffer kind);
// A Group Linear allocator over `mem`: each buffer counted under linear_buffer_category(kind) and named
// "<owner> <group_linear_buffer_name(kind)>", the held activations once per slot of mem.slots(). `mem` must outlive
// the Group Linear.
GroupLinearAllocator counted_allocator(DeviceMemory& mem, const std::string& owner);

class LinearQuantized {
 public:
  // name: the weight's (messages, buffer names). K = in_features, N = out_features, already checked by Linear;
  // recipe fp8 or mxfp4. Allocates nothing: the Group Linear is built at the first forward, with ctx.lt and ctx.mem.
  LinearQuantized(std::string name, int64_t K, int64_t N, const Recipe& recipe);

  // w [N, K] BF16 parameters, x [M, K] BF16, y [M, N] BF16, M >= 1 (Linear handles M = 0 and null checks).
  // Quantizes W and W^T (FP8 128x128), X (mxfp4: to MXFP4, kept), then Fprop; the fp8 recipe keeps X's FP8
  // column copy. Binds the layer to ctx.mem and ctx.lt at the first call.
  void forward(ModelContext& ctx, const bf16* w, const bf16* x, int64_t M, bf16* y);
  // dy [M, N] BF16 with M the last forward's; dx as LinearGradOut (null data: no Dgrad); dw [N, K] FP32 += dW.
  void backward(ModelContext& ctx, const bf16* dy, int64_t M, const LinearGradOut& dx, float* dw);

 private:
  void bind(const ModelContext& ctx, const char* what);
  void set_tokens(ModelContext& ctx, int64_t M);
  GroupSplit split() const { return GroupSplit{offsets_.data(), host_offsets_, 1}; }

  std::string name_;
  int64_t K_, N_;
  Recipe recipe_;
  DeviceMemory* mem_ = nullptr;   // bound at the first forward
  CublasLtMatmul* lt_ = nullptr;  // bound at the first forward (null: Group Linear's own)
  std::optional<GroupLinear> gl_;  // G = 1, N, K, built at the first forward
  DeviceArray<int32_t> offsets_;  // [2] {0, M} on the device                                 (workspace)
  int32_t host_offsets_[2] = {0, 0};
  int64_t device_M_ = -1;         // the M that offsets_ holds (its copy is queued on the stream)
  KeptArray<uint8_t> mx_codes_;     // mxfp4: [mx_rows_, K/2] E2M1 codes of X, per slot        (activations)
  KeptArray<uint8_t> mx_scales_;    // mxfp4: [mx_rows_, K/32] UE8M0 scales of X, per slot     (activations)
  int64_t mx_rows_ = 0;
  DeviceArray<bf16> dx16_;        // [dx_rows_, K] BF16 Dgrad before an FP32 output            (workspace)
  int64_t dx_rows_ = 0;
  KeptValue<int64_t> last_M_;     // per slot (of ctx.mem, from the first forward): tokens of its forward (-1: none)
};

}  // namespace fp4moe
