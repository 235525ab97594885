// The expert-parallel transport over NCCL (transport.h): one process per GPU, a communicator over the group's
// ranks given by the caller; each exchange is one NCCL group (ncclGroupStart; per peer ncclSend and ncclRecv of the
// byte counts, ncclUint8; ncclGroupEnd), the self pair included (at world size 1 an exchange is a send to itself);
// each all-reduce one ncclAllReduce (ncclFloat32, ncclSum, in place).
//
// Bounded waits (issue 17 item 4). The communicator is made non-blocking (ncclConfig_t blocking = 0, NcclComm
// below): ncclGroupEnd and the initialisation may return ncclInProgress, and NcclTransport polls
// ncclCommGetAsyncError until the operation is enqueued. wait() polls cudaStreamQuery together with
// ncclCommGetAsyncError. Either poll past the timeout, or an asynchronous NCCL error (a peer's failure surfaces as a
// remote or system error on the others), aborts the communicator (ncclCommAbort: it frees the kernels blocked on
// it) and throws fp4moe::Error naming this rank and the cause; the communicator is unusable afterwards. What one GPU
// tests: a world-size-1 communicator (NcclComm::single_rank, and through the rank environment) and its exchanges.
// Several processes: `fp4moe launch` (cli/cmd_launch.cpp) starts them with the rank environment (rank_env.h), each
// builds its communicator from it (NcclComm(const RankEnv&)), and ends all ranks when one fails (the error on one
// rank makes the others' polls fail or time out, each then ends itself with its message).
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>

#include "trainer/comm/rank_env.h"
#include "trainer/comm/transport.h"

namespace fp4moe {

// A non-blocking NCCL communicator (ncclCommInitRankConfig, blocking = 0), destroyed (ncclCommFinalize +
// ncclCommDestroy, or ncclCommAbort after an error) with the object. Move-only.
class NcclComm {
 public:
  // Rank `rank` of `nranks` under the unique id (from rank 0's ncclGetUniqueId) on the current device; waits for
  // the initialisation at most `timeout`. Rejects (fp4moe::Error) nranks < 1, rank outside [0, nranks), and NCCL
  // errors or a timeout (naming the rank).
  NcclComm(int nranks, const ncclUniqueId& id, int rank, std::chrono::milliseconds timeout);
  // Rank env.rank of env.world_size on the CUDA device rank_device(env, visible devices), made current; the unique
  // id comes through env's file (share_unique_id: rank 0 calls ncclGetUniqueId); every wait bounded by env.timeout.
  // Rejects (fp4moe::Error) what rank_device, share_unique_id and the constructor above reject.
  explicit NcclComm(const RankEnv& env);
  // A world of one: a fresh unique id, rank 0 of 1.
  static NcclComm single_rank(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~NcclComm();
  NcclComm(NcclComm&& o) noexcept : comm_(o.comm_), rank_(o.rank_), nranks_(o.nranks_) { o.comm_ = nullptr; }
  NcclComm& operator=(NcclComm&&) = delete;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Polls ncclCommGetAsyncError until it is not ncclInProgress (and, with a stream, until cudaStreamQuery says the
  // stream is done); on an error or past `timeout` aborts the communicator and throws fp4moe::Error naming `what`.
  void poll(const char* what, cudaStream_t stream, std::chrono::milliseconds timeout);

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, nranks_ = 0;
};

class NcclTransport : public EpTransport {
 public:
  // Over `comm` (kept by the caller, outliving the transport); every exchange and wait bounded by `timeout`.
  explicit NcclTransport(NcclComm& comm,
                         std::chrono::milliseconds timeout = std::chrono::seconds(kDefaultCommTimeoutS));
  // Over a communicator of its own, NcclComm(env); every exchange and wait bounded by env.timeout.
  explicit NcclTransport(const RankEnv& env);
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->nranks(); }
  EpExchangeBytes exchange(const std::vector<EpPeerBuffers>& peers, cudaStream_t stream) override;
  void all_reduce_sum(float* data, int64_t n, cudaStream_t stream) override;
  void wait(cudaStream_t stream) override;

 private:
  std::unique_ptr<NcclComm> owned_;  // set by the constructor from a RankEnv
  NcclComm* comm_;
  std::chrono::milliseconds timeout_;
};

}  // namespace fp4moe
