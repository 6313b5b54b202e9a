#include <xgrad/runs/report.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <xgrad/io/input_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/json.hpp>
#include <xgrad/io/number.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/runs/detail/summary_json.hpp>
#include <xgrad/runs/plots.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/version.hpp>

namespace xg::runs {

namespace fs = std::filesystem;
using json::Value;

const char* const kDygraphsPath = "/usr/share/javascript/dygraphs/dygraph.min.js";

namespace {

const char* const kOp = "report";

// The whole file, or nothing when it cannot be read (not a regular file: a FIFO or a device
// is never opened; more than kTextLimit bytes).
std::optional<std::string> slurp(const fs::path& path) {
  try {
    return io::read_input_file(path.string(), io::kTextLimit, "[report] the file", io::InputError::format);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// A number for the page's JSON, in the shortest text that reads back to it: null for NaN and
// infinities (JSON has neither).
Value number(double v) { return std::isfinite(v) ? Value::make_number_text(io::shortest_text(v)) : Value(); }
Value number(const std::optional<double>& v) { return v ? number(*v) : Value(); }
Value integer(std::int64_t v) { return Value::make_number_text(std::to_string(v)); }
Value text(const std::string& s) { return Value::make_text(s); }
Value array() { return Value::make_array(); }
Value object() { return Value::make_object(); }

}  // namespace

PlotLibrary load_dygraphs() {
  const char* env = std::getenv("XGRAD_DYGRAPHS_JS");
  const fs::path js_path = env != nullptr && env[0] != '\0' ? env : kDygraphsPath;
  const fs::path css_path = fs::path(js_path).replace_extension(".css");
  const std::string hint = " (the report's plotting library, Debian package libjs-dygraphs: apt-get install "
                           "libjs-dygraphs, or scripts/setup.sh)";
  const auto load = [&](const fs::path& path, const char* closing) {
    std::optional<std::string> t = slurp(path);
    if (!t) throw UsageError(op_message(kOp, "cannot read " + path.string() + hint));
    std::string lower = *t;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find(closing) != std::string::npos)
      throw UsageError(op_message(kOp, path.string() + " holds '" + closing + "' and cannot be inlined into the page" + hint));
    // The source-map comment would point the browser's tools at a file beside the page: made inert.
    for (std::size_t at = t->find("sourceMappingURL="); at != std::string::npos; at = t->find("sourceMappingURL=", at))
      t->replace(at, 17, "source-map-removed=");
    return *t;
  };
  PlotLibrary lib;
  lib.js = load(js_path, "</script");
  if (lib.js.find("Dygraph") == std::string::npos)
    throw UsageError(op_message(kOp, js_path.string() + " is not the dygraphs library" + hint));
  lib.css = load(css_path, "</style");
  return lib;
}

GradcheckReport read_gradcheck(const std::string& path) {
  const auto bad = [&](const std::string& why) { throw FormatError("[" + std::string(kOp) + "] --gradcheck " + path + ": " + why); };
  const std::optional<std::string> t = slurp(path);
  std::error_code ec;
  if (!t) bad(fs::exists(path, ec) ? "cannot read the file" : "does not exist");
  Value j;
  try {
    json::check_limits(*t);
    j = json::parse(*t);
  } catch (const FormatError& e) {
    bad(std::string("not JSON (") + e.what() + "); give the file xgrad gradcheck --json wrote");
  }
  const Value* tool = j.is_object() ? j.find("tool") : nullptr;
  const Value* all = j.is_object() ? j.find("checks") : nullptr;
  if (!tool || !tool->is_string() || tool->str() != "xgrad gradcheck" || !all || !all->is_array())
    bad("not an xgrad gradcheck --json report (no \"tool\": \"xgrad gradcheck\" with a \"checks\" array)");
  GradcheckReport r;
  r.path = path;
  const auto num = [&](const Value* v, const std::string& what) -> std::optional<double> {
    if (!v || v->kind() == Value::Kind::null) return std::nullopt;
    if (!v->is_number()) bad(what + " is not a number or null");
    return std::strtod(v->str().c_str(), nullptr);
  };
  const auto str = [&](const Value& o, const char* key, const std::string& what) -> std::string {
    const Value* v = o.find(key);
    if (!v || v->kind() == Value::Kind::null) return "";
    if (v->is_string()) return v->str();
    if (v->is_object() || v->is_array()) return v->dump();
    bad(what + " \"" + key + "\" is not text");
    return "";
  };
  r.dtype = str(j, "dtype", "the report's");
  if (const Value* order = j.find("order")) {  // reports before --order have none: order 1
    std::uint64_t o = 0;
    if (!order->as_uint(o) || (o != 1 && o != 2)) bad("\"order\" is not 1 or 2");
    r.order = static_cast<int>(o);
  }
  if (const Value* tol = j.find("tolerances"); tol && tol->is_object()) {
    r.atol = num(tol->find("atol"), "tolerances.atol").value_or(0);
    r.rtol = num(tol->find("rtol"), "tolerances.rtol").value_or(0);
    r.eps = num(tol->find("eps"), "tolerances.eps").value_or(0);
  }
  std::size_t i = 0;
  for (const Value& c : all->items()) {
    const std::string at = "checks[" + std::to_string(i++) + "]";
    const Value* name = c.is_object() ? c.find("check") : nullptr;
    const Value* status = c.is_object() ? c.find("status") : nullptr;
    if (!name || !name->is_string() || !status || !status->is_string())
      bad(at + " has no \"check\" name and \"status\"");
    GradcheckRow row;
    row.check = name->str();
    row.status = status->str();
    if (row.status != "passed" && row.status != "failed" && row.status != "skipped")
      bad(at + ": status '" + row.status + "' is not passed, failed or skipped");
    row.kind = str(c, "kind", at);
    row.configuration = str(c, "configuration", at);
    row.message = str(c, "message", at);
    row.worst_element = str(c, "worst_element", at);
    row.mode = str(c, "mode", at);
    row.max_abs_error = num(c.find("max_abs_error"), at + ".max_abs_error");
    row.max_rel_error = num(c.find("max_rel_error"), at + ".max_rel_error");
    r.checks.push_back(std::move(row));
  }
  return r;
}

RunOutput read_run_output(const RunSummary& run) {
  RunOutput out;
  if (const std::optional<std::string> t = slurp(fs::path(run.dir) / kResultFile)) {
    std::string line;
    bool in_samples = false;
    std::string samples;
    std::size_t pos = 0;
    while (pos < t->size()) {
      const std::size_t end = t->find('\n', pos);
      line = t->substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      pos = end == std::string::npos ? t->size() : end + 1;
      if (line == "samples:") {
        in_samples = true;
        out.samples = "";
        continue;
      }
      if (line.rfind("RESULT ", 0) == 0) {
        out.result_lines.push_back(line);
        in_samples = false;
      } else if (in_samples) {
        if (line.rfind("validation loss ", 0) == 0 || line.rfind("wrote ", 0) == 0 || line.rfind("trained ", 0) == 0)
          in_samples = false;
        else
          *out.samples += line + "\n";
      }
    }
  }
  const fs::path samples_path = fs::path(run.dir) / kSamplesFile;
  if (const std::optional<std::string> t = slurp(samples_path)) {
    std::size_t pos = 0, line_no = 0;
    for (std::size_t end; (end = t->find('\n', pos)) != std::string::npos; pos = end + 1) {
      const std::string at = "[report] " + samples_path.string() + ":" + std::to_string(++line_no);
      std::uint64_t step = 0;
      json::Value v;
      try {
        v = json::parse(t->substr(pos, end - pos));
      } catch (const FormatError& e) {
        throw FormatError(at + ": not a JSON line: " + e.what());
      }
      const json::Value* s = v.is_object() ? v.find("step") : nullptr;
      const json::Value* x = v.is_object() ? v.find("text") : nullptr;
      if (!s || !s->as_uint(step) || step > (std::uint64_t(1) << 62) || !x || !x->is_string())
        throw FormatError(at + ": not a sample ({\"step\": S, \"text\": \"...\"})");
      out.eval_samples.emplace_back(static_cast<std::int64_t>(step), x->str());
    }
  }
  if (const std::optional<std::string> cfg = slurp(fs::path(run.dir) / kConfigFile)) {
    try {
      out.config_json = json::parse(*cfg).dump(2);
    } catch (const FormatError&) {
      out.config_json = *cfg;  // read_run already refused a config.json that is not JSON
    }
  } else {
    Value o = object();
    for (const auto& [k, v] : run.options) o.set(text(k).str(), text(v));
    out.config_json = o.dump(2);
  }
  return out;
}

namespace {

// The page's data: one JSON object, inlined into a <script type="application/json">.
Value page_data(const ReportInput& in) {
  Value d = object();
  d.set("title", text(in.title));
  d.set("xgrad_version", Value::make_string(XGRAD_VERSION_STRING));
  {
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
    d.set("generated", Value::make_string(buf));
  }
  Value runs = array();
  for (std::size_t i = 0; i < in.runs.size(); ++i) {
    const RunSummary& r = in.runs[i];
    Value o = detail::summary_json(r);
    o.set("task", r.options.count("task") ? text(r.options.at("task")) : Value());
    // The curves, one array per column; wall time runs on across sessions (a resumed run's
    // clock restarts at 0 in log.csv).
    const std::vector<std::size_t> starts = session_starts(r.log.rows, r.tokens_per_step);
    Value step = array(), lr = array(), loss = array(), gn = array(), tps = array(), wall = array(), val = array(),
          bpb = array();
    double offset = 0.0;
    std::size_t next = 1;
    for (std::size_t k = 0; k < r.log.rows.size(); ++k) {
      const LogRow& row = r.log.rows[k];
      if (next < starts.size() && k == starts[next]) {
        offset += r.log.rows[k - 1].elapsed_s;
        ++next;
      }
      step.push(integer(row.step));
      lr.push(number(row.lr));
      loss.push(number(row.loss));
      gn.push(number(row.grad_norm));
      tps.push(number(row.tokens_per_s));
      wall.push(number(offset + row.elapsed_s));
      val.push(number(row.val_loss));
      bpb.push(number(row.val_bpb));
    }
    o.set("log", Value::make_object({{"step", std::move(step)}, {"lr", std::move(lr)}, {"loss", std::move(loss)},
                                     {"grad_norm", std::move(gn)}, {"tokens_per_s", std::move(tps)},
                                     {"wall_s", std::move(wall)}, {"val_loss", std::move(val)},
                                     {"val_bpb", std::move(bpb)}}));
    const RunOutput& out = in.outputs.at(i);
    o.set("samples", out.samples ? text(*out.samples) : Value());
    Value res = array();
    for (const std::string& l : out.result_lines) res.push(text(l));
    o.set("result_lines", std::move(res));
    o.set("config_json", text(out.config_json));
    Value eval_samples = array();
    for (const auto& [step, sample] : out.eval_samples)
      eval_samples.push(Value::make_object({{"step", integer(step)}, {"text", text(sample)}}));
    o.set("eval_samples", std::move(eval_samples));
    runs.push(std::move(o));
  }
  d.set("runs", std::move(runs));
  Value diff = array();
  for (const std::string& k : differing_options(in.runs)) diff.push(text(k));
  d.set("differing", std::move(diff));
  if (in.attention) {
    const AttentionReport& a = *in.attention;
    Value w = array(), al = array(), toks = array(), windows = array();
    for (const auto& m : a.weights) {
      Value row = array();
      for (double v : m) row.push(number(v));
      w.push(std::move(row));
    }
    for (const auto& m : a.allowed) {
      Value row = array();
      for (unsigned char v : m) row.push(Value::make_uint(v != 0 ? 1 : 0));
      al.push(std::move(row));
    }
    for (const std::string& t : a.tokens) toks.push(text(t));
    for (std::size_t W : a.windows) windows.push(Value::make_uint(W));
    d.set("attention", Value::make_object({{"checkpoint", text(a.checkpoint)}, {"prompt", text(a.prompt)},
                                           {"tokens", std::move(toks)}, {"layers", Value::make_uint(a.layers)},
                                           {"heads", Value::make_uint(a.heads)}, {"kv_heads", Value::make_uint(a.kv_heads)},
                                           {"windows", std::move(windows)}, {"weights", std::move(w)},
                                           {"allowed", std::move(al)}}));
  } else {
    d.set("attention", Value());
  }
  if (in.gradcheck) {
    const GradcheckReport& g = *in.gradcheck;
    Value checks = array();
    for (const GradcheckRow& c : g.checks)
      checks.push(Value::make_object({{"check", text(c.check)},
                                      {"kind", text(c.kind)},
                                      {"configuration", text(c.configuration)},
                                      {"status", text(c.status)},
                                      {"max_abs_error", number(c.max_abs_error)},
                                      {"max_rel_error", number(c.max_rel_error)},
                                      {"worst_element", text(c.worst_element)},
                                      {"mode", text(c.mode)},
                                      {"message", text(c.message)}}));
    d.set("gradcheck", Value::make_object({{"path", text(g.path)}, {"dtype", text(g.dtype)},
                                           {"order", Value::make_uint(static_cast<std::uint64_t>(g.order))},
                                           {"atol", number(g.atol)}, {"rtol", number(g.rtol)}, {"eps", number(g.eps)},
                                           {"checks", std::move(checks)}}));
  } else {
    d.set("gradcheck", Value());
  }
  return d;
}

// JSON inside <script>: '<', '>' and '&' only occur in strings, where \u escapes mean the same.
std::string script_safe(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '<')
      o += "\\u003c";
    else if (c == '>')
      o += "\\u003e";
    else if (c == '&')
      o += "\\u0026";
    else
      o += c;
  }
  return o;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

#include "report_page.inc"

}  // namespace

std::string report_html(const ReportInput& in) {
  const std::string data = script_safe(page_data(in).dump());
  std::string page;
  page += kPageHead;
  page += "<title>" + html_escape(in.title) + "</title>\n";
  page += "<style>\n";
  page += in.library.css;
  page += "\n";
  page += kPageStyle;
  page += "</style>\n</head>\n<body>\n";
  page += kPageBody;
  page += "<script id=\"report-data\" type=\"application/json\">" + data + "</script>\n";
  page += "<script>\n" + in.library.js + "\n</script>\n";
  page += "<script>\n";
  page += kPageScript;
  page += "</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace xg::runs
