// N simulated ranks of an expert- or data-parallel group in one process (trainer/comm/in_process_transport.h), for
// the GPU tests of the layers and the model over a transport: one host thread per rank, all on the current device.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "trainer/comm/in_process_transport.h"

namespace fp4moe::test {

// Runs fn(transport) for ranks 0..N-1, each on its own thread with its InProcessTransport over one InProcessGroup,
// and returns their results in rank order. A rank that throws aborts the group (the others' collectives then throw
// instead of waiting) and fails the test with its message; its result is R{}.
template <typename R, typename F>
std::vector<R> run_simulated_ranks(int N, F&& fn, std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  InProcessGroup group(N, timeout);
  std::vector<R> out(static_cast<size_t>(N));
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      try {
        InProcessTransport t(group, r);
        out[static_cast<size_t>(r)] = fn(t);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        group.abort(e.what());
      }
    });
  for (std::thread& th : threads) th.join();
  for (int r = 0; r < N; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return out;
}

}  // namespace fp4moe::test
