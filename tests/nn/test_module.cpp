// Module::pack_parameters (nn/module.hpp): every parameter becomes a view of its own 64-byte
// aligned part of one block per dtype, with the same values, gradients and requires_grad; a
// parameter reached by two paths moves once; a packed model decodes and trains to the same bits
// as the same model unpacked (the same kernels on the same shapes at the same alignment), and an
// optimizer step gives the parameters it updates arrays of their own.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <xgrad/nn/generate.hpp>
#include <xgrad/nn/optim.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

nn::TransformerConfig small_llama() {
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = 37;
  c.context = 12;
  c.d_model = 24;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = 2;
  c.multiple_of = 8;
  c.dtype = DType::float32;
  return c;
}

std::uintptr_t address(const Tensor& t) {
  return t.dtype() == DType::float32 ? reinterpret_cast<std::uintptr_t>(t.value().data<float>())
                                     : reinterpret_cast<std::uintptr_t>(t.value().data<double>());
}

std::size_t width(DType d) { return d == DType::float32 ? sizeof(float) : sizeof(double); }

// Checks that `params` (in this order) lie one after the other in one block of `bytes` from the
// first one's address, each 64-byte aligned and at most 63 bytes of padding after the one before.
void check_one_block(const std::vector<Tensor>& params, std::size_t bytes) {
  REQUIRE(!params.empty());
  const std::uintptr_t start = address(params.front());
  std::uintptr_t expected = start;
  for (const Tensor& p : params) {
    INFO("parameter " << p.name() << " of " << p.size() << " elements");
    CHECK(address(p) % 64 == 0);
    CHECK(address(p) == expected);
    expected += (p.size() * width(p.dtype()) + 63) / 64 * 64;
  }
  CHECK(expected - start == bytes);
}

// Float32 and float64 parameters, one of them reached by two paths.
struct Leaf : nn::Module {
  Tensor w32, w64;
  Leaf() {
    Generator g(3);
    w32 = register_parameter("w32", random_uniform({3, 5}, g, DType::float32, -1, 1));
    w64 = register_parameter("w64", random_uniform({7}, g, DType::float64, -1, 1));
  }
};
struct Mixed : nn::Module {
  Leaf shared;
  Tensor bias;
  Mixed() {
    Generator g(4);
    bias = register_parameter("bias", random_uniform({33}, g, DType::float32, -1, 1));
    register_module("first", shared);
    register_module("second", shared);
  }
};

}  // namespace

TEST_CASE("pack_parameters: one block per dtype with every parameter in its own aligned part", "[nn][module]") {
  Mixed m;
  const auto named = m.named_parameters();
  REQUIRE(named.size() == 5);  // bias, first.w32, first.w64, second.w32, second.w64
  std::vector<Array> before;
  std::vector<std::uintptr_t> old_address;
  for (const auto& [name, t] : named) {
    before.push_back(t.value().clone());
    old_address.push_back(address(t));
  }
  m.shared.w32.set_grad(Array::full({3, 5}, 0.5, DType::float32));
  m.shared.w64.requires_grad_(false);

  // float32: bias (33 -> 48 floats) and w32 (15 -> 16 floats); float64: w64 (7 -> 8 doubles).
  CHECK(m.pack_parameters() == 48 * 4 + 16 * 4 + 8 * 8);
  for (std::size_t k = 0; k < named.size(); ++k) {
    INFO(named[k].first);
    XGT_CHECK_SAME(named[k].second.value(), before[k]);  // a copy of the same values
    CHECK(address(named[k].second) != old_address[k]);  // ... in a new place
  }
  check_one_block({m.bias, m.shared.w32}, 48 * 4 + 16 * 4);
  check_one_block({m.shared.w64}, 8 * 8);
  XGT_CHECK_SAME(m.shared.w32.grad(), Array::full({3, 5}, 0.5, DType::float32));
  CHECK(m.shared.w32.requires_grad());
  CHECK_FALSE(m.shared.w64.requires_grad());
  CHECK(address(m.parameter("second.w32")) == address(m.shared.w32));  // moved once

  // Packing again moves the packed parameters into a new block, values unchanged.
  const std::uintptr_t first_block = address(m.bias);
  CHECK(m.pack_parameters() == 48 * 4 + 16 * 4 + 8 * 8);
  CHECK(address(m.bias) != first_block);
  XGT_CHECK_SAME(m.bias.value(), before[0]);
}

TEST_CASE("pack_parameters: a packed Llama decodes and trains to the bits of the same model unpacked",
          "[nn][module]") {
  Generator g1(21), g2(21);
  nn::GPT unpacked(small_llama().resolved(), g1), packed(small_llama().resolved(), g2);
  std::vector<Tensor> params;
  for (const auto& [name, t] : packed.named_parameters()) params.push_back(t);
  std::size_t bytes = 0;
  for (const Tensor& p : params) bytes += (p.size() * sizeof(float) + 63) / 64 * 64;
  CHECK(packed.pack_parameters() == bytes);
  check_one_block(params, bytes);

  nn::SampleOptions so;  // greedy, KV cache, every step's logits kept
  so.keep_logits = true;
  const nn::Generation a = nn::generate(unpacked, {{1, 5, 9}}, 8, so);
  const nn::Generation b = nn::generate(packed, {{1, 5, 9}}, 8, so);
  REQUIRE(a.logits.size() == 8);
  CHECK(a.tokens == b.tokens);
  for (std::size_t s = 0; s < a.logits.size(); ++s) XGT_CHECK_SAME(a.logits[s], b.logits[s]);  // same kernels and shapes

  const IndexArray tokens({2, 6}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const IndexArray targets({2, 6}, {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  const Array held = params.front().value();  // holds the block: no new array can land in it
  const std::uintptr_t block = address(params.front());
  nn::AdamW opt_a(unpacked.named_parameters(), 1e-2), opt_b(packed.named_parameters(), 1e-2);
  for (int step = 0; step < 2; ++step) {
    unpacked.zero_grad();
    packed.zero_grad();
    const Tensor la = unpacked.loss(tokens, targets);
    const Array loss_a = la.value();
    la.backward();  // consumes the tape: the other model's pass records on a new one
    const Tensor lb = packed.loss(tokens, targets);
    XGT_CHECK_SAME(loss_a, lb.value());
    lb.backward();
    opt_a.step();
    opt_b.step();
  }
  const auto pa = unpacked.named_parameters(), pb = packed.named_parameters();
  for (std::size_t k = 0; k < pa.size(); ++k) {
    INFO(pa[k].first);
    XGT_CHECK_SAME(pa[k].second.value(), pb[k].second.value());
    CHECK((address(pb[k].second) < block || address(pb[k].second) >= block + bytes));  // its own array now
  }
}
