#include "trainer/comm/transport.h"

#include "kernels/common/check.h"

namespace fp4moe {

void check_all_reduce(float* data, int64_t n, int rank) {
  FP4MOE_CHECK(n >= 0, "all-reduce, rank {}: n must be >= 0, got {}", rank, n);
  FP4MOE_CHECK(n == 0 || data, "all-reduce, rank {}: null buffer for {} FP32 values", rank, n);
}

EpExchangeBytes ep_exchange_bytes(const std::vector<EpPeerBuffers>& peers, int rank, int world_size) {
  FP4MOE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
               "expert-parallel exchange: rank {} outside [0, world size {})", rank, world_size);
  FP4MOE_CHECK(static_cast<int64_t>(peers.size()) == world_size,
               "expert-parallel exchange: {} peer entries for a group of {} ranks (one per rank expected)",
               peers.size(), world_size);
  EpExchangeBytes b;
  for (int p = 0; p < world_size; ++p) {
    const EpPeerBuffers& q = peers[static_cast<size_t>(p)];
    FP4MOE_CHECK(q.send_bytes >= 0 && q.recv_bytes >= 0,
                 "expert-parallel exchange: rank {} peer {}: negative byte count (send {}, recv {})", rank, p,
                 q.send_bytes, q.recv_bytes);
    FP4MOE_CHECK((q.send_bytes == 0 || q.send) && (q.recv_bytes == 0 || q.recv),
                 "expert-parallel exchange: rank {} peer {}: null buffer for a positive count (send {}, recv {})",
                 rank, p, q.send_bytes, q.recv_bytes);
    if (p == rank) {
      FP4MOE_CHECK(q.send_bytes == q.recv_bytes,
                   "expert-parallel exchange: rank {} sends {} bytes to itself but receives {}", rank, q.send_bytes,
                   q.recv_bytes);
      b.to_self += q.send_bytes;
    } else {
      b.sent += q.send_bytes;
      b.received += q.recv_bytes;
    }
  }
  return b;
}

}  // namespace fp4moe
