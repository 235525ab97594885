// The metrics file of a training run (trainer/train/metrics.h) on a fake run, read back with results/h5_read.h:
// the step and eval tables, the configuration attributes of /train/<run>, the memory peaks, the root attributes;
// carrying an earlier file's rows into a resumed run; the run-name rule.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "results/h5_file.h"
#include "results/h5_read.h"
#include "trainer/config.h"
#include "trainer/train/metrics.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::TempDir;

StepRecord fake_step(int64_t step) {
  StepRecord r;
  r.step = step;
  r.tokens = 256 * step;
  r.loss = 10.0 - 0.5 * static_cast<double>(step);
  r.lr = 1e-3 * static_cast<double>(step);
  r.grad_norm = 1.0 / static_cast<double>(step);
  r.tokens_per_s = 1000.0 + static_cast<double>(step);
  r.mfu = 0.01 * static_cast<double>(step);
  r.peak_act_gib = 0.25;
  r.peak_total_gib = 1.5;
  r.skipped = step >= 2 ? 1 : 0;  // step 2 was skipped
  r.all_to_all_sent_bytes = 1000 * step;
  r.all_to_all_received_bytes = 900 * step;
  r.all_to_all_to_self_bytes = 100 * step;
  r.all_to_all_ms = 0.5 * static_cast<double>(step);
  return r;
}

EnvInfo fake_env() {
  EnvInfo env;
  env.driver = "none";
  env.cuda_runtime = "13.0";
  env.host = "test-host";
  return env;
}

TrainMetrics fake_run(const TrainerConfig& cfg, int64_t steps) {
  TrainMetrics m("tiny", train_run_attributes(cfg), "fp4moe train --config configs/tiny.toml", fake_env());
  m.set_attribute("synthetic_data", int64_t{1});
  for (int64_t s = 1; s <= steps; ++s) m.add_step(fake_step(s));
  m.add_eval({2, 512, 6.5, 2048});
  m.add_eval({4, 1024, 6.25, 8192});
  MemoryPeaks peaks;
  for (int c = 0; c < kMemCategories; ++c) peaks.peak[c] = (size_t{1} << 20) * (c + 1);
  peaks.peak_total = size_t{3} << 30;
  peaks.budget = size_t{80} << 30;
  m.set_memory(peaks);
  return m;
}

TEST(TrainMetrics, WritesTheDocumentedLayout) {
  TempDir dir;
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny")});
  const std::string path = dir.file("run.h5");
  fake_run(cfg, 4).write(path);

  const H5Reader r(path);
  const std::string steps = "train/tiny/steps/";
  for (const char* c : {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_act_gib",
                        "peak_total_gib", "skipped", "all_to_all_sent_bytes", "all_to_all_received_bytes",
                        "all_to_all_to_self_bytes", "all_to_all_ms"})
    EXPECT_TRUE(r.has_dataset(steps + c)) << c;
  EXPECT_EQ(r.info(steps + "step").type, "int64");
  EXPECT_EQ(r.info(steps + "loss").type, "float64");
  EXPECT_EQ(r.info(steps + "skipped").type, "int64");
  EXPECT_EQ(r.read_f64(steps + "step"), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(r.read_f64(steps + "tokens"), (std::vector<double>{256, 512, 768, 1024}));
  EXPECT_EQ(r.read_f64(steps + "loss"), (std::vector<double>{9.5, 9.0, 8.5, 8.0}));
  EXPECT_EQ(r.read_f64(steps + "skipped"), (std::vector<double>{0, 1, 1, 1}));
  EXPECT_EQ(r.read_f64(steps + "lr")[2], 3e-3);
  EXPECT_EQ(r.read_f64(steps + "mfu")[3], 0.04);
  EXPECT_EQ(r.info(steps + "all_to_all_sent_bytes").type, "int64");
  EXPECT_EQ(r.info(steps + "all_to_all_ms").type, "float64");
  EXPECT_EQ(r.read_f64(steps + "all_to_all_sent_bytes"), (std::vector<double>{1000, 2000, 3000, 4000}));
  EXPECT_EQ(r.read_f64(steps + "all_to_all_received_bytes")[1], 1800);
  EXPECT_EQ(r.read_f64(steps + "all_to_all_to_self_bytes")[2], 300);
  EXPECT_EQ(r.read_f64(steps + "all_to_all_ms")[3], 2.0);
  EXPECT_EQ(r.read_f64("train/tiny/eval/step"), (std::vector<double>{2, 4}));
  EXPECT_EQ(r.read_f64("train/tiny/eval/val_loss"), (std::vector<double>{6.5, 6.25}));
  EXPECT_EQ(r.read_f64("train/tiny/eval/tokens"), (std::vector<double>{512, 1024}));
  EXPECT_EQ(r.read_f64("train/tiny/eval/val_tokens"), (std::vector<double>{2048, 8192}));

  // The configuration on /train/<run>.
  EXPECT_EQ(r.string_attribute("train/tiny", "model_config_text"), model_config_text(cfg));
  EXPECT_EQ(r.string_attribute("train/tiny", "model_config_hash"), fmt::format("{:016x}", model_config_hash(cfg)));
  EXPECT_EQ(r.string_attribute("train/tiny", "model.name"), "tiny");
  EXPECT_EQ(r.string_attribute("train/tiny", "train.non_finite"), "stop");
  EXPECT_EQ(r.string_attribute("train/tiny", "train.data_dir"), "data/cache/shards");
  EXPECT_EQ(r.string_attribute("train/tiny", "recompute.modules"), "none");

  // Memory peaks.
  EXPECT_EQ(r.info("memory/tiny/category").type, "string");
  const std::vector<double> bytes = r.read_f64("memory/tiny/peak_bytes");
  ASSERT_EQ(bytes.size(), 7u);
  for (int c = 0; c < kMemCategories; ++c) EXPECT_EQ(bytes[c], static_cast<double>((size_t{1} << 20) * (c + 1)));
  EXPECT_EQ(bytes[6], static_cast<double>(size_t{3} << 30));
  EXPECT_EQ(r.read_f64("memory/tiny/peak_gib")[6], 3.0);

  // Root attributes (results/run_info.h).
  EXPECT_EQ(r.string_attribute("/", "command"), "fp4moe train --config configs/tiny.toml");
  EXPECT_EQ(r.string_attribute("/", "host"), "test-host");
  EXPECT_TRUE(r.string_attribute("/", "git_sha").has_value());
}

TEST(TrainMetrics, NonFiniteLossesRoundTrip) {
  TempDir dir;
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny")});
  TrainMetrics m("r", train_run_attributes(cfg), "", fake_env());
  StepRecord s = fake_step(1);
  s.loss = NAN;
  s.grad_norm = INFINITY;
  m.add_step(s);
  m.write(dir.file("nan.h5"));
  const H5Reader r(dir.file("nan.h5"));
  EXPECT_TRUE(std::isnan(r.read_f64("train/r/steps/loss")[0]));
  EXPECT_TRUE(std::isinf(r.read_f64("train/r/steps/grad_norm")[0]));
  EXPECT_TRUE(r.read_f64("train/r/eval/step").empty());
}

TEST(TrainMetrics, ResumedRunCarriesTheEarlierRowsUpToItsStep) {
  TempDir dir;
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny")});
  const std::string path = dir.file("run.h5");
  fake_run(cfg, 4).write(path);

  TrainMetrics resumed("tiny", train_run_attributes(cfg), "", fake_env());
  resumed.load_previous(path, 3);  // the checkpoint was at step 3: step 4 is trained again
  ASSERT_EQ(resumed.steps().size(), 3u);
  EXPECT_EQ(resumed.steps()[2].step, 3);
  EXPECT_EQ(resumed.steps()[1].skipped, 1);
  EXPECT_EQ(resumed.steps()[2].loss, 8.5);
  EXPECT_EQ(resumed.steps()[2].tokens, 768);
  EXPECT_EQ(resumed.steps()[2].all_to_all_sent_bytes, 3000);
  EXPECT_EQ(resumed.steps()[2].all_to_all_received_bytes, 2700);
  EXPECT_EQ(resumed.steps()[2].all_to_all_to_self_bytes, 300);
  EXPECT_EQ(resumed.steps()[2].all_to_all_ms, 1.5);
  ASSERT_EQ(resumed.evals().size(), 1u);
  EXPECT_EQ(resumed.evals()[0].val_loss, 6.5);
  EXPECT_EQ(resumed.evals()[0].val_tokens, 2048);
  expect_error_with([&] { resumed.add_step(fake_step(3)); }, {"step 3 does not follow step 3"});
  resumed.add_step(fake_step(4));
  resumed.write(path);
  EXPECT_EQ(H5Reader(path).read_f64("train/tiny/steps/step"), (std::vector<double>{1, 2, 3, 4}));

  TrainMetrics other("other_run", train_run_attributes(cfg), "", fake_env());
  other.load_previous(path, 100);  // no tables of this run: nothing
  EXPECT_TRUE(other.steps().empty());

  const std::string junk = dir.write("junk.h5", "not an HDF5 file");
  TrainMetrics bad("tiny", {}, "", fake_env());
  EXPECT_FALSE(test::error_message([&] { bad.load_previous(junk, 1); }).empty());
}

// A file written before the all-to-all columns existed: its steps carry over with those columns 0.
TEST(TrainMetrics, EarlierFilesWithoutAllToAllColumnsReadAsZero) {
  TempDir dir;
  const std::string path = dir.file("old.h5");
  Table steps;
  for (const char* c : {"step", "tokens", "skipped"}) steps.add_column(c, ColumnType::i64);
  for (const char* c : {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_act_gib", "peak_total_gib"})
    steps.add_column(c, ColumnType::f64);
  steps.add_row({int64_t{1}, int64_t{256}, int64_t{0}, 9.5, 1e-3, 1.0, 1000.0, 0.01, 0.25, 1.5});
  ResultFile f;
  f.add_table("/train/tiny/steps", std::move(steps));
  f.write(path);
  TrainMetrics resumed("tiny", {}, "", fake_env());
  resumed.load_previous(path, 1);
  ASSERT_EQ(resumed.steps().size(), 1u);
  EXPECT_EQ(resumed.steps()[0].loss, 9.5);
  EXPECT_EQ(resumed.steps()[0].all_to_all_sent_bytes + resumed.steps()[0].all_to_all_received_bytes +
                resumed.steps()[0].all_to_all_to_self_bytes, 0);
  EXPECT_EQ(resumed.steps()[0].all_to_all_ms, 0.0);
}

TEST(TrainMetrics, ConfigTextAndRunNames) {
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny"), "--train.lr", "0.002"});
  const std::string text = train_config_text(cfg);
  EXPECT_EQ(text.rfind(model_config_text(cfg), 0), 0u);
  EXPECT_NE(text.find("train.lr = 0.002\n"), std::string::npos) << text;
  EXPECT_NE(text.find("train.seed = 1234\n"), std::string::npos) << text;
  EXPECT_NE(text.find("train.tokens_per_step = 256\n"), std::string::npos) << text;
  check_run_name("tiny-bf16_2");
  for (const char* bad : {"", "a/b", ".", ".."})
    expect_error_with([&] { check_run_name(bad); }, {"run name"});
  expect_error_with([] { TrainMetrics("x/y", {}, "", EnvInfo{}); }, {"run name 'x/y'"});
}

}  // namespace
}  // namespace fp4moe
