// Measured stage times of the layout planner (trainer/memory/stage_times.h, stage_measure.h), no device: a stage's
// compute composed from a fixed table of layer times (and divided by tp), the cache's round trip and its refusal of
// foreign or damaged files, which candidates and keys are measured, the measured/modelled mix in the ranking, the
// measuring loop with a stand-in for the GPU (head = last stage - middle stage, failures recorded, a second run hits
// the cache), the child's configuration (its TOML reads back to the same configuration), the child process with a
// stand-in executable (a failure's one line; the median timed step over its micro-batches), and two review fixes of
// the planner (a configuration's [parallel] rules not enforced; a GPU count without a layout explained).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/plan.h"
#include "trainer/memory/stage_measure.h"
#include "trainer/memory/stage_times.h"
#include "trainer/train/metrics.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::TempDir;

TrainerConfig tiny() { return parse_config_args({"--config", test::preset("tiny")}); }

PlanRequest tiny_request(int64_t gpus) {
  PlanRequest r;
  r.model = tiny();
  r.title = "tiny";
  r.gpus = gpus;
  r.memory_gib = 1000;
  r.micro_batch = 4;
  r.seq_len = 64;
  r.global_batch = 32;
  r.recipes = {Recipe::bf16, Recipe::mxfp4};
  return r;
}

StageTimeKey key(LayerKind kind, int64_t ep = 1, const std::string& recipe = "fp8") {
  StageTimeKey k;
  k.gpu = "NVIDIA H200";
  k.model = "0123456789abcdef";
  k.recipe = kind == LayerKind::head ? "-" : recipe;
  k.policy = kind == LayerKind::head ? "-" : "mla_up_proj";
  k.kind = kind;
  k.ep = ep;
  k.micro_batch = 1;
  k.seq_len = 4096;
  return k;
}

StageTimeEntry entry(const StageTimeKey& k, double seconds, const std::string& failure = "") {
  StageTimeEntry e;
  e.key = k;
  e.seconds = seconds;
  e.failure = failure;
  return e;
}

TEST(StageTimes, StageComputeIsTheSumOfItsLayersPlusTheHeadOverTp) {
  // DeepSeek-V3 (61 layers, the first 3 dense) over pp 4: stages of 15, 15, 15 and 16 layers. Dense 1 ms, MoE 2 ms,
  // head 5 ms: stage 0 = 3 x 1 + 12 x 2 = 27 ms, stages 1 and 2 = 30 ms, stage 3 = 32 + 5 = 37 ms; tp 2 halves each.
  const TrainerConfig v3 = production_preset("v3").config;
  ParallelLayout lay = production_preset("v3").layout;
  ASSERT_EQ(lay.pp, 4);
  ASSERT_EQ(stage_layer_counts(v3, lay), (std::vector<int64_t>{15, 15, 15, 16}));
  std::vector<double> t = stage_compute_seconds(v3, lay, 1e-3, 2e-3, 5e-3);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_NEAR(t[0], 27e-3, 1e-12);
  EXPECT_NEAR(t[1], 30e-3, 1e-12);
  EXPECT_NEAR(t[2], 30e-3, 1e-12);
  EXPECT_NEAR(t[3], 37e-3, 1e-12);
  lay.tp = 2;
  lay.dp = 32;
  t = stage_compute_seconds(v3, lay, 1e-3, 2e-3, 5e-3);
  EXPECT_NEAR(t[0], 13.5e-3, 1e-12);
  EXPECT_NEAR(t[3], 18.5e-3, 1e-12);
  expect_error_with([&] { stage_compute_seconds(v3, lay, -1, 0, 0); }, {"expected >= 0"});
}

TEST(StageTimes, CacheRoundTripReplacesByKey) {
  TempDir dir;
  const std::string path = dir.file("sub/stage_times.tsv");  // the folder is created by save()
  StageTimeCache cache(path);
  cache.put(entry(key(LayerKind::dense), 0.0123456789));
  cache.put(entry(key(LayerKind::moe, 16), 0.5));
  cache.put(entry(key(LayerKind::moe, 8), 0, "fp4moe train exit 1: out of memory"));
  cache.put(entry(key(LayerKind::head), 0.02));
  cache.put(entry(key(LayerKind::moe, 16), 0.25));  // replaces the ep 16 entry
  ASSERT_EQ(cache.entries().size(), 4u);
  cache.save();
  const StageTimeCache back = StageTimeCache::load(path);
  EXPECT_EQ(back.text(), cache.text());
  ASSERT_NE(back.find(key(LayerKind::moe, 16)), nullptr);
  EXPECT_EQ(back.find(key(LayerKind::moe, 16))->seconds, 0.25);
  EXPECT_NEAR(back.find(key(LayerKind::dense))->seconds, 0.0123456789, 1e-15);
  EXPECT_FALSE(back.find(key(LayerKind::moe, 8))->measured());
  EXPECT_EQ(back.find(key(LayerKind::moe, 8))->failure, "fp4moe train exit 1: out of memory");
  EXPECT_EQ(back.find(key(LayerKind::moe, 32)), nullptr);
  StageTimeKey other_gpu = key(LayerKind::dense);
  other_gpu.gpu = "NVIDIA H100 80GB HBM3";
  EXPECT_EQ(back.find(other_gpu), nullptr);
  // A missing file is an empty cache; no temporary file is left beside the saved one.
  EXPECT_TRUE(StageTimeCache::load(dir.file("none.tsv")).entries().empty());
  for (const auto& f : std::filesystem::directory_iterator(dir.path() / "sub"))
    EXPECT_EQ(f.path().filename(), "stage_times.tsv");
  // What a table cannot hold is refused.
  expect_error_with([&] { cache.put(entry(key(LayerKind::dense), 0)); }, {"seconds 0", "no failure"});
  expect_error_with([&] { cache.put(entry(key(LayerKind::dense), 1, "why")); }, {"expected a time > 0"});
  expect_error_with([&] { cache.put(entry(key(LayerKind::dense), 1, "a\tb")); }, {"tab"});
}

TEST(StageTimes, ForeignOrDamagedCacheIsRefusedNamingTheFile) {
  TempDir dir;
  StageTimeCache good(dir.file("good.tsv"));
  good.put(entry(key(LayerKind::dense), 0.01));
  const std::string text = good.text();
  const std::string header = text.substr(0, text.find('\n', text.find('\n') + 1) + 1);
  const std::string row = text.substr(header.size());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"foreign.tsv", "step\tloss\n1\t2.5\n"},
      {"empty.tsv", ""},
      {"columns.tsv", header.substr(0, header.find('\n') + 1) + "gpu\tmodel\n"},
      {"fields.tsv", header + "NVIDIA H200\tx\tfp8\n"},
      {"kind.tsv", header + "NVIDIA H200\tm\tfp8\tnone\tattention\t1\t1\t64\t0.1\t\n"},
      {"number.tsv", header + "NVIDIA H200\tm\tfp8\tnone\tmoe\tsixteen\t1\t64\t0.1\t\n"},
      {"range.tsv", header + "NVIDIA H200\tm\tfp8\tnone\tmoe\t0\t1\t64\t0.1\t\n"},
      {"disagree.tsv", header + "NVIDIA H200\tm\tfp8\tnone\tmoe\t1\t1\t64\t0\t\n"},
      {"twice.tsv", header + row + row},
  };
  for (const auto& [name, body] : bad) {
    const std::string path = dir.write(name, body);
    expect_error_with([&] { StageTimeCache::load(path); }, {"--cache '" + path + "'", "not a stage-time table"});
  }
  EXPECT_NO_THROW(StageTimeCache::load(dir.write("fine.tsv", text)));
  EXPECT_NO_THROW(StageTimeCache::load(dir.write("blank.tsv", header + "\n" + row + "\n")));  // an entry deleted
}

TEST(StageTimes, ModelShapeHashNamesTheShapeNotTheRecipeOrName) {
  TrainerConfig a = tiny(), b = tiny();
  b.recipe = paper_recipe(Recipe::mxfp4);
  b.model.name = "other";
  b.recompute.modules = {"moe"};
  EXPECT_EQ(model_shape_hash(a), model_shape_hash(b));
  EXPECT_EQ(model_shape_hash(a).size(), 16u);
  b.moe.expert_ffn *= 2;
  EXPECT_NE(model_shape_hash(a), model_shape_hash(b));
  EXPECT_EQ(policy_key({}), "none");
  EXPECT_EQ(policy_key({"moe_act", "mla_up_proj"}), "moe_act mla_up_proj");
}

TEST(StageTimes, MeasuresEachRecipesTopAndTheBestOfEachPolicy) {
  const PlanResult result = plan_layouts(tiny_request(8));
  const std::vector<size_t> chosen = candidates_to_measure(result, 2);
  // Every recipe's first two, and for each (recipe, policy) its first candidate; nothing else.
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    const PlanCandidate& c = result.fitting[i];
    int64_t rank = 0;
    bool first_of_policy = true;
    for (size_t j = 0; j < i; ++j) {
      rank += result.fitting[j].recipe == c.recipe;
      first_of_policy = first_of_policy && !(result.fitting[j].recipe == c.recipe && result.fitting[j].policy == c.policy);
    }
    const bool expected = rank < 2 || first_of_policy;
    EXPECT_EQ(std::find(chosen.begin(), chosen.end(), i) != chosen.end(), expected) << i;
  }
  EXPECT_GE(chosen.size(), 2u * 3u);  // 2 recipes x 3 policies at least
  expect_error_with([&] { candidates_to_measure(result, 0); }, {"--measure-top must be >= 1"});
}

TEST(StageTimes, KeysAreDeduplicatedAndTheHeadFollowsItsBase) {
  const PlanRequest r = tiny_request(8);
  const PlanResult result = plan_layouts(r);
  const std::vector<size_t> chosen = candidates_to_measure(result, 3);
  const std::vector<StageTimeKey> keys = keys_to_measure(result, chosen, r, "GPU");
  ASSERT_GE(keys.size(), 3u);
  EXPECT_EQ(keys[0].kind, LayerKind::dense);  // tiny has a dense layer: the head's base
  EXPECT_EQ(keys[1].kind, LayerKind::head);
  EXPECT_EQ(&head_base_key(keys), &keys[0]);
  EXPECT_EQ(std::count_if(keys.begin(), keys.end(), [](const StageTimeKey& k) { return k.kind == LayerKind::head; }), 1);
  for (size_t i = 0; i < keys.size(); ++i)
    for (size_t j = 0; j < i; ++j) EXPECT_FALSE(keys[i] == keys[j]) << keys[i].text();
  // Every candidate chosen finds its dense and moe keys among them.
  for (size_t i : chosen) {
    const PlanCandidate& c = result.fitting[i];
    EXPECT_TRUE(std::any_of(keys.begin(), keys.end(), [&](const StageTimeKey& k) {
      return k.kind == LayerKind::moe && k.ep == c.layout.ep && k.recipe == recipe_name(c.recipe);
    })) << c.layout.name;
  }
}

TEST(StageTimes, MeasuredCandidatesRankFirstAndFailuresKeepTheModel) {
  const PlanRequest r = tiny_request(8);
  PlanResult result = plan_layouts(r);
  const std::vector<size_t> chosen = candidates_to_measure(result, 2);
  const std::vector<StageTimeKey> keys = keys_to_measure(result, chosen, r, "GPU");
  // Every key measured at 1 ms (dense), 2 ms (moe), 0.5 ms (head), except mxfp4's moe keys, which failed.
  StageTimeCache cache("unused.tsv");
  for (const StageTimeKey& k : keys) {
    if (k.kind == LayerKind::moe && k.recipe == "mxfp4") cache.put(entry(k, 0, "fp4moe train exit 1: out of memory"));
    else cache.put(entry(k, k.kind == LayerKind::dense ? 1e-3 : k.kind == LayerKind::moe ? 2e-3 : 0.5e-3));
  }
  const PlanResult modelled = result;
  apply_measured_times(result, chosen, r, cache, "GPU");
  ASSERT_EQ(result.fitting.size(), modelled.fitting.size());
  size_t measured = 0;
  bool seen_modelled = false;
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    const PlanCandidate& c = result.fitting[i];
    const bool is_measured = c.compute_source != "modelled";
    EXPECT_FALSE(is_measured && seen_modelled) << "a measured candidate after a modelled one at " << i;
    seen_modelled = seen_modelled || !is_measured;
    if (i > 0 && (result.fitting[i - 1].compute_source != "modelled") == is_measured) {
      EXPECT_GE(result.fitting[i - 1].step.tokens_per_s_per_gpu, c.step.tokens_per_s_per_gpu);
    }
    if (c.recipe == Recipe::mxfp4) {
      EXPECT_EQ(c.compute_source, "modelled");
      continue;
    }
    if (!is_measured) continue;
    ++measured;
    // The slowest stage's compute is the composition of the table, divided by tp.
    const TrainerConfig cfg = candidate_config(r, c.recipe, paper_recompute_policies()[0].modules);
    const std::vector<double> t = stage_compute_seconds(cfg, c.layout, 1e-3, 2e-3, 0.5e-3);
    EXPECT_NEAR(c.step.slowest.compute_s, t[static_cast<size_t>(c.step.slowest_stage)], 1e-15) << c.layout.name;
    EXPECT_EQ(c.compute_source, c.layout.tp > 1 ? "measured/tp" : "measured");
    EXPECT_TRUE(c.compute_note.empty());
  }
  EXPECT_GE(measured, 3u);  // bf16's candidates
  // mxfp4's chosen candidates say why they kept the model.
  size_t noted = 0;
  for (const PlanCandidate& c : result.fitting)
    if (!c.compute_note.empty()) {
      ++noted;
      EXPECT_NE(c.compute_note.find("out of memory"), std::string::npos) << c.compute_note;
      EXPECT_EQ(c.recipe, Recipe::mxfp4);
    }
  EXPECT_GE(noted, 3u);
  // result.all carries the same numbers; the report shows the compute source and the notes.
  for (const PlanCandidate& a : result.all)
    for (const PlanCandidate& f : result.fitting)
      if (a.recipe == f.recipe && a.policy == f.policy && a.layout.name == f.layout.name) {
        EXPECT_EQ(a.step.tokens_per_s_per_gpu, f.step.tokens_per_s_per_gpu);
      }
  PlanRequest shown = r;
  shown.measured_on = "GPU";
  const std::string report = format_plan(result, shown, 100);
  for (const char* part : {"Compute measured on the local GPU", "| measured/tp |", "| modelled |",
                           "not measured, modelled instead", "out of memory"})
    EXPECT_NE(report.find(part), std::string::npos) << part << " not in:\n" << report;
  const Table table = plan_table(result, shown);
  ASSERT_EQ(table.column("compute_source").str.size(), result.all.size());
  // Each candidate's rank is its place among its recipe's fitting candidates, measured ones first.
  for (size_t i = 0; i < result.all.size(); ++i) {
    const PlanCandidate& a = result.all[i];
    int64_t place = 0;
    for (const PlanCandidate& f : result.fitting) {
      if (f.recipe != a.recipe) continue;
      ++place;
      if (f.policy == a.policy && f.layout.name == a.layout.name) break;
    }
    EXPECT_EQ(table.column("rank").i64[i], place) << a.layout.name;
    EXPECT_EQ(table.column("compute_source").str[i], a.compute_source);
  }
}

TEST(StageTimes, TpAboveOneDividesTheMeasuredTime) {
  PlanRequest r = tiny_request(8);
  r.tp_values = {2};
  PlanResult result = plan_layouts(r);
  ASSERT_FALSE(result.fitting.empty());
  const std::vector<size_t> chosen = {0};
  StageTimeCache cache("unused.tsv");
  for (const StageTimeKey& k : keys_to_measure(result, chosen, r, "GPU")) cache.put(entry(k, 4e-3));
  const ParallelLayout lay = result.fitting[0].layout;
  ASSERT_EQ(lay.tp, 2);
  apply_measured_times(result, chosen, r, cache, "GPU");
  const PlanCandidate& c = result.fitting[0];
  EXPECT_EQ(c.compute_source, "measured/tp");
  // tiny: 1 dense + 1 MoE layer; every piece 4 ms; the slowest stage's compute is its pieces x 4 ms / 2.
  const std::vector<int64_t> counts = stage_layer_counts(r.model, lay);
  const double last = (static_cast<double>(counts.back()) + 1) * 4e-3 / 2;
  EXPECT_NEAR(c.step.slowest.compute_s, lay.pp == 1 ? last : std::max(counts[0] * 4e-3 / 2, last), 1e-15);
}

TEST(StageTimes, MeasuringLoopRecordsFailuresAndHitsTheCacheTheSecondTime) {
  TempDir dir;
  const PlanRequest r = tiny_request(8);
  const PlanResult result = plan_layouts(r);
  const std::vector<size_t> chosen = candidates_to_measure(result, 1);
  const std::vector<StageTimeKey> keys = keys_to_measure(result, chosen, r, "GPU");
  MeasureSettings settings;
  settings.work_dir = dir.path().string();
  // A stand-in for the GPU: the middle stage of a dense layer 3 ms, the last 4 ms; MoE layers 5 ms, except under
  // mxfp4, which fails.
  int64_t runs = 0;
  MeasureFn fake = [&](const TrainerConfig& cfg, const std::string&) {
    ++runs;
    EXPECT_EQ(cfg.model.layers, 3);
    EXPECT_EQ(cfg.parallel.pp, 3);
    EXPECT_EQ(cfg.parallel.tp, 1);
    EXPECT_EQ(cfg.train.grad_accum, cfg.parallel.micro_batches);
    const bool moe = cfg.model.n_dense_layers == 0;
    if (moe && cfg.recipe.routed_experts == Recipe::mxfp4) throw Error("fp4moe train exit 1: out of memory");
    if (moe) return 5e-3;
    return cfg.parallel.stage == 2 ? 4e-3 : 3e-3;
  };
  StageTimeCache cache(dir.file("times.tsv"));
  std::vector<int64_t> progress;
  const int64_t measured = measure_stage_times(r.model, keys, cache, settings, fake,
                                               [&](int64_t done, int64_t total, const StageTimeKey&) {
                                                 progress.push_back(done);
                                                 EXPECT_EQ(total, static_cast<int64_t>(keys.size()));
                                               });
  EXPECT_EQ(measured, static_cast<int64_t>(keys.size()));
  EXPECT_EQ(runs, measured) << cache.text();
  EXPECT_EQ(progress.back(), measured);
  const StageTimeCache saved = StageTimeCache::load(dir.file("times.tsv"));
  for (const StageTimeKey& k : keys) {
    const StageTimeEntry* e = saved.find(k);
    ASSERT_NE(e, nullptr) << k.text();
    if (k.kind == LayerKind::head) EXPECT_NEAR(e->seconds, 1e-3, 1e-15);  // last 4 ms - middle 3 ms
    else if (k.kind == LayerKind::dense) EXPECT_EQ(e->seconds, 3e-3);
    else if (k.recipe == "mxfp4") EXPECT_NE(e->failure.find("out of memory"), std::string::npos);
    else EXPECT_EQ(e->seconds, 5e-3);
  }
  // A second run over the saved cache measures nothing.
  StageTimeCache again = StageTimeCache::load(dir.file("times.tsv"));
  EXPECT_EQ(measure_stage_times(r.model, keys, again, settings, fake), 0);
  EXPECT_EQ(runs, measured);
}

TEST(StageTimes, ChildConfigurationReadsBackAndIsTheTinyPipeline) {
  TempDir dir;
  const TrainerConfig v3 = production_preset("v3").config;
  MeasureSettings settings;
  StageTimeKey k = key(LayerKind::moe, 16, "mxfp4");
  k.policy = "moe_act mla_up_proj";
  const TrainerConfig cfg = measurement_config(v3, k, false, settings);
  EXPECT_EQ(cfg.model.layers, 3);
  EXPECT_EQ(cfg.model.n_dense_layers, 0);
  EXPECT_EQ(cfg.model.hidden, v3.model.hidden);
  EXPECT_EQ(cfg.parallel.ep, 16);
  EXPECT_EQ(cfg.parallel.stage, 1);
  EXPECT_EQ(cfg.recipe.routed_experts, Recipe::mxfp4);
  EXPECT_EQ(cfg.recompute.modules, (std::vector<std::string>{"moe_act", "mla_up_proj"}));
  const std::string text = trainer_config_toml(cfg);
  const TrainerConfig back = parse_config_args({"--config", dir.write("child.toml", text)});
  EXPECT_EQ(trainer_config_toml(back), text);
  EXPECT_EQ(model_config_text(back), model_config_text(cfg));

  const TrainerConfig last = measurement_config(tiny(), key(LayerKind::dense), true, settings);
  EXPECT_EQ(last.model.n_dense_layers, 3);
  EXPECT_EQ(last.parallel.stage, 2);
  EXPECT_EQ(last.parallel.ep, 1);
  TrainerConfig no_dense = tiny();
  no_dense.model.n_dense_layers = 0;
  expect_error_with([&] { measurement_config(no_dense, key(LayerKind::dense), false, settings); },
                    {"no dense layer"});
}

TEST(StageTimes, ChildFailureIsOneLineWithItsExitCodeAndLastLine) {
  // A stand-in executable: records its arguments, prints progress and the trainer's error line, exits 1.
  TempDir dir;
  const std::string exe = dir.write("fake_fp4moe", "#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/argv\"\n"
                                                   "echo 'step 1/4' >&2\necho 'fp4moe train: failed: out of memory' >&2\n"
                                                   "exit 1\n");
  std::filesystem::permissions(exe, std::filesystem::perms::owner_all);
  MeasureSettings settings;
  settings.exe = exe;
  settings.work_dir = dir.path().string();
  const TrainerConfig cfg = measurement_config(tiny(), key(LayerKind::dense), false, settings);
  expect_error_with([&] { run_stage_measurement(cfg, settings, "m0"); },
                    {"fp4moe train exit 1: fp4moe train: failed: out of memory"});
  std::ifstream in(dir.file("argv"));
  std::string argv((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string& part : std::vector<std::string>{"train --config " + dir.file("m0.toml"), "--synthetic-data",
                                                          "--out " + dir.file("m0.h5"), "--run measure"})
    EXPECT_NE(argv.find(part), std::string::npos) << part << " not in: " << argv;
  // The configuration it was given reads back as the measured one.
  EXPECT_EQ(trainer_config_toml(parse_config_args({"--config", dir.file("m0.toml")})), trainer_config_toml(cfg));
  settings.exe = dir.file("missing");
  expect_error_with([&] { run_stage_measurement(cfg, settings, "m1"); }, {"cannot start", "missing"});
}

TEST(StageTimes, ChildResultIsTheMedianTimedStepOverItsMicroBatches) {
  // A stand-in executable that copies a prepared result file to --out: one warm-up step, then timed steps of 10, 30
  // and 20 ms for 4 micro-batches of 1 x 4096 tokens: the median step 20 ms, 5 ms per micro-batch.
  TempDir dir;
  MeasureSettings settings;
  settings.work_dir = dir.path().string();
  const TrainerConfig cfg = measurement_config(tiny(), key(LayerKind::dense), false, settings);
  ASSERT_EQ(cfg.train.tokens_per_step(), 4096 * 4);
  TrainMetrics metrics("measure", {}, "train", EnvInfo{});
  const double tokens = static_cast<double>(cfg.train.tokens_per_step());
  const double step_s[] = {1.0, 10e-3, 30e-3, 20e-3};
  for (int i = 0; i < 4; ++i) {
    StepRecord r;
    r.step = i + 1;
    r.tokens_per_s = tokens / step_s[i];
    metrics.add_step(r);
  }
  metrics.write(dir.file("prepared.h5"));
  settings.exe = dir.write("fake_fp4moe", "#!/bin/sh\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = --out ]; then cp '" +
                                              dir.file("prepared.h5") + "' \"$2\"; fi\n  shift\ndone\n");
  std::filesystem::permissions(settings.exe, std::filesystem::perms::owner_all);
  EXPECT_NEAR(run_stage_measurement(cfg, settings, "m0"), 5e-3, 1e-12);
  // Fewer steps than timed: refused naming the file.
  TrainMetrics short_run("measure", {}, "train", EnvInfo{});
  StepRecord r;
  r.step = 1;
  r.tokens_per_s = tokens;
  short_run.add_step(r);
  short_run.write(dir.file("prepared.h5"));
  expect_error_with([&] { run_stage_measurement(cfg, settings, "m1"); }, {"m1.h5' holds 1 steps, expected 4"});
}

TEST(LayoutPlanConfig, ParallelSectionOfTheConfigIsReplacedNotEnforced) {
  // A trainer configuration whose [parallel] section breaks the trainer's grad_accum = micro_batches rule: the
  // plan enumerates its own layouts, so only the section's global batch (micro_batches x dp x micro_batch) is read.
  TempDir dir;
  std::ifstream in(test::preset("tiny"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text += "\n[parallel]\ntp = 1\npp = 2\ndp = 2\nep = 1\nmicro_batches = 8\n";
  const std::string path = dir.write("tiny_pp2.toml", text);
  expect_error_with([&] { parse_config_args({"--config", path}); }, {"train.grad_accum = 1 must equal"});
  int64_t global_batch = 0;
  const TrainerConfig cfg = plan_config_from_file(path, global_batch);
  EXPECT_EQ(global_batch, 8 * 2 * 4);
  EXPECT_EQ(cfg.parallel.gpus(), 1);
  EXPECT_EQ(cfg.model.hidden, 64);
}

TEST(LayoutPlanConfig, NoLayoutOfTheGpuCountIsExplained) {
  PlanRequest r;
  const ProductionPreset v3 = production_preset("v3");
  r.model = v3.config;
  r.title = v3.title;
  r.gpus = 255;  // 3 x 5 x 17: dp 255, 85, 51 or 17, none dividing 15360 sequences
  r.memory_gib = 80;
  r.micro_batch = 1;
  r.seq_len = 4096;
  r.global_batch = v3.global_batch;
  r.recipes = {Recipe::mxfp4};
  ASSERT_TRUE(enumerate_layouts(r).empty());
  const std::string why = explain_no_layout(r);
  for (const char* part : {"no layout of 255 GPUs exists", "tp x pp x dp = 255", "dp of them (255, 85, 51, 17)",
                           "global batch of 15360"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " not in: " << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace fp4moe
