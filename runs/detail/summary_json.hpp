// A run's summary (runs/compare.hpp's RunSummary) as a JSON object, the same in `xgrad compare
// --json` and in the data of `xgrad report`'s page (internal to runs/).
#pragma once

#include <xgrad/io/detail/json.hpp>
#include <xgrad/runs/compare.hpp>

namespace xg::runs::detail {

// label, dir, run_id (null when the folder has none), options_source, options (every option's
// text), steps, tokens_per_step, tokens, sessions, wall_s, the final and best losses (null
// where the run has none; numbers with 17 digits, which read back exactly), best_val_step (null
// without a validation loss), the final and best bits per byte.
json::Value summary_json(const RunSummary& r);

}  // namespace xg::runs::detail
