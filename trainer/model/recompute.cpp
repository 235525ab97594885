#include "trainer/model/recompute.h"

namespace fp4moe {

LayerRecompute layer_recompute(const RecomputeConfig& rc) {
  LayerRecompute r;
  r.full = rc.has("full");
  r.norms = r.full || rc.has("layernorm");
  r.mla.whole = r.full;
  r.mla.norms = r.norms;
  r.mla.up_proj = r.full || rc.has("mla_up_proj");
  r.mla.core_attn = r.full || rc.has("core_attn");
  r.dense_mlp = r.full || rc.has("mlp");
  r.moe.whole = r.full || rc.has("moe");
  r.moe.act = r.moe.whole || rc.has("moe_act");
  r.moe.shared_experts = r.moe.whole || rc.has("shared_experts");
  return r;
}

}  // namespace fp4moe
