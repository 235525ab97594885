#include "trainer/train/step_graph.h"

#include <fmt/format.h>

#include <exception>
#include <string>
#include <utility>

#include "kernels/common/check.h"

namespace fp4moe {

StepGraph::StepGraph(Model& model, DeviceMemory& mem, cudaStream_t stream, std::vector<PipelineStep> schedule,
                     bool capture)
    : model_(model), mem_(mem), stream_(stream), schedule_(std::move(schedule)), capture_(capture) {
  FP4MOE_CHECK(model.host_sync_free(), "StepGraph: the model must run without host synchronisation "
               "(Model::set_host_sync_free(true) first)");
  const auto micro_batches = static_cast<int64_t>(schedule_.size() / 2);
  FP4MOE_CHECK(micro_batches >= 1 && schedule_ == one_f_one_b_schedule(1, 0, micro_batches),
               "StepGraph: expected the schedule of one pipeline stage (F0 B0 F1 B1 ...), got {}",
               schedule_text(schedule_));
  losses_ = DeviceArray<float>(mem, micro_batches, MemCategory::workspace, "step losses");
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_losses_), static_cast<size_t>(micro_batches) * sizeof(float),
                           cudaHostAllocDefault));
}

StepGraph::~StepGraph() {
  drop_graph();
  if (host_losses_) cudaFreeHost(host_losses_);
}

void StepGraph::drop_graph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

void StepGraph::enqueue(const Batch& b, float grad_scale) {
  const int64_t n = b.B * b.T;
  const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
  model_.params().zero_grads(stream_);
  for (const PipelineStep& op : schedule_) {
    if (op.pass == PipelinePass::forward) {
      const int32_t* staged = b.pinned + 2 * op.micro_batch * n;
      CUDA_CHECK(cudaMemcpyAsync(b.tokens, staged, bytes, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(b.targets, staged + n, bytes, cudaMemcpyHostToDevice, stream_));
      model_.forward_in_slot(op.slot, b.tokens, b.targets, b.B);  // copies them into its slot before returning
    } else {
      model_.backward_in_slot(op.slot, grad_scale);
      CUDA_CHECK(cudaMemcpyAsync(losses_.data() + op.micro_batch, model_.loss_device(), sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_));
    }
  }
}

StepGraph::Epoch StepGraph::epoch() const { return Epoch{mem_.releases(), model_.device_state_writes()}; }

StepGraph::Pass StepGraph::run(const Batch& b, float grad_scale, int64_t step) {
  FP4MOE_CHECK(b.pinned && b.tokens && b.targets && b.B >= 1 && b.T >= 1,
               "StepGraph: step {}: a batch without its arrays or with B = {}, T = {}", step, b.B, b.T);
  if (batch_.pinned == nullptr) {
    batch_ = b;
    grad_scale_ = grad_scale;
  }
  FP4MOE_CHECK(b.pinned == batch_.pinned && b.tokens == batch_.tokens && b.targets == batch_.targets &&
                   b.B == batch_.B && b.T == batch_.T && grad_scale == grad_scale_,
               "StepGraph: step {}: a batch of {} x {} tokens in other arrays or a grad_scale of {}, where the first "
               "step's were {} x {} and {} (a graph holds them)",
               step, b.B, b.T, grad_scale, batch_.B, batch_.T, grad_scale_);
  const Epoch now = epoch();
  if (exec_ && !(now == at_capture_)) drop_graph();  // a buffer it addresses, or state it left, may be gone
  Pass pass = Pass::replayed;
  if (!exec_) {
    if (!capture_ || !warm_ || !(now == at_eager_)) {
      enqueue(b, grad_scale);
      warm_ = true;
      at_eager_ = epoch();
      pass = Pass::eager;
    } else {
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
      std::string failed;  // what the passes threw while captured
      try {
        enqueue(b, grad_scale);
      } catch (const std::exception& e) {
        failed = e.what();
      }
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(stream_, &graph);  // ends the capture whatever happened
      if (!failed.empty() || end != cudaSuccess || graph == nullptr) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();  // the capture's error, reported below
        const std::string why = !failed.empty() ? failed : std::string(cudaGetErrorString(end));
        FP4MOE_CHECK(false, "StepGraph: step {}: capturing the step's passes in a CUDA graph failed: {} (a host "
                     "synchronisation, synchronous copy or allocation in the passes, or the error itself; "
                     "train.cuda_graph = false runs without the graph)",
                     step, why);
      }
      cudaGraphExec_t exec = nullptr;
      const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      CUDA_CHECK(inst);
      exec_ = exec;
      at_capture_ = epoch();
      ++captures_;
      pass = Pass::captured;
    }
  }
  if (exec_) {
    CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    if (pass == Pass::replayed) ++replays_;
  }
  CUDA_CHECK(cudaMemcpyAsync(host_losses_, losses_.data(), schedule_.size() / 2 * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_));
  return pass;
}

double StepGraph::loss_sum() const {
  double sum = 0;
  for (size_t i = 0; i < schedule_.size() / 2; ++i) sum += host_losses_[i];
  return sum;
}

}  // namespace fp4moe
