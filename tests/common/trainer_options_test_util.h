// TrainerOptions (trainer/train/options.h) of the GPU tests that run the Trainer: seeded synthetic tokens, no log
// and no signal handlers (a test process holds several Trainers, some on threads), the run named "tiny".
#pragma once

#include <string>

#include "trainer/train/options.h"

namespace fp4moe::test {

// The options above, the result file at out_path ("": none written).
inline TrainerOptions quiet_options(const std::string& out_path = "") {
  TrainerOptions o;
  o.synthetic_data = true;
  o.log = nullptr;
  o.handle_signals = false;
  o.run_name = "tiny";
  o.out_path = out_path;
  return o;
}

}  // namespace fp4moe::test
