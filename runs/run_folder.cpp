#include <xgrad/runs/run_folder.hpp>
#include <xgrad/io/number.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <unistd.h>

#include <xgrad/io/input_file.hpp>
#include <xgrad/core/detail/sha256.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/safetensors.hpp>

namespace xg::runs {

namespace fs = std::filesystem;

namespace {

}  // namespace

RunLog::RunLog(fs::path path, std::vector<std::string> kept, bool bpb) : path_(std::move(path)) {
  pending_ = std::string(bpb ? kHeaderBpb : kHeader) + "\n";
  for (const auto& row : kept) pending_ += row + "\n";
}
RunLog::~RunLog() {
  if (file_) std::fclose(file_);
}


void RunLog::commit() {
  if (!file_) {
    // The first commit replaces the file whole (the kept rows of a resumed run and the new
    // ones), then rows are appended and synced.
    io::write_atomically(path_.string(), pending_, "[train] " + path_.string() + ": ");
    file_ = std::fopen(path_.c_str(), "ab");
    if (!file_) throw FormatError("[train] cannot append to " + path_.string() + ": " + std::strerror(errno));
  } else if (!write_sync(file_)) {
    throw FormatError("[train] writing " + path_.string() + " failed: " + std::strerror(errno));
  }
  written_ += pending_;
  pending_.clear();
}

std::string RunLog::digest() const { return xg::detail::sha256_hex(written_ + pending_); }

bool RunLog::write_sync(std::FILE* f) {
  return std::fwrite(pending_.data(), 1, pending_.size(), f) == pending_.size() && std::fflush(f) == 0 &&
         ::fsync(::fileno(f)) == 0;
}


// The comma-separated fields of a line, empty ones included ("1,2," has 3).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  for (char c : line) {
    if (c == ',')
      fields.emplace_back();
    else
      fields.back() += c;
  }
  return fields;
}

// The rows of an earlier log.csv up to the checkpoint's step: exactly steps 1..step, each a
// complete row of numbers; rows after the step (written after the checkpoint) are dropped.
std::vector<std::string> rows_up_to(const fs::path& path, std::int64_t step, bool bpb) {
  if (!io::non_regular_kind(path.string()).empty())  // a FIFO would wait, a device never end
    io::require_input_file(path.string(), "[train] the log of the run to resume", io::InputError::format);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError("[train] " + path.string() + ": cannot read the log of the run to resume");
  std::string line;
  std::vector<std::string> rows;
  if (!std::getline(in, line) ||
      (bpb ? line != RunLog::kHeaderBpb : (line != RunLog::kHeader && line != RunLog::kHeaderV1)))
    throw FormatError("[train] " + path.string() + ":1: not the header of a training log");
  const bool v1 = line == RunLog::kHeaderV1;
  const std::size_t columns = v1 ? 6 : bpb ? 8 : 7;
  for (std::int64_t n = 2; static_cast<std::int64_t>(rows.size()) < step; ++n) {
    const std::string where = "[train] " + path.string() + ":" + std::to_string(n);
    if (!std::getline(in, line))
      throw FormatError(where + ": the log ends at step " + std::to_string(rows.size()) + ", the checkpoint is at step " +
                        std::to_string(step));
    const std::vector<std::string> fields = csv_fields(line);
    if (fields.size() != columns)
      throw FormatError(where + ": expected " + std::to_string(columns) + " comma-separated fields, found " +
                        std::to_string(fields.size()));
    const std::int64_t s = io::parse_int(fields[0], where + ": step");
    if (s != static_cast<std::int64_t>(rows.size()) + 1)
      throw FormatError(where + ": step " + fields[0] + " where step " + std::to_string(rows.size() + 1) + " belongs");
    for (std::size_t i = 1; i < fields.size(); ++i)
      if (i < 6 || !fields[i].empty()) io::parse_double(fields[i], where + ": field " + std::to_string(i + 1));
    rows.push_back(v1 ? line + "," : line);
  }
  return rows;
}

// A new run's identity: 128 random bits as 32 lowercase hex digits. Random (not derived from
// the options), so two runs with the same flags have different ids.
std::string new_run_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    id += buf;
  }
  return id;
}

bool is_run_id(const std::string& id) {
  if (id.size() != 32) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The run id in DIR/run_id.txt; empty if the file does not exist (a folder of a run saved
// before run ids). FormatError if it exists but does not hold one id.
std::string read_run_id(const fs::path& dir) {
  const fs::path path = dir / kRunIdFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  io::require_input_file(path.string(), "[train] the run id", io::InputError::format);
  std::ifstream in(path, std::ios::binary);
  std::string text;
  if (!in || !std::getline(in, text))
    throw FormatError("[train] " + path.string() + ": cannot read the run id");
  std::string rest;
  if (!is_run_id(text) || std::getline(in, rest))
    throw FormatError("[train] " + path.string() + ": not a run id (one line of 32 hex digits)");
  return text;
}

// Writes DIR/run_id.txt atomically (temporary file, fsync, rename).
void write_run_id(const fs::path& dir, const std::string& id) {
  const std::string path = (dir / kRunIdFile).string();
  io::write_atomically(path, id + "\n", "[train] " + path + ": ");
}

std::string describe_run_id(const std::string& id) { return id.empty() ? "none (saved before run ids)" : id; }

// --resume: the state must belong to the run whose files are in the folder. Checked before
// anything in the folder changes.
void check_run_id(const std::string& state_id, const fs::path& dir, const std::string& state_path) {
  if (!state_id.empty() && !is_run_id(state_id))
    throw FormatError("[train] " + state_path + ": metadata 'run_id' = '" + state_id + "' is not a run id (32 hex digits)");
  const std::string folder_id = read_run_id(dir);
  if (state_id == folder_id) return;
  throw FormatError("[train] " + state_path + " is from run " + describe_run_id(state_id) + ", but " +
                    (dir / kRunIdFile).string() +
                    (folder_id.empty() ? " does not exist (the folder's files are of no known run)"
                                       : " says the folder holds run " + folder_id) +
                    ": the state belongs to another run; refusing to resume (nothing changed)");
}

void prepare_out_folder(const std::string& out) {
  try {
    fs::create_directories(out);
  } catch (const fs::filesystem_error& e) {
    throw UsageError(op_message("train", "--out " + out + ": cannot create the folder: " + e.code().message()));
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    for (const std::string base : {kStateFile, kModelFile, kBestFile, kLogFile, kRunIdFile, kConfigFile,
                                   "train.bin", "val.bin"})  // also token files of a killed run
      if (name.rfind(base + ".tmp.", 0) == 0) fs::remove(entry.path(), ec);
  }
}

}  // namespace xg::runs
