// What `fp4moe train` may do with its result file (--out, trainer/train/metrics.h), decided before anything runs.
// The file is rewritten whole at every evaluation, checkpoint and at the end, so an existing file would be lost
// unless the run continues it:
//   - a path that does not exist is created;
//   - an existing file is continued by a --resume of its own run: an HDF5 result file holding /train/<run> of this
//     model configuration (its model_config_hash attribute) and no other results (only datasets under
//     /train/<run> and /memory/<run>); its rows up to the checkpoint's step are carried over (Trainer), with or
//     without --overwrite;
//   - any other existing file (a fresh run, another run, another configuration, another kind of file) is refused,
//     unless --overwrite asks to replace it: then none of its rows are kept.
#pragma once

#include <string>
#include <vector>

#include "results/output_path.h"
#include "trainer/config.h"

namespace fp4moe {

enum class TrainOutUse {
  create,    // out does not exist
  resume,    // out holds this run: continued, its rows up to the checkpoint carried over
  replace,   // out exists and --overwrite replaces it whole
};

// out: the --out path; run: the run name (check_run_name); resuming: a --resume was given; overwrite: --overwrite;
// inputs: the files the run reads (--config, the --resume checkpoint, the token shards, the tokenizer model beside
// them). First check_output_path("--out", out, inputs, OutputFolder::may_be_created) (results/output_path.h), then
// that out is not train.checkpoint_dir nor inside it (where the checkpoints are written), then the rules above.
// Throws fp4moe::Error, one line naming --out and the path, saying what the file holds and what to pass
// (--overwrite, or another --out). A file that --resume would continue but whose tables cannot be read (not HDF5,
// columns missing or of different lengths) is refused the same way.
TrainOutUse check_train_out(const std::string& out, const std::string& run, const TrainerConfig& cfg, bool resuming,
                            bool overwrite, const std::vector<NamedPath>& inputs);

}  // namespace fp4moe
