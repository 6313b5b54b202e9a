#include <xgrad/runs/compare.hpp>
#include <xgrad/runs/detail/summary_json.hpp>
#include <xgrad/io/number.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <xgrad/io/input_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/json.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/version.hpp>

namespace xg::runs {

namespace fs = std::filesystem;

const std::vector<std::string> kRunFolderFiles = {
    kLogFile, kStateFile, kModelFile, kBestFile, kRunIdFile, kConfigFile, kLossPicture, kLossScript, kResultFile,
    kSamplesFile};

namespace {

const char* const kOp = "compare";
// The columns every training log starts with (train/trainer.cpp, RunLog).
const std::vector<std::string> kBaseColumns = {"step", "lr", "loss", "grad_norm", "tokens_per_s", "elapsed_s"};

std::string where(const std::string& path) { return "[" + std::string(kOp) + "] " + path; }

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> fields(1);
  for (char c : line) {
    if (c == sep)
      fields.emplace_back();
    else
      fields.back() += c;
  }
  return fields;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string s;
  for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? sep : "") + parts[i];
  return s;
}

// The whole file as text; FormatError when it is not a readable regular file (of at most
// kTextLimit bytes; a FIFO or a device is refused by name, before it is opened).
std::string read_text(const fs::path& path) {
  return io::read_input_file(path.string(), io::kTextLimit, "[compare] the file", io::InputError::format);
}

// run_id.txt's id ("" when the folder has none): one line of 32 lowercase hex digits, as the
// trainer writes and reads it (the line end may be missing).
std::string read_run_id(const fs::path& dir) {
  const fs::path path = dir / kRunIdFile;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "";
  const std::string text = read_text(path);
  const bool ok = (text.size() == 32 || (text.size() == 33 && text[32] == '\n')) &&
                  text.substr(0, 32).find_first_not_of("0123456789abcdef") == std::string::npos;
  if (!ok) throw FormatError(where(path.string()) + ": not a run id (one line of 32 hex digits)");
  return text.substr(0, 32);
}

// config.json's members as option texts: nested objects flattened as parent.child, strings as
// they are, any other value as its JSON text.
void flatten(const json::Value& v, const std::string& prefix, std::map<std::string, std::string>& out) {
  for (const auto& [key, item] : v.members()) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (item.is_object() && !item.members().empty())
      flatten(item, name, out);
    else
      out[name] = item.is_string() ? item.str() : item.dump();
  }
}

std::map<std::string, std::string> read_config(const fs::path& path) {
  const std::string text = read_text(path);
  json::Value v;
  try {
    v = json::parse(text);
  } catch (const FormatError& e) {
    throw FormatError(where(path.string()) + ": not valid JSON: " + e.what());
  }
  if (!v.is_object()) throw FormatError(where(path.string()) + ": not a JSON object of options");
  std::map<std::string, std::string> options;
  flatten(v, "", options);
  return options;
}

// The trainer's tokens_per_batch from the options (empty when the task or a size is unknown).
std::optional<std::uint64_t> tokens_per_step(const RunSummary& r, const std::string& source) {
  const auto get = [&](const std::string& key) -> std::optional<std::uint64_t> {
    const auto it = r.options.find(key);
    if (it == r.options.end()) return std::nullopt;
    return io::parse_uint(it->second, where(source) + ": option '" + key + "'");
  };
  const auto product = [&](std::uint64_t a, std::uint64_t b) {
    std::uint64_t p = 0;
    if (__builtin_mul_overflow(a, b, &p) || p > (std::uint64_t(1) << 53))
      throw FormatError(where(source) + ": the options give " + std::to_string(a) + " x " + std::to_string(b) +
                        " tokens per step, out of range");
    return p;
  };
  const auto task = r.options.find("task");
  if (task == r.options.end()) return std::nullopt;
  const std::optional<std::uint64_t> batch = get("batch");
  if (!batch) return std::nullopt;
  std::optional<std::uint64_t> per_sequence;
  if (task->second == "sort") {
    if (const auto n = get("n_digits")) per_sequence = product(2, *n);
  } else if (task->second == "reverse") {
    if (const auto n = get("max_len")) per_sequence = product(2, *n) + 1;
  } else if (task->second == "charlm" || task->second == "text") {
    per_sequence = get("context");
  }
  if (!per_sequence) return std::nullopt;
  return product(*batch, *per_sequence);
}

// Whether the text is an integer as the trainer writes them ('-' and digits).
bool integer_text(const std::string& s) {
  const std::size_t d = !s.empty() && s[0] == '-' ? 1 : 0;
  return s.size() > d && s.find_first_not_of("0123456789", d) == std::string::npos;
}

// A finite number (the whole text), for comparing and showing option values.
std::optional<double> number_text(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (integer_text(a) && integer_text(b)) return false;  // exactly, also beyond 2^53 (seeds)
  const std::optional<double> x = number_text(a), y = number_text(b);
  return x && y && *x == *y;
}

// An option's value for the table: numbers in their shortest exact form.
std::string shown_value(const std::string& v) {
  if (integer_text(v)) return v;
  const std::optional<double> x = number_text(v);
  return x ? io::shortest_text(*x) : v;
}

std::string path_components_suffix(const std::vector<std::string>& parts, const std::string& full, std::size_t k) {
  if (k > parts.size()) return full;
  return join(std::vector<std::string>(parts.end() - static_cast<long>(k), parts.end()), "/");
}

}  // namespace

RunLogData read_log(const std::string& path) {
  const std::string text = read_text(path);
  const std::string w = where(path);
  if (text.empty()) throw FormatError(w + ":1: the file is empty, not a training log");
  RunLogData log;
  std::size_t line_no = 0, pos = 0;
  const std::string header_help = " (expected " + join(kBaseColumns, ",") + "[,val_loss[,val_bpb]])";
  while (pos < text.size()) {
    ++line_no;
    const std::size_t end = text.find('\n', pos);
    const std::string at = w + ":" + std::to_string(line_no);
    if (end == std::string::npos)
      throw FormatError(at + ": the last line has no line end: a truncated " + (line_no == 1 ? "header" : "row"));
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    const std::vector<std::string> fields = split(line, ',');
    if (line_no == 1) {
      bool ok = fields.size() >= kBaseColumns.size() &&
                std::equal(kBaseColumns.begin(), kBaseColumns.end(), fields.begin());
      std::set<std::string> seen;
      for (const std::string& f : fields) ok = ok && !f.empty() && seen.insert(f).second;
      if (!ok) throw FormatError(at + ": not the header of a training log: '" + line.substr(0, 120) + "'" + header_help);
      log.columns = fields;
      for (std::size_t i = kBaseColumns.size(); i < fields.size(); ++i) {
        if (fields[i] == "val_loss") log.val_loss_column = i + 1;
        if (fields[i] == "val_bpb") log.val_bpb_column = i + 1;
      }
      continue;
    }
    if (fields.size() != log.columns.size())
      throw FormatError(at + ": expected " + std::to_string(log.columns.size()) + " comma-separated fields, found " +
                        std::to_string(fields.size()));
    LogRow row;
    row.step = io::parse_int(fields[0], at + ": step");
    const std::int64_t expected = static_cast<std::int64_t>(log.rows.size()) + 1;
    if (row.step != expected)
      throw FormatError(at + ": step " + fields[0] + " where step " + std::to_string(expected) + " belongs");
    double* base[] = {&row.lr, &row.loss, &row.grad_norm, &row.tokens_per_s, &row.elapsed_s};
    for (std::size_t i = 1; i < kBaseColumns.size(); ++i)
      *base[i - 1] = io::parse_double(fields[i], at + ": " + log.columns[i]);
    for (std::size_t i = kBaseColumns.size(); i < fields.size(); ++i) {
      if (fields[i].empty()) continue;
      const double v = io::parse_double(fields[i], at + ": " + log.columns[i]);
      if (i + 1 == log.val_loss_column) row.val_loss = v;
      if (i + 1 == log.val_bpb_column) row.val_bpb = v;
    }
    log.rows.push_back(row);
  }
  if (log.rows.empty()) throw FormatError(w + ":2: the log has no rows (no step was logged)");
  return log;
}

void check_run_folder(const std::string& dir) {
  const auto bad = [&](const std::string& why) { throw UsageError(op_message(kOp, "RUN '" + dir + "': " + why)); };
  if (dir.empty()) bad("must name a run folder");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) bad("does not exist");
  if (!fs::is_directory(st)) bad("is a file, not a run folder (give the folder xgrad train --out wrote)");
  std::vector<std::string> missing;
  for (const char* f : {kLogFile, kStateFile})
    if (!fs::exists(fs::symlink_status(fs::path(dir) / f, ec))) missing.push_back(f);
  if (!missing.empty())
    bad("not a run folder: " + join(missing, " and ") + (missing.size() > 1 ? " are" : " is") +
        " missing (a run folder is what xgrad train --out wrote)");
}

RunSummary read_run(const std::string& dir) {
  check_run_folder(dir);
  RunSummary r;
  r.dir = dir;
  r.label = unique_labels({dir}).front();
  r.run_id = read_run_id(dir);

  // The state's header (never its tensors: a state can hold hundreds of megabytes).
  const std::string state = (fs::path(dir) / kStateFile).string();
  const io::safetensors::Header header = io::safetensors::load_header(state);
  const fs::path config = fs::path(dir) / kConfigFile;
  std::string source = state;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(config, ec))) {
    r.options = read_config(config);
    r.options_source = kConfigFile;
    source = config.string();
  } else {
    for (const auto& [key, value] : header.metadata)
      if (key.rfind("opt.", 0) == 0 && key.size() > 4) r.options[key.substr(4)] = value;
    r.options_source = kStateFile;
  }

  r.log = read_log((fs::path(dir) / kLogFile).string());
  const std::vector<LogRow>& rows = r.log.rows;
  r.steps = rows.back().step;
  r.tokens_per_step = tokens_per_step(r, source);
  std::uint64_t tokens = 0;
  if (r.tokens_per_step && !__builtin_mul_overflow(static_cast<std::uint64_t>(r.steps), *r.tokens_per_step, &tokens))
    r.tokens = tokens;

  const std::vector<std::size_t> starts = session_starts(rows, r.tokens_per_step);
  r.sessions = starts.size();
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const std::size_t last = (i + 1 < starts.size() ? starts[i + 1] : rows.size()) - 1;
    r.wall_s += rows[last].elapsed_s;
  }

  const std::size_t tail = std::max<std::size_t>(1, (rows.size() + 19) / 20);  // the last 5%, rounded up
  double sum = 0.0;
  for (std::size_t i = rows.size() - tail; i < rows.size(); ++i) sum += rows[i].loss;
  r.final_train_loss = sum / static_cast<double>(tail);

  for (const LogRow& row : rows) {
    if (!row.val_loss) continue;
    if (!r.bytes_per_token && row.val_bpb && *row.val_bpb > 0 && *row.val_loss > 0)
      r.bytes_per_token = *row.val_loss / (*row.val_bpb * std::log(2.0));
    r.final_val_loss = row.val_loss;
    r.final_val_bpb = row.val_bpb;
    if (!r.best_val_loss || *row.val_loss < *r.best_val_loss) {
      r.best_val_loss = row.val_loss;
      r.best_val_step = row.step;
      r.best_val_bpb = row.val_bpb;
    }
  }
  return r;
}

std::vector<std::size_t> session_starts(const std::vector<LogRow>& rows, std::optional<std::uint64_t> tokens_per_step) {
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    bool start = i == 0 || rows[i].elapsed_s < rows[i - 1].elapsed_s;
    // The trainer writes tokens_per_s = tokens_per_step * (steps into the session) / elapsed_s,
    // so tokens_per_s * elapsed_s / tokens_per_step counts the session's steps: 1 at its first
    // step (to the 6 significant digits both are written with).
    if (!start && tokens_per_step && *tokens_per_step > 0)
      start = std::fabs(rows[i].tokens_per_s * rows[i].elapsed_s / static_cast<double>(*tokens_per_step) - 1.0) < 0.25;
    if (start) starts.push_back(i);
  }
  return starts;
}

std::vector<std::string> unique_labels(const std::vector<std::string>& dirs) {
  std::vector<std::vector<std::string>> parts(dirs.size());
  std::vector<std::string> full(dirs.size());
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    std::error_code ec;
    fs::path p = fs::absolute(dirs[i], ec).lexically_normal();
    if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
    full[i] = p.string();
    for (const fs::path& c : p.relative_path()) parts[i].push_back(c.string());
  }
  std::vector<std::string> labels(dirs.size());
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    for (std::size_t k = 1;; ++k) {
      const std::string mine = path_components_suffix(parts[i], full[i], k);
      bool clash = false;
      for (std::size_t j = 0; j < dirs.size() && !clash; ++j)
        clash = j != i && full[j] != full[i] && path_components_suffix(parts[j], full[j], k) == mine;
      if (!clash || k > parts[i].size()) {
        labels[i] = mine;
        break;
      }
    }
  }
  return labels;
}

std::vector<RunSummary> read_runs(const std::vector<std::string>& dirs) {
  if (dirs.empty()) throw UsageError(op_message(kOp, "no runs: give one or more run folders"));
  for (const std::string& d : dirs) check_run_folder(d);
  const auto same = [](const std::string& a, const std::string& b, const std::string& why) {
    throw UsageError(op_message(kOp, "RUN '" + a + "' and RUN '" + b + "' are " + why + "; give each run once"));
  };
  for (std::size_t i = 0; i < dirs.size(); ++i)
    for (std::size_t j = i + 1; j < dirs.size(); ++j) {
      std::error_code ec;
      if (fs::equivalent(dirs[i], dirs[j], ec)) same(dirs[i], dirs[j], "the same folder");
    }
  std::vector<std::string> ids;
  for (const std::string& d : dirs) ids.push_back(read_run_id(d));
  for (std::size_t i = 0; i < dirs.size(); ++i)
    for (std::size_t j = i + 1; j < dirs.size(); ++j)
      if (!ids[i].empty() && ids[i] == ids[j]) same(dirs[i], dirs[j], "the same run (run_id.txt " + ids[i] + ")");
  std::vector<RunSummary> runs;
  for (const std::string& d : dirs) runs.push_back(read_run(d));
  const std::vector<std::string> labels = unique_labels(dirs);
  for (std::size_t i = 0; i < runs.size(); ++i) runs[i].label = labels[i];
  return runs;
}

std::vector<std::string> differing_options(const std::vector<RunSummary>& runs) {
  if (runs.empty()) return {};
  std::set<std::string> names;
  for (const RunSummary& r : runs)
    for (const auto& kv : r.options) names.insert(kv.first);
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name == "out" || name == "resume") continue;
    bool differ = false;
    const auto first = runs.front().options.find(name);
    for (const RunSummary& r : runs) {
      const auto it = r.options.find(name);
      if ((it == r.options.end()) != (first == runs.front().options.end()))
        differ = true;
      else if (it != r.options.end() && !same_value(it->second, first->second))
        differ = true;
    }
    if (differ) out.push_back(name);
  }
  return out;
}

namespace {

std::string tokens_text(std::uint64_t t) {
  if (t < 10000) return std::to_string(t);
  const char* units[] = {"K", "M", "G", "T", "P", "E"};
  double v = static_cast<double>(t);
  int u = -1;
  while (v >= 999.5 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 9.995 ? "%.2f%s" : v < 99.95 ? "%.1f%s" : "%.0f%s", v, units[u]);
  return buf;
}

std::string wall_text(double s) {
  char buf[48];
  if (s < 9.995) {
    std::snprintf(buf, sizeof buf, "%.2fs", s);
  } else if (s < 59.95) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3599.5) {
    const long t = std::lround(s);
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  } else {
    const long t = std::lround(s / 60.0);
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 60, t % 60);
  }
  return buf;
}

std::string loss_text(const std::optional<double>& v) { return v ? fixed(*v, 4) : "-"; }

// Columns of text, the first left-aligned, the others right-aligned, two spaces apart.
std::string render(const std::vector<std::vector<std::string>>& rows, std::size_t left_aligned, const std::string& indent) {
  std::vector<std::size_t> width;
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }
  std::string s;
  for (const auto& row : rows) {
    std::string line = indent;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      line += (c ? "  " : "") + (c < left_aligned ? row[c] + pad : pad + row[c]);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    s += line + "\n";
  }
  return s;
}

std::string option_of(const RunSummary& r, const std::string& name) {
  const auto it = r.options.find(name);
  return it == r.options.end() ? "-" : shown_value(it->second);
}

}  // namespace

std::string compare_table(const std::vector<RunSummary>& runs) {
  bool bpb = false;
  for (const RunSummary& r : runs) bpb = bpb || r.final_val_bpb || r.best_val_bpb;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"run", "task", "steps", "tokens", "wall", "train loss", "val loss", "best val (step)"};
  if (bpb) {
    head.push_back("val bpb");
    head.push_back("best bpb");
  }
  rows.push_back(head);
  for (const RunSummary& r : runs) {
    std::vector<std::string> row = {r.label,
                                    option_of(r, "task"),
                                    std::to_string(r.steps),
                                    r.tokens ? tokens_text(*r.tokens) : "-",
                                    wall_text(r.wall_s),
                                    fixed(r.final_train_loss, 4),
                                    loss_text(r.final_val_loss),
                                    r.best_val_loss ? fixed(*r.best_val_loss, 4) + " (" + std::to_string(r.best_val_step) + ")"
                                                    : "-"};
    if (bpb) {
      row.push_back(loss_text(r.final_val_bpb));
      row.push_back(loss_text(r.best_val_bpb));
    }
    rows.push_back(row);
  }
  std::string s = render(rows, 2, "");
  s += "train loss: the mean of the last 5% of the steps; wall: training time, summed over resumed sessions\n";
  if (runs.size() < 2) return s;
  const std::vector<std::string> differ = differing_options(runs);
  if (differ.empty()) return s + "\noptions that differ: none\n";
  std::vector<std::vector<std::string>> opts;
  std::vector<std::string> labels = {"option"};
  for (const RunSummary& r : runs) labels.push_back(r.label);
  opts.push_back(labels);
  for (const std::string& name : differ) {
    std::vector<std::string> row = {name};
    for (const RunSummary& r : runs) row.push_back(option_of(r, name));
    opts.push_back(row);
  }
  return s + "\noptions that differ:\n" + render(opts, opts.front().size(), "  ");
}

namespace {

}  // namespace

namespace detail {

json::Value summary_json(const RunSummary& r) {
  using json::Value;
  // JSON has no NaN or infinity: null.
  const auto number = [](double v) { return std::isfinite(v) ? Value::make_number_text(io::exact_text(v)) : Value(); };
  const auto maybe = [&](const std::optional<double>& v) { return v ? number(*v) : Value(); };
  const auto integer = [](std::int64_t v) { return Value::make_number_text(std::to_string(v)); };
  Value options = Value::make_object();
  for (const auto& [k, v] : r.options) options.set(Value::make_text(k).str(), Value::make_text(v));
  Value run = Value::make_object();
  run.set("label", Value::make_text(r.label));
  run.set("dir", Value::make_text(r.dir));
  run.set("run_id", r.run_id.empty() ? Value() : Value::make_string(r.run_id));
  run.set("options_source", Value::make_string(r.options_source));
  run.set("options", std::move(options));
  run.set("steps", integer(r.steps));
  run.set("tokens_per_step", r.tokens_per_step ? Value::make_uint(*r.tokens_per_step) : Value());
  run.set("tokens", r.tokens ? Value::make_uint(*r.tokens) : Value());
  run.set("sessions", Value::make_uint(r.sessions));
  run.set("wall_s", number(r.wall_s));
  run.set("final_train_loss", number(r.final_train_loss));
  run.set("final_val_loss", maybe(r.final_val_loss));
  run.set("best_val_loss", maybe(r.best_val_loss));
  run.set("best_val_step", r.best_val_loss ? integer(r.best_val_step) : Value());
  run.set("final_val_bpb", maybe(r.final_val_bpb));
  run.set("best_val_bpb", maybe(r.best_val_bpb));
  run.set("bytes_per_token", maybe(r.bytes_per_token));
  return run;
}

}  // namespace detail

std::string compare_json(const std::vector<RunSummary>& runs, CompareX x, const Picture* picture, CompareY y) {
  using json::Value;
  Value list = Value::make_array();
  for (const RunSummary& r : runs) list.push(detail::summary_json(r));
  Value differ = Value::make_array();
  for (const std::string& name : differing_options(runs)) differ.push(Value::make_text(name));
  Value pic;
  if (picture) {
    pic = Value::make_object();
    pic.set("png", Value::make_text(picture->png));
    pic.set("script", Value::make_text(picture->script));
    pic.set("drawn", Value::make_bool(picture->drawn));
    pic.set("width", picture->drawn ? Value::make_uint(static_cast<std::uint64_t>(picture->size.width)) : Value());
    pic.set("height", picture->drawn ? Value::make_uint(static_cast<std::uint64_t>(picture->size.height)) : Value());
  }
  Value doc = Value::make_object();
  doc.set("command", Value::make_string(kOp));
  doc.set("xgrad_version", Value::make_string(XGRAD_VERSION_STRING));
  doc.set("x", Value::make_string(axis_name(x)));
  doc.set("y", Value::make_string(axis_name(y)));
  doc.set("runs", std::move(list));
  doc.set("differing_options", std::move(differ));
  doc.set("picture", std::move(pic));
  return doc.dump(2);
}

namespace {

// One colour per run (Tableau 10), repeated after ten runs.
const char* const kRunColours[] = {"1f77b4", "ff7f0e", "2ca02c", "d62728", "9467bd",
                                   "8c564b", "e377c2", "7f7f7f", "bcbd22", "17becf"};
const ImageSize kCompareSize = {1000, 600};

}  // namespace

std::string axis_name(CompareX x) {
  switch (x) {
    case CompareX::step: return "step";
    case CompareX::tokens: return "tokens";
    case CompareX::bytes: return "bytes";
  }
  return "step";
}

std::string axis_name(CompareY y) {
  switch (y) {
    case CompareY::loss: return "loss";
    case CompareY::val_loss: return "val_loss";
    case CompareY::val_bpb: return "val_bpb";
  }
  return "val_loss";
}

void check_x_axis(const std::vector<RunSummary>& runs, CompareX x) {
  if (x == CompareX::step) return;
  const std::string flag = "--x " + axis_name(x);
  for (const RunSummary& r : runs) {
    if (!r.tokens_per_step)
      throw UsageError(op_message(kOp, flag + ": the tokens per step of run '" + r.label + "' (task '" +
                                           option_of(r, "task") + "') are unknown; use --x step"));
    if (x == CompareX::bytes && !r.bytes_per_token)
      throw UsageError(op_message(kOp, flag + ": run '" + r.label + "' (task '" + option_of(r, "task") +
                                           "') has no bytes per token (its log has no val_bpb); use --x step or tokens"));
  }
}

void check_y_axis(const std::vector<RunSummary>& runs, CompareY y) {
  for (const RunSummary& r : runs) {
    if (y == CompareY::val_loss && !r.final_val_loss)
      throw UsageError(op_message(kOp, "--y val_loss: run '" + r.label + "' (task '" + option_of(r, "task") +
                                           "') has no validation loss in its log; use --y loss"));
    if (y == CompareY::val_bpb && !r.final_val_bpb)
      throw UsageError(op_message(kOp, "--y val_bpb: run '" + r.label + "' (task '" + option_of(r, "task") +
                                           "') has no validation bits per byte in its log (only text runs log "
                                           "val_bpb); use --y val_loss or loss"));
  }
}

std::string tokenizer_of(const RunSummary& r) {
  const auto it = r.options.find("tokenizer");
  if (it != r.options.end() && !it->second.empty()) return it->second;
  const auto task = r.options.find("task");
  return task == r.options.end() ? "" : "task " + task->second;
}

CompareY default_y(const std::vector<RunSummary>& runs) {
  bool differ = false, bpb = !runs.empty();
  for (const RunSummary& r : runs) {
    differ = differ || tokenizer_of(r) != tokenizer_of(runs.front());
    bpb = bpb && r.final_val_bpb.has_value();
  }
  return differ && bpb ? CompareY::val_bpb : CompareY::val_loss;
}

std::string compare_script(const std::vector<RunSummary>& runs, const std::string& png, CompareX x, CompareY y) {
  if (runs.empty()) throw ValueError(op_message(kOp, "no runs to draw"));
  check_x_axis(runs, x);
  if (y == CompareY::val_bpb) check_y_axis(runs, y);  // a run without validation shows its training loss
  // The script runs in the picture's folder: each log is named relative to it.
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(fs::absolute(png, ec).parent_path(), ec);
  // The values drawn: training loss (loss, val_loss), validation loss (val_loss), val_bpb.
  const bool train_curve = y != CompareY::val_bpb;
  const auto drawn = [&](const LogRow& row) -> std::vector<std::optional<double>> {
    if (y == CompareY::val_bpb) return {row.val_bpb};
    if (y == CompareY::loss) return {row.loss};
    return {row.loss, row.val_loss};
  };
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  bool any_val = false;
  for (const RunSummary& r : runs)
    for (const LogRow& row : r.log.rows) {
      for (const std::optional<double>& v : drawn(row))
        if (v) {
          lo = std::min(lo, *v);
          hi = std::max(hi, *v);
        }
      any_val = any_val || row.val_loss.has_value();
    }
  if (y != CompareY::val_loss) any_val = false;  // no validation-loss curve to explain
  const bool log_y = lo > 0.0 && hi / lo > 4.0;
  std::string title = "xgrad compare: ";
  for (std::size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : "") + runs[i].label;
  if (title.size() > 120) title = title.substr(0, 117) + "...";
  const std::string y_label = y == CompareY::val_bpb ? "validation bits per byte"
                              : y == CompareY::loss  ? "training loss"
                                                     : "loss";
  const std::string x_label = x == CompareX::step ? "step" : x == CompareX::tokens ? "tokens seen" : "bytes seen";

  std::ostringstream s;
  s << "# " << title << "\n"
    << "# Written by xgrad " << XGRAD_VERSION_STRING << "; redraw with: gnuplot "
    << fs::path(png).filename().replace_extension(".gp").string() << " (in this folder; it reads the runs' log.csv)\n"
    << "set terminal pngcairo size " << kCompareSize.width << "," << kCompareSize.height << " noenhanced font 'sans,10'\n"
    << "set output " << gnuplot_quote(fs::path(png).filename().string()) << "\n"
    << "set datafile separator ','\n"
    << "set title " << gnuplot_quote(title) << "\n"
    << "set xlabel " << gnuplot_quote(x_label) << "\n"
    << "set ylabel " << gnuplot_quote(log_y ? y_label + " (log scale)" : y_label) << "\n"
    << (log_y ? "set logscale y\n" : "") << (x != CompareX::step ? "set format x '%.1s%c'\n" : "")
    << "set grid\nset key outside right top Left reverse\n";
  s << "plot ";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& r = runs[i];
    const std::string colour = kRunColours[i % (sizeof kRunColours / sizeof *kRunColours)];
    const fs::path log = fs::weakly_canonical(fs::absolute(fs::path(r.dir) / kLogFile, ec), ec);
    fs::path ref = log.lexically_relative(folder);
    if (ref.empty()) ref = log;
    std::string xs = "1";
    if (x == CompareX::tokens) xs = "($1*" + std::to_string(*r.tokens_per_step) + ".0)";
    if (x == CompareX::bytes)
      xs = "($1*" + std::to_string(*r.tokens_per_step) + ".0*" + io::exact_text(*r.bytes_per_token) + ")";
    // The run's colour in the legend, then its training loss thin and light (the colour 40%
    // transparent: 0x66 in gnuplot's ARGB) and its validation loss; --y loss draws the
    // training loss alone in full colour, --y val_bpb the bits per byte alone.
    s << (i ? ", \\\n     " : "") << "keyentry with lines lw 3 lc rgb '#" << colour << "' title "
      << gnuplot_quote(r.label);
    if (train_curve)
      s << ", \\\n     " << gnuplot_quote(ref.string()) << " using " << xs << ":3 with lines lw "
        << (y == CompareY::loss ? "1.5 lc rgb '#" : "1 lc rgb '#66") << colour << "' notitle";
    bool val = false;
    for (const LogRow& row : r.log.rows) val = val || row.val_loss.has_value();
    const std::size_t column = y == CompareY::val_bpb ? r.log.val_bpb_column : r.log.val_loss_column;
    if (y != CompareY::loss && val)  // rows without an evaluation have empty fields: gnuplot skips them
      s << ", \\\n     " << gnuplot_quote(ref.string()) << " using " << xs << ":" << column
        << " with linespoints lw 2 pt 7 ps 0.6 lc rgb '#" << colour << "' notitle";
  }
  // What the two line styles mean.
  if (y == CompareY::val_loss) s << ", \\\n     keyentry with lines lw 1 lc rgb '#66000000' title 'training loss'";
  if (any_val) s << ", \\\n     keyentry with linespoints lw 2 pt 7 ps 0.6 lc rgb '#000000' title 'validation loss'";
  s << "\n";
  return s.str();
}

Picture compare_png(const std::vector<RunSummary>& runs, const std::string& png, CompareX x, CompareY y) {
  return draw_picture(png, compare_script(runs, png, x, y), kOp, kCompareSize);
}

}  // namespace xg::runs
