// The routed experts of one MoE layer (part of MoeLayer, trainer/model/moe.h), dropless, on one device:
//
//   permute_map, permute_forward    x [M, d] -> xs [R, d], R = M k rows grouped by expert (kernels/nn/permute.h)
//   fc1  GroupLinear G = E, N = 2f, K = d   "<prefix>.experts.fc1" [E, 2f, d]    h  [R, 2f] (gate | up)
//   swiglu                                                                       a  [R, f]
//   fc2  GroupLinear G = E, N = d, K = f    "<prefix>.experts.fc2" [E, d, f]     ys [R, d]
//   unpermute_forward with topk_weight [M, k] (routed_scale is already in the router's weights) -> y [M, d]
// Backward in reverse: unpermute_backward -> dys [R, d] and dweights [M, k] FP32; fc2 Dgrad/Wgrad; swiglu
// backward; fc1 Dgrad/Wgrad; permute_backward -> dx [M, d] BF16. Expert Wgrads accumulate into the FP32 grads.
//
// Recipe (cfg.recipe.routed_experts, trainer/model/group_linear.h):
//   bf16  xs and a are kept as BF16 (GroupLinear's Wgrad reads the caller's X, which backward passes to it).
//   fp8   GroupLinear keeps its own FP8 column copies of X; xs and a are forward-only scratch (under moe/full the
//         layer keeps the FP8 row copy of xs, below).
//   mxfp4 xs and a are quantized to MXFP4 rows (bf16_to_mxfp4_row, OCP floor scales, RNE) and kept in that form
//         only (GroupLinear converts them directly to FP8 for Fprop and Wgrad); xs and a in BF16 are scratch.
//         On one device the permuted rows are quantized, which gives the codes that quantizing x before an
//         expert-parallel dispatch would (the rule is per row).
// The fp8/mxfp4 recipes quantize the expert weights in every forward (GroupLinear::set_weights: the BF16
// parameters change after each optimizer step; a recompute in backward reuses them). fc1 and fc2 are built at the
// first forward, with the model's cuBLASLt object (ctx.lt, the same for every later call) and an allocator over
// the layer's DeviceMemory (counted_allocator); their buffers are allocated at the first forward and kept: FP8
// weight copies under weights, the fp8 recipe's FP8 column copies of xs and a under activations, FP8 row copies and
// columns of one pass under workspace (per layer); the cuBLASLt workspace is not counted.
// Experts that receive no token are skipped by the grouped GEMMs (their grads stay unchanged).
// Skewed routed load (the emulated layout's parallel.routed_load r > 1, trainer/model/layout_emulation.h): the
// routing hands R = routed_row_count(M k, r) rows (MoeRouting::rows), the M k real assignments then R - M k extra
// ones; the permutation runs over the R assignments as R tokens of top-1, an extra row copying its real
// assignment's token (routed_row_tokens); the GEMMs, swiglu and every buffer below run at R rows; the combine and
// permute backward read only the M k real rows (extra rows: combine weight 0), and unpermute_backward's dys of the
// extra rows is zeroed (zero_extra_rows), so they add nothing to y, dx, the expert grads or dweights.
//
// Memory. Kept from forward to backward (MemCategory::activations), R = k rows per token; buffers() states every
// buffer with its size (the dispatched input is the permuted x, xs, in the recipe's storage format: what an
// expert-parallel dispatch sends):
//   every policy  row_of (the permutation: unpermute and permute backward read it); bf16: xs; mxfp4: xs as MXFP4
//                 codes and scales; fp8: nothing here (Group Linear keeps fc1's FP8 column copy of xs)
//   no moe/full   h (fc1 output), ys (fc2 output, for the top-k weights' gradient); a: bf16 itself, mxfp4 its MXFP4
//                 copy, fp8 nothing here (both dropped by moe_act)
//   moe/full, fp8 xs as its FP8 1x128 row copy: the operand of fc1's Fprop, which the recompute reruns (a ladder
//                 recipe with an MXFP4 Fprop: xs in BF16, which fc1's forward quantizes to the same MXFP4 rows)
// fc1's and fc2's Group Linears keep, from the first forward on and under every policy, the FP8 weight copies and
// the fp8 recipe's FP8 column copies of xs and a (fc1's is read by its Wgrad and never rebuilt; fc2's is rebuilt,
// with the same bits, by the rerun of fc2 under moe/full), and their scratch (GroupLinear::buffers).
// Recompute (trainer/model/recompute.h):
//   moe_act  a is not kept: backward reruns swiglu(h) into the scratch; with mxfp4 it is the MXFP4 copy of a that is
//            not kept: backward reruns swiglu into BF16 scratch and quantizes it again (the same codes and scales,
//            the rule is deterministic per row), and fc2's Wgrad reads that copy (backward passes it); fp8:
//            no change (a is never kept here).
//   whole    (moe, full) the experts alone rerun from the kept dispatched input, on the kept routing (no router,
//            no permute): fc1 (bf16: GroupLinear::forward on the kept xs; mxfp4: on the kept MXFP4 xs, converted
//            directly to FP8 again; fp8: GroupLinear::fprop_fp8_rows on the kept FP8 row copy, the operand fc1's
//            forward quantized from the same BF16 xs), swiglu, fc2 (its input copy, and ys) into the scratch. The
//            same operands and kernels as the forward: h, a and ys bit for bit. fp8 pays one more bf16_to_fp8_row
//            pass over xs in forward (the kept copy; fc1 makes its own from the same rows).
// Scratch (ModelContext::scratch): forward takes assignment_of [R] int32 and every tensor not kept (xs in BF16 for
// fp8/mxfp4), in the caller's scope; recompute() takes, in the caller's scope, h, a (and its MXFP4 copy) and ys for
// whole, a (and its MXFP4 copy) for moe_act; backward dys/dxs [R, d], da [R, f] and dh [R, 2f] BF16 in its own scope.
// In-flight micro-batches (trainer/memory/device_memory.h): the kept tensors, fc1's and fc2's FP8 column copies
// (fp8) and the token count have one copy per slot; recompute and backward bind the active slot's kept tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/group_linear.h"
#include "trainer/model/moe_router.h"
#include "trainer/model/params.h"
#include "trainer/model/recompute.h"

namespace fp4moe {

// Bytes per routed token (one row of the permuted input xs: one (token, expert) pair) of the expert-parallel
// dispatch payload in a layer's recipe (DESIGN.md "Expert parallelism"), from the row layout of the buffers that
// hold it (computed from the shapes: the same whether or not the recompute policy keeps them):
//   bf16   xs itself, [R, d] BF16:                                            payload 2 d, scales 0
//   fp8    the FP8 1x128 row copy of xs that fc1's GroupLinear makes for Fprop (group_linear.cpp sizes it
//          R d E4M3 codes + fp8_row_scale_count(R, d) FP32 scales, layouts.h): payload d, scales ~ 4 ceil(d/128).
//          On one device the permute moves BF16 rows and fc1 quantizes them after it; a dispatch in FP8
//          (DeepSeek-V3's) sends this tensor instead; under moe/full the layer keeps it (Memory, above).
//   mxfp4  xs_codes + xs_scales, [R, d/2] E2M1 codes and [R, d/32] UE8M0 scales: payload d/2, scales d/32
// with R the rows the buffers hold (max_tokens top_k, or a skewed load's more); per token = bytes / R (both 0 when
// R = 0). Not counted: the combine (expert outputs return in BF16 in every recipe) and the backward's gradients.
struct DispatchBytes {
  double payload = 0;  // element bytes per routed token (BF16, E4M3 or packed E2M1)
  double scales = 0;   // block-scale bytes per routed token (FP32 per 128 elements, UE8M0 per 32; 0 for bf16)
  double total() const { return payload + scales; }
};

class MoeRoutedExperts {
 public:
  // E experts of width f on hidden d, top-k; fc1 init N(0, 0.02^2), fc2 N(0, fc2_init_std^2); recompute: whole
  // and act (MoeRecompute's, above; shared_experts is MoeLayer's). Rejects (fp4moe::Error): what
  // GroupLinear::check_shape rejects (a recipe other than the presets; d, f multiples of 16, of 32 for mxfp4),
  // max_tokens < 0, and what routed_row_count rejects of routed_load (the skewed load r: at most
  // R = routed_row_count(max_tokens k, r) rows, layout_emulation.h) or an R beyond int32.
  MoeRoutedExperts(ParamStore& store, const std::string& prefix, int64_t E, int64_t d, int64_t f, int64_t k,
                   const Recipe& recipe, float fc2_init_std, int64_t max_tokens, DeviceMemory& mem,
                   MoeRecompute recompute = {}, double routed_load = 1.0);

  // x [M, d] BF16 with the router's routing for the same M (1 <= M <= max_tokens, M k <= routing.rows <= R at
  // max_tokens) -> y [M, d] BF16 (overwritten). Takes its scratch in the caller's scope. Rejects a ctx.lt other than
  // the first forward's.
  void forward(ModelContext& ctx, const bf16* x, const MoeRouting& routing, bf16* y);
  // Whether backward can run now: what it reads is kept, or a forward/recompute in a scope still open left it.
  bool ready(const ScratchArena& arena) const { return !needs_recompute() || arena.alive(stamp_); }
  // Rebuilds, in the caller's scope, what the policy does not keep (above), for a backward in that scope, from the
  // kept dispatched input and `routing`, which must be the forward's (the router's, kept). A no-op when ready().
  // Rejects (fp4moe::Error) a routing whose M, E or k is not the last forward's.
  void recompute(ModelContext& ctx, const MoeRouting& routing);
  // dy [M, d] BF16 -> dx [M, d] BF16 (overwritten: the routed experts' part of d x), dweights [M, k] FP32
  // (overwritten: the gradient of topk_weight); expert grads +=. Same routing as the forward; rejects a backward
  // that is not ready().
  void backward(ModelContext& ctx, const bf16* dy, const MoeRouting& routing, bf16* dx, float* dweights);

  // Expert parallelism (trainer/model/moe_expert_parallel.h): the experts on rows that arrive grouped by local
  // expert (EpExchange's dispatch), with no permute and no unpermute; `split` is over the E local experts, its
  // R = split.host_offsets[E] rows in [0, max_tokens * k] (the rows the kept buffers hold). R = 0 runs nothing.
  // Rejects (fp4moe::Error) a recompute policy that drops tensors (whole, act: not built for this entry), a split of
  // another G or without a host copy, R outside that range, and (backward) a split other than the forward's.
  //   kept_input     the active slot's kept buffers of the dispatched input, where a dispatch may receive its rows:
  //                  bf16 xs [max_tokens k, d]; mxfp4 xs codes [., d/2] and scales [., d/32]; fp8 none (all null:
  //                  Group Linear keeps its own FP8 column copy, and forward_rows takes the caller's BF16 rows)
  //   forward_rows   x: the input rows [R, d] as the recipe takes them (GroupLinearInput) -> ys [R, d] BF16 grouped
  //                  (a kept buffer; valid until the next forward), null when R = 0. Takes its scratch in the
  //                  caller's scope, like forward.
  //   backward_rows  x: the forward's input again (as GroupLinear::backward takes it), dys [R, d] BF16 grouped ->
  //                  dxs [R, d] BF16 (overwritten; may be dys itself); expert grads +=. Its scratch in its own scope.
  GroupLinearInput kept_input() const;
  const bf16* forward_rows(ModelContext& ctx, const GroupLinearInput& x, const GroupSplit& split);
  void backward_rows(ModelContext& ctx, const GroupLinearInput& x, const bf16* dys, const GroupSplit& split,
                     bf16* dxs);

  // The dispatch payload of this layer per routed token (DispatchBytes above).
  DispatchBytes dispatch_bytes() const;

  const Param& fc1_weight() const { return *w1_; }
  const Param& fc2_weight() const { return *w2_; }
  size_t kept_bytes() const;  // activations kept from forward to backward (buffers()), as DeviceMemory counts them
  // Every buffer of the routed experts (trainer/memory/buffer_plan.h; module "moe.experts") for R routed rows on
  // E_local experts (this GPU's), hidden d, width f, under `recipe` and `recompute`: the kept tensors of the Memory
  // paragraph above by name ("row_of", "xs", "xs MXFP4 codes", "xs MXFP4 scales", "xs FP8 row codes", "xs FP8 row
  // scales", "h", "a", "ys", "a MXFP4 codes", "a MXFP4 scales"; sized whether held or not, no elements for what the
  // recipe never makes), the scratch "assignment_of" [R] int32 (forward), "d rows" [R, d], "d a" [R, f], "d h" [R, 2f]
  // BF16 (backward), then fc1's and fc2's GroupLinear::buffers prefixed "fc1 " and "fc2 ". Rejects R < 0 and what
  // GroupLinear::buffers rejects.
  static BufferPlan buffers(int64_t R, int64_t E_local, int64_t d, int64_t f, const Recipe& recipe,
                            const MoeRecompute& recompute);
  // The shared scratch of the passes (trainer/memory/scratch.h) for R routed rows, as buffers() takes them:
  // forward assignment_of and every tensor not kept, left in the caller's scope; recompute what recompute() leaves
  // there (0 when nothing is recomputed); backward (and backward_after_recompute) d rows, d a, d h in its own scope.
  // Counted by the passes' binding code on a measuring arena. Rejects what buffers() rejects.
  static PassScratch scratch(int64_t R, int64_t E_local, int64_t d, int64_t f, const Recipe& recipe,
                             const MoeRecompute& recompute);
  // scratch() for R = max_rows: the rows at max_tokens (max_tokens * k, or a skewed load's routed_row_count).
  size_t forward_bytes() const { return scratch_.forward; }
  size_t recompute_bytes() const { return scratch_.recompute; }
  size_t backward_bytes() const { return scratch_.backward; }

 private:
  struct Tensors {
    int32_t *row_of = nullptr, *assignment_of = nullptr;
    bf16 *xs = nullptr, *h = nullptr, *a = nullptr, *ys = nullptr;
    uint8_t *xs_codes = nullptr, *xs_scales = nullptr, *a_codes = nullptr, *a_scales = nullptr;
    uint8_t* xs_fp8_codes = nullptr;  // fp8 under whole: the kept FP8 row copy of xs
    float* xs_fp8_scales = nullptr;
  };
  // Whether backward needs a recompute first: what the policy drops (moe_act under fp8 drops nothing here).
  static bool needs_recompute(const Recipe& recipe, bool whole, bool act) {
    return whole || (act && !quantizes_bf16_input(recipe));
  }
  bool needs_recompute() const { return needs_recompute(recipe_, whole_, act_); }
  // The tensors of plan `p` (buffers() for one pass): `kept`'s pointers for the held ones, takes from `arena` for
  // the rest (a measuring arena gives null and counts): forward's whole set; the recompute's (whole: h, a and its
  // MXFP4 copy, ys; moe_act: a and its MXFP4 copy) over the kept rest.
  static Tensors take_forward(ScratchArena& arena, const BufferPlan& p, const Recipe& recipe, const Tensors& kept);
  static void take_recompute(ScratchArena& arena, const BufferPlan& p, const Recipe& recipe, bool whole, Tensors& t);
  // take_forward and take_recompute for R rows with the active slot's kept tensors.
  Tensors bind_forward(ScratchArena& arena, int64_t R) {
    return take_forward(arena, plan_for(R), recipe_, kept_tensors());
  }
  void bind_recompute(ScratchArena& arena, int64_t R, Tensors& t) {
    take_recompute(arena, plan_for(R), recipe_, whole_, t);
  }
  Tensors kept_tensors() const;  // the active slot's kept tensors (null where not kept)
  // Points t's kept tensors at the active slot's copies (the others stay as they are: scratch of a recompute).
  void bind_kept(Tensors& t) const;
  // The start of a forward over R rows: fc1 and fc2 built (bind), this pass's tensors (t_), the step's seeds and
  // weight copies. Takes its scratch in the caller's scope.
  void begin_forward(ModelContext& ctx, int64_t R);
  // fc2's backward, swiglu's and fc1's from dys [R, d] (grouped) to dxs [R, d] (may alias dys); takes d a and d h in
  // the caller's scope; x is fc1's input as GroupLinear::backward takes it.
  void backward_from_rows(ModelContext& ctx, const GroupLinearInput& x, const bf16* dys, const GroupSplit& split,
                          int64_t R, bf16* dxs);
  // The rows entry points' checks (forward_rows above); returns R.
  int64_t check_rows_split(const GroupSplit& split, const char* what) const;
  // Forward: permute, the kept FP8 row copy of xs (fp8 under whole), fc1, then run_from_h (not the unpermute).
  void run_to_ys(ModelContext& ctx, const bf16* x, const MoeRouting& r, const Tensors& t);
  // swiglu and fc2 from t.h: a (and its MXFP4 copy), ys.
  void run_from_h(ModelContext& ctx, const GroupSplit& split, int64_t R, const Tensors& t);
  GroupLinearInput quantized_input(const bf16* rows, int64_t R, int64_t K, uint8_t* codes, uint8_t* scales,
                                   cudaStream_t stream) const;
  // The Group Linear input the recipe reads: BF16 rows (bf16, fp8), or their MXFP4 codes and scales (mxfp4).
  GroupLinearInput input_of(const bf16* rows, const uint8_t* codes, const uint8_t* scales) const;
  // Builds fc1 and fc2 at the first forward, with ctx.lt; rejects another ctx.lt later.
  void bind(const ModelContext& ctx);
  const BufferPlan& plan_for(int64_t R);  // buffers() for R rows, kept from the last call with the same R

  std::string prefix_;
  int64_t E_, d_, f_, k_, max_tokens_;
  int64_t max_rows_;  // R_max: routed_row_count(max_tokens k, routed_load), max_tokens * k when balanced
  Recipe recipe_;
  bool whole_, act_;
  Param *w1_, *w2_;
  DeviceMemory* mem_;
  CublasLtMatmul* lt_ = nullptr;           // the first forward's ctx.lt
  std::optional<GroupLinear> fc1_, fc2_;  // built at the first forward (bind)
  KeptValue<int64_t> last_M_;  // per slot: tokens of its forward (-1: none)
  KeptValue<int64_t> last_rows_;  // per slot: rows of its forward_rows (-1: none)
  Tensors t_;                 // the tensors of the last forward / recompute (the kept ones: the active slot's)
  uint64_t stamp_ = 0;        // scratch stamp of the last forward / recompute
  PassScratch scratch_;       // scratch() at R_max
  BufferPlan plan_{"moe.experts"};  // buffers() for R_max
  BufferPlan pass_plan_{"moe.experts"};
  int64_t pass_R_ = -1;
  // Kept (MemCategory::activations), R_max rows, one copy per in-flight slot; empty when not kept
  // (Memory, above). Scratch always: assignment_of [R] int32 (permute_forward only), xs BF16 for fp8/mxfp4, a BF16
  // for fp8/mxfp4.
  KeptArray<int32_t> row_of_;           // [R_max] row of assignment a (t*k + j; extras after)    (always)
  KeptArray<bf16> xs_;                  // [R_max, d] permuted x, fc1 input                       (bf16)
  KeptArray<uint8_t> xs_codes_;         // [R_max, d/2] E2M1 codes of xs                          (mxfp4)
  KeptArray<uint8_t> xs_scales_;        // [R_max, d/32] UE8M0 scales of xs                       (mxfp4)
  KeptArray<uint8_t> xs_fp8_codes_;     // [R_max, d] E4M3 codes of xs, 1x128 row blocks          (fp8, whole)
  KeptArray<float> xs_fp8_scales_;      // [fp8_row_scale_count(R_max, d)] their FP32 scales      (fp8, whole)
  KeptArray<bf16> h_;                   // [R_max, 2f] fc1 output, gate | up                      (not whole)
  KeptArray<bf16> a_;                   // [R_max, f] swiglu output, fc2 input          (bf16, not whole/act)
  KeptArray<bf16> ys_;                  // [R_max, d] fc2 output, read by unpermute_backward      (not whole)
  KeptArray<uint8_t> a_codes_;          // [R_max, f/2] E2M1 codes of a                (mxfp4, not whole/act)
  KeptArray<uint8_t> a_scales_;         // [R_max, f/32] UE8M0 scales of a             (mxfp4, not whole/act)
};

}  // namespace fp4moe
