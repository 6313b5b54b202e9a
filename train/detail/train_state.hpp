// The training state, train_state.safetensors: every parameter ("model." + name), its AdamW
// moments ("optim." + name + ".exp_avg" / ".exp_avg_sq"), the generators, the step and the
// run's options in the metadata. Writing one checkpoint (log, state, model) and reading one
// back for --resume, with every check that makes a resume exact or refused. Internal to train/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/train/task.hpp>

namespace xg::train::detail {

// What a checkpoint records about the run besides the task and its options.
struct RunIdentity {
  std::string id;           // empty for a run saved before run ids (it stays so)
  bool on_disk = false;     // run_id.txt holds it (resumed, or written at the first checkpoint)
  bool config_on_disk = false;  // config.json holds the run's options (written with the first checkpoint)
};

// One checkpoint: the log first (so it holds every step the checkpoint holds), then the
// state, which holds everything resume needs and is replaced atomically (the commit point),
// then the model alone for generate/inspect.
// `threads`: the worker threads per rank the run ran with (metadata "threads", written when
// not 1: checkpoints of earlier versions lack the key, and their runs had 1 by default).
void save_checkpoint(Task& task, const TrainOptions& o, int threads, RunIdentity& run, const nn::Optimizer& opt,
                     std::int64_t step, const Generator& data, const Generator& dropout, runs::RunLog& log);
// The worker threads per rank a checkpoint's run ran with ("threads"; 1 when it lacks the key,
// the default of the versions that did not save it). FormatError naming `state_path` for a
// value that is not a count in [1, 1024].
int saved_threads(const io::safetensors::Metadata& state, const std::string& state_path);
// Writes DIR/model.safetensors (or another file of the folder) at `step`, with `extra` metadata.
void save_model(Task& task, const std::string& path, std::int64_t step, const io::safetensors::Metadata& extra = {});

// A checkpoint read back for --resume (checked on rank 0; the others get the parameters by
// broadcast).
struct ResumePoint {
  std::int64_t step = 0;
  io::safetensors::NamedArrays params, moments;
  bool legacy_pair = false;  // an earlier xgrad's checkpoint: parameters in model.safetensors
};
// The step, parameters and moments of `state` (rank 0 checks that every parameter comes with
// both moments and that they describe a model of `n_expected` parameters).
ResumePoint read_resume_point(const io::safetensors::File& state, const TrainOptions& o, const std::string& state_path,
                              bool root, std::uint64_t n_expected);
// Before the model of a resumed run is built (rank 0): FormatError naming `state_path` when its
// saved options describe a model (`n_expected` parameters, counted from the options) that the
// checkpoint cannot hold: a state in which every parameter trains must hold exactly that many;
// otherwise (adapters, frozen weights, an earlier xgrad's pair) DIR/model.safetensors, of which
// only the header is read, must hold at least that many. Options changed to a huge model are so
// refused at once, not after allocating and initialising it.
void check_saved_model_size(const io::safetensors::File& state, const TrainOptions& o, const std::string& state_path,
                            std::uint64_t n_expected);
// Sets the model's parameters, the optimizer's moments and the generators from `point`.
void restore(const ResumePoint& point, const io::safetensors::File& state, const std::string& state_path, bool root,
             nn::NamedTensors& params, nn::Optimizer& opt, Generator& data, Generator& dropout);

}  // namespace xg::train::detail
