#include <xgrad/train/plots.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stb_image_write.h>
#include <sys/wait.h>
#include <vector>

#include <xgrad/core/error.hpp>

namespace xg::train {

namespace {

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

}  // namespace

void loss_curve_png(const std::string& csv, const std::string& png, const std::string& title) {
  std::FILE* gp = ::popen("gnuplot 2>&1", "w");
  if (!gp) throw ValueError(op_message("plot", "cannot start gnuplot (apt-get install gnuplot-nox)"));
  std::fprintf(gp,
               "set terminal pngcairo size 900,500 font 'sans,10'\n"
               "set output %s\n"
               "set datafile separator ','\n"
               "set key autotitle columnhead\n"
               "set title %s\n"
               "set xlabel 'step'\nset ylabel 'training loss'\nset logscale y\nset grid\n"
               "plot %s using 1:3 with lines lw 1.5 lc rgb '#1f4e9c' title 'loss'\n",
               quoted(png).c_str(), quoted(title).c_str(), quoted(csv).c_str());
  const int status = ::pclose(gp);
  if (status != 0 || png_size(png).width != 900)
    throw ValueError(op_message("plot", "gnuplot failed to write " + png + " (exit status " + std::to_string(status) +
                                            "); is gnuplot-nox installed?"));
}

ImageSize heatmap_png(const Array& M, const std::string& png, int cell) {
  if (M.ndim() != 2 || M.size() == 0)
    throw ShapeError(op_message("heatmap", "needs a non-empty [rows, cols] matrix, got shape " + shape_str(M.shape())));
  const int rows = static_cast<int>(M.shape()[0]), cols = static_cast<int>(M.shape()[1]);
  double hi = 0;
  for (std::size_t i = 0; i < M.size(); ++i) {
    const double v = M.flat(i);
    if (!std::isfinite(v) || v < 0)
      throw ValueError(op_message("heatmap", "value " + std::to_string(v) + " at flat index " + std::to_string(i) +
                                                 " is not a finite non-negative weight"));
    hi = std::max(hi, v);
  }
  const int W = cols * cell + 1, H = rows * cell + 1;
  std::vector<unsigned char> px(static_cast<std::size_t>(W * H * 3), 160);  // grid colour
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const double t = hi > 0 ? M.flat(static_cast<std::size_t>(r * cols + c)) / hi : 0.0;
      const unsigned char R = static_cast<unsigned char>(255 - t * (255 - 8));
      const unsigned char G = static_cast<unsigned char>(255 - t * (255 - 48));
      const unsigned char B = static_cast<unsigned char>(255 - t * (255 - 107));
      for (int y = r * cell + 1; y < (r + 1) * cell; ++y)
        for (int x = c * cell + 1; x < (c + 1) * cell; ++x) {
          unsigned char* p = &px[static_cast<std::size_t>((y * W + x) * 3)];
          p[0] = R;
          p[1] = G;
          p[2] = B;
        }
    }
  if (!stbi_write_png(png.c_str(), W, H, 3, px.data(), W * 3))
    throw ValueError(op_message("heatmap", "cannot write " + png));
  return {W, H};
}

ImageSize visibility_png(const nn::Visibility& v, std::size_t T, std::size_t S, const std::string& png, int cell) {
  const auto allowed = v.expand_allowed("visibility_png", {1, 1, T, S});
  Array M = Array::empty({T, S}, DType::float64);
  for (std::size_t i = 0; i < allowed.size(); ++i) M.set_flat(i, allowed[i] ? 1.0 : 0.0);
  return heatmap_png(M, png, cell);
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

}  // namespace xg::train
