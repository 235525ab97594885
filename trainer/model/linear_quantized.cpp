#include "trainer/model/linear_quantized.h"

#include <utility>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/linear.h"

namespace fp4moe {

MemCategory linear_buffer_category(GroupLinearBuffer kind) {
  switch (kind) {
    case GroupLinearBuffer::weight_copy: return MemCategory::weights;
    case GroupLinearBuffer::held_activation: return MemCategory::activations;
    case GroupLinearBuffer::scratch: return MemCategory::workspace;
  }
  FP4MOE_CHECK(false, "linear_buffer_category: unknown buffer kind {}", static_cast<int>(kind));
  return MemCategory::workspace;
}

GroupLinearAllocator counted_allocator(DeviceMemory& mem, const std::string& owner) {
  DeviceMemory* m = &mem;
  return GroupLinearAllocator{
      [m, owner](size_t bytes, GroupLinearBuffer kind) {
        return m->allocate(bytes, linear_buffer_category(kind), owner + " " + group_linear_buffer_name(kind));
      },
      [m](void* p) { m->release(p); }, &mem.slots()};
}

LinearQuantized::LinearQuantized(std::string name, int64_t K, int64_t N, const Recipe& recipe)
    : name_(std::move(name)), K_(K), N_(N), recipe_(recipe) {
  GroupLinear::check_shape(1, N, K, recipe);
  FP4MOE_CHECK(recipe != Recipe::bf16, "Linear {}: the bf16 recipe does not go through Group Linear", name_);
}

void LinearQuantized::bind(const ModelContext& ctx, const char* what) {
  FP4MOE_CHECK(ctx.mem != nullptr,
               "Linear {} {}: the {} recipe takes its buffers from ctx.mem (the model's DeviceMemory), which is null",
               name_, what, recipe_name(recipe_));
  if (mem_ == nullptr) {  // the model's one cuBLASLt workspace (ctx.lt), not one per layer
    gl_.emplace(1, N_, K_, recipe_, ctx.lt, counted_allocator(*ctx.mem, name_));
    offsets_ = Linear::buffers(recipe_, 0, N_, K_, false).allocate<int32_t>(*ctx.mem, "token offsets", name_);
    last_M_ = KeptValue<int64_t>(ctx.mem->slots(), -1);
    mem_ = ctx.mem;
    lt_ = ctx.lt;
  }
  FP4MOE_CHECK(ctx.mem == mem_,
               "Linear {} {}: ctx.mem is not the DeviceMemory of the layer's first forward, which holds its buffers",
               name_, what);
  FP4MOE_CHECK(ctx.lt == lt_,
               "Linear {} {}: ctx.lt is not the cuBLASLt object of the layer's first forward, which its Group Linear "
               "uses",
               name_, what);
}

// The split of one group, {0, M}: the host copy for Group Linear's checks and loops, the device copy for the
// column quantizers. The device copy is rewritten only when M changes (pageable memory: the call returns once the
// 8 bytes are staged, so the host array may change afterwards), and each rewrite is counted in
// ctx.device_state_writes.
void LinearQuantized::set_tokens(ModelContext& ctx, int64_t M) {
  FP4MOE_CHECK(M >= 1 && M < (int64_t{1} << 31), "Linear {}: M must be in [1, 2^31), got {}", name_, M);
  host_offsets_[0] = 0;
  host_offsets_[1] = static_cast<int32_t>(M);
  if (device_M_ == M) return;
  CUDA_CHECK(cudaMemcpyAsync(offsets_.data(), host_offsets_, sizeof(host_offsets_), cudaMemcpyHostToDevice,
                             ctx.stream));
  device_M_ = M;
  ++ctx.device_state_writes;
}

void LinearQuantized::forward(ModelContext& ctx, const bf16* w, const bf16* x, int64_t M, bf16* y) {
  bind(ctx, "forward");
  last_M_.get() = -1;  // until this forward has been queued: a backward after a failed forward is rejected
  set_tokens(ctx, M);
  gl_->set_quant_seed(layer_quant_seed(ctx.quant_seed, name_));  // this step's, this layer's
  gl_->set_weights(w, ctx.stream);  // the weight copies (the parameters changed since the last step)
  GroupLinearInput in{x, nullptr, nullptr};
  if (recipe_.mxfp4_input) {
    if (M > mx_rows_) {  // free first: the old and new copies are never held together
      mx_codes_.reset();
      mx_scales_.reset();
      mx_rows_ = 0;
      const BufferPlan plan = Linear::buffers(recipe_, M, N_, K_, false);
      mx_codes_ = plan.allocate_kept<uint8_t>(*mem_, "X MXFP4 codes", name_);  // every slot's copy
      mx_scales_ = plan.allocate_kept<uint8_t>(*mem_, "X MXFP4 scales", name_);
      mx_rows_ = M;
    }
    bf16_to_mxfp4_row(x, M, K_, mx_codes_.data(), mx_scales_.data(), MxQuantConfig{}, nullptr, ctx.stream);
    in = GroupLinearInput{nullptr, mx_codes_.data(), mx_scales_.data()};
  }
  gl_->forward(in, split(), y, ctx.stream);
  last_M_.get() = M;
}

void LinearQuantized::backward(ModelContext& ctx, const bf16* dy, int64_t M, const LinearGradOut& dx, float* dw) {
  bind(ctx, "backward");
  FP4MOE_CHECK(last_M_.get() >= 1,
               "Linear {} backward: no forward to differentiate (the {} recipe reads its own copy of the forward's X)",
               name_, recipe_name(recipe_));
  FP4MOE_CHECK(M == last_M_.get(),
               "Linear {} backward: M={} is not the last forward's M={} (backward differentiates the layer's last "
               "forward in the active slot)",
               name_, M, last_M_.get());
  set_tokens(ctx, M);  // the split of this slot's forward (another slot's forward may have changed it)
  bf16* dx16 = static_cast<bf16*>(dx.data);
  if (dx.data && dx.fp32) {
    if (M > dx_rows_) {
      dx16_.reset();
      dx_rows_ = 0;
      dx16_ = Linear::buffers(recipe_, M, N_, K_, true).allocate<bf16>(*mem_, "BF16 Dgrad before FP32", name_);
      dx_rows_ = M;
    }
    dx16 = dx16_.data();
  }
  const GroupLinearInput x = recipe_.mxfp4_input ? GroupLinearInput{nullptr, mx_codes_.data(), mx_scales_.data()}
                                                 : GroupLinearInput{};  // fp8: Group Linear's own column copy
  gl_->backward(x, dy, split(), dx16, dw, ctx.stream);  // dx16 [M, K] BF16 (or none), dw += dY^T X
  if (dx.data && dx.fp32) {
    auto* out = static_cast<float*>(dx.data);
    if (dx.accumulate) add_bf16_into_f32(dx16, M * K_, out, ctx.stream);  // dx += dX
    else cast_bf16_to_f32(dx16, M * K_, out, ctx.stream);                // dx = dX
  }
}

}  // namespace fp4moe
