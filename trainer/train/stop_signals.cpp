#include "trainer/train/stop_signals.h"

#include <csignal>

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

volatile std::sig_atomic_t g_pending = 0;
bool g_installed = false;
struct sigaction g_old_int, g_old_term;

extern "C" void on_stop_signal(int sig) {
  if (g_pending == sig) {  // the second one: the default action (terminate)
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (g_pending == 0) g_pending = sig;
}

}  // namespace

StopSignals::StopSignals() {
  FP4MOE_CHECK(!g_installed, "StopSignals: the handlers are already installed");
  g_pending = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  FP4MOE_CHECK(sigaction(SIGINT, &sa, &g_old_int) == 0, "cannot install the SIGINT handler");
  if (sigaction(SIGTERM, &sa, &g_old_term) != 0) {
    sigaction(SIGINT, &g_old_int, nullptr);
    FP4MOE_CHECK(false, "cannot install the SIGTERM handler");
  }
  g_installed = true;
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

int StopSignals::pending() { return g_pending; }

const char* stop_signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  return "a signal";
}

}  // namespace fp4moe
