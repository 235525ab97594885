#include "trainer/train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

#include "kernels/common/check.h"

namespace fp4moe {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = std::llround(seconds);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02d}h", s / 86400, (s % 86400) / 3600);
}

std::string format_rate(double v) {
  if (!std::isfinite(v)) return fmt::format("{}", v);
  const char* suffix[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (std::fabs(v) >= 999.5 && i < 4) {
    v /= 1000.0;
    ++i;
  }
  if (i == 0) return fmt::format("{:.0f}", v);
  return fmt::format("{:.{}f}{}", v, std::fabs(v) >= 99.95 ? 0 : std::fabs(v) >= 9.995 ? 1 : 2, suffix[i]);
}

std::string format_progress_line(const ProgressInfo& p) {
  const int width = static_cast<int>(fmt::format("{}", p.steps).size());
  std::string s = fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | {} tok/s | mfu {:.1f}% | peak {:.2f} GiB | "
                              "eta {}",
                              p.step, width, p.steps, p.loss, p.lr, format_rate(p.tokens_per_s), 100.0 * p.mfu,
                              p.peak_total_gib, format_duration(p.eta_s));
  if (p.skipped > 0) s += fmt::format(" | skipped {}", p.skipped);
  return s;
}

ProgressPrinter::ProgressPrinter(std::FILE* out, bool terminal, int64_t log_interval)
    : out_(out), terminal_(terminal), log_interval_(log_interval) {
  FP4MOE_CHECK(log_interval >= 1, "progress: log_interval must be >= 1, got {}", log_interval);
}

bool ProgressPrinter::is_terminal(std::FILE* out) { return out != nullptr && ::isatty(::fileno(out)) == 1; }

void ProgressPrinter::end_line() {
  if (line_shown_) std::fputc('\n', out_);
  line_shown_ = false;
}

void ProgressPrinter::step(const ProgressInfo& p) {
  if (!out_) return;
  if (terminal_) {
    std::fprintf(out_, "\r%s\x1b[K", format_progress_line(p).c_str());
    line_shown_ = true;
  } else if (p.step % log_interval_ == 0 || p.step == p.steps) {
    std::fprintf(out_, "%s\n", format_progress_line(p).c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::message(const std::string& text) {
  if (!out_) return;
  end_line();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (!out_) return;
  end_line();
  std::fflush(out_);
}

}  // namespace fp4moe
