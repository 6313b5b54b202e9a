#include <xgrad/train/eval_samples.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/detail/json.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/train/task.hpp>

namespace xg::train {

namespace fs = std::filesystem;

namespace {

// The step of a line `{"step": S, ...}` as write_eval_sample writes it (-1: not such a line).
std::int64_t step_of(const std::string& line) {
  const std::string head = "{\"step\": ";
  if (line.compare(0, head.size(), head) != 0) return -1;
  std::int64_t step = 0;
  std::size_t i = head.size(), digits = 0;
  for (; i < line.size() && line[i] >= '0' && line[i] <= '9' && digits < 18; ++i, ++digits)
    step = step * 10 + (line[i] - '0');
  return digits > 0 && i < line.size() && line[i] == ',' ? step : -1;
}

// The sample's text: Task::sample's line without its indent, label and quotes.
std::string sample_text(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  const std::size_t start = s.find_first_not_of(' ');
  s = start == std::string::npos ? std::string() : s.substr(start);
  const std::string label = "sample (prompt|what the model wrote): \"";
  if (s.compare(0, label.size(), label) == 0 && s.size() > label.size() && s.back() == '"')
    s = s.substr(label.size(), s.size() - label.size() - 1);
  return s;
}

}  // namespace

void start_eval_samples(const std::string& out, std::int64_t start) {
  const fs::path path = fs::path(out) / runs::kSamplesFile;
  std::error_code ec;
  if (start == 0) {
    fs::remove(path, ec);
    return;
  }
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  std::string kept, line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a last line without its line end: cut by a kill
    const std::int64_t step = step_of(line);
    if (step >= 0 && step <= start) kept += line + "\n";
  }
  io::write_atomically(path.string(), kept, "[train] " + path.string());
}

void write_eval_sample(Task& task, const std::string& out, std::int64_t step) {
  std::ostringstream sample;
  task.sample(sample);
  if (sample.str().empty()) return;
  const std::string line = "{\"step\": " + std::to_string(step) +
                           ", \"text\": " + json::Value::make_text(sample_text(sample.str())).dump() + "}\n";
  const std::string path = (fs::path(out) / runs::kSamplesFile).string();
  std::FILE* f = std::fopen(path.c_str(), "ab");
  const bool ok = f && std::fwrite(line.data(), 1, line.size(), f) == line.size() && std::fflush(f) == 0;
  if (f) std::fclose(f);
  if (!ok) throw FormatError("[train] " + path + ": cannot append the sample of step " + std::to_string(step));
}

}  // namespace xg::train
