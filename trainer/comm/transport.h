// The transport of the expert-parallel exchanges (DESIGN.md "Expert parallelism"): grouped point-to-point
// exchanges among the world_size ranks of one expert-parallel group, each rank sending a byte range to every rank
// (itself included) and receiving one from every rank, all at once (an all-to-all with uneven sizes); and the sum of
// an FP32 buffer over the ranks (all_reduce_sum: the data-parallel gradient all-reduce, the step's loss, gradient
// norm and expert loads). Two
// implementations: NcclTransport (nccl_transport.h: grouped ncclSend / ncclRecv, one process per GPU) and
// InProcessTransport (in_process_transport.h: N simulated ranks in one process on one device, device-to-device
// copies; for tests and simulations, e.g. bench_ep_comm, since NCCL refuses two ranks on one GPU).
//
// Every rank of the group calls exchange() and all_reduce_sum() the same number of times in the same order
// (collectives, one sequence for both); the bytes rank s sends to rank r must equal those r receives from s (the
// counts exchange that precedes each payload exchange makes them agree; InProcessTransport checks, NCCL would hang or
// corrupt). exchange() is asynchronous on the caller's stream: it returns once the transfers are enqueued. wait() is
// the one host synchronisation of a stream: bounded, it throws fp4moe::Error naming the rank and the cause on a
// transport error or a timeout, never hangs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace fp4moe {

// One rank's buffers for one peer of an exchange: send_bytes from `send` to that peer, recv_bytes from that peer
// into `recv`. Device memory. A zero count needs no pointer and moves nothing.
struct EpPeerBuffers {
  const void* send = nullptr;
  int64_t send_bytes = 0;
  void* recv = nullptr;
  int64_t recv_bytes = 0;
};

// Bytes of one exchange as seen by one rank: sent to and received from the other ranks (what crosses the
// interconnect), and moved to itself (a local copy, not on the wire).
struct EpExchangeBytes {
  int64_t sent = 0, received = 0, to_self = 0;
  EpExchangeBytes& operator+=(const EpExchangeBytes& o) {
    sent += o.sent;
    received += o.received;
    to_self += o.to_self;
    return *this;
  }
};

class EpTransport {
 public:
  virtual ~EpTransport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // peers[p] for p in [0, world_size): this rank's buffers toward peer p. Rejects (fp4moe::Error) a peers list of
  // another length, negative counts, null pointers under positive counts. Returns the bytes (ep_exchange_bytes).
  virtual EpExchangeBytes exchange(const std::vector<EpPeerBuffers>& peers, cudaStream_t stream) = 0;
  // data: device FP32 [n], the same n on every rank; afterwards every rank's buffer holds the elementwise sum over
  // the ranks, the same bits on every rank (NCCL: ncclAllReduce, ncclSum, in place, its own order of additions;
  // in-process: rank_sum.h's rank order). Asynchronous on the caller's stream, as exchange(). Rejects (fp4moe::Error)
  // n < 0 and (n > 0) a null buffer; in-process also ranks that disagree on n. n = 0 moves nothing but is still a
  // collective.
  virtual void all_reduce_sum(float* data, int64_t n, cudaStream_t stream) = 0;
  // Waits until the stream's work so far (this rank's exchanges included) is done; throws on error or timeout.
  virtual void wait(cudaStream_t stream) = 0;
};

// The checks of all_reduce_sum (n >= 0, a buffer when n > 0), naming the rank.
void check_all_reduce(float* data, int64_t n, int rank);

// The bytes of `peers` for `rank` (EpExchangeBytes), after the checks of EpTransport::exchange for a group of
// peers.size() ranks (rank in [0, peers.size())).
EpExchangeBytes ep_exchange_bytes(const std::vector<EpPeerBuffers>& peers, int rank, int world_size);

}  // namespace fp4moe
