// Group Linear: one linear layer of the routed MoE experts, Y_g = X_g W_g^T for G experts over ragged token
// groups, forward and backward, in the three preset recipes (trainer/model/recipe.h, DESIGN.md "Recipes"):
//
// | recipe | Fprop                               | Dgrad                    | Wgrad                               |
// | bf16   | BF16 X, W                           | BF16 dY, W               | BF16 dY, X (the caller's BF16 X)    |
// | fp8    | X -> FP8 1x128 row, W -> 128x128    | dY -> 1x128 row, W^T     | dY, X as FP8 columns (1x128 along   |
// |        | (bf16_to_fp8_row / _block128)       | (block128, transpose)    | tokens); the FP8 X column copy is   |
// |        |                                     |                          | made in forward and held            |
// | mxfp4  | X arrives as MXFP4 (dispatched in   | as fp8                   | X via MXFP4 -> FP8 column (direct), |
// |        | MXFP4) -> FP8 row (direct)          |                          | from the caller's MXFP4 X only      |
//
// (the paper: FP4 storage and communication with FP8 compute; DeepSeek-V3's fine-grained FP8 for the fp8 recipe).
// Paper 2's ladder (recipe.h): a GEMM class in mxfp4 quantizes both operands to MXFP4 along its reduction
// dimension and multiplies them on FP8 tensor cores (kernels/gemm/mxfp4_gemm.h), the other classes as fp8:
//   Fprop  X (bf16_to_mxfp4_row, RNE) and W (from the BF16 parameters at set_weights, RNE) along K; mxfp4_gemm
//          (G = 1), or over G > 1 ragged groups: X's MXFP4 rows converted to FP8 1x128 rows (mxfp4_row_to_fp8_row)
//          and each expert's MXFP4 W converted at set_weights to an FP8 1x128 row tensor, multiplied by
//          GroupedGemm::fprop_fp8_row_weights, VEC128 x VEC128 (the same product as mxfp4_gemm per group, any M_g).
//   Dgrad  dY along N (bf16_to_mxfp4_row, the recipe's rounding) and W^T: W [N, K] along N (bf16_to_mxfp4_col,
//          RNE, at set_weights); mxfp4_gemm, or over G > 1 groups the same conversion to FP8 1x128 rows of dY and
//          of each expert's W^T, and GroupedGemm::dgrad_fp8_row_weights.
//   Wgrad  X along tokens, ragged per expert (bf16_to_mxfp4_col_ragged, RNE, made in forward and held instead of
//          the FP8 column copy) and dY likewise in backward (the recipe's rounding); mxfp4_wgrad_grouped.
// The recipe's transform goes to both operands of each mxfp4 class. Seeds (set_quant_seed, once per step): the
// random Hadamard signs are splitmix64_at(seed, 0) for every operand of the step; stochastic rounding in the c-th
// backward call since the seed last changed (c = 0, 1, ...: one per micro-batch) draws from
// splitmix64_at(seed, 2c + 1) (Dgrad's dY) and splitmix64_at(seed, 2c + 2) (Wgrad's dY).
// MXFP4 Fprop and Dgrad of one group (G = 1) need M % 4 == 0 (cuBLASLt); over G > 1 groups any M_g.
// Weights stay BF16 parameters [G, N, K]; the weight gradient accumulates into an FP32 master gradient [G, N, K].
// All GEMMs go through GroupedGemm (kernels/gemm/grouped_gemm.h); shape rules are its own (N, K multiples of
// 16), plus K % 32 == 0 for the mxfp4 recipe (MX blocks of 32).
//
// Routing counts: forward and backward take the layer's GroupSplit, whose host copy of the offsets the caller
// fetched once for this layer and step (grouped_gemm.h); nothing here synchronises with the device.
// State: the layer is built with what it uses (the recipe, the cuBLASLt object, the allocator) and owns what it
// keeps: the FP8 copies of the weights, the fp8 recipe's FP8 column copy of X (from forward to backward; one per
// in-flight micro-batch when the allocator names slots, all grown together) and the scratch of one pass. It keeps no pointer to the caller's tensors: backward takes the forward's input again (the
// bf16 recipe's X, the mxfp4 recipe's MXFP4 X, which the caller keeps or rebuilds with the same values).
// Buffers grow on demand, from cudaMalloc or from the caller's allocator; freeing a buffer to grow it
// synchronises the device (cudaFree), the first time a larger batch arrives. Not thread-safe; one stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/gemm/grouped_gemm.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/recipe.h"

namespace fp4moe {

// What one of the layer's buffers holds, for an allocator that counts device memory by purpose:
//   weight_copy      FP8 W and W^T (fp8, mxfp4): written by set_weights, read until the next set_weights;
//   held_activation  the fp8 recipe's FP8 column copy of X: written by forward, read by backward
//                    (held_activation_bytes counts it);
//   scratch          FP8 row copies of X and dY, the dY columns, the mxfp4 recipe's X columns: dead between calls.
enum class GroupLinearBuffer { weight_copy, held_activation, scratch };
const char* group_linear_buffer_name(GroupLinearBuffer kind);

// Where the layer's buffers come from. allocate(bytes, kind) returns device memory of at least `bytes` bytes,
// 16-byte aligned, or throws; release(p) frees a pointer allocate returned. Both run on the host thread inside
// set_weights, forward, backward and the destructor (release must then not throw: what it throws there is
// dropped). The functions, and whatever they capture, must outlive the layer. Both empty: cudaMalloc/cudaFree
// (which count nowhere). slots: the in-flight micro-batches (trainer/memory/device_memory.h), read when the layer is
// built (how many) and at each forward and backward (which one): the held activation and the forward's token count
// exist once per slot; null: one.
struct GroupLinearAllocator {
  std::function<void*(size_t bytes, GroupLinearBuffer kind)> allocate;
  std::function<void(void*)> release;
  const ActivationSlots* slots = nullptr;
};

// The layer's input: BF16 [M, K] for the bf16 and fp8 recipes; MXFP4 row tensor for mxfp4 (layouts.h: codes
// [M, K/2], UE8M0 scales [M, K/32]), as bf16_to_mxfp4_row writes it before the dispatch (recipe.mxfp4_input).
struct GroupLinearInput {
  const bf16* x = nullptr;
  const uint8_t* mx_codes = nullptr;
  const uint8_t* mx_scales = nullptr;
};

class GroupLinear {
 public:
  // G experts, N outputs, K inputs, in `recipe`. lt: the cuBLASLt object of the caller's stream for the GEMMs
  // (not owned; it must outlive the layer: the model's one, ModelContext::lt), or null for one of the layer's own,
  // made at the first GEMM. allocator: where the buffers come from (both functions set, or both empty for
  // cudaMalloc). scale_mode: FP8 block scales (pow2 as TransformerEngine, or fp32).
  // Rejects (fp4moe::Error): what check_shape rejects, and an allocator with one function set and not the other.
  // Allocates nothing (buffers grow on the first set_weights and forward).
  GroupLinear(int64_t G, int64_t N, int64_t K, const Recipe& recipe, CublasLtMatmul* lt,
              GroupLinearAllocator allocator = {}, Fp8ScaleMode scale_mode = Fp8ScaleMode::pow2);
  ~GroupLinear();
  GroupLinear(const GroupLinear&) = delete;
  GroupLinear& operator=(const GroupLinear&) = delete;

  // Rejects (fp4moe::Error) a recipe that is not built (check_recipe_built, grouped when G > 1), G < 1, N or K
  // not a positive multiple of 16, K % 32 != 0 for a recipe that stores X as MXFP4 or runs Fprop in MXFP4, and
  // N % 32 != 0 for an MXFP4 Dgrad; for a layer's owner that checks before it builds the layer.
  static void check_shape(int64_t G, int64_t N, int64_t K, const Recipe& recipe);

  // w: BF16 parameters [G, N, K], device; call again after every optimizer step. The quantized recipes make here
  // the weight copies their classes read: W (fp8 Fprop) and W^T (fp8 Dgrad) in 128x128 blocks, W MXFP4 along K
  // (mxfp4 Fprop), W^T MXFP4 along N (mxfp4 Dgrad); the bf16 recipe keeps the pointer. Rejects a null w.
  void set_weights(const bf16* w, cudaStream_t stream);
  // The seed of the MXFP4 quantizers' random choices for this step (random Hadamard signs, stochastic rounding;
  // the scheme at the top): call it before set_weights with a value that changes per step (the layers take
  // layer_quant_seed of ModelContext::quant_seed); calling it again with the same value (every forward of the
  // step) changes nothing. Default 0.
  void set_quant_seed(uint64_t seed);

  // y [M, N] BF16, device, M = split.host_offsets[G], or split.rows for a split without a host copy of its offsets:
  // then nothing of forward, backward or fprop_fp8_rows reads the counts on the host, and no host synchronisation is
  // left (rows <= 2^30; the expert GEMMs on the Hopper kernels where they take the problem, else on the CUDA-core
  // kernels: kernels/gemm/grouped_gemm.h "Without a host copy"), for every recipe but paper 2's MXFP4 Wgrad, which
  // is rejected with the reason. A CUDA graph can
  // then hold a forward and backward, captured after an eager one with the same rows (which allocates the buffers; a
  // larger M later reallocates them and leaves the graph's pointers dangling): it bakes in M, the buffers, the active
  // slot and the stochastic-rounding stream of its backward (every replay draws the same numbers), while the device
  // offsets may change between replays. Rejects (before any launch) a forward before set_weights, a split whose G
  // differs from the layer's or that has neither a host copy nor rows, the wrong kind of input for the recipe (null x
  // for bf16/fp8, null mx_codes or mx_scales for mxfp4), and everything GroupedGemm rejects.
  void forward(const GroupLinearInput& x, const GroupSplit& split, bf16* y, cudaStream_t stream);

  // x: the forward's input, with the forward's values (the same tensor, or one rebuilt at another address, e.g.
  // by a recompute), read by Wgrad: bf16 x.x, mxfp4 x.mx_codes and x.mx_scales; the fp8 recipe reads its own FP8
  // column copy of X and ignores x. dy [M, N] BF16 with the forward's split. dx [M, K] BF16 (null: no Dgrad,
  // e.g. the first layer); dw_master [G, N, K] FP32 += dW (null: no Wgrad). Rejects a backward without a
  // forward, a null dy, a split other than the forward's (another G or another token count M), and with
  // dw_master the wrong kind of input for the recipe (as forward).
  void backward(const GroupLinearInput& x, const bf16* dy, const GroupSplit& split, bf16* dx, float* dw_master,
                cudaStream_t stream);

  // The fp8 recipe's Fprop again, from an FP8 1x128 row copy of X that the caller made with bf16_to_fp8_row
  // (this layer's scale_mode()) and kept: x.codes E4M3 [M, K], x.scales FP32 [fp8_row_scale_count(M, K)]
  // (layouts.h), device, M as in forward. y [M, N] BF16 gets the bits forward gave for the BF16 X those
  // rows came from (the same operands, the same grouped GEMM). Fprop only: the FP8 column copy of X that the last
  // forward made for Wgrad, and what backward reads, are left as they are (a recompute of Y from a kept FP8 input,
  // trainer/model/moe_experts.h). Rejects (before any launch) a recipe other than fp8, a call before set_weights,
  // a split as forward rejects it, null codes or scales, and everything GroupedGemm rejects.
  void fprop_fp8_rows(Fp8RowOperand x, const GroupSplit& split, bf16* y, cudaStream_t stream);
  Fp8ScaleMode scale_mode() const { return scale_mode_; }

  // Every buffer the layer holds once it has run a forward and a backward over M tokens (trainer/memory/
  // buffer_plan.h; all Lifetime::first_forward, allocated through the allocator as the passes need them and kept;
  // module "group_linear"); the passes size their buffers from it. bf16: none. fp8 and mxfp4:
  //   weights      "W FP8 codes" [G, N, K] E4M3, "W FP8 scales" [G fp8_block_scale_count(N, K)] FP32,
  //                "W^T FP8 codes" [G, K, N] E4M3, "W^T FP8 scales" [G fp8_block_scale_count(K, N)] FP32
  //   activations  fp8: "X FP8 column codes" [fp8_col_codes_capacity(M, K, G)] E4M3 and "X FP8 column scales"
  //                [fp8_col_scales_capacity(M, K, G)] FP32, made by forward, read by Wgrad (layouts.h)
  //   workspace    "row FP8 codes" [M max(K, N)] E4M3 and "row FP8 scales" [max of fp8_row_scale_count(M, K) and
  //                (M, N)] FP32 (X in forward, dY in backward); "dY FP8 column codes" / "dY FP8 column scales"
  //                (the capacities of [M, N] in G groups); mxfp4: X's FP8 column copy, made in backward from the
  //                MXFP4 X, under workspace
  // The fp8 entries are 0 for a class that is mxfp4 (W FP8 for Fprop, W^T FP8 for Dgrad, the FP8 columns for
  // Wgrad). The mxfp4 classes add (K/32, N/32 scale bytes per row; mxfp4_col_*_capacity of layouts.h):
  //   Fprop   weights "W MXFP4 codes" [G, N, K/2], "W MXFP4 scales" [G, N, K/32]; workspace "X MXFP4 row codes"
  //           [M, K/2] and "X MXFP4 row scales" [M, K/32]
  //   Dgrad   weights "W^T MXFP4 codes" [G, K, N/2], "W^T MXFP4 scales" [G, K, N/32]; workspace "dY MXFP4 row
  //           codes" [M, N/2], "dY MXFP4 row scales" [M, N/32]
  //   either  G = 1: workspace "MXFP4 GEMM workspace" (bytes: mxfp4_gemm_workspace_bytes of the larger of the two
  //           GEMMs); G > 1: weights "W FP8 row codes" [G, N, K] E4M3 and "W FP8 row scales" [G
  //           fp8_row_scale_count(N, K)] FP32 (Fprop), "W^T FP8 row codes" [G, K, N] and "W^T FP8 row scales" [G
  //           fp8_row_scale_count(K, N)] (Dgrad): the experts' MXFP4 weights as FP8 1x128 row tensors; and the
  //           "row FP8 codes" / "row FP8 scales" workspace above for X (Fprop) or dY (Dgrad) as FP8 rows
  //   Wgrad   activations "X MXFP4 column codes" / "scales" (the column tensor of X over the split, made in forward,
  //           read by Wgrad); workspace "dY MXFP4 column codes" / "scales", "MXFP4 Wgrad workspace"
  //           (mxfp4_wgrad_workspace_bytes)
  // Rejects G, N, K < 1, M < 0 and a recipe that is not built.
  static BufferPlan buffers(const Recipe& recipe, int64_t G, int64_t N, int64_t K, int64_t M);

  // Activation bytes that must stay alive from a forward over M tokens in G groups to its backward (DESIGN.md
  // "Recipes", column "cached for backward"), whoever owns them:
  //   bf16:  the caller's BF16 X [M, K]: 2 M K bytes;
  //   fp8:   the layer's FP8 column copy of X (buffers(): "X FP8 column codes" and "scales"); the caller's BF16
  //          X may be freed after forward;
  //   mxfp4: the caller's MXFP4 X (layouts.h): M K / 2 bytes of E2M1 codes plus M K / 32 UE8M0 scale bytes.
  // Not counted: the weights' FP8 copies (held for the whole step: weight_copy_bytes), and the scratch of one pass.
  //   an mxfp4 Wgrad (X stored as BF16): the layer's MXFP4 column copy of X (buffers(): "X MXFP4 column codes"
  //          and "scales") instead of the FP8 one.
  // Rejects M < 0, K < 1, G < 1, a recipe that is not built and K % 32 != 0 for mxfp4.
  static size_t held_activation_bytes(const Recipe& recipe, int64_t M, int64_t K, int64_t G);
  // The same for this layer's last forward. Rejects a call before any forward.
  size_t held_activation_bytes() const;

  // FP8 copies of the weights held for the whole step (buffers()' weights: fp8 and mxfp4 W and W^T as E4M3 codes,
  // 2 G N K bytes, plus their FP32 128x128 block scales; bf16: 0). The BF16 parameters are not counted. Rejects G,
  // N or K < 1 and a recipe that is not built. With mxfp4 classes: the weight entries of buffers().
  static size_t weight_copy_bytes(const Recipe& recipe, int64_t G, int64_t N, int64_t K);

 private:
  // A device buffer that grows on demand, through the owner's allocator (empty functions: cudaMalloc/cudaFree).
  struct Buffer {
    explicit Buffer(const GroupLinearAllocator* a) : alloc(a) {}
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer();
    void* ensure(size_t n, GroupLinearBuffer kind);
    void release();
    const GroupLinearAllocator* alloc;
    void* ptr = nullptr;
    size_t bytes = 0;
  };

  // The MXFP4 quantizer options of an operand: `rounding`, the recipe's transform and this step's seeds; stream_id
  // picks the stochastic-rounding seed (the scheme at the top).
  MxQuantConfig mx_config(Rounding rounding, uint64_t stream_id) const;
  // The MXFP4 GEMM operand of G > 1 groups: `in` [M, C] BF16 quantized along C to MXFP4 rows (mx_codes,
  // mx_scales: the planned "X/dY MXFP4 row" buffers) with `cfg`, converted to FP8 1x128 rows in the "row FP8"
  // buffers, which it returns.
  Fp8RowOperand mx_rows_as_fp8(const bf16* in, int64_t M, int64_t C, uint8_t* mx_codes, uint8_t* mx_scales,
                               const MxQuantConfig& cfg, cudaStream_t stream);
  // set_weights over G > 1 groups: each expert's MXFP4 rows [P, R] (codes, scales: G of them one after the other)
  // converted to its own FP8 1x128 row tensor in out_codes / out_scales (the planned buffers named so).
  void mx_weight_rows(const uint8_t* codes, const uint8_t* scales, int64_t P, int64_t R, Buffer& out_codes,
                      Buffer& out_scales, const char* codes_name, const char* scales_name, cudaStream_t stream);
  // Rejects a token count an MXFP4 Fprop or Dgrad (`gemm`) cannot take (M % 4 != 0).
  void check_mx_tokens(int64_t M, const char* gemm) const;
  // Checks that input `x` is the recipe's kind (BF16 or MXFP4); `what` names the call.
  void check_input(const GroupLinearInput& x, const char* what) const;
  // The split's token count M (host_offsets[G], or rows without a host copy); rejects another G, or neither.
  int64_t split_tokens(const GroupSplit& split, const char* what) const;
  // The active in-flight slot (allocator_.slots; 0 without), and its copy of X's FP8 columns: the fp8 recipe's held
  // activation (one per slot), the mxfp4 recipe's backward scratch (one).
  size_t slot() const { return static_cast<size_t>(checked_slot(allocator_.slots, cached_M_.size(), "GroupLinear")); }
  Buffer& xcol_codes() { return *xcol_codes_[xcol_codes_.size() == 1 ? 0 : slot()]; }
  Buffer& xcol_scales() { return *xcol_scales_[xcol_scales_.size() == 1 ? 0 : slot()]; }
  // buffers() for this layer and M tokens (kept from the last call with the same M), and the bytes of one of them.
  const BufferPlan& plan_for(int64_t M);
  size_t planned(int64_t M, const char* tensor) { return static_cast<size_t>(plan_for(M).at(tensor).bytes()); }

  int64_t G_, N_, K_;
  Recipe recipe_;
  Fp8ScaleMode scale_mode_;
  GroupedGemm gemm_;
  const bf16* w_ = nullptr;
  GroupLinearAllocator allocator_;  // declared before the buffers: they release through it when destroyed
  Buffer w_codes_{&allocator_}, w_scales_{&allocator_}, wt_codes_{&allocator_},
      wt_scales_{&allocator_};                          // FP8 W [G, N, K] and W^T [G, K, N]
  Buffer row_codes_{&allocator_}, row_scales_{&allocator_};  // FP8 row copy of X (forward) or dY (backward)
  Buffer dycol_codes_{&allocator_}, dycol_scales_{&allocator_};
  Buffer w_mx_codes_{&allocator_}, w_mx_scales_{&allocator_};    // MXFP4 W [G, N, K] along K (mxfp4 Fprop)
  Buffer wt_mx_codes_{&allocator_}, wt_mx_scales_{&allocator_};  // MXFP4 W^T [G, K, N] along N (mxfp4 Dgrad)
  Buffer mx_row_codes_{&allocator_}, mx_row_scales_{&allocator_};  // MXFP4 rows of X (Fprop) or dY (Dgrad)
  Buffer mx_workspace_{&allocator_}, mx_wgrad_workspace_{&allocator_};  // mxfp4_gemm's, mxfp4_wgrad_grouped's
  // G > 1 with MXFP4 Fprop / Dgrad: each expert's MXFP4 W [N, K] / W^T [K, N] as an FP8 1x128 row tensor.
  Buffer w_rows_codes_{&allocator_}, w_rows_scales_{&allocator_}, wt_rows_codes_{&allocator_},
      wt_rows_scales_{&allocator_};
  // X's column copy for Wgrad (FP8, or MXFP4 for an mxfp4 Wgrad): held per slot unless X is stored as MXFP4
  // (then one, rebuilt in backward).
  std::vector<std::unique_ptr<Buffer>> xcol_codes_, xcol_scales_;
  uint64_t quant_seed_ = 0;      // set_quant_seed
  uint64_t backward_count_ = 0;  // backward calls since set_quant_seed last changed the seed
  std::vector<int64_t> cached_M_;  // per slot: its forward's token count (-1: none yet)
  BufferPlan plan_{"group_linear"};
  int64_t plan_M_ = -1;    // the M of plan_
};

}  // namespace fp4moe
