#include <xgrad/nn/kv_head_pooling.hpp>

#include <map>

#include <xgrad/core/error.hpp>

namespace xg::nn {

void check_kv_groups(std::size_t H_q, std::size_t H_kv, std::size_t G) {
  const std::string heads = "H_q = " + std::to_string(H_q) + ", H_kv = " + std::to_string(H_kv);
  if (G == 0 || G > H_kv)
    throw ValueError(op_message("convert_kv_heads", "G = " + std::to_string(G) + " key/value heads must be in [1, H_kv] (" +
                                                        heads + ")"));
  if (H_kv % G != 0)
    throw ValueError(op_message("convert_kv_heads", "G = " + std::to_string(G) + " key/value heads do not divide the " +
                                                        std::to_string(H_kv) + " of the model (" + heads +
                                                        "): each group must pool the same number of heads"));
}

Array pool_kv_columns(const Array& W, std::size_t q_columns, std::size_t H_kv, std::size_t d_h, std::size_t G) {
  check_kv_groups(H_kv, H_kv, G);
  if (!W.defined() || W.ndim() < 1 || W.ndim() > 2)
    throw ValueError(op_message("pool_kv_columns", "W must be a weight [rows, columns] or a bias [columns]"));
  const std::size_t cols = W.shape().back(), rows = W.ndim() == 2 ? W.shape()[0] : 1;
  if (d_h == 0 || cols != q_columns + 2 * H_kv * d_h)
    throw ValueError(op_message("pool_kv_columns", "W has " + std::to_string(cols) + " columns, expected q_columns " +
                                                       std::to_string(q_columns) + " + 2 H_kv d_h = 2 * " +
                                                       std::to_string(H_kv) + " * " + std::to_string(d_h)));
  const std::size_t r = H_kv / G, new_cols = q_columns + 2 * G * d_h;
  Shape shape = W.shape();
  shape.back() = new_cols;
  Array out = Array::zeros(shape, W.dtype());
  for (std::size_t i = 0; i < rows; ++i) {
    const std::size_t in_row = i * cols, out_row = i * new_cols;
    for (std::size_t c = 0; c < q_columns; ++c) out.set_flat(out_row + c, W.flat(in_row + c));
    for (std::size_t part = 0; part < 2; ++part) {  // K heads, then V heads
      const std::size_t in_base = in_row + q_columns + part * H_kv * d_h;
      const std::size_t out_base = out_row + q_columns + part * G * d_h;
      for (std::size_t g = 0; g < G; ++g)
        for (std::size_t j = 0; j < d_h; ++j) {
          double sum = 0;  // heads h = g r .. g r + r - 1: exactly those with floor(h / r) == g
          for (std::size_t h = g * r; h < (g + 1) * r; ++h) sum += W.flat(in_base + h * d_h + j);
          out.set_flat(out_base + g * d_h + j, sum / static_cast<double>(r));
        }
    }
  }
  return out;
}

std::vector<std::pair<std::string, Array>> pooled_kv_weights(const MultiHeadAttention& layer, std::size_t G) {
  const AttentionConfig& c = layer.config();
  check_kv_groups(c.H_q, c.H_kv, G);
  using P = MultiHeadAttention::Projection;
  for (P p : {P::q, P::k, P::v, P::o})  // their terms are not in W_QKV and W_O
    if (layer.adapter(p))
      throw ValueError(op_message("convert_kv_heads", std::string("projection ") + MultiHeadAttention::projection_name(p) +
                                                       " has an adapter; merge it first (merge_adapter, nn::merge_lora)"));
  const std::size_t q = c.H_q * layer.d_head();
  std::vector<std::pair<std::string, Array>> w;
  w.emplace_back("W_QKV", pool_kv_columns(layer.W_QKV.value(), q, c.H_kv, layer.d_head(), G));
  if (c.bias) w.emplace_back("b_QKV", pool_kv_columns(layer.b_QKV.value(), q, c.H_kv, layer.d_head(), G));
  w.emplace_back("W_O", layer.W_O.value().clone());
  if (c.bias) w.emplace_back("b_O", layer.b_O.value().clone());
  return w;
}

std::vector<std::pair<std::string, Array>> pooled_kv_weights(const CrossAttention& layer, std::size_t G) {
  const CrossAttentionConfig& c = layer.config();
  check_kv_groups(c.H_q, c.H_kv, G);
  std::vector<std::pair<std::string, Array>> w;
  w.emplace_back("W_Q", layer.W_Q.value().clone());
  if (c.bias) w.emplace_back("b_Q", layer.b_Q.value().clone());
  w.emplace_back("W_KV", pool_kv_columns(layer.W_KV.value(), 0, c.H_kv, layer.d_head(), G));
  if (c.bias) w.emplace_back("b_KV", pool_kv_columns(layer.b_KV.value(), 0, c.H_kv, layer.d_head(), G));
  w.emplace_back("W_O", layer.W_O.value().clone());
  if (c.bias) w.emplace_back("b_O", layer.b_O.value().clone());
  return w;
}

namespace {

using Named = std::vector<std::pair<std::string, Array>>;

// Every parameter of `model` by name, with the entries of `replaced` (full names) swapped in.
Named merged(const Module& model, const std::map<std::string, Array>& replaced) {
  Named all;
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = replaced.find(name);
    all.emplace_back(name, it != replaced.end() ? it->second : p.value().clone());
  }
  return all;
}

void put(std::map<std::string, Array>& into, const std::string& prefix, const Named& weights) {
  for (const auto& [name, a] : weights) into[prefix + name] = a;
}

TransformerConfig with_groups(const TransformerConfig& c, std::size_t G) {
  check_kv_groups(c.H_q, c.H_kv == 0 ? c.H_q : c.H_kv, G);
  TransformerConfig n = c;
  n.H_kv = G;
  return n.resolved();
}

}  // namespace

std::unique_ptr<GPT> with_kv_heads(const GPT& model, std::size_t G) {
  const TransformerConfig c = with_groups(model.config(), G);
  std::map<std::string, Array> pooled;
  for (std::size_t l = 0; l < model.blocks.size(); ++l)
    put(pooled, "blocks." + std::to_string(l) + ".attn.", pooled_kv_weights(model.blocks[l]->attn, G));
  Generator gen(0);  // every value is replaced below
  auto out = std::make_unique<GPT>(c, gen);
  out->set_weights(merged(model, pooled));
  out->train(model.training());
  return out;
}

std::unique_ptr<EncoderDecoder> with_kv_heads(const EncoderDecoder& model, std::size_t G) {
  const TransformerConfig c = with_groups(model.config(), G);
  std::map<std::string, Array> pooled;
  for (std::size_t l = 0; l < model.encoder.size(); ++l)
    put(pooled, "encoder." + std::to_string(l) + ".attn.", pooled_kv_weights(model.encoder[l]->attn, G));
  for (std::size_t l = 0; l < model.decoder.size(); ++l) {
    put(pooled, "decoder." + std::to_string(l) + ".attn.", pooled_kv_weights(model.decoder[l]->attn, G));
    put(pooled, "decoder." + std::to_string(l) + ".cross.", pooled_kv_weights(model.decoder[l]->cross, G));
  }
  Generator gen(0);
  auto out = std::make_unique<EncoderDecoder>(c, gen);
  out->set_weights(merged(model, pooled));
  out->train(model.training());
  return out;
}

}  // namespace xg::nn
