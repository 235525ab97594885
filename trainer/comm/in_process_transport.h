// N simulated ranks of an expert-parallel group inside one process on one device (transport.h), for tests and
// simulations only (never a training run's transport: the ranks share one GPU, so nothing here measures an
// interconnect): NCCL refuses two ranks on one GPU, so the multi-rank logic (counts, routing tables, payload
// packing, combine order) runs here with each rank on its own host thread and its own stream, all on one device
// (run_in_process_ranks below starts them). Users: the GPU tests over ranks, and benchmarks/bench_ep_comm.cu, which
// counts the bytes every exchange of a simulated step moved (exchange_rounds).
//
// An exchange or an all-reduce is a rendezvous: each rank posts its call (its peers list, or its FP32 buffer and
// count) and an event recorded on its stream; the last rank to post checks that the calls agree (all exchanges or all
// all-reduces; bytes s sends to r == bytes r receives from s; one count; else every rank's call throws fp4moe::Error
// naming the pair or the counts), makes its stream wait for every poster's event, issues the transfer on its stream
// (an exchange: the device-to-device copies, cudaMemcpyAsync, one per non-empty pair; an all-reduce: rank_sum_device,
// rank_sum.h, over every rank's buffer) and records a completion event that every rank's stream then waits for. A
// rank whose call throws (or any caller, through abort()) marks the group failed: every rank blocked in or later
// entering exchange() throws instead of waiting. A rendezvous that does not complete within the timeout throws
// (naming the ranks that did not post): bounded, never a hang. wait() is cudaStreamSynchronize.
// The group logs the bytes each exchange round copied (take_exchange_rounds), counted where the copies are issued:
// the transport's own count, apart from the callers' (EpExchange::bytes, from the peers lists they post).
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/check.h"
#include "trainer/comm/transport.h"

namespace fp4moe {

class InProcessGroup {
 public:
  // world_size >= 1 simulated ranks (else fp4moe::Error); timeout bounds each rendezvous.
  explicit InProcessGroup(int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int world_size() const { return world_size_; }
  // Marks the group failed with `why`; every pending and later exchange throws it.
  void abort(const std::string& why);
  // One rank's exchange (InProcessTransport::exchange).
  EpExchangeBytes exchange(int rank, const std::vector<EpPeerBuffers>& peers, cudaStream_t stream);
  // One rank's all-reduce (InProcessTransport::all_reduce_sum).
  void all_reduce_sum(int rank, float* data, int64_t n, cudaStream_t stream);
  // The bytes of every exchange round completed since the last call, in round order, and clears the log: per round
  // `sent` (= `received`) the bytes copied between distinct ranks, summed over every ordered pair, and `to_self`
  // the bytes every rank copied to itself, as the round's copies were issued (all-reduces are not logged). Call it
  // between rounds (e.g. after the ranks' threads ended).
  std::vector<EpExchangeBytes> take_exchange_rounds();

 private:
  // One rank's call of a round: an exchange (peers) or an all-reduce (data, n).
  struct Post {
    bool reduce = false;
    std::vector<EpPeerBuffers> peers;
    float* data = nullptr;
    int64_t n = 0;
  };
  void rendezvous(int rank, Post post, cudaStream_t stream);  // posts; the last poster transfers; all wait for it
  void transfer_locked(cudaStream_t stream);  // the last poster's part: checks, copies or sum, completion event

  int world_size_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Post> posted_;                         // [rank]: this round's calls
  std::vector<cudaEvent_t> ready_;                  // [rank]: recorded on the poster's stream at posting
  std::vector<bool> has_posted_;
  int posted_count_ = 0;
  uint64_t round_ = 0;                              // completed rendezvous
  cudaEvent_t done_ = nullptr;                      // recorded after the copies of the last round
  std::string failure_;                             // non-empty: the group failed
  std::vector<EpExchangeBytes> rounds_;             // bytes of each exchange round since take_exchange_rounds
};

class InProcessTransport : public EpTransport {
 public:
  // Rank `rank` of `group` (0 <= rank < group.world_size(), else fp4moe::Error); the group outlives it.
  InProcessTransport(InProcessGroup& group, int rank);
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }
  EpExchangeBytes exchange(const std::vector<EpPeerBuffers>& peers, cudaStream_t stream) override;
  void all_reduce_sum(float* data, int64_t n, cudaStream_t stream) override;
  void wait(cudaStream_t stream) override;

 private:
  InProcessGroup* group_;
  int rank_;
};

// Runs fn(transport) -> R on every rank of `group`: rank r on its own host thread with its own InProcessTransport
// (fn receives it as EpTransport&), every thread on the caller's current device; returns the ranks' results in rank
// order once every thread has ended. R must be default-constructible. A rank whose fn throws aborts the group (the
// others' collectives then throw instead of waiting); after the threads end, fp4moe::Error names every rank that
// failed with its message. For tests and simulations (above).
template <typename R, typename F>
std::vector<R> run_in_process_ranks(InProcessGroup& group, F&& fn) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int N = group.world_size();
  std::vector<R> out(static_cast<size_t>(N));
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      try {
        CUDA_CHECK(cudaSetDevice(device));
        InProcessTransport t(group, r);
        out[static_cast<size_t>(r)] = fn(static_cast<EpTransport&>(t));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        group.abort(fmt::format("rank {}: {}", r, e.what()));
      }
    });
  for (std::thread& th : threads) th.join();
  std::string failed;
  int failures = 0;
  for (int r = 0; r < N; ++r)
    if (!errors[static_cast<size_t>(r)].empty()) {
      failed += fmt::format("\n  rank {}: {}", r, errors[static_cast<size_t>(r)]);
      ++failures;
    }
  FP4MOE_CHECK(failures == 0, "in-process ranks: {} of {} failed:{}", failures, N, failed);
  return out;
}

}  // namespace fp4moe
