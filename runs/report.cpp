#include <xgrad/runs/report.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <xgrad/io/input_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/json.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/runs/plots.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/version.hpp>

namespace xg::runs {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

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

// A number for the page's JSON: null for NaN and infinities (JSON has neither).
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
json number(const std::optional<double>& v) { return v ? number(*v) : json(nullptr); }

// Text for JSON: invalid UTF-8 bytes become U+FFFD (a log or a sample may hold any bytes).
std::string utf8(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }
json text(const std::string& s) { return json::parse(utf8(s)); }

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
  json j;
  try {
    xg::json::check_limits(*t);  // nlohmann recurses: bounded depth and size first
    j = json::parse(*t);
  } catch (const json::exception& e) {
    bad(std::string("not JSON (") + e.what() + "); give the file xgrad gradcheck --json wrote");
  } catch (const FormatError& e) {
    bad(std::string(e.what()) + "; give the file xgrad gradcheck --json wrote");
  }
  if (!j.is_object() || j.value("tool", "") != "xgrad gradcheck" || !j.contains("checks") || !j["checks"].is_array())
    bad("not an xgrad gradcheck --json report (no \"tool\": \"xgrad gradcheck\" with a \"checks\" array)");
  GradcheckReport r;
  r.path = path;
  const auto num = [&](const json& v, const std::string& what) -> std::optional<double> {
    if (v.is_null()) return std::nullopt;
    if (!v.is_number()) bad(what + " is not a number or null");
    return v.get<double>();
  };
  const auto str = [&](const json& o, const char* key, const std::string& what) -> std::string {
    if (!o.contains(key)) return "";
    const json& v = o[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_null()) return "";
    if (v.is_object() || v.is_array()) return v.dump();
    bad(what + " \"" + key + "\" is not text");
    return "";
  };
  r.dtype = str(j, "dtype", "the report's");
  if (j.contains("order")) {  // reports before --order have none: order 1
    if (!j["order"].is_number_integer() || (j["order"] != 1 && j["order"] != 2)) bad("\"order\" is not 1 or 2");
    r.order = j["order"].get<int>();
  }
  if (j.contains("tolerances") && j["tolerances"].is_object()) {
    const json& tol = j["tolerances"];
    r.atol = num(tol.value("atol", json()), "tolerances.atol").value_or(0);
    r.rtol = num(tol.value("rtol", json()), "tolerances.rtol").value_or(0);
    r.eps = num(tol.value("eps", json()), "tolerances.eps").value_or(0);
  }
  std::size_t i = 0;
  for (const json& c : j["checks"]) {
    const std::string at = "checks[" + std::to_string(i++) + "]";
    if (!c.is_object() || !c.contains("check") || !c["check"].is_string() || !c.contains("status") ||
        !c["status"].is_string())
      bad(at + " has no \"check\" name and \"status\"");
    GradcheckRow row;
    row.check = c["check"].get<std::string>();
    row.status = c["status"].get<std::string>();
    if (row.status != "passed" && row.status != "failed" && row.status != "skipped")
      bad(at + ": status '" + row.status + "' is not passed, failed or skipped");
    row.kind = str(c, "kind", at);
    row.configuration = str(c, "configuration", at);
    row.message = str(c, "message", at);
    row.worst_element = str(c, "worst_element", at);
    row.mode = str(c, "mode", at);
    row.max_abs_error = num(c.value("max_abs_error", json()), at + ".max_abs_error");
    row.max_rel_error = num(c.value("max_rel_error", json()), at + ".max_rel_error");
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
  if (const std::optional<std::string> cfg = slurp(fs::path(run.dir) / kConfigFile)) {
    try {
      xg::json::check_limits(*cfg);
      out.config_json = json::parse(*cfg).dump(2);
    } catch (const json::exception&) {
      out.config_json = *cfg;
    } catch (const FormatError&) {
      out.config_json = *cfg;  // read_run already refused a config.json that is not JSON
    }
  } else {
    json o = json::object();
    for (const auto& [k, v] : run.options) o[k] = text(v);
    out.config_json = o.dump(2);
  }
  return out;
}

namespace {

// The page's data: one JSON object, inlined into a <script type="application/json">.
json page_data(const ReportInput& in) {
  json d;
  d["title"] = in.title;
  d["xgrad_version"] = XGRAD_VERSION_STRING;
  {
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
    d["generated"] = buf;
  }
  json runs = json::array();
  for (std::size_t i = 0; i < in.runs.size(); ++i) {
    const RunSummary& r = in.runs[i];
    json o;
    o["label"] = text(r.label);
    o["dir"] = text(r.dir);
    o["run_id"] = r.run_id;
    o["options_source"] = r.options_source;
    json opts = json::object();
    for (const auto& [k, v] : r.options) opts[k] = text(v);
    o["options"] = opts;
    o["task"] = r.options.count("task") ? text(r.options.at("task")) : json(nullptr);
    o["steps"] = r.steps;
    o["tokens"] = r.tokens ? json(*r.tokens) : json(nullptr);
    o["tokens_per_step"] = r.tokens_per_step ? json(*r.tokens_per_step) : json(nullptr);
    o["sessions"] = r.sessions;
    o["wall_s"] = number(r.wall_s);
    o["final_train_loss"] = number(r.final_train_loss);
    o["final_val_loss"] = number(r.final_val_loss);
    o["best_val_loss"] = number(r.best_val_loss);
    o["best_val_step"] = r.best_val_step;
    o["final_val_bpb"] = number(r.final_val_bpb);
    o["best_val_bpb"] = number(r.best_val_bpb);
    // The curves, one array per column; wall time runs on across sessions (a resumed run's
    // clock restarts at 0 in log.csv).
    const std::vector<std::size_t> starts = session_starts(r.log.rows, r.tokens_per_step);
    json step = json::array(), lr = json::array(), loss = json::array(), gn = json::array(), tps = json::array(),
         wall = json::array(), val = json::array(), bpb = json::array();
    double offset = 0.0;
    std::size_t next = 1;
    for (std::size_t k = 0; k < r.log.rows.size(); ++k) {
      const LogRow& row = r.log.rows[k];
      if (next < starts.size() && k == starts[next]) {
        offset += r.log.rows[k - 1].elapsed_s;
        ++next;
      }
      step.push_back(row.step);
      lr.push_back(number(row.lr));
      loss.push_back(number(row.loss));
      gn.push_back(number(row.grad_norm));
      tps.push_back(number(row.tokens_per_s));
      wall.push_back(number(offset + row.elapsed_s));
      val.push_back(number(row.val_loss));
      bpb.push_back(number(row.val_bpb));
    }
    o["log"] = {{"step", step}, {"lr", lr},     {"loss", loss},   {"grad_norm", gn},
                {"tokens_per_s", tps}, {"wall_s", wall}, {"val_loss", val}, {"val_bpb", bpb}};
    const RunOutput& out = in.outputs.at(i);
    o["samples"] = out.samples ? text(*out.samples) : json(nullptr);
    json res = json::array();
    for (const std::string& l : out.result_lines) res.push_back(text(l));
    o["result_lines"] = res;
    o["config_json"] = text(out.config_json);
    runs.push_back(o);
  }
  d["runs"] = runs;
  json diff = json::array();
  for (const std::string& k : differing_options(in.runs)) diff.push_back(text(k));
  d["differing"] = diff;
  if (in.attention) {
    const AttentionReport& a = *in.attention;
    json w = json::array(), al = json::array(), toks = json::array();
    for (const auto& m : a.weights) {
      json row = json::array();
      for (double v : m) row.push_back(number(v));
      w.push_back(row);
    }
    for (const auto& m : a.allowed) {
      json row = json::array();
      for (unsigned char v : m) row.push_back(v != 0 ? 1 : 0);
      al.push_back(row);
    }
    for (const std::string& t : a.tokens) toks.push_back(text(t));
    d["attention"] = {{"checkpoint", text(a.checkpoint)}, {"prompt", text(a.prompt)}, {"tokens", toks},
                      {"layers", a.layers}, {"heads", a.heads}, {"kv_heads", a.kv_heads},
                      {"windows", a.windows}, {"weights", w}, {"allowed", al}};
  } else {
    d["attention"] = nullptr;
  }
  if (in.gradcheck) {
    const GradcheckReport& g = *in.gradcheck;
    json checks = json::array();
    for (const GradcheckRow& c : g.checks)
      checks.push_back({{"check", text(c.check)},
                        {"kind", text(c.kind)},
                        {"configuration", text(c.configuration)},
                        {"status", c.status},
                        {"max_abs_error", number(c.max_abs_error)},
                        {"max_rel_error", number(c.max_rel_error)},
                        {"worst_element", text(c.worst_element)},
                        {"mode", text(c.mode)},
                        {"message", text(c.message)}});
    d["gradcheck"] = {{"path", text(g.path)}, {"dtype", g.dtype}, {"order", g.order}, {"atol", number(g.atol)},
                      {"rtol", number(g.rtol)}, {"eps", number(g.eps)}, {"checks", checks}};
  } else {
    d["gradcheck"] = nullptr;
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
  const std::string data = script_safe(page_data(in).dump(-1, ' ', false, json::error_handler_t::replace));
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
