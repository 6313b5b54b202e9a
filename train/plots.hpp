// Pictures: the loss curve (gnuplot, from log.csv), attention maps and visibility patterns
// (heatmaps written as PNG with stb_image_write). Every function throws on failure rather
// than leaving a missing or broken file behind.
#pragma once

#include <string>

#include <xgrad/core/array.hpp>
#include <xgrad/nn/visibility.hpp>

namespace xg::train {

// Loss against step from a log.csv (columns step,lr,loss,...), 900 x 500 PNG via gnuplot.
void loss_curve_png(const std::string& csv, const std::string& png, const std::string& title);

struct ImageSize {
  int width = 0, height = 0;
};

// A [rows, cols] matrix as a heatmap: each entry a cell of `cell` x `cell` pixels, white (0)
// to dark blue (max), with 1-pixel grid lines. Values must be finite and >= 0 (weights).
ImageSize heatmap_png(const Array& M, const std::string& png, int cell = 24);

// A visibility pattern [T, S] (layouts like those of Figure 5.1, or the causal suffix that
// illustrates (5.12)): allowed cells dark, forbidden cells white.
ImageSize visibility_png(const nn::Visibility& v, std::size_t T, std::size_t S, const std::string& png, int cell = 24);

// Width and height of a PNG file (reads the IHDR chunk; FormatError if not a PNG).
ImageSize png_size(const std::string& png);

}  // namespace xg::train
