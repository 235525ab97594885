#include "trainer/comm/ep_exchange.h"

#include <string>
#include <utility>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/router.h"
#include "trainer/model/moe_router.h"  // PinnedHost

namespace fp4moe {
namespace {

// Device bytes grown on demand (cudaFree synchronises the device, so a buffer the stream still reads is not freed
// under it), kept until destruction; from `mem` under MemCategory::comm when one is given (named `what`), else
// cudaMalloc.
class GrowingDeviceBytes {
 public:
  GrowingDeviceBytes(DeviceMemory* mem, std::string what) : mem_(mem), what_(std::move(what)) {}
  ~GrowingDeviceBytes() { free_noexcept(); }
  GrowingDeviceBytes(const GrowingDeviceBytes&) = delete;
  GrowingDeviceBytes& operator=(const GrowingDeviceBytes&) = delete;
  void* reserve(int64_t bytes) {
    if (bytes > cap_) {
      void* old = p_;
      p_ = nullptr;
      cap_ = 0;
      if (old) {
        if (mem_) mem_->release(old);
        else CUDA_CHECK(cudaFree(old));
      }
      if (mem_) p_ = mem_->allocate(static_cast<size_t>(bytes), MemCategory::comm, what_);
      else CUDA_CHECK(cudaMalloc(&p_, static_cast<size_t>(bytes)));
      cap_ = bytes;
    }
    return p_;
  }
  void* get() const { return p_; }

 private:
  void free_noexcept() {
    if (!p_) return;
    if (!mem_) {
      cudaFree(p_);
      return;
    }
    try {
      mem_->release(p_);
    } catch (...) {  // a destructor does not throw; DeviceMemory frees what it still holds at its own end
    }
  }
  DeviceMemory* mem_;
  std::string what_;
  void* p_ = nullptr;
  int64_t cap_ = 0;
};

}  // namespace

struct EpExchange::Buffers {
  explicit Buffers(DeviceMemory* mem)
      : counts(mem, "ep exchange counts"), table(mem, "ep exchange table"), row_of(mem, "ep exchange row_of"),
        assignment_of(mem, "ep exchange assignment_of"), grouped_of(mem, "ep exchange grouped_of"),
        send_wire(mem, "ep exchange send wire"), recv_wire(mem, "ep exchange receive wire") {}
  GrowingDeviceBytes counts;         // [E] int32: this rank's rows per global expert
  GrowingDeviceBytes table;          // [E + 1 + ep E_l] int32: offsets, then the received count matrix [ep, E_l]
  GrowingDeviceBytes row_of, assignment_of, grouped_of, send_wire, recv_wire;
  PinnedHost host_table;             // the table's host copy
  struct Timed {
    EpExchangeKind kind;
    cudaEvent_t start, stop;
  };
  std::vector<Timed> timed;          // exchanges timed since reset_bytes, read by exchange_ms
  void clear_timed() {
    for (Timed& t : timed) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    timed.clear();
  }
  ~Buffers() { clear_timed(); }
};

const char* ep_exchange_kind_name(EpExchangeKind k) {
  static const char* const names[] = {"counts", "dispatch", "combine", "dispatch_gradient", "combine_gradient"};
  return names[static_cast<int>(k)];
}

EpExchangeBytes EpLayerBytes::total() const {
  EpExchangeBytes t;
  for (const EpExchangeBytes& b : kind) t += b;
  return t;
}

EpExchange::EpExchange(EpTransport& transport, int64_t E, int64_t d, DeviceMemory* mem)
    : t_(&transport), E_(E), d_(d) {
  const int ep = transport.world_size();
  FP4MOE_CHECK(E >= 1 && E <= kRouterMaxExperts && E % ep == 0,
               "EpExchange: {} experts must lie in [1, {}] and split evenly over {} ranks", E, kRouterMaxExperts, ep);
  FP4MOE_CHECK(d >= 1, "EpExchange: hidden size d must be >= 1, got {}", d);
  E_l_ = E / ep;
  buf_ = std::make_unique<Buffers>(mem);
  const int64_t table_bytes = 4 * (E + 1 + ep * E_l_);
  buf_->counts.reserve(4 * E);
  buf_->table.reserve(table_bytes);
  buf_->host_table = PinnedHost(static_cast<size_t>(table_bytes));
}

EpExchange::~EpExchange() = default;

void EpExchange::reset_bytes() {
  bytes_ = {};
  buf_->clear_timed();
}

EpExchangeBytes EpExchange::exchange(const std::vector<EpPeerBuffers>& peers, EpExchangeKind kind,
                                     cudaStream_t stream) {
  Buffers::Timed timed{kind, nullptr, nullptr};
  if (timing_) {
    CUDA_CHECK(cudaEventCreate(&timed.start));
    CUDA_CHECK(cudaEventCreate(&timed.stop));
    buf_->timed.push_back(timed);  // owned by the list from here (destroyed by clear_timed)
    CUDA_CHECK(cudaEventRecord(timed.start, stream));
  }
  const EpExchangeBytes b = t_->exchange(peers, stream);
  if (timing_) CUDA_CHECK(cudaEventRecord(timed.stop, stream));
  bytes_.kind[static_cast<int>(kind)] += b;
  return b;
}

std::vector<double> EpExchange::exchange_ms() {
  std::vector<double> ms(kEpExchangeKinds, 0.0);
  for (const Buffers::Timed& t : buf_->timed) {
    CUDA_CHECK(cudaEventSynchronize(t.stop));
    float x = 0;
    CUDA_CHECK(cudaEventElapsedTime(&x, t.start, t.stop));
    ms[static_cast<size_t>(t.kind)] += x;
  }
  return ms;
}

const int32_t* EpExchange::row_of() const { return static_cast<const int32_t*>(buf_->row_of.get()); }
const int32_t* EpExchange::assignment_of() const { return static_cast<const int32_t*>(buf_->assignment_of.get()); }
const int32_t* EpExchange::grouped_of() const { return static_cast<const int32_t*>(buf_->grouped_of.get()); }

const EpCounts& EpExchange::route(const int32_t* topk_idx, int64_t M, int64_t k, cudaStream_t stream) {
  FP4MOE_CHECK(M >= 0 && k >= 1 && k <= E_, "EpExchange::route: need M >= 0 and 1 <= k <= E = {}, got M={} k={}", E_,
               M, k);
  const int ep = t_->world_size();
  M_ = -1;  // no valid route until this one completes
  auto* counts = static_cast<int32_t*>(buf_->counts.get());
  auto* table = static_cast<int32_t*>(buf_->table.get());
  auto* row_of = static_cast<int32_t*>(buf_->row_of.reserve(4 * M * k));
  auto* assignment_of = static_cast<int32_t*>(buf_->assignment_of.reserve(4 * M * k));
  expert_counts_and_offsets(topk_idx, M, k, E_, counts, table, stream);
  if (M > 0) permute_map(topk_idx, table, M, k, E_, row_of, assignment_of, stream);

  std::vector<EpPeerBuffers> peers(static_cast<size_t>(ep));
  for (int p = 0; p < ep; ++p)
    peers[static_cast<size_t>(p)] = {counts + p * E_l_, 4 * E_l_, table + E_ + 1 + p * E_l_, 4 * E_l_};
  exchange(peers, EpExchangeKind::counts, stream);

  const int64_t table_n = E_ + 1 + ep * E_l_;
  CUDA_CHECK(cudaMemcpyAsync(buf_->host_table.get(), table, static_cast<size_t>(4 * table_n), cudaMemcpyDeviceToHost,
                             stream));
  t_->wait(stream);  // the one host synchronisation of the layer
  const auto* host = static_cast<const int32_t*>(buf_->host_table.get());
  counts_.ep = ep;
  counts_.rank = t_->rank();
  counts_.E = E_;
  counts_.E_l = E_l_;
  counts_.offsets.assign(host, host + E_ + 1);
  counts_.recv_counts.assign(host + E_ + 1, host + table_n);
  counts_.validate();
  const int64_t R = counts_.recv_total();
  ep_grouped_rows(table + E_ + 1, ep, E_l_, R, static_cast<int32_t*>(buf_->grouped_of.reserve(4 * R)), stream);
  M_ = M;
  k_ = k;
  return counts_;
}

void EpExchange::check_routed(const char* what) const {
  FP4MOE_CHECK(M_ >= 0, "EpExchange::{}: no route for this layer yet (call route first)", what);
}

EpExchangeBytes EpExchange::send_rows(const EpRows& src, const int32_t* gather, int64_t divisor,
                                      const EpRows& expert_rows, EpExchangeKind kind, cudaStream_t stream) {
  const char* what = ep_exchange_kind_name(kind);
  const int64_t R = counts_.recv_total(), n = M_ * k_;
  FP4MOE_CHECK(src.d == d_ && expert_rows.d == d_, "EpExchange::{}: rows of d = {} and {}, expected d = {}", what,
               src.d, expert_rows.d, d_);
  FP4MOE_CHECK(expert_rows.format == src.format, "EpExchange::{}: expert rows in {}, the sent rows in {}", what,
               ep_row_format_name(expert_rows.format), ep_row_format_name(src.format));
  FP4MOE_CHECK(expert_rows.rows == R, "EpExchange::{}: expert rows hold {} rows, this rank receives {}", what,
               expert_rows.rows, R);
  const int64_t rb = ep_wire_row_bytes(src.format, d_);
  auto* send = static_cast<uint8_t*>(buf_->send_wire.reserve(n * rb));
  auto* recv = static_cast<uint8_t*>(buf_->recv_wire.reserve(R * rb));
  ep_pack_rows(src, gather, divisor, n, send, stream);
  std::vector<EpPeerBuffers> peers(static_cast<size_t>(counts_.ep));
  for (int p = 0; p < counts_.ep; ++p)
    peers[static_cast<size_t>(p)] = {send + counts_.send_row_begin(p) * rb, counts_.send_rows(p) * rb,
                                     recv + counts_.recv_row_begin(p) * rb, counts_.recv_rows(p) * rb};
  const EpExchangeBytes b = exchange(peers, kind, stream);
  ep_unpack_rows(recv, R, grouped_of(), expert_rows, stream);
  return b;
}

EpExchangeBytes EpExchange::dispatch(const EpRows& tokens, const EpRows& expert_rows, cudaStream_t stream) {
  check_routed("dispatch");
  FP4MOE_CHECK(tokens.rows == M_, "EpExchange::dispatch: {} token rows, the route has M = {}", tokens.rows, M_);
  return send_rows(tokens, assignment_of(), k_, expert_rows, EpExchangeKind::dispatch, stream);
}

EpExchangeBytes EpExchange::dispatch_gradient(const EpRows& rows, const EpRows& expert_rows, cudaStream_t stream) {
  check_routed("dispatch_gradient");
  FP4MOE_CHECK(rows.rows == M_ * k_, "EpExchange::dispatch_gradient: {} rows, the route has M k = {}", rows.rows,
               M_ * k_);
  return send_rows(rows, nullptr, 1, expert_rows, EpExchangeKind::dispatch_gradient, stream);
}

EpExchangeBytes EpExchange::return_rows(const bf16* grouped, bf16* permuted, EpExchangeKind kind,
                                        cudaStream_t stream) {
  check_routed(ep_exchange_kind_name(kind));
  const int64_t R = counts_.recv_total(), n = M_ * k_;
  FP4MOE_CHECK((R == 0 || grouped) && (n == 0 || permuted),
               "EpExchange::{}: null pointer ({} grouped rows, {} permuted rows)", ep_exchange_kind_name(kind), R, n);
  const int64_t rb = ep_wire_row_bytes(EpRowFormat::bf16, d_);
  auto* send = static_cast<uint8_t*>(buf_->send_wire.reserve(R * rb));
  // Wire row i = grouped row grouped_of[i]: the received order, i.e. per source its rows in its send order.
  ep_pack_rows(EpRows{EpRowFormat::bf16, R, d_, const_cast<bf16*>(grouped), nullptr}, grouped_of(), 1, R, send,
               stream);
  auto* out = reinterpret_cast<uint8_t*>(permuted);  // BF16 wire rows are the tensor's rows: received in place
  std::vector<EpPeerBuffers> peers(static_cast<size_t>(counts_.ep));
  for (int p = 0; p < counts_.ep; ++p)
    peers[static_cast<size_t>(p)] = {send + counts_.recv_row_begin(p) * rb, counts_.recv_rows(p) * rb,
                                     out + counts_.send_row_begin(p) * rb, counts_.send_rows(p) * rb};
  return exchange(peers, kind, stream);
}

EpExchangeBytes EpExchange::combine(const bf16* expert_out, bf16* ys, cudaStream_t stream) {
  return return_rows(expert_out, ys, EpExchangeKind::combine, stream);
}

EpExchangeBytes EpExchange::combine_gradient(const bf16* dxs, bf16* dys_rows, cudaStream_t stream) {
  return return_rows(dxs, dys_rows, EpExchangeKind::combine_gradient, stream);
}

}  // namespace fp4moe
