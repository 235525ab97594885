#include "trainer/model/ep_traffic.h"

#include <chrono>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "trainer/comm/in_process_transport.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/moe_expert_parallel.h"
#include "trainer/model/param_init.h"
#include "trainer/model/params.h"

namespace fp4moe {

TrainerConfig ep_probe_config(int64_t hidden, const Recipe& routed, int64_t top_k, int64_t experts,
                              int64_t expert_ffn) {
  TrainerConfig cfg;
  cfg.model.hidden = hidden;
  cfg.model.layers = 1;
  cfg.moe.routed_experts = experts;
  cfg.moe.shared_experts = 0;
  cfg.moe.top_k = top_k;
  cfg.moe.expert_ffn = expert_ffn;
  cfg.moe.router = RouterStyle::v3_sigmoid;
  cfg.moe.routed_scale = 2.5;
  cfg.recipe.routed_experts = routed;
  return cfg;
}

std::array<int64_t, kEpExchangeKinds> ep_step_bytes_by_formats(const Recipe& routed, int64_t d, int ranks,
                                                               int64_t experts, int64_t routed_rows) {
  FP4MOE_CHECK(ranks >= 1, "ep_step_bytes_by_formats: ranks must be >= 1, got {}", ranks);
  FP4MOE_CHECK(experts >= 1 && experts % ranks == 0,
               "ep_step_bytes_by_formats: {} routed experts do not split evenly over {} ranks", experts, ranks);
  FP4MOE_CHECK(routed_rows >= 0, "ep_step_bytes_by_formats: routed rows must be >= 0, got {}", routed_rows);
  const ExpertParallelRowBytes row = expert_parallel_row_bytes(routed, d);
  std::array<int64_t, kEpExchangeKinds> b{};
  b[static_cast<size_t>(EpExchangeKind::counts)] = int64_t{ranks} * ranks * 4 * (experts / ranks);
  b[static_cast<size_t>(EpExchangeKind::dispatch)] = routed_rows * row.dispatch;
  b[static_cast<size_t>(EpExchangeKind::combine)] = routed_rows * row.combine;
  b[static_cast<size_t>(EpExchangeKind::dispatch_gradient)] = routed_rows * row.backward_dispatch;
  b[static_cast<size_t>(EpExchangeKind::combine_gradient)] = routed_rows * row.backward_combine;
  return b;
}

struct EpLayerProbe::Impl {
  DeviceMemory mem;  // first: freed last
  CublasLtMatmul lt;
  ParamStore store;
  cudaStream_t stream = nullptr;
  ModelContext ctx;
  std::unique_ptr<ScratchArena> scratch;
  std::unique_ptr<ExpertParallelMoeLayer> layer;
  DeviceArray<bf16> x, y, dy, dx;  // [M, d]
  int64_t M = 0;

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
    layer.reset();
    scratch.reset();
    if (stream) cudaStreamDestroy(stream);
  }
};

EpLayerProbe::EpLayerProbe(const TrainerConfig& cfg, int64_t tokens, EpTransport& transport, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  FP4MOE_CHECK(tokens >= 1, "EpLayerProbe: tokens must be >= 1, got {}", tokens);
  Impl& p = *impl_;
  p.M = tokens;
  CUDA_CHECK(cudaStreamCreate(&p.stream));
  p.ctx = ModelContext{p.stream, &p.lt, &p.mem};
  p.ctx.quant_seed = splitmix64_at(seed, static_cast<uint64_t>(transport.rank()));
  p.layer = std::make_unique<ExpertParallelMoeLayer>(p.store, "layers.0.moe", cfg, tokens, p.mem, transport);
  p.scratch = std::make_unique<ScratchArena>(p.mem, p.layer->scratch_bytes(), "EpLayerProbe scratch");
  p.ctx.scratch = p.scratch.get();
  p.store.allocate(p.mem);
  p.store.init(seed, p.stream);
  p.store.zero_grads(p.stream);
  const int64_t n = tokens * cfg.model.hidden;
  p.x = DeviceArray<bf16>(p.mem, n, MemCategory::activations, "EpLayerProbe tokens");
  p.y = DeviceArray<bf16>(p.mem, n, MemCategory::activations, "EpLayerProbe output");
  p.dy = DeviceArray<bf16>(p.mem, n, MemCategory::activations, "EpLayerProbe output gradient");
  p.dx = DeviceArray<bf16>(p.mem, n, MemCategory::activations, "EpLayerProbe input gradient");
  const uint64_t key = 2 * static_cast<uint64_t>(transport.rank());
  param_init_normal_device(MasterShard{}, p.x.data(), n, seed, key, 0, 1.0f, p.stream);
  param_init_normal_device(MasterShard{}, p.dy.data(), n, seed, key + 1, 0, 1.0f, p.stream);
  CUDA_CHECK(cudaStreamSynchronize(p.stream));
}

EpLayerProbe::~EpLayerProbe() = default;

void EpLayerProbe::step() {
  Impl& p = *impl_;
  p.layer->forward(p.ctx, p.x.data(), p.M, p.y.data());
  p.layer->backward(p.ctx, p.dy.data(), p.x.data(), p.M, p.dx.data());
}

EpExchange& EpLayerProbe::exchange() { return impl_->layer->exchange(); }
cudaStream_t EpLayerProbe::stream() const { return impl_->stream; }
int64_t EpLayerProbe::tokens() const { return impl_->M; }
double EpLayerProbe::dispatch_payload_per_token() const { return impl_->layer->experts().dispatch_bytes().payload; }
double EpLayerProbe::dispatch_scales_per_token() const { return impl_->layer->experts().dispatch_bytes().scales; }

EpSimulatedStep simulate_ep_step(const TrainerConfig& cfg, int ranks, int64_t tokens_per_rank, uint64_t seed) {
  InProcessGroup group(ranks, std::chrono::seconds(300));
  struct RankOut {
    EpLayerBytes bytes;
    int64_t routed_rows = 0;
    double payload = 0, scales = 0;
  };
  const std::vector<RankOut> outs = run_in_process_ranks<RankOut>(group, [&](EpTransport& t) {
    EpLayerProbe probe(cfg, tokens_per_rank, t, seed);
    probe.step();
    CUDA_CHECK(cudaStreamSynchronize(probe.stream()));
    return RankOut{probe.exchange().bytes(), tokens_per_rank * cfg.moe.top_k, probe.dispatch_payload_per_token(),
                   probe.dispatch_scales_per_token()};
  });
  const std::vector<EpExchangeBytes> rounds = group.take_exchange_rounds();
  FP4MOE_CHECK(rounds.size() == static_cast<size_t>(kEpExchangeKinds),
               "simulate_ep_step: the transport logged {} exchange rounds; a layer's forward and backward make {} "
               "(counts, dispatch, combine, dispatch_gradient, combine_gradient)", rounds.size(), kEpExchangeKinds);
  EpSimulatedStep s;
  for (int i = 0; i < kEpExchangeKinds; ++i) s.transport.kind[i] = rounds[static_cast<size_t>(i)];
  for (const RankOut& o : outs) {
    s.routed_rows += o.routed_rows;
    for (int i = 0; i < kEpExchangeKinds; ++i) s.layers.kind[i] += o.bytes.kind[i];
  }
  s.dispatch_payload_per_token = outs.front().payload;
  s.dispatch_scales_per_token = outs.front().scales;
  return s;
}

}  // namespace fp4moe
