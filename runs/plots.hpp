/// \file
/// Pictures, drawn by gnuplot (Debian gnuplot-nox, pngcairo terminal): the loss curve (from
/// log.csv), attention maps and visibility patterns. Each picture X.png comes with its gnuplot
/// script X.gp beside it (self-contained but for log.csv; `cd DIR && gnuplot X.gp` redraws it).
///
/// gnuplot is looked up on PATH when a picture is drawn. Without it a picture is skipped, not an
/// error: the script is still written, any earlier X.png is removed (it would no longer match)
/// and Picture::note says so. A gnuplot that runs and fails, or input that cannot be drawn
/// (a non-finite weight, a bad path), throws.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <xgrad/core/array.hpp>

namespace xg::runs {

/// The size of a picture in pixels.
struct ImageSize {
  /// Width and height in pixels (0 when unknown). @{
  int width = 0, height = 0;
  /// @}
};

/// What drawing one picture did.
struct Picture {
  /// The paths of the picture and of its gnuplot script. @{
  std::string png, script;
  /// @}
  bool drawn = false;       ///< false: gnuplot is not on PATH, only the script was written.
  ImageSize size;           ///< Of the PNG, when drawn (checked against the size asked of gnuplot).
  std::string note;         ///< When not drawn: what was skipped and how to draw it later.
};

/// The first executable `gnuplot` on PATH ("" when there is none).
std::string find_gnuplot();

/// `s` as a gnuplot double-quoted string: backslash and quote escaped, a line break as \\n
/// (pictures use the noenhanced terminal, so ^ _ @ { } stay plain text).
std::string gnuplot_quote(const std::string& s);

/// Writes `script_text` (a gnuplot script that draws the picture named by `png`'s file name,
/// run in `png`'s folder) to the script beside `png` (X.png -> X.gp) and draws it: without
/// gnuplot on PATH the picture is skipped as described above; ValueError (naming `op`) when
/// the path is bad, a file cannot be written, gnuplot fails, or the PNG is not `expected`'s size.
Picture draw_picture(const std::string& png, const std::string& script_text, const std::string& op, ImageSize expected);

/// Tick labels are drawn on an axis of at most this many cells (one label per cell).
constexpr std::size_t kMaxTickLabels = 32;

/// Title, axis names and per-cell labels of a heatmap.
struct HeatmapLabels {
  std::string title;  ///< May hold "\n" for a second line.
  std::string x_label = "key position";    ///< The horizontal axis's name.
  std::string y_label = "query position";  ///< The vertical axis's name.
  /// One label per column / row (ValueError for another count), or empty (positions 0, 1, ...). @{
  std::vector<std::string> x_ticks, y_ticks;
  /// @}
};

/// A label for a token on an axis: spaces, control characters and bytes that are not UTF-8
/// become visible escapes ("␣", "\n", "\x07", "\xC3"); anything else is kept.
std::string tick_label(const std::string& token);

/// What a loss curve's axes are chosen from: the smallest and largest loss in the log (training
/// and validation; 0 when unknown) and whether the log has the val_bpb column (column 8).
struct LossData {
  /// The smallest and largest loss, both > 0 when known. @{
  double lo = 0, hi = 0;
  /// @}
  bool bits_per_byte = false;  ///< Also draw the validation bits per byte, on a right-hand axis.
};

/// Loss against step from a log.csv (columns step,lr,loss,...), 900 x 500; `validation`: also
/// the validation loss (column 7, val_loss, points where it is not empty). The loss axis is
/// chosen from `data`: linear over the losses' range (with a margin) when they span less than
/// a factor of 10, so that it has several labels; a log scale over their range when they span
/// more (or when the range is unknown). `data.bits_per_byte`: the validation bits per byte
/// (column 8) too, on a right-hand axis. `png_name` is the output's file name; the CSV is
/// named relative to the script's folder. Returns the gnuplot script's text.
std::string loss_curve_script(const std::string& csv, const std::string& png_name, const std::string& title,
                              bool validation = false, const LossData& data = {});
/// The LossData of a log.csv (the losses of columns 3 and 7, the val_bpb column); a file that
/// cannot be read gives {} (the picture then has a log scale, as before).
LossData loss_data(const std::string& csv);
/// Writes loss_curve_script's script for the picture `png` beside it and draws it (see the
/// file's description for a missing gnuplot). ValueError when the path is bad, a file cannot
/// be written, or gnuplot fails.
Picture loss_curve_png(const std::string& csv, const std::string& png, const std::string& title,
                       bool validation = false);

/// Attention weights M [rows = queries, cols = keys], finite and in [0, 1], with the cells a query
/// may not see (allowed[r * cols + c] == 0, e.g. from Visibility::expand_allowed) drawn grey,
/// apart from the white-to-dark-blue colour scale of the weights (0 to 1). A masked cell must
/// hold weight 0. Tick labels on an axis of <= kMaxTickLabels cells, numbers on longer ones.
/// Returns the gnuplot script's text for the picture named `png_name`. ShapeError when M is
/// not a non-empty matrix or `allowed` has another number of cells; ValueError for a weight
/// outside [0, 1], a non-zero masked weight, or a wrong number of tick labels.
std::string attention_map_script(const Array& M, const std::vector<unsigned char>& allowed, const HeatmapLabels& labels,
                                 const std::string& png_name);
/// Writes attention_map_script's script for the picture `png` beside it and draws it, as
/// loss_curve_png does.
Picture attention_map_png(const Array& M, const std::vector<unsigned char>& allowed, const HeatmapLabels& labels,
                          const std::string& png);

/// A visibility pattern [T, S] (layouts like those of Figure 5.1, or the causal suffix that
/// illustrates (5.12)): allowed cells dark blue, masked
/// (forbidden) cells grey, with a legend naming both. Returns the gnuplot script's text for
/// the picture named `png_name`. `allowed` holds T x S cells, row-major, non-zero where a query
/// may see a key (nn::Visibility::expand_allowed's output); ShapeError when T or S is 0 or
/// `allowed` has another size.
std::string visibility_script(const std::vector<unsigned char>& allowed, std::size_t T, std::size_t S,
                              const HeatmapLabels& labels, const std::string& png_name);
/// Writes visibility_script's script for the picture `png` beside it and draws it, as
/// loss_curve_png does.
Picture visibility_png(const std::vector<unsigned char>& allowed, std::size_t T, std::size_t S,
                       const HeatmapLabels& labels, const std::string& png);

/// Width and height of a PNG file (reads the IHDR chunk; FormatError if not a PNG).
ImageSize png_size(const std::string& png);

}  // namespace xg::runs
