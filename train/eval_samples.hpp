/// \file
/// Samples at evaluation: during training, at every evaluation of a task with a validation
/// split (text, charlm), the task's sample (Task::sample: a fixed prompt, the first tokens of
/// the validation text, continued with a fixed seed) is appended to the run folder's
/// samples.jsonl as one JSON line {"step": S, "text": "..."}, which `xgrad report` shows. The
/// trainer calls these two functions; rank 0 alone.
#pragma once

#include <cstdint>
#include <string>

namespace xg::train {

class Task;

/// Before the first step of a session: a new run (start 0) starts without samples.jsonl (an
/// earlier run's is removed); a resumed run keeps the lines of the steps up to `start`, its
/// checkpoint (lines written after it, by the session that was interrupted, are dropped; a
/// truncated last line too). The file is rewritten atomically.
void start_eval_samples(const std::string& out, std::int64_t start);

/// Appends the task's sample at `step` to OUT/samples.jsonl (flushed; nothing for a task
/// whose sample() writes nothing). FormatError naming the file when it cannot be written.
void write_eval_sample(Task& task, const std::string& out, std::int64_t step);

}  // namespace xg::train
