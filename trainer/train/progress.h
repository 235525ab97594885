// Progress output of `fp4moe train`: on a terminal one line updated in place after every step, otherwise one plain
// line every log_interval steps (logs, CI). Evaluations, checkpoints and skipped steps print lines of their own.
// The formatting is a pure function (format_progress_line) so that it can be tested without a terminal.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace fp4moe {

// What one progress line shows.
struct ProgressInfo {
  int64_t step = 0;           // steps completed (1-based: the step just finished)
  int64_t steps = 0;          // train.steps
  double loss = 0;            // this step's training loss (nats/token)
  double lr = 0;              // this step's learning rate
  double tokens_per_s = 0;    // per GPU, this step
  double mfu = 0;             // model FLOPs utilization, 0..1
  double peak_total_gib = 0;  // peak device memory of the step (GiB, 2^30 bytes)
  double eta_s = -1;          // seconds left; negative or not finite: unknown
  int64_t skipped = 0;        // steps skipped so far (non-finite loss or gradient norm), StepRecord::skipped
};

// "step 12/200 | loss 7.4132 | lr 3.00e-04 | 41.2K tok/s | mfu 12.3% | peak 1.23 GiB | eta 3m12s", with
// " | skipped 2" appended when skipped > 0. The step is padded to the width of `steps`; a non-finite loss prints
// as nan or inf.
std::string format_progress_line(const ProgressInfo& p);

// A duration for humans: "45s", "3m12s", "2h05m", "3d04h"; "?" for a negative or non-finite value.
std::string format_duration(double seconds);

// A rate with an SI suffix and three significant digits: 950 -> "950", 41234 -> "41.2K", 1.5e6 -> "1.50M".
std::string format_rate(double per_second);

// Writes progress to `out` (null: nothing). `terminal`: redraw one line with '\r' and erase-to-end-of-line;
// otherwise print a line at each step that is a multiple of log_interval and at the last step.
class ProgressPrinter {
 public:
  ProgressPrinter(std::FILE* out, bool terminal, int64_t log_interval);
  // True when `out` is a terminal (isatty).
  static bool is_terminal(std::FILE* out);

  void step(const ProgressInfo& p);
  // A line of its own (evaluation, checkpoint, skipped step, interruption), printed below the progress line (which
  // stays on screen as a record of where the run was).
  void message(const std::string& text);
  // Ends the updating line (a newline if one is shown). Call before the program's last output.
  void finish();

 private:
  void end_line();  // terminal: keeps the progress line on screen and moves below it
  std::FILE* out_;
  bool terminal_;
  int64_t log_interval_;
  bool line_shown_ = false;  // terminal: a progress line without its newline is on screen
};

}  // namespace fp4moe
