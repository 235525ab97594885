// train.cuda_graph (trainer/config.h): a training step's forwards and backwards replayed from one CUDA graph.
//
// A step of the reference trainer launches hundreds of kernels per micro-batch; on small models the host's launches,
// not the GPU, set the step time. With the model in its mode without host synchronisation (Model::
// set_host_sync_free: the routers keep the expert counts on the device, the expert GEMMs read the device offsets, the
// loss stays on the device), the passes of one step are the same launches every step, so they are queued once under
// stream capture and replayed (cudaGraphLaunch): one launch per step instead of one per kernel.
//
// What the graph holds, in order on the trainer's stream (one pipeline stage: F0 B0 F1 B1 ...):
//   the gradients zeroed (ParamStore::zero_grads);
//   per micro-batch i of the step: its tokens and targets copied from the page-locked staging (Batch::pinned,
//   [micro_batches][2][B*T] int32: micro-batch i's tokens at 2 i B T, its targets B T further) into the model's input
//   arrays (Batch::tokens, Batch::targets, device [B*T]), Model::forward_in_slot, Model::backward_in_slot(grad_scale),
//   and the micro-batch's loss (Model::loss_device) copied into this object's device losses [micro_batches] FP32.
// After the graph, outside it: the losses copied to the host (loss_sum() once the stream has synchronised). The
// optimizer step (gradient norm, the non-finite decision, AdamW with the step's learning rate) and the v3 router's
// bias update (Model::end_step) stay eager in the trainer: they take host values per step.
//
// Which pass runs (run()): the first step is queued eagerly in the same mode (it allocates the buffers a first forward
// allocates, and the v3 routers' device tallies); the next one is captured and launched; later ones launch the graph.
// A graph holds device addresses and what the layers last wrote of their per-shape device state. It is dropped when
// a DeviceMemory buffer has been freed since its capture (DeviceMemory::releases) or a pass has rewritten such state
// (Model::device_state_writes: an evaluation forward of fewer rows rewrites the quantized Linears' offsets); that
// step then runs eagerly and the next one is captured again. What neither count sees, and the graph relies on: the
// buffers that grow outside DeviceMemory when a pass has more rows (GroupedGemm's scratch, the LM head's chunks) do
// not grow after the capture, because no pass has more than the B x T rows of a training micro-batch.
// capture = false (a test hook, TrainerOptions::capture_step_graph) queues every step eagerly: the reference the
// replays equal bit for bit.
//
// Any host synchronisation, synchronous copy or allocation inside the passes fails the capture (global capture mode):
// fp4moe::Error naming the step. Not thread-safe; one per Model.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"
#include "trainer/train/pipeline_schedule.h"

namespace fp4moe {

class StepGraph {
 public:
  // model: in the mode without host synchronisation, outliving this. mem: the model's. schedule: the step's passes
  // (pipeline_schedule.h) of one stage, F0 B0 F1 B1 ... over m >= 1 micro-batches. Device losses [m] FP32 from mem
  // under MemCategory::workspace ("step losses"); host page-locked [m]. Rejects (fp4moe::Error) a model with host
  // synchronisation and any other schedule.
  StepGraph(Model& model, DeviceMemory& mem, cudaStream_t stream, std::vector<PipelineStep> schedule, bool capture);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  struct Batch {
    const int32_t* pinned = nullptr;  // host page-locked [micro_batches][2][B*T] (above), written before run()
    int32_t* tokens = nullptr;        // device [B*T]
    int32_t* targets = nullptr;       // device [B*T]
    int64_t B = 0, T = 0;             // rows of T tokens per micro-batch (B as every step's)
  };
  enum class Pass { eager, captured, replayed };

  // Queues one step's passes (above) on the stream, asynchronously; `step` names the step in errors. The staging must
  // stay unchanged until the stream has passed this step's copies. Rejects a batch or grad_scale other than the first
  // run's (a graph holds its arrays, sizes and scale).
  Pass run(const Batch& batch, float grad_scale, int64_t step);
  // The step's micro-batch losses summed in micro-batch order (FP64 of each FP32 loss), after the stream has
  // synchronised past run().
  double loss_sum() const;

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  void enqueue(const Batch& batch, float grad_scale);
  void drop_graph();

  Model& model_;
  DeviceMemory& mem_;
  cudaStream_t stream_;
  std::vector<PipelineStep> schedule_;
  bool capture_;
  DeviceArray<float> losses_;      // device [micro_batches]
  float* host_losses_ = nullptr;   // page-locked [micro_batches]
  cudaGraphExec_t exec_ = nullptr;
  // DeviceMemory::releases and Model::device_state_writes, at the capture and after the last eager step
  struct Epoch {
    uint64_t releases = 0, state_writes = 0;
    bool operator==(const Epoch& o) const { return releases == o.releases && state_writes == o.state_writes; }
  };
  Epoch epoch() const;
  Epoch at_capture_, at_eager_;
  bool warm_ = false;              // an eager step ran (at_eager_)
  Batch batch_{};                  // the first run's, which every run must give
  float grad_scale_ = 0;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace fp4moe
