// SIGINT and SIGTERM during training: the first one asks the loop to stop after the current step (which then
// writes a checkpoint and the metrics file, so no progress is lost); a second one of the same kind ends the
// process at once (the default action).
#pragma once

namespace fp4moe {

// Installs the handlers for its lifetime and restores the previous ones when destroyed. One at a time per process
// (a second live instance throws fp4moe::Error). Not for use from several threads.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (SIGINT or SIGTERM), or 0.
  static int pending();
};

// "SIGINT", "SIGTERM", or "a signal" for any other number.
const char* stop_signal_name(int sig);

}  // namespace fp4moe
