// Progress output of the trainer (trainer/train/progress.h): the line's exact format, durations and rates, and
// what the printer writes on a terminal (one line redrawn) and elsewhere (a line every log_interval steps).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "tests/common/trainer_test_util.h"
#include "trainer/train/progress.h"

namespace fp4moe {
namespace {

ProgressInfo info(int64_t step, int64_t steps) {
  ProgressInfo p;
  p.step = step;
  p.steps = steps;
  p.loss = 7.41321;
  p.lr = 3e-4;
  p.tokens_per_s = 41234;
  p.mfu = 0.1234;
  p.peak_total_gib = 1.2345;
  p.eta_s = 192;
  return p;
}

// Everything written to a temporary FILE by f.
template <typename F>
std::string captured(F&& f) {
  std::FILE* out = std::tmpfile();
  EXPECT_NE(out, nullptr);
  f(out);
  std::fflush(out);
  std::rewind(out);
  std::string s;
  int c;
  while ((c = std::fgetc(out)) != EOF) s += static_cast<char>(c);
  std::fclose(out);
  return s;
}

TEST(TrainProgress, LineFormat) {
  EXPECT_EQ(format_progress_line(info(12, 200)),
            "step  12/200 | loss 7.4132 | lr 3.00e-04 | 41.2K tok/s | mfu 12.3% | peak 1.23 GiB | eta 3m12s");
  ProgressInfo p = info(200, 200);
  p.skipped = 2;
  p.loss = NAN;
  p.eta_s = 0;
  EXPECT_EQ(format_progress_line(p),
            "step 200/200 | loss nan | lr 3.00e-04 | 41.2K tok/s | mfu 12.3% | peak 1.23 GiB | eta 0s | skipped 2");
  p.eta_s = -1;
  EXPECT_NE(format_progress_line(p).find("eta ?"), std::string::npos);
}

TEST(TrainProgress, DurationsAndRates) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(44.6), "45s");
  EXPECT_EQ(format_duration(192), "3m12s");
  EXPECT_EQ(format_duration(2 * 3600 + 5 * 60 + 7), "2h05m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(INFINITY), "?");
  EXPECT_EQ(format_duration(NAN), "?");
  EXPECT_EQ(format_rate(0), "0");
  EXPECT_EQ(format_rate(950), "950");
  EXPECT_EQ(format_rate(1302), "1.30K");
  EXPECT_EQ(format_rate(41234), "41.2K");
  EXPECT_EQ(format_rate(412340), "412K");
  EXPECT_EQ(format_rate(1.5e6), "1.50M");
  EXPECT_EQ(format_rate(999.7), "1.00K");
}

TEST(TrainProgress, PlainOutputEveryLogIntervalAndAtTheEnd) {
  const std::string s = captured([](std::FILE* out) {
    ProgressPrinter p(out, /*terminal=*/false, /*log_interval=*/3);
    for (int64_t step = 1; step <= 7; ++step) {
      p.step(info(step, 7));
      if (step == 4) p.message("eval at step 4");
    }
    p.finish();
  });
  EXPECT_EQ(s, format_progress_line(info(3, 7)) + "\n" + "eval at step 4\n" + format_progress_line(info(6, 7)) +
                   "\n" + format_progress_line(info(7, 7)) + "\n");
  EXPECT_EQ(s.find('\r'), std::string::npos);
}

TEST(TrainProgress, TerminalRedrawsOneLine) {
  const std::string s = captured([](std::FILE* out) {
    ProgressPrinter p(out, /*terminal=*/true, /*log_interval=*/100);
    p.step(info(1, 2));
    p.message("checkpoint at step 1");
    p.step(info(2, 2));
    p.finish();
  });
  std::string expected = "\r";
  expected += format_progress_line(info(1, 2));
  expected += "\x1b[K\ncheckpoint at step 1\n\r";
  expected += format_progress_line(info(2, 2));
  expected += "\x1b[K\n";
  EXPECT_EQ(s, expected);
}

TEST(TrainProgress, NullOutputAndBadInterval) {
  ProgressPrinter quiet(nullptr, false, 1);
  quiet.step(info(1, 1));
  quiet.message("nothing");
  quiet.finish();
  EXPECT_FALSE(ProgressPrinter::is_terminal(nullptr));
  test::expect_error_with([] { ProgressPrinter(stderr, false, 0); }, {"log_interval", ">= 1"});
}

}  // namespace
}  // namespace fp4moe
