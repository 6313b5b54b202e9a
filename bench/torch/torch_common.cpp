#include "bench/torch/torch_common.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "bench/openblas.hpp"

namespace bench::torchref {

void add_flags(CLI::App& app, ThreadFlags& f) {
  app.add_option_function<int>(
         "--blas-threads", [&f](const int& n) { f.blas_threads = n; },
         "OpenBLAS's own threads (default: OpenBLAS's default, one per core)")
      ->check(CLI::Range(1, 1024))
      ->type_name("N>=1");
}

void without_backtrace(const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

void set_threads(int threads, const ThreadFlags& f) {
  torch::set_num_threads(threads);
  if (f.blas_threads) set_openblas_threads(*f.blas_threads);
  print_line("libtorch " + std::string(TORCH_VERSION) + ": intra-op threads " +
             std::to_string(torch::get_num_threads()) + ", OpenBLAS threads " + std::to_string(openblas_threads()));
}

torch::Tensor hidden_mask(const AttentionFlags& f) {
  const auto T = static_cast<std::int64_t>(f.seq);
  if (f.mask == "causal") return torch::ones({T, T}, torch::kBool).triu(1);
  if (f.mask == "padding") {
    const std::vector<std::size_t> lengths = padding_lengths(f.batch, f.seq);
    torch::Tensor hidden = torch::zeros({static_cast<std::int64_t>(f.batch), 1, 1, T}, torch::kBool);
    for (std::size_t b = 0; b < f.batch; ++b)
      hidden[static_cast<std::int64_t>(b)]
          .narrow(-1, static_cast<std::int64_t>(lengths[b]), T - static_cast<std::int64_t>(lengths[b]))
          .fill_(true);
    return hidden;
  }
  if (f.mask == "documents") {
    const std::vector<std::int64_t> ids = document_ids(f.seq, f.seed);
    const torch::Tensor doc = torch::tensor(ids, torch::kLong);
    return doc.unsqueeze(1).ne(doc.unsqueeze(0)).logical_or(torch::ones({T, T}, torch::kBool).triu(1));
  }
  return {};
}

torch::Tensor composed_attention(const torch::Tensor& Q, const torch::Tensor& K, const torch::Tensor& V,
                                 const torch::Tensor& hidden) {
  const std::int64_t B = Q.size(0), H = Q.size(1), T = Q.size(2), dh = Q.size(3);
  const std::int64_t Hkv = K.size(1), S = K.size(2), r = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  torch::Tensor U = torch::matmul((Q * scale).reshape({B, Hkv, r * T, dh}), K.transpose(-2, -1));
  if (hidden.defined()) {
    const torch::Tensor m = hidden.dim() == 4 ? hidden.unsqueeze(2) : hidden;  // [B, 1, 1, T|1, S]
    U = U.view({B, Hkv, r, T, S}).masked_fill(m, -std::numeric_limits<double>::infinity()).view({B, Hkv, r * T, S});
  }
  return torch::matmul(torch::softmax(U, -1), V).view({B, H, T, V.size(3)});
}

torch::Tensor library_attention(const torch::Tensor& Q, const torch::Tensor& K, const torch::Tensor& V,
                                const torch::Tensor& hidden) {
  const std::int64_t r = Q.size(1) / K.size(1);
  const torch::Tensor Kh = r == 1 ? K : K.repeat_interleave(r, 1);
  const torch::Tensor Vh = r == 1 ? V : V.repeat_interleave(r, 1);
  c10::optional<torch::Tensor> allowed;
  if (hidden.defined()) allowed = hidden.logical_not();
  return std::get<0>(at::_scaled_dot_product_attention(Q, Kh, Vh, allowed, 0.0, false, false));
}

}  // namespace bench::torchref
