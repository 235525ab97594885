// N simulated ranks of an expert- or data-parallel group in one process (trainer/comm/in_process_transport.h), for
// the GPU tests of the exchange, the layers and the model over a transport: one host thread per rank, all on the
// current device.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "kernels/common/check.h"
#include "trainer/comm/in_process_transport.h"

namespace fp4moe::test {

// Runs fn(transport) for ranks 0..N-1 of a fresh InProcessGroup (run_in_process_ranks) and returns their results in
// rank order. A rank that throws aborts the group (the others' collectives then throw instead of waiting) and fails
// the test with every failed rank's message; the results are then R{}.
template <typename R, typename F>
std::vector<R> run_simulated_ranks(int N, F&& fn, std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  InProcessGroup group(N, timeout);
  try {
    return run_in_process_ranks<R>(group, fn);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  return std::vector<R>(static_cast<size_t>(N));
}

}  // namespace fp4moe::test
