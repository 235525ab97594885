#include "trainer/comm/in_process_transport.h"

#include "kernels/common/check.h"
#include "trainer/comm/rank_sum.h"

namespace fp4moe {

InProcessGroup::InProcessGroup(int world_size, std::chrono::milliseconds timeout)
    : world_size_(world_size), timeout_(timeout) {
  FP4MOE_CHECK(world_size >= 1, "InProcessGroup: world size must be >= 1, got {}", world_size);
  posted_.resize(static_cast<size_t>(world_size));
  has_posted_.assign(static_cast<size_t>(world_size), false);
  ready_.assign(static_cast<size_t>(world_size), nullptr);
  for (cudaEvent_t& e : ready_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

InProcessGroup::~InProcessGroup() {
  for (cudaEvent_t e : ready_)
    if (e) cudaEventDestroy(e);
  if (done_) cudaEventDestroy(done_);
}

void InProcessGroup::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = why;
  }
  cv_.notify_all();
}

void InProcessGroup::transfer_locked(cudaStream_t stream) {
  const Post& first = posted_.front();
  for (int r = 0; r < world_size_; ++r) {
    const Post& p = posted_[static_cast<size_t>(r)];
    FP4MOE_CHECK(p.reduce == first.reduce, "in-process group: rank {} calls {} where rank 0 calls {} (the ranks' "
                 "collectives are out of order)", r, p.reduce ? "an all-reduce" : "an exchange",
                 first.reduce ? "an all-reduce" : "an exchange");
    FP4MOE_CHECK(!p.reduce || p.n == first.n, "in-process all-reduce: rank {} sums {} values, rank 0 {}", r, p.n,
                 first.n);
  }
  if (!first.reduce)
    for (int s = 0; s < world_size_; ++s)
      for (int r = 0; r < world_size_; ++r) {
        const EpPeerBuffers& out = posted_[static_cast<size_t>(s)].peers[static_cast<size_t>(r)];
        const EpPeerBuffers& in = posted_[static_cast<size_t>(r)].peers[static_cast<size_t>(s)];
        FP4MOE_CHECK(out.send_bytes == in.recv_bytes,
                     "in-process exchange: rank {} sends {} bytes to rank {}, which expects {} from it", s,
                     out.send_bytes, r, in.recv_bytes);
      }
  for (cudaEvent_t e : ready_) CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
  if (first.reduce) {
    std::vector<float*> buffers;
    for (const Post& p : posted_) buffers.push_back(p.data);
    rank_sum_device(buffers.data(), world_size_, first.n, stream);
  } else {
    EpExchangeBytes copied;
    for (int s = 0; s < world_size_; ++s)
      for (int r = 0; r < world_size_; ++r) {
        const EpPeerBuffers& out = posted_[static_cast<size_t>(s)].peers[static_cast<size_t>(r)];
        if (out.send_bytes == 0) continue;
        CUDA_CHECK(cudaMemcpyAsync(posted_[static_cast<size_t>(r)].peers[static_cast<size_t>(s)].recv, out.send,
                                   static_cast<size_t>(out.send_bytes), cudaMemcpyDeviceToDevice, stream));
        (s == r ? copied.to_self : copied.sent) += out.send_bytes;
      }
    copied.received = copied.sent;
    rounds_.push_back(copied);
  }
  CUDA_CHECK(cudaEventRecord(done_, stream));
}

EpExchangeBytes InProcessGroup::exchange(int rank, const std::vector<EpPeerBuffers>& peers, cudaStream_t stream) {
  const EpExchangeBytes bytes = ep_exchange_bytes(peers, rank, world_size_);
  Post post;
  post.peers = peers;
  rendezvous(rank, std::move(post), stream);
  return bytes;
}

void InProcessGroup::all_reduce_sum(int rank, float* data, int64_t n, cudaStream_t stream) {
  check_all_reduce(data, n, rank);
  FP4MOE_CHECK(world_size_ <= kRankSumMaxRanks, "in-process all-reduce: {} ranks, at most {} are summed",
               world_size_, kRankSumMaxRanks);
  Post post;
  post.reduce = true;
  post.data = data;
  post.n = n;
  rendezvous(rank, std::move(post), stream);
}

std::vector<EpExchangeBytes> InProcessGroup::take_exchange_rounds() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<EpExchangeBytes> out;
  out.swap(rounds_);
  return out;
}

void InProcessGroup::rendezvous(int rank, Post post, cudaStream_t stream) {
  std::unique_lock<std::mutex> lock(mu_);
  FP4MOE_CHECK(failure_.empty(), "in-process group, rank {}: the group failed: {}", rank, failure_);
  FP4MOE_CHECK(!has_posted_[static_cast<size_t>(rank)], "in-process group: rank {} posted twice in one round", rank);
  posted_[static_cast<size_t>(rank)] = std::move(post);
  CUDA_CHECK(cudaEventRecord(ready_[static_cast<size_t>(rank)], stream));
  has_posted_[static_cast<size_t>(rank)] = true;
  const uint64_t round = round_;
  if (++posted_count_ == world_size_) {
    try {
      transfer_locked(stream);
    } catch (const Error& e) {
      failure_ = e.what();
      cv_.notify_all();
      throw;
    }
    has_posted_.assign(static_cast<size_t>(world_size_), false);
    posted_count_ = 0;
    ++round_;
    cv_.notify_all();
    return;
  }
  const bool completed = cv_.wait_for(lock, timeout_, [&] { return round_ != round || !failure_.empty(); });
  FP4MOE_CHECK(failure_.empty(), "in-process group, rank {}: the group failed: {}", rank, failure_);
  if (!completed) {
    std::string missing;
    for (int r = 0; r < world_size_; ++r)
      if (!has_posted_[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    failure_ = fmt::format("rank {} timed out after {} ms waiting for rank(s) {}", rank, timeout_.count(), missing);
    cv_.notify_all();
    fail(__FILE__, __LINE__, "in-process group: " + failure_);
  }
  CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));  // done_ is re-recorded only after this rank posts again
}

InProcessTransport::InProcessTransport(InProcessGroup& group, int rank) : group_(&group), rank_(rank) {
  FP4MOE_CHECK(rank >= 0 && rank < group.world_size(), "InProcessTransport: rank {} outside [0, {})", rank,
               group.world_size());
}

EpExchangeBytes InProcessTransport::exchange(const std::vector<EpPeerBuffers>& peers, cudaStream_t stream) {
  try {
    return group_->exchange(rank_, peers, stream);
  } catch (const Error& e) {
    group_->abort(fmt::format("rank {}: {}", rank_, e.what()));  // the other ranks stop waiting for this one
    throw;
  }
}

void InProcessTransport::all_reduce_sum(float* data, int64_t n, cudaStream_t stream) {
  try {
    group_->all_reduce_sum(rank_, data, n, stream);
  } catch (const Error& e) {
    group_->abort(fmt::format("rank {}: {}", rank_, e.what()));
    throw;
  }
}

void InProcessTransport::wait(cudaStream_t stream) { CUDA_CHECK(cudaStreamSynchronize(stream)); }

}  // namespace fp4moe
