// What training over real ranks (`fp4moe train` under `fp4moe launch`: trainer/model/model.h check_ranks_config,
// trainer/train/trainer.h check_trainable) refuses before anything is allocated, and what it lets through, on the CPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/comm/transport.h"
#include "trainer/config.h"
#include "trainer/model/model.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

TrainerConfig tiny() { return parse_config_args({"--config", test::preset("tiny")}); }

TrainerOptions over_ranks(int world, bool synthetic = true) {
  TrainerOptions o;
  RankEnv env;
  env.world_size = world;
  env.launched = true;
  o.ranks = env;
  o.synthetic_data = synthetic;
  return o;
}

TEST(RanksConfig, ModelOverRanksRefusesEmulatedLayoutsAndUnevenExperts) {
  TrainerConfig c = tiny();
  check_ranks_config(c, 1);
  check_ranks_config(c, 2);
  check_ranks_config(c, 8);
  test::expect_error_with([&] { check_ranks_config(c, 0); }, {"must have >= 1 ranks, got 0"});
  test::expect_error_with([&] { check_ranks_config(c, 3); },
                          {"moe.routed_experts = 8 must split evenly over the 3 expert-parallel ranks"});
  c.parallel.ep = 2;
  test::expect_error_with([&] { check_ranks_config(c, 2); },
                          {"the [parallel] section (tp 1 pp 1 dp 1 ep 2) emulates one GPU of a layout",
                           "a run over 2 real ranks"});
  TrainerConfig dense = tiny();
  dense.model.n_dense_layers = dense.model.layers;  // no MoE layer: no experts to split
  check_ranks_config(dense, 3);
}

TEST(RanksConfig, TrainingOverRanksCheckpointsAndEvaluatesTheWholeSplit) {
  TrainerConfig c = tiny();
  check_trainable(c, over_ranks(2));
  c.train.checkpoint_dir = "ckpt";
  check_trainable(c, over_ranks(1));  // one rank checkpoints as one GPU
  check_trainable(c, over_ranks(2));  // every rank its experts' shard, rank 0 the replicated state
  TrainerOptions resume = over_ranks(4);
  resume.resume_path = "latest";
  check_trainable(c, resume);
  c.train.checkpoint_dir.clear();
  c.train.eval_interval = 5;
  c.train.eval_steps = 2;
  c.train.final_eval_steps = 0;  // the whole validation split
  check_trainable(c, over_ranks(1, false));  // one rank evaluates the whole split as one GPU
  check_trainable(c, over_ranks(2));         // synthetic data has no split: eval_steps batches per rank
  check_trainable(c, over_ranks(2, false));  // each rank its strided share of the split's windows
  c.train.eval_steps = 0;
  test::expect_error_with([&] { check_trainable(c, over_ranks(2)); }, {"train.eval_steps = 0", "synthetic data"});
}

// A transport that only reports its group (what check_trainable reads of simulated ranks).
class GroupOnlyTransport : public EpTransport {
 public:
  explicit GroupOnlyTransport(int world) : world_(world) {}
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  EpExchangeBytes exchange(const std::vector<EpPeerBuffers>&, cudaStream_t) override { return {}; }
  void all_reduce_sum(float*, int64_t, cudaStream_t) override {}
  void wait(cudaStream_t) override {}

 private:
  int world_;
};

TEST(RanksConfig, SimulatedRanksAreCheckedAsLaunchedOnesAndExcludeThem) {
  TrainerConfig c = tiny();
  GroupOnlyTransport three(3), two(2);
  TrainerOptions o;
  o.synthetic_data = true;
  o.transport = &three;
  test::expect_error_with([&] { check_trainable(c, o); },
                          {"moe.routed_experts = 8 must split evenly over the 3 expert-parallel ranks"});
  o.transport = &two;
  check_trainable(c, o);
  TrainerOptions both = over_ranks(2);
  both.transport = &two;
  test::expect_error_with([&] { check_trainable(c, both); }, {"ranks and transport are exclusive"});
}

}  // namespace
}  // namespace fp4moe
