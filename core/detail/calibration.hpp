// Internal: the calibration cache (core/calibration.cpp). The kernel choices made by measured
// speed (bfloat16 products, the fused attention's bfloat16 tiles, the float64 GEMM between two
// AVX-512 kernels) time two kernels against each
// other; on a CPU whose ratio sits near a threshold two processes can decide differently, and a
// run then differs in its bits from the same run repeated. So a ratio measured once is kept, per
// CPU and per build of xgrad, in a text file the user can delete (docs/performance.md,
// "Calibration cache"):
//
//   xgrad calibration cache 1
//   # comment lines start with '#'
//   <CPU and build key> TAB <name> TAB <value>
//
// The file is read when a calibration is first needed and written whole (a new file renamed over
// the old) when a new ratio is measured; a file that cannot be written leaves the process with
// its own measurement, as before the cache. A file that does not parse is an error naming the
// file and the line (FormatError), never ignored.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>

namespace xg::detail {

// What a choice's reason adds when its ratio came from the cache file.
constexpr const char* kReadFromCache = ", read from the calibration cache";

struct Calibration {
  double value = 0.0;
  bool cached = false;  // read from the cache file (not measured by this process)
};

// The file: XGRAD_CACHE_DIR/calibration-v1.txt, else $XDG_CACHE_HOME/xgrad/calibration-v1.txt,
// else $HOME/.cache/xgrad/calibration-v1.txt; "" where XGRAD_CACHE_DIR is "off" or there is
// no home. Read from the environment at every call.
std::string calibration_cache_path();

// What a cached ratio belongs to: the CPU (vendor, brand string, family, model, stepping) and the
// build of xgrad (version, compiler, optimisation, sanitizers), on one line without tabs.
std::string calibration_key();

// The ratio `name` ([a-z0-9_], at most 64 characters): this process's value if it has one, else
// the cache file's for this key, else measure() now, written to the file where it can be. A
// measurement that is not a finite positive number is returned but not kept.
Calibration calibrated(const std::string& name, const std::function<double()>& measure);

// This process's calibrated ratios as text, one "name<TAB>value<TAB>0|1" line each (1: read from
// the cache file), for another process to adopt: data-parallel ranks take rank 0's
// (dist::agree_on_kernel_choices), so that no rank measures a borderline ratio on the other side.
std::string calibrations_text();
// Takes calibrations_text() of another process as this process's values; a ratio this process
// has already used stays. Throws InternalError on text calibrations_text() would not write.
void adopt_calibrations(const std::string& text);

// The same on a given file and key, without this process's memory (tests, the fuzzer).
Calibration calibrated_in(const std::string& path, const std::string& key, const std::string& name,
                          const std::function<double()>& measure);

// The entries of a cache file, (key, name) -> value; a missing file has none. Throws FormatError
// naming the file and the line for anything else than the format above.
std::map<std::pair<std::string, std::string>, double> read_calibration_file(const std::string& path);

}  // namespace xg::detail
