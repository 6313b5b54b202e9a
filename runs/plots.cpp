#include <xgrad/runs/plots.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xgrad/core/error.hpp>
#include <xgrad/version.hpp>

namespace xg::runs {

namespace fs = std::filesystem;

// A gnuplot double-quoted string: backslash and quote escaped, a line break as \n (the
// terminal is noenhanced, so ^ _ @ { } are plain text). Single quotes would not do: gnuplot
// draws the label '''' (one quote) empty.
std::string gnuplot_quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"') q += '\\';
    if (c == '\n') {
      q += "\\n";
      continue;
    }
    q += c;
  }
  return q + "\"";
}

namespace {

// Colours: weights from white (0) to dark blue (1); masked cells a neutral grey that the
// weight scale never reaches.
const char* const kMaskedColour = "#9e9e9e";
const char* const kAllowedColour = "#08306b";
const char* const kPalette = "(0 '#ffffff', 0.25 '#c6dbef', 0.5 '#6baed6', 0.75 '#2171b5', 1 '#08306b')";

// A tick label is also a format for the tick's value: a literal % is %%.
std::string tick_text(const std::string& s) {
  std::string t;
  for (char c : s) t += c == '%' ? std::string("%%") : std::string(1, c);
  return gnuplot_quote(t);
}

// Length of the valid UTF-8 sequence starting at s[i] (0 if none).
std::size_t utf8_length(const std::string& s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  std::size_t n = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3;
  else if (c >= 0xF0 && c <= 0xF4) n = 4;
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  if (n == 3 && ((c == 0xE0 && b(i + 1) < 0xA0) || (c == 0xED && b(i + 1) > 0x9F))) return 0;  // overlong, surrogate
  if (n == 4 && ((c == 0xF0 && b(i + 1) < 0x90) || (c == 0xF4 && b(i + 1) > 0x8F))) return 0;  // overlong, > U+10FFFF
  return n;
}

std::string hex_byte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02X", c);
  return buf;
}

std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The script's path beside the picture: X.png -> X.gp.
std::string script_path(const std::string& png, const std::string& op) {
  if (png.empty()) throw ValueError(op_message(op, "the picture's path is empty"));
  fs::path p(png);
  if (p.filename().empty() || p.filename() == "." || p.filename() == "..")
    throw ValueError(op_message(op, "'" + png + "' does not name a file"));
  if (p.extension() == ".gp") throw ValueError(op_message(op, "'" + png + "' would be overwritten by its own gnuplot script"));
  p.replace_extension(".gp");
  return p.string();
}

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void write_text(const std::string& path, const std::string& text, const std::string& op) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw ValueError(op_message(op, "cannot write " + path + ": " + std::strerror(errno)));
  f << text;
  f.close();
  if (!f) throw ValueError(op_message(op, "writing " + path + " failed"));
}

struct Outcome {
  bool exited = false;
  int code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `exe script` in `dir` (stdin from /dev/null) and collects what it prints.
Outcome run_gnuplot(const std::string& exe, const std::string& dir, const std::string& script, const std::string& op) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw ValueError(op_message(op, std::string("pipe: ") + std::strerror(errno)));
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()), const_cast<char*>(script.c_str()), nullptr};
  const char* const cdir = dir.c_str();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw ValueError(op_message(op, std::string("cannot start gnuplot: ") + std::strerror(errno)));
  }
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    if (::chdir(cdir) != 0) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  Outcome r;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      if (r.output.size() < 65536) r.output.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  return r;
}

// Ticks of one axis: labels at 0..n-1 when there are few cells, gnuplot's numbers otherwise.
std::string ticks(const char* axis, std::size_t n, const std::vector<std::string>& labels, const std::string& op) {
  if (!labels.empty() && labels.size() != n)
    throw ValueError(op_message(op, std::string("expected ") + std::to_string(n) + " " + axis + " tick labels, got " +
                                    std::to_string(labels.size())));
  std::ostringstream s;
  s << "set " << axis << "tics out nomirror";
  if (n <= kMaxTickLabels) {
    s << " (";
    for (std::size_t i = 0; i < n; ++i)
      s << (i ? ", " : "") << tick_text(labels.empty() ? std::to_string(i) : tick_label(labels[i])) << " " << i;
    s << ")";
  }
  s << "\n";
  return s.str();
}

// The canvas of a heatmap: cells of up to 32 pixels, the grid at most 720 pixels on a side,
// plus room for the title, the legend, the axes and the colour scale.
ImageSize heatmap_size(std::size_t rows, std::size_t cols) {
  const std::size_t cell = std::max<std::size_t>(1, std::min<std::size_t>(32, 720 / std::max(rows, cols)));
  return {std::max(560, static_cast<int>(cols * cell) + 300), std::max(400, static_cast<int>(rows * cell) + 240)};
}

// Everything but the data and the plot command: terminal, title, axes, cell grid, masked colour.
std::string heatmap_frame(std::size_t rows, std::size_t cols, const HeatmapLabels& l, const std::string& png_name,
                          const std::string& op) {
  const std::size_t n = std::max(rows, cols);
  const ImageSize size = heatmap_size(rows, cols);
  std::ostringstream s;
  s << "# " << (l.title.empty() ? png_name : l.title.substr(0, l.title.find('\n'))) << "\n"
    << "# Written by xgrad " << XGRAD_VERSION_STRING << "; redraw with: gnuplot "
    << fs::path(png_name).replace_extension(".gp").string() << " (in this folder)\n"
    << "set terminal pngcairo size " << size.width << "," << size.height << " noenhanced font 'sans,10'\n"
    << "set output " << gnuplot_quote(png_name) << "\n"
    << "set title " << gnuplot_quote(l.title) << "\n"
    << "set xlabel " << gnuplot_quote(l.x_label) << "\n"
    << "set ylabel " << gnuplot_quote(l.y_label) << "\n"
    << "set size ratio -1\n"
    << "set xrange [-0.5:" << cols << "-0.5]\n"
    << "set yrange [" << rows << "-0.5:-0.5]  # query 0 at the top\n"
    << ticks("x", cols, l.x_ticks, op) << ticks("y", rows, l.y_ticks, op);
  if (n <= kMaxTickLabels)  // thin white lines between the cells
    s << "set x2tics -0.5, 1 format '' scale 0\nset y2tics -0.5, 1 format '' scale 0\n"
      << "set link x2\nset link y2\nset grid x2tics y2tics front lt 1 lw 0.5 lc rgb '#ffffff'\n";
  // Masked cells are NaN in the data: the image leaves them out and this background shows.
  s << "set object 1 rectangle from graph 0,0 to graph 1,1 behind fillcolor rgb '" << kMaskedColour
    << "' fillstyle solid 1.0 noborder\n"
    << "set key below horizontal samplen 1.5 height 1\n";
  return s.str();
}

// The data as a gnuplot matrix (rows of values; NaN = masked).
std::string matrix_block(const std::string& name, std::size_t rows, std::size_t cols,
                         const std::vector<unsigned char>& allowed, const Array* M) {
  std::string s = "$" + name + " << EOD\n";
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      if (c) s += ' ';
      const std::size_t i = r * cols + c;
      s += !allowed[i] ? "NaN" : (M ? shortest(M->flat(i)) : std::string("1"));
    }
    s += '\n';
  }
  return s + "EOD\n";
}

void check_cells(const std::vector<unsigned char>& allowed, std::size_t T, std::size_t S, const std::string& op) {
  if (T == 0 || S == 0)
    throw ShapeError(op_message(op, "needs at least one query and one key, got " + std::to_string(T) + " x " +
                                        std::to_string(S)));
  if (allowed.size() != T * S)
    throw ShapeError(op_message(op, "allowed has " + std::to_string(allowed.size()) + " cells, expected " +
                                        std::to_string(T) + " x " + std::to_string(S)));
}

}  // namespace

// Writes the script beside the picture, then draws it with gnuplot (or notes that it cannot).
Picture draw_picture(const std::string& png, const std::string& script_text, const std::string& op, ImageSize expected) {
  Picture pic;
  pic.png = png;
  pic.script = script_path(png, op);
  write_text(pic.script, script_text, op);
  const std::string exe = find_gnuplot();
  std::error_code ec;
  if (exe.empty()) {
    fs::remove(png, ec);  // an earlier picture would no longer match its script
    pic.note = "gnuplot not found on PATH: skipped " + png + " (wrote its script " + pic.script +
               "; install gnuplot-nox and run gnuplot " + fs::path(pic.script).filename().string() + " in " +
               folder_of(png) + ")";
    return pic;
  }
  const Outcome r = run_gnuplot(exe, folder_of(png), fs::path(pic.script).filename().string(), op);
  std::string first = r.output.substr(0, r.output.find_first_of("\r\n", r.output.find_first_not_of("\r\n \t")));
  first.erase(0, first.find_first_not_of("\r\n \t"));
  if (!r.exited || r.code != 0)
    throw ValueError(op_message(op, "gnuplot (" + exe + ") failed drawing " + png + " from " + pic.script + " (" +
                                        (r.exited ? "exit status " + std::to_string(r.code) : std::string("killed")) +
                                        (first.empty() ? "" : ": " + first) + ")"));
  try {
    pic.size = png_size(png);
  } catch (const FormatError&) {
    throw ValueError(op_message(op, "gnuplot ran but " + png + " is not a PNG" + (first.empty() ? "" : " (" + first + ")")));
  }
  if (pic.size.width != expected.width || pic.size.height != expected.height)
    throw ValueError(op_message(op, png + " is " + std::to_string(pic.size.width) + "x" + std::to_string(pic.size.height) +
                                        ", expected " + std::to_string(expected.width) + "x" +
                                        std::to_string(expected.height)));
  pic.drawn = true;
  return pic;
}

std::string find_gnuplot() {
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";
    const std::string exe = dir + "/gnuplot";
    struct stat st {};
    if (::stat(exe.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(exe.c_str(), X_OK) == 0) return exe;
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

std::string tick_label(const std::string& token) {
  std::string out;
  for (std::size_t i = 0; i < token.size();) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c == ' ') {
      out += "\xE2\x90\xA3";  // U+2423 OPEN BOX
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += hex_byte(c);
    } else if (c >= 0x80) {
      const std::size_t n = utf8_length(token, i);
      if (n == 0) {
        out += hex_byte(c);
      } else {
        out += token.substr(i, n);
        i += n;
        continue;
      }
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

LossData loss_data(const std::string& csv) {
  LossData d;
  std::ifstream in(csv, std::ios::binary);
  std::string line;
  if (!in || !std::getline(in, line)) return d;
  d.bits_per_byte = line.size() >= 8 && line.compare(line.size() - 8, 8, ",val_bpb") == 0;
  bool any = false;
  while (std::getline(in, line)) {
    std::size_t field = 1, start = 0;
    for (std::size_t i = 0; i <= line.size(); ++i) {
      if (i < line.size() && line[i] != ',') continue;
      if ((field == 3 || field == 7) && i > start) {
        const std::string text = line.substr(start, i - start);
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end && *end == '\0' && std::isfinite(v) && v > 0) {
          d.lo = any ? std::min(d.lo, v) : v;
          d.hi = any ? std::max(d.hi, v) : v;
          any = true;
        }
      }
      ++field;
      start = i + 1;
    }
  }
  return d;
}

std::string loss_curve_script(const std::string& csv, const std::string& png_name, const std::string& title,
                              bool validation, const LossData& data) {
  // A log scale over less than a decade shows one or two labels: then the axis is linear.
  const bool known = data.lo > 0 && data.hi >= data.lo;
  const bool linear = known && data.hi < 10 * data.lo;
  std::ostringstream axis;
  axis.precision(17);
  if (linear) {
    const double pad = std::max((data.hi - data.lo) * 0.05, data.hi * 0.01);
    axis << "set yrange [" << std::max(0.0, data.lo - pad) << ":" << data.hi + pad << "]\n";
  } else {
    axis << "set logscale y\n";
    if (known) axis << "set yrange [" << data.lo / 1.1 << ":" << data.hi * 1.1 << "]\n";
  }
  std::ostringstream s;
  s << "# " << title.substr(0, title.find('\n')) << "\n"
    << "# Written by xgrad " << XGRAD_VERSION_STRING << "; redraw with: gnuplot "
    << fs::path(png_name).replace_extension(".gp").string() << " (in this folder)\n"
    << "set terminal pngcairo size 900,500 noenhanced font 'sans,10'\n"
    << "set output " << gnuplot_quote(png_name) << "\n"
    << "set datafile separator ','\n"
    << "set key autotitle columnhead\n"
    << "set title " << gnuplot_quote(title) << "\n"
    << "set xlabel 'step'\nset ylabel '" << (validation ? "loss" : "training loss") << (linear ? " (nats)" : " (nats, log scale)")
    << "'\n" << axis.str() << "set grid\n";
  if (data.bits_per_byte)
    s << "set ytics nomirror\nset y2tics\nset y2label 'validation bits per byte'\n";
  s << "plot " << gnuplot_quote(csv) << " using 1:3 with lines lw 1.5 lc rgb '#1f4e9c' title '"
    << (validation ? "training loss" : "loss") << "'";
  if (validation)  // rows without an evaluation have an empty val_loss: gnuplot skips them
    s << ", \\\n     " << gnuplot_quote(csv) << " using 1:7 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d95f02' title 'validation loss'";
  if (data.bits_per_byte)
    s << ", \\\n     " << gnuplot_quote(csv)
      << " using 1:8 axes x1y2 with linespoints lw 1.5 dt 2 pt 6 ps 0.6 lc rgb '#1b9e77' title 'validation bits per byte'";
  s << "\n";
  return s.str();
}

Picture loss_curve_png(const std::string& csv, const std::string& png, const std::string& title, bool validation) {
  // The script runs in the picture's folder: name the CSV relative to it when it is there.
  std::error_code ec;
  const fs::path csv_abs = fs::absolute(csv, ec), png_abs = fs::absolute(png, ec);
  const std::string csv_ref = csv_abs.parent_path().lexically_normal() == png_abs.parent_path().lexically_normal()
                                  ? csv_abs.filename().string()
                                  : csv_abs.lexically_normal().string();
  const std::string name = fs::path(png).filename().string();
  return draw_picture(png, loss_curve_script(csv_ref, name, title, validation, loss_data(csv)), "plot", {900, 500});
}

std::string attention_map_script(const Array& M, const std::vector<unsigned char>& allowed, const HeatmapLabels& labels,
                                 const std::string& png_name) {
  const std::string op = "attention_map";
  if (M.ndim() != 2 || M.size() == 0)
    throw ShapeError(op_message(op, "needs a non-empty [queries, keys] matrix, got shape " + shape_str(M.shape())));
  const std::size_t rows = M.shape()[0], cols = M.shape()[1];
  if (allowed.size() != M.size())
    throw ShapeError(op_message(op, "the mask has " + std::to_string(allowed.size()) + " cells, the weights " +
                                        shape_str(M.shape())));
  for (std::size_t i = 0; i < M.size(); ++i) {
    const double v = M.flat(i);
    const std::string where = "cell (query " + std::to_string(i / cols) + ", key " + std::to_string(i % cols) + ")";
    if (!std::isfinite(v) || v < 0.0 || v > 1.0 + 1e-6)
      throw ValueError(op_message(op, where + " holds " + shortest(v) + ", not an attention weight in [0, 1]"));
    if (!allowed[i] && v != 0.0)
      throw ValueError(op_message(op, where + " is masked but holds weight " + shortest(v)));
  }
  std::ostringstream s;
  s << heatmap_frame(rows, cols, labels, png_name, op) << "set palette defined " << kPalette << "\n"
    << "set cbrange [0:1]\nset cbtics 0.2\nset cblabel " << gnuplot_quote("attention weight") << "\n"
    << matrix_block("weights", rows, cols, allowed, &M)
    << "plot $weights matrix with image notitle, \\\n"
    << "     keyentry with boxes fillstyle solid 1.0 fillcolor rgb '" << kMaskedColour
    << "' title " << gnuplot_quote("masked (not allowed)") << "\n";
  return s.str();
}

Picture attention_map_png(const Array& M, const std::vector<unsigned char>& allowed, const HeatmapLabels& labels,
                          const std::string& png) {
  const std::string text = attention_map_script(M, allowed, labels, fs::path(png).filename().string());
  return draw_picture(png, text, "attention_map", heatmap_size(M.shape()[0], M.shape()[1]));
}

std::string visibility_script(const std::vector<unsigned char>& allowed, std::size_t T, std::size_t S,
                              const HeatmapLabels& labels, const std::string& png_name) {
  check_cells(allowed, T, S, "visibility_png");
  std::ostringstream s;
  s << heatmap_frame(T, S, labels, png_name, "visibility_png") << "set palette defined (0 '" << kAllowedColour
    << "', 1 '" << kAllowedColour << "')\nunset colorbox\n"
    << matrix_block("allowed", T, S, allowed, nullptr) << "plot $allowed matrix with image notitle, \\\n"
    << "     keyentry with boxes fillstyle solid 1.0 fillcolor rgb '" << kAllowedColour << "' title "
    << gnuplot_quote("allowed") << ", \\\n"
    << "     keyentry with boxes fillstyle solid 1.0 fillcolor rgb '" << kMaskedColour
    << "' title " << gnuplot_quote("masked (forbidden)") << "\n";
  return s.str();
}

Picture visibility_png(const std::vector<unsigned char>& allowed, std::size_t T, std::size_t S,
                       const HeatmapLabels& labels, const std::string& png) {
  const std::string text = visibility_script(allowed, T, S, labels, fs::path(png).filename().string());
  return draw_picture(png, text, "visibility_png", heatmap_size(T, S));
}

ImageSize png_size(const std::string& png) {
  std::ifstream in(png, std::ios::binary);
  unsigned char h[24] = {};
  in.read(reinterpret_cast<char*>(h), 24);
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (!in || std::memcmp(h, sig, 8) != 0 || std::memcmp(h + 12, "IHDR", 4) != 0)
    throw FormatError("[png] " + png + " is not a PNG file");
  auto be32 = [&](int o) { return (h[o] << 24) | (h[o + 1] << 16) | (h[o + 2] << 8) | h[o + 3]; };
  return {be32(16), be32(20)};
}

}  // namespace xg::runs
