// Measured stage compute times of the layout planner (`fp4moe plan` without --no-measure; trainer/memory/plan.h
// holds the cost model they replace the compute part of). Nothing here runs on the device: the measurement itself
// is trainer/memory/stage_measure.h's.
//
// ---- The unit -----------------------------------------------------------------------------------------------------
// One micro-batch of N = micro_batch x seq_len tokens (forward + backward, the recompute policy's reruns included) on
// one GPU at tp 1, under a paper recipe (paper_recipe) and recompute policy, of one piece of a stage (LayerKind):
//   dense  one decoder layer with the dense SwiGLU FFN
//   moe    one decoder layer with E / ep local routed experts fed the balanced routed load (N k rows)
//   head   the last stage's final norm, LM head and loss: a one-layer last stage minus a one-layer middle stage
// The first stage's embedding (a row gather, its backward a scatter-add of N rows of d) is not measured: counted 0.
//
// ---- Stage compute time (per micro-batch, per GPU) ----------------------------------------------------------------
// The sum over the stage's layers of their kind's time, plus head on the last stage, divided by tp: tensor
// parallelism is not emulated, so tp > 1 assumes perfect scaling and leaves the TP collectives out ("measured/tp").
// EP and PP transfers and the 1F1B bubble stay the cost model's (plan.h).
//
// ---- Cache ---------------------------------------------------------------------------------------------------------
// A text table, tab-separated, reused across runs (default kDefaultStageTimeCache):
//   line 1   "# fp4moe plan stage times v1"
//   line 2   gpu model recipe policy kind ep micro_batch seq_len seconds failure   (the column names)
//   then     one entry per line: gpu the device name (cudaDeviceProp::name), model model_shape_hash, recipe
//            recipe_name of the paper recipe, policy the recompute modules space-separated ("none"), kind
//            layer_kind_name, ep (1 for dense and head), micro_batch, seq_len, seconds per micro-batch (0 when the
//            measurement failed), failure (why, one line; empty when measured). head is keyed by recipe and policy
//            "-": neither changes it (the LM head is BF16 under every recipe and no policy recomputes it).
// A failed entry stays in the table (its candidates keep their modelled time) until its line is deleted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

struct PlanRequest;
struct PlanResult;

inline constexpr const char* kDefaultStageTimeCache = "runs/plan/stage_times.tsv";

enum class LayerKind { dense, moe, head };
// "dense", "moe", "head".
const char* layer_kind_name(LayerKind kind);

struct StageTimeKey {
  std::string gpu;     // "NVIDIA H200"
  std::string model;   // model_shape_hash
  std::string recipe;  // "mxfp4"; "-" for head
  std::string policy;  // "mla_up_proj", "none"; "-" for head
  LayerKind kind = LayerKind::dense;
  int64_t ep = 1;      // moe: the expert-parallel size (E / ep local experts); dense and head: 1
  int64_t micro_batch = 1, seq_len = 1;
  bool operator==(const StageTimeKey& o) const {
    return gpu == o.gpu && model == o.model && recipe == o.recipe && policy == o.policy && kind == o.kind &&
           ep == o.ep && micro_batch == o.micro_batch && seq_len == o.seq_len;
  }
  // "mxfp4, mla_up_proj, moe ep 16" (for progress and notes).
  std::string text() const;
};

struct StageTimeEntry {
  StageTimeKey key;
  double seconds = 0;   // per micro-batch, > 0 when measured
  std::string failure;  // why the measurement failed (one line, no tab); empty when measured
  bool measured() const { return failure.empty(); }
};

// 16 hex digits: FNV-1a of model_config_text of cfg's [model] and [moe] sections (its recipe set to bf16, its name
// left out), so that the key names the shape alone.
std::string model_shape_hash(const TrainerConfig& cfg);

// The recompute modules as a key: space-separated in the given order, "none" when empty.
std::string policy_key(const std::vector<std::string>& modules);

class StageTimeCache {
 public:
  // An empty cache written to `path` by save(). The path is not read.
  explicit StageTimeCache(std::string path) : path_(std::move(path)) {}
  // Reads `path` (a missing file: an empty cache). Throws fp4moe::Error, one line naming the file and the line,
  // for a file that is not such a table (another first line, other column names, a line without exactly 10
  // tab-separated fields, a kind other than dense/moe/head, an ep, micro_batch or seq_len < 1, seconds not a
  // finite number >= 0, seconds 0 without a failure or > 0 with one, a key given twice).
  static StageTimeCache load(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<StageTimeEntry>& entries() const { return entries_; }
  // The entry of `key`, or null.
  const StageTimeEntry* find(const StageTimeKey& key) const;
  // Adds the entry, replacing one of the same key. Rejects a tab or newline in a text field, seconds not finite or
  // < 0, seconds > 0 with a failure, seconds 0 without one.
  void put(StageTimeEntry entry);
  // The table as load() reads it.
  std::string text() const;
  // Writes text() atomically: a temporary file beside the target, flushed, then renamed over it; the folder is
  // created when missing. Throws fp4moe::Error naming the file.
  void save() const;

 private:
  std::string path_;
  std::vector<StageTimeEntry> entries_;
};

// The per-micro-batch compute time of each stage of `layout` on one GPU: (sum over its layers of dense_s or moe_s,
// by cfg.is_moe_layer, + head_s on the last stage) / tp. Rejects a time not finite or < 0, and what
// stage_layer_counts rejects.
std::vector<double> stage_compute_seconds(const TrainerConfig& cfg, const ParallelLayout& layout, double dense_s,
                                          double moe_s, double head_s);

// The candidates to measure: their (recipe, policy, layout name) as indices into result.fitting (ranked, modelled):
// per recipe the first `top` and the best of every recompute policy, in result.fitting's order. Rejects top < 1.
std::vector<size_t> candidates_to_measure(const PlanResult& result, int64_t top);

// The keys the candidates result.fitting[i], i in `selected`, need, each once, in the order to measure them: per
// (recipe, policy) dense (when the model has dense layers) then moe per ep (when it has MoE layers); head once,
// after the first dense (or, without dense layers, the first moe) key, which its measurement subtracts.
std::vector<StageTimeKey> keys_to_measure(const PlanResult& result, const std::vector<size_t>& selected,
                                          const PlanRequest& request, const std::string& gpu);

// The key `head` is measured against (its middle-stage twin): the first of `keys` that is not head.
const StageTimeKey& head_base_key(const std::vector<StageTimeKey>& keys);

// Replaces the compute time of the selected candidates (and of their twins in result.all) by the measured stage
// times of `cache` on `gpu` (stage_compute_seconds; EP, PP and the bubble stay modelled) and sets their
// compute_source to "measured" (tp 1) or "measured/tp"; a candidate whose entries are missing or failed keeps its
// modelled time, compute_source "modelled" and compute_note saying which entry and why. Then re-ranks
// result.fitting (rank_candidates: measured candidates first).
void apply_measured_times(PlanResult& result, const std::vector<size_t>& selected, const PlanRequest& request,
                          const StageTimeCache& cache, const std::string& gpu);

}  // namespace fp4moe
