/// \file
/// The life-cycle rules of `xgrad train`: how one invocation's options become the options of
/// a run. A new run, `--resume` (the saved run continues; only session options may be given),
/// `--init-from` (a new run shaped by a model file) and `--config` (a JSON file of options
/// under the flags). The command line only parses; these rules decide (docs/cli.md).
#pragma once

#include <ostream>
#include <set>
#include <string>

#include <xgrad/train/options.hpp>

namespace xg::train {

/// What the command line of `xgrad train` said, before any rule.
struct Invocation {
  std::set<std::string> given;  ///< The names of the options whose flag appeared (option_schema()).
  bool resume_flag = false;     ///< `--resume` appeared (perhaps with '').
  std::string config;           ///< `--config FILE` ("" : none).
};

/// The text of `--config FILE`: a regular file of at most io::kConfigLimit bytes (a FIFO or a
/// device is refused by name, before it is opened); UsageError otherwise.
std::string read_config_file(const std::string& path);

/// Applies the life-cycle rules to `o` (the options as parsed): `--config` merged under the
/// flags (a flag wins; a differing `--threads` is a warning on `warnings`), the refusals of
/// `--resume`, and for a new run `--init-from`, the `--task charlm` alias, the task defaults,
/// the options the task does not read and every range. UsageError (FormatError for a bad
/// `--init-from` file) naming the flag or key, before any work. Returns the names of the
/// options given on the command line or in `--config`.
std::set<std::string> resolve_invocation(TrainOptions& o, const Invocation& inv, std::ostream& warnings);

}  // namespace xg::train
