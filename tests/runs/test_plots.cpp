// Pictures (runs/plots.cpp): the gnuplot scripts carry the title, the axis names, the token
// labels, a colour scale and a colour for masked cells that the weight scale never uses; the
// PNGs gnuplot draws from them are valid and of the size asked for; without gnuplot a picture
// is skipped (its script still written, a stale PNG removed), and a failing gnuplot is an
// error naming it. Also: the training loop's two streams (results vs progress and warnings),
// and a run whose loss curve cannot be drawn still succeeds.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "tests/support/helpers.hpp"
#include <xgrad/runs/plots.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

// Sets PATH for the lifetime of the object (each test case runs in its own process under ctest).
class PathOverride {
 public:
  explicit PathOverride(const std::string& path) {
    const char* old = std::getenv("PATH");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("PATH", path.c_str(), 1);
  }
  ~PathOverride() {
    if (had_)
      ::setenv("PATH", old_.c_str(), 1);
    else
      ::unsetenv("PATH");
  }

 private:
  bool had_ = false;
  std::string old_;
};

// The 3 x 3 causal attention of tokens "a", "b", "c".
Array causal_weights() { return Array::of({{1.0, 0.0, 0.0}, {0.25, 0.75, 0.0}, {0.5, 0.0, 0.5}}); }
std::vector<unsigned char> causal_allowed(std::size_t T) {
  return nn::Visibility::causal(T, T).expand_allowed("test", {1, 1, T, T});
}
runs::HeatmapLabels abc_labels() {
  runs::HeatmapLabels l;
  l.title = "attention weights: layer 1, query head 0\nprompt \"ab\"";
  l.x_ticks = l.y_ticks = {"a", "b", "c"};
  return l;
}

}  // namespace

TEST_CASE("plots: tick labels make spaces and control characters and stray bytes visible", "[plots]") {
  CHECK(runs::tick_label("a") == "a");
  CHECK(runs::tick_label(" ") == "\xE2\x90\xA3");
  CHECK(runs::tick_label("\n") == "\\n");
  CHECK(runs::tick_label("\t") == "\\t");
  CHECK(runs::tick_label(std::string(1, '\x07')) == "\\x07");
  CHECK(runs::tick_label("\xC3") == "\\xC3");                // half of a two-byte character
  CHECK(runs::tick_label("\xC3\xA9") == "\xC3\xA9");         // é, whole
  CHECK(runs::tick_label("\xE0\x80\x80") == "\\xE0\\x80\\x80");  // overlong: not UTF-8
}

TEST_CASE("plots: the attention-map script has title / axis names / token labels / colour scale / masked colour",
          "[plots]") {
  const std::string s = runs::attention_map_script(causal_weights(), causal_allowed(3), abc_labels(), "map.png");
  // Title (two lines, the quote escaped), axis names, output name.
  CHECK_THAT(s, Catch::Contains("set title \"attention weights: layer 1, query head 0\\nprompt \\\"ab\\\"\""));
  CHECK_THAT(s, Catch::Contains("set xlabel \"key position\""));
  CHECK_THAT(s, Catch::Contains("set ylabel \"query position\""));
  CHECK_THAT(s, Catch::Contains("set output \"map.png\""));
  // Token labels on both axes, query 0 at the top.
  CHECK_THAT(s, Catch::Contains("set xtics out nomirror (\"a\" 0, \"b\" 1, \"c\" 2)"));
  CHECK_THAT(s, Catch::Contains("set ytics out nomirror (\"a\" 0, \"b\" 1, \"c\" 2)"));
  CHECK_THAT(s, Catch::Contains("set yrange [3-0.5:-0.5]"));
  // The colour scale: weights 0..1 from white to dark blue, with a title.
  CHECK_THAT(s, Catch::Contains("set cbrange [0:1]"));
  CHECK_THAT(s, Catch::Contains("set cblabel \"attention weight\""));
  CHECK_THAT(s, Catch::Contains("set palette defined (0 '#ffffff'"));
  // Masked cells: NaN in the data (left out of the image) over a grey background that is not a
  // colour of the palette, and a legend entry naming it. A near-zero weight stays a number.
  CHECK_THAT(s, Catch::Contains("$weights << EOD\n1 NaN NaN\n0.25 0.75 NaN\n0.5 0 0.5\nEOD\n"));
  CHECK_THAT(s, Catch::Contains("set object 1 rectangle from graph 0,0 to graph 1,1 behind fillcolor rgb '#9e9e9e'"));
  CHECK_THAT(s, Catch::Contains("keyentry with boxes fillstyle solid 1.0 fillcolor rgb '#9e9e9e' title \"masked (not allowed)\""));
  const std::string palette = s.substr(s.find("set palette"), s.find('\n', s.find("set palette")) - s.find("set palette"));
  CHECK(palette.find("#9e9e9e") == std::string::npos);
  CHECK_THAT(s, Catch::Contains("plot $weights matrix with image"));
}

TEST_CASE("plots: labels needing escapes and numbers instead of labels on long axes", "[plots]") {
  runs::HeatmapLabels l;
  l.title = "t";
  l.x_ticks = l.y_ticks = {"'", "\"", "%"};
  const std::string s = runs::attention_map_script(causal_weights(), causal_allowed(3), l, "m.png");
  CHECK_THAT(s, Catch::Contains("set xtics out nomirror (\"'\" 0, \"\\\"\" 1, \"%%\" 2)"));

  const std::size_t T = runs::kMaxTickLabels + 1;
  Array M = Array::zeros({T, T}, DType::float64);
  for (std::size_t i = 0; i < T; ++i) M.set_flat(i * T, 1.0);  // every query on key 0
  runs::HeatmapLabels many;
  many.x_ticks = many.y_ticks = std::vector<std::string>(T, "x");
  const std::string big = runs::attention_map_script(M, causal_allowed(T), many, "big.png");
  CHECK_THAT(big, Catch::Contains("set xtics out nomirror\n"));
  CHECK_THAT(big, !Catch::Contains("\"x\" 0"));
  CHECK_THAT(big, !Catch::Contains("set grid x2tics"));  // no cell lines on a dense grid
}

TEST_CASE("plots: the visibility script marks allowed and masked cells and names both in a legend", "[plots]") {
  runs::HeatmapLabels l;
  l.title = "causal visibility of 2 new queries";
  l.x_ticks = {"0", "1", "2", "3"};
  l.y_ticks = {"2", "3"};
  const std::string s = runs::visibility_script(nn::Visibility::causal(2, 4).expand_allowed("test", {1, 1, 2, 4}), 2, 4, l, "v.png");
  CHECK_THAT(s, Catch::Contains("set title \"causal visibility of 2 new queries\""));
  CHECK_THAT(s, Catch::Contains("set xlabel \"key position\""));
  CHECK_THAT(s, Catch::Contains("set ylabel \"query position\""));
  CHECK_THAT(s, Catch::Contains("set ytics out nomirror (\"2\" 0, \"3\" 1)"));
  // Bottom-right aligned: the query at position 2 sees keys 0..2.
  CHECK_THAT(s, Catch::Contains("$allowed << EOD\n1 1 1 NaN\n1 1 1 1\nEOD\n"));
  CHECK_THAT(s, Catch::Contains("title \"allowed\""));
  CHECK_THAT(s, Catch::Contains("fillcolor rgb '#9e9e9e' title \"masked (forbidden)\""));
}

TEST_CASE("plots: bad input is an error naming the cell or the path", "[plots]") {
  const auto allowed = causal_allowed(3);
  const auto labels = abc_labels();
  Array leak = causal_weights();
  leak.set_flat(1, 0.1);  // weight on a masked cell
  CHECK_THROWS_WITH(runs::attention_map_script(leak, allowed, labels, "m.png"),
                    Catch::Contains("query 0, key 1") && Catch::Contains("masked"));
  Array nan = causal_weights();
  nan.set_flat(0, std::nan(""));
  CHECK_THROWS_AS(runs::attention_map_script(nan, allowed, labels, "m.png"), ValueError);
  Array big = causal_weights();
  big.set_flat(0, 1.5);
  CHECK_THROWS_WITH(runs::attention_map_script(big, allowed, labels, "m.png"), Catch::Contains("[0, 1]"));
  CHECK_THROWS_AS(runs::attention_map_script(causal_weights(), causal_allowed(2), labels, "m.png"), ShapeError);
  CHECK_THROWS_AS(runs::attention_map_script(Array::zeros({3}, DType::float64), allowed, labels, "m.png"), ShapeError);
  // The visibility picture takes T x S cells: another count, or no query or key, is refused.
  CHECK_THROWS_WITH(runs::visibility_script(std::vector<unsigned char>(7, 1), 2, 4, labels, "v.png"),
                    Catch::Contains("7 cells, expected 2 x 4"));
  CHECK_THROWS_AS(runs::visibility_script({}, 0, 4, labels, "v.png"), ShapeError);
  runs::HeatmapLabels two = labels;
  two.x_ticks = {"a", "b"};
  CHECK_THROWS_WITH(runs::attention_map_script(causal_weights(), allowed, two, "m.png"), Catch::Contains("tick labels"));
  const fs::path dir = temp_dir("plots_bad");
  CHECK_THROWS_WITH(runs::attention_map_png(causal_weights(), allowed, labels, (dir / "m.gp").string()),
                    Catch::Contains("its own gnuplot script"));
  CHECK_THROWS_AS(runs::attention_map_png(causal_weights(), allowed, labels, (dir / "no" / "m.png").string()),
                  ValueError);
  CHECK_THROWS_AS(runs::png_size((dir / "missing.png").string()), FormatError);
  fs::remove_all(dir);
}

TEST_CASE("plots: gnuplot draws valid PNGs of the planned size each with its script beside it", "[plots]") {
  REQUIRE_FALSE(runs::find_gnuplot().empty());  // gnuplot-nox is a build requirement (scripts/setup.sh)
  const fs::path dir = temp_dir("plots_draw");
  {
    std::ofstream csv(dir / "log.csv");
    csv << "step,lr,loss\n";
    for (int s = 1; s <= 50; ++s) csv << s << ",0.001," << 3.0 / s << "\n";
  }
  const runs::Picture loss = runs::loss_curve_png((dir / "log.csv").string(), (dir / "loss.png").string(), "test");
  CHECK(loss.drawn);
  CHECK(loss.size.width == 900);
  CHECK(loss.size.height == 500);
  CHECK_THAT(read_file(dir / "loss.gp"), Catch::Contains("plot \"log.csv\" using 1:3"));  // relative to the script

  const runs::Picture map =
      runs::attention_map_png(causal_weights(), causal_allowed(3), abc_labels(), (dir / "map.png").string());
  REQUIRE(map.drawn);
  CHECK(map.script == (dir / "map.gp").string());
  CHECK(read_file(dir / "map.gp") == runs::attention_map_script(causal_weights(), causal_allowed(3), abc_labels(), "map.png"));
  const runs::ImageSize got = runs::png_size((dir / "map.png").string());
  CHECK(got.width == map.size.width);
  CHECK(got.height == map.size.height);
  CHECK(got.width >= 560);  // room for the grid, the labels and the colour scale
  CHECK(got.height >= 400);

  const runs::Picture vis =
      runs::visibility_png(nn::Visibility::causal(3, 8).expand_allowed("test", {1, 1, 3, 8}), 3, 8, runs::HeatmapLabels{}, (dir / "v.png").string());
  REQUIRE(vis.drawn);
  CHECK(runs::png_size((dir / "v.png").string()).width == vis.size.width);
  CHECK(vis.size.width > vis.size.height);  // 8 keys wide, 3 queries high
  fs::remove_all(dir);
}

TEST_CASE("plots: without gnuplot a picture is skipped (script written and stale PNG removed)", "[plots]") {
  const fs::path dir = temp_dir("plots_nognuplot");
  fs::create_directories(dir / "bin");
  { std::ofstream(dir / "map.png") << "an old picture"; }
  PathOverride path((dir / "bin").string());
  CHECK(runs::find_gnuplot().empty());
  const runs::Picture p =
      runs::attention_map_png(causal_weights(), causal_allowed(3), abc_labels(), (dir / "map.png").string());
  CHECK_FALSE(p.drawn);
  CHECK_THAT(p.note, Catch::Contains("gnuplot not found") && Catch::Contains("map.gp"));
  CHECK(fs::exists(dir / "map.gp"));
  CHECK_FALSE(fs::exists(dir / "map.png"));
  fs::remove_all(dir);
}

TEST_CASE("plots: a gnuplot that fails is an error naming it and what it said", "[plots]") {
  const fs::path dir = temp_dir("plots_badgnuplot");
  fs::create_directories(dir / "bin");
  {
    std::ofstream fake(dir / "bin" / "gnuplot");
    fake << "#!/bin/sh\necho 'line 3: something broke' >&2\nexit 3\n";
  }
  fs::permissions(dir / "bin" / "gnuplot", fs::perms::owner_all);
  PathOverride path((dir / "bin").string());
  CHECK(runs::find_gnuplot() == (dir / "bin" / "gnuplot").string());
  CHECK_THROWS_WITH(
      runs::attention_map_png(causal_weights(), causal_allowed(3), abc_labels(), (dir / "map.png").string()),
      Catch::Contains("exit status 3") && Catch::Contains("something broke") && Catch::Contains("map.gp"));
  fs::remove_all(dir);
}

TEST_CASE("train: results go to the output stream and progress and warnings to the progress stream / a loss curve "
          "that cannot be drawn does not fail the run",
          "[train][plots]") {
  const fs::path dir = temp_dir("train_streams");
  fs::create_directories(dir / "bin");
  train::TrainOptions o;
  o.out = (dir / "run").string();
  o.steps = 4;
  o.batch = 8;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.n_digits = 4;
  o.threads = 1;
  o.progress = true;
  o.plot = true;
  std::ostringstream out, progress;
  {
    PathOverride path((dir / "bin").string());  // no gnuplot
    const train::TrainResult r = train::run_training(o, out, progress);
    CHECK(r.steps_done == 4);
  }
  INFO("out:\n" << out.str() << "\nprogress:\n" << progress.str());
  CHECK_THAT(out.str(), Catch::Contains("xgrad train: task sort") && Catch::Contains("samples:") &&
                            Catch::Contains("RESULT heldout_exact_match") && Catch::Contains("trained 4 steps"));
  CHECK_THAT(out.str(), !Catch::Contains("step 4/4") && !Catch::Contains("warning"));
  CHECK_THAT(out.str(), !Catch::Contains("loss.png"));  // not written
  CHECK_THAT(progress.str(), Catch::Contains("step 4/4 | loss"));
  CHECK_THAT(progress.str(), Catch::Contains("warning: gnuplot not found") && Catch::Contains("loss.png"));
  CHECK_THAT(progress.str(), !Catch::Contains("RESULT"));
  CHECK(fs::exists(dir / "run" / "model.safetensors"));
  CHECK(fs::exists(dir / "run" / "loss.gp"));
  CHECK_FALSE(fs::exists(dir / "run" / "loss.png"));
  fs::remove_all(dir);
}

TEST_CASE("plots: the loss axis is chosen from the losses and text runs get a bits-per-byte curve", "[plots]") {
  // Losses between 4 and 7: a linear axis over them (a log axis from 1 to 10 had two labels).
  const std::string narrow = runs::loss_curve_script("log.csv", "loss.png", "t", true, {4.0, 7.0, false});
  CHECK(narrow.find("logscale") == std::string::npos);
  CHECK_THAT(narrow, Catch::Contains("set yrange [3.85") && Catch::Contains(":7.15"));
  // Over more than a decade: a log scale over their range.
  const std::string wide = runs::loss_curve_script("log.csv", "loss.png", "t", true, {0.01, 5.0, false});
  CHECK_THAT(wide, Catch::Contains("set logscale y") && Catch::Contains("set yrange [0.0090909"));
  CHECK(wide.find("using 1:8") == std::string::npos);
  // Unknown: a log scale, as before.
  CHECK_THAT(runs::loss_curve_script("log.csv", "loss.png", "t"), Catch::Contains("set logscale y"));
  // A text run's log (val_bpb column): the bits per byte on the right-hand axis, drawn by gnuplot.
  const fs::path dir = temp_dir("plots_bpb");
  {
    std::ofstream csv(dir / "log.csv");
    csv << "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_bpb\n";
    for (int s = 1; s <= 20; ++s)
      csv << s << ",0.001," << 6.0 - 0.1 * s << ",1,100,0.1," << (s % 5 == 0 ? "5.5,7.9" : ",") << "\n";
  }
  const runs::LossData d = runs::loss_data((dir / "log.csv").string());
  CHECK(d.bits_per_byte);
  CHECK(d.lo == 6.0 - 0.1 * 20);
  CHECK(d.hi == 6.0 - 0.1);
  const runs::Picture p = runs::loss_curve_png((dir / "log.csv").string(), (dir / "loss.png").string(), "t", true);
  CHECK(p.drawn);
  CHECK_THAT(xgt::read_file(dir / "loss.gp"), Catch::Contains("using 1:8 axes x1y2") && Catch::Contains("validation bits per byte") &&
                                        !Catch::Contains("logscale"));
}
