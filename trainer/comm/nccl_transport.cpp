#include "trainer/comm/nccl_transport.h"

#include <thread>

#include "kernels/common/check.h"

namespace fp4moe {
namespace {

// ncclSuccess and ncclInProgress pass; any other result throws with NCCL's own string.
void check_nccl(ncclResult_t r, int rank, const char* call) {
  FP4MOE_CHECK(r == ncclSuccess || r == ncclInProgress, "NCCL rank {}: {} failed: {} ({})", rank, call,
               ncclGetErrorString(r), static_cast<int>(r));
}

// Makes rank_device(env, ...) current and returns the unique id shared through env's file.
ncclUniqueId unique_id_on_rank_device(const RankEnv& env) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  FP4MOE_CHECK(e == cudaSuccess, "rank {}: no CUDA device ({})", env.rank, cudaGetErrorString(e));
  CUDA_CHECK(cudaSetDevice(rank_device(env, devices)));
  return share_unique_id(env, [&env] {
    ncclUniqueId id;
    check_nccl(ncclGetUniqueId(&id), env.rank, "ncclGetUniqueId");
    return id;
  });
}

}  // namespace

NcclComm::NcclComm(const RankEnv& env)
    : NcclComm(env.world_size, unique_id_on_rank_device(env), env.rank, env.timeout) {}

NcclComm::NcclComm(int nranks, const ncclUniqueId& id, int rank, std::chrono::milliseconds timeout)
    : rank_(rank), nranks_(nranks) {
  FP4MOE_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, "NcclComm: rank {} outside [0, {}) (nranks must be >= 1)",
               rank, nranks);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  check_nccl(ncclCommInitRankConfig(&comm_, nranks, id, rank, &config), rank, "ncclCommInitRankConfig");
  poll("communicator initialisation", nullptr, timeout);
}

NcclComm NcclComm::single_rank(std::chrono::milliseconds timeout) {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), 0, "ncclGetUniqueId");
  return NcclComm(1, id, 0, timeout);
}

NcclComm::~NcclComm() {
  if (!comm_) return;
  // Non-blocking: finalize may return ncclInProgress; a bounded poll, then destroy (abort when it did not finish).
  bool finalized = ncclCommFinalize(comm_) == ncclSuccess;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  ncclResult_t state = ncclInProgress;
  while (!finalized && std::chrono::steady_clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    if (state == ncclSuccess) finalized = true;
    else if (state != ncclInProgress) break;
    else std::this_thread::yield();
  }
  if (finalized) ncclCommDestroy(comm_);
  else ncclCommAbort(comm_);
}

void NcclComm::poll(const char* what, cudaStream_t stream, std::chrono::milliseconds timeout) {
  FP4MOE_CHECK(comm_, "NCCL rank {}: {} on a communicator that was aborted", rank_, what);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    std::string error;
    if (r != ncclSuccess) error = fmt::format("ncclCommGetAsyncError failed: {}", ncclGetErrorString(r));
    else if (state != ncclSuccess && state != ncclInProgress) error = ncclGetErrorString(state);
    bool done = error.empty() && state == ncclSuccess;
    if (done && stream) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaErrorNotReady) done = false;
      else if (q != cudaSuccess) error = fmt::format("CUDA error {}", cudaGetErrorString(q));
    }
    if (done) return;
    if (error.empty() && std::chrono::steady_clock::now() >= deadline)
      error = fmt::format("timed out after {} ms", timeout.count());
    if (!error.empty()) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      fail(__FILE__, __LINE__, fmt::format("NCCL rank {} of {}: {}: {}; communicator aborted", rank_, nranks_, what,
                                           error));
    }
    std::this_thread::yield();
  }
}

NcclTransport::NcclTransport(NcclComm& comm, std::chrono::milliseconds timeout) : comm_(&comm), timeout_(timeout) {
  FP4MOE_CHECK(comm.get(), "NcclTransport: the communicator was aborted");
}

NcclTransport::NcclTransport(const RankEnv& env)
    : owned_(std::make_unique<NcclComm>(env)), comm_(owned_.get()), timeout_(env.timeout) {}

EpExchangeBytes NcclTransport::exchange(const std::vector<EpPeerBuffers>& peers, cudaStream_t stream) {
  const EpExchangeBytes bytes = ep_exchange_bytes(peers, rank(), world_size());
  FP4MOE_CHECK(comm_->get(), "NCCL rank {}: exchange on a communicator that was aborted", rank());
  check_nccl(ncclGroupStart(), rank(), "ncclGroupStart");
  for (int p = 0; p < world_size(); ++p) {
    const EpPeerBuffers& q = peers[static_cast<size_t>(p)];
    if (q.send_bytes > 0)
      check_nccl(ncclSend(q.send, static_cast<size_t>(q.send_bytes), ncclUint8, p, comm_->get(), stream), rank(),
                 "ncclSend");
    if (q.recv_bytes > 0)
      check_nccl(ncclRecv(q.recv, static_cast<size_t>(q.recv_bytes), ncclUint8, p, comm_->get(), stream), rank(),
                 "ncclRecv");
  }
  check_nccl(ncclGroupEnd(), rank(), "ncclGroupEnd");
  comm_->poll("exchange enqueue", nullptr, timeout_);  // non-blocking: the group may still be in progress
  return bytes;
}

void NcclTransport::all_reduce_sum(float* data, int64_t n, cudaStream_t stream) {
  check_all_reduce(data, n, rank());
  FP4MOE_CHECK(comm_->get(), "NCCL rank {}: all-reduce on a communicator that was aborted", rank());
  if (n == 0) return;  // every rank has the same n: every rank skips it
  check_nccl(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_->get(), stream), rank(),
             "ncclAllReduce");
  comm_->poll("all-reduce enqueue", nullptr, timeout_);
}

void NcclTransport::wait(cudaStream_t stream) { comm_->poll("wait", stream, timeout_); }

}  // namespace fp4moe
