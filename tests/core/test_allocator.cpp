// The allocator's blocks and the bits of results: an elementwise op on the same values gives
// the same bits wherever its arrays were placed. xtensor's SIMD assignment sends the elements
// before the first aligned address through the scalar function and the rest through the
// vector one (tanh, exp differ there in the last place), so small blocks must be aligned as the
// large ones (core/allocator.cpp) for a run and its resumption to agree bit for bit.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <xgrad/core/detail/sanitizer.hpp>
#include <xgrad/core/runtime.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("allocator: small arrays are 64-byte aligned and tanh of the same values has the same bits",
          "[allocator]") {
  Generator g(1);
  const Array x = random_uniform({13}, g, DType::float64, -3, 3);
  const Array first = ops::tanh(Tensor(x)).value();
  std::set<std::uintptr_t> offsets;
  std::vector<Array> keep;  // blocks of every small size held, so that later ones land elsewhere
  for (std::size_t n = 1; n <= 40; ++n) {
    keep.push_back(Array::zeros({n}, DType::float64));
    const Array y = ops::tanh(Tensor(x)).value();
    offsets.insert(reinterpret_cast<std::uintptr_t>(y.data<double>()) % 64);
    XGT_CHECK_SAME(y, first);
  }
  CHECK(offsets == std::set<std::uintptr_t>{0});
}

// Array descriptors (core/array.cpp) are recycled with their shape vector: each new array must
// take exactly its own shape, size and values whatever rank the recycled descriptor had, views
// must keep their base's data after the base is dropped, and descriptors freed on another
// thread than the one that made them must come back as good as new.
TEST_CASE("allocator: recycled array descriptors take each new shape and keep views intact", "[allocator]") {
  const std::vector<Shape> shapes = {{2, 3, 4, 5}, {}, {7}, {3, 1}, {1, 1, 1, 1, 1, 2}, {0, 4}, {40, 3}};
  for (int round = 0; round < 3; ++round) {
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const Shape& s = shapes[(k + static_cast<std::size_t>(round)) % shapes.size()];
      std::vector<double> values(numel(s));
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.25 * static_cast<double>(i) - 3.0;
      const Array a = Array::from_vector(s, values, k % 2 ? DType::float32 : DType::float64);
      REQUIRE(a.shape() == s);
      CHECK(a.ndim() == s.size());
      CHECK(a.size() == values.size());
      CHECK(a.to_vector() == values);
    }
  }

  Array base = Array::from_vector({2, 3}, {1, 2, 3, 4, 5, 6}, DType::float32);
  const Array flat = base.view({6});
  base = Array();  // the view alone holds the buffer now
  std::vector<Array> churn;
  for (std::size_t n = 1; n <= 200; ++n) churn.push_back(Array::full({n % 5 + 1, 2}, -1.0, DType::float32));
  churn.clear();  // back to the recycled list...
  for (std::size_t n = 1; n <= 200; ++n) churn.push_back(Array::full({n % 3 + 1}, -2.0, DType::float32));  // ...and out
  CHECK(flat.shape() == Shape{6});
  CHECK(flat.to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});

  // Made on a worker thread, released on this one (they join this thread's list), reused here.
  std::vector<Array> made;
  std::thread([&made] {
    for (std::size_t n = 1; n <= 100; ++n) made.push_back(Array::full({n, 2, 2}, static_cast<double>(n), DType::float64));
  }).join();
  for (std::size_t n = 1; n <= 100; ++n) {
    REQUIRE(made[n - 1].shape() == (Shape{n, 2, 2}));
    CHECK(made[n - 1].flat(4 * n - 1) == static_cast<double>(n));
  }
  made.clear();
  for (std::size_t n = 1; n <= 100; ++n) {
    const Array a = Array::full({n}, 0.5, DType::float32);
    REQUIRE(a.shape() == Shape{n});
    CHECK(a.flat(n - 1) == 0.5);
  }
}

// An Array counts its descriptor in the descriptor itself (core/array.hpp): copies share one
// descriptor, assigning an array to itself keeps its data, a moved-from array is undefined, and
// the count stays right when two threads copy and drop the same array at once. A count that
// dropped to zero early would send the descriptor back to the recycled list, where the churn
// below would overwrite its values. That the last copy does free it is LeakSanitizer's to see
// (scripts/sanitize.sh runs this test with leak detection on).
TEST_CASE("allocator: an Array's count: copies share one descriptor that lives until the last copy goes",
          "[allocator]") {
  Array a = Array::from_vector({2, 2}, {1.5, -2.0, 3.25, 4.0}, DType::float32);
  const std::vector<double> values = a.to_vector();
  {
    const Array b = a;
    CHECK(&b.storage() == &a.storage());
    Array c;
    c = a;
    CHECK(&c.storage() == &a.storage());
  }
  Array& alias = a;
  a = alias;  // copy-assigned to itself
  REQUIRE(a.defined());
  CHECK(a.to_vector() == values);
  a = std::move(alias);  // move-assigned to itself
  REQUIRE(a.defined());
  CHECK(a.to_vector() == values);

  Array moved = std::move(a);
  CHECK_FALSE(a.defined());  // a moved-from Array is undefined
  REQUIRE(moved.defined());
  a = moved;

  // Two threads copy and drop `a` a hundred thousand times each, while this thread holds it.
  auto hammer = [&a] {
    for (int i = 0; i < 100000; ++i) {
      Array copy = a;
      Array again(copy);
      copy = Array();
    }
  };
  std::thread t1(hammer), t2(hammer);
  t1.join();
  t2.join();
  moved = Array();
  std::vector<Array> churn;  // would reuse a descriptor that went back to the list too early
  for (int i = 0; i < 300; ++i) churn.push_back(Array::full({2, 2}, -7.0, DType::float32));
  CHECK(a.to_vector() == values);
  CHECK(a.shape() == (Shape{2, 2}));
}

TEST_CASE("allocator: arrays of 64 bytes or less give the same bits wherever their descriptor lies", "[allocator]") {
  for (const DType dt : {DType::float64, DType::float32}) {
    for (const std::size_t n : {3u, 5u, 8u, 16u}) {
      const std::size_t width = dt == DType::float64 ? 8 : 4;
      if (n * width > 64) continue;
      INFO(dtype_name(dt) << " n " << n);
      Generator g(2);
      const Array x = random_uniform({n}, g, dt, -3, 3);
      const Array first_tanh = ops::tanh(Tensor(x)).value();
      const Array first_exp = ops::exp(Tensor(x)).value();
      std::set<std::uintptr_t> offsets;
      std::vector<Array> keep;  // descriptors held, so that later ones land elsewhere
      for (std::size_t k = 0; k < 64; ++k) {
        keep.push_back(Array::zeros({1 + k % 7}, dt));
        const Array xs = x.clone();  // the input in another descriptor too
        const Array y = ops::tanh(Tensor(xs)).value(), z = ops::exp(Tensor(xs)).value();
        offsets.insert((dt == DType::float64 ? reinterpret_cast<std::uintptr_t>(y.data<double>())
                                            : reinterpret_cast<std::uintptr_t>(y.data<float>())) % 64);
        XGT_CHECK_SAME(y, first_tanh);
        XGT_CHECK_SAME(z, first_exp);
      }
      INFO("offsets seen: " << offsets.size());
    }
  }
}

namespace {

// The VmFlags of the mapping of this process that holds address `p` (/proc/self/smaps), "" if
// none does; "unmapped" where no mapping holds it. (Unused where the build has AddressSanitizer,
// whose allocator the test below cannot see through.)
[[maybe_unused]] std::string vm_flags_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false, found = false;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(' ') > line.find('-')) {
      inside = a >= lo && a < hi;
      found = found || inside;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return found ? "" : "unmapped";
}

[[maybe_unused]] bool has_flag(const std::string& flags, const std::string& flag) { return flags.find(" " + flag + " ") != std::string::npos; }

}  // namespace

// Blocks of 2 MiB and more (core/allocator.cpp): mapped on their own at a 2 MiB boundary,
// advised as huge pages (VmFlags "hg") while set_huge_pages is on and not while it is off,
// whole (every element written and read back), and unmapped when the cache lets them go. Under
// AddressSanitizer they stay malloc's: 64-byte aligned only.
TEST_CASE("allocator: large blocks start on a 2 MiB boundary with the huge page advice while it is on",
          "[allocator][huge_pages]") {
  const bool was = huge_pages();
  const std::size_t n = (3u << 20) / 4 + 1000;  // 3 MiB and a bit: a whole 2 MiB extent and a tail
  for (const bool on : {true, false}) {
    INFO("huge pages " << (on ? "on" : "off"));
    set_huge_pages(on);
    CHECK(huge_pages() == on);
    release_cached_memory();  // a new mapping, not a cached block mapped under the other setting
    Array a = Array::empty({n}, DType::float32);
    float* x = a.data<float>();
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000);
    CHECK(a.flat(n - 1) == static_cast<double>((n - 1) % 1000));
    const auto address = reinterpret_cast<std::uintptr_t>(x);
#if XG_UNDER_ASAN
    CHECK(address % 64 == 0);
#else
    CHECK(address % (2u << 20) == 0);
    const std::string flags = vm_flags_of(x);
    INFO("VmFlags:" << flags);
    REQUIRE(flags != "unmapped");
    CHECK(has_flag(flags, "rd"));
    CHECK(has_flag(flags, "hg") == on);
    a = Array();
    release_cached_memory();
    CHECK(vm_flags_of(x) == "unmapped");
#endif
  }
  set_huge_pages(was);
}
