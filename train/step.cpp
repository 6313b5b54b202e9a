// The step machinery both training loops share (train/detail/step.hpp).
#include <xgrad/train/detail/step.hpp>

#include <limits>
#include <sstream>

#include <xgrad/io/number.hpp>

namespace xg::train::detail {

double Schedule::at(std::int64_t step) const {
  return nn::warmup_cosine(step - 1, warmup, steps, lr, lr * min_lr_ratio);
}

double finish_step(nn::AdamW& opt, const nn::NamedTensors& params, double clip) {
  const double norm = nn::clip_grad_norm(params, clip > 0 ? clip : std::numeric_limits<double>::infinity());
  opt.step();
  opt.zero_grad();
  return norm;
}

bool every_and_last(std::int64_t step, std::int64_t every, std::int64_t steps) {
  return (every > 0 && step % every == 0) || step == steps;
}

std::string log_row(std::int64_t step, double lr, double loss, double grad_norm, double tokens_per_s, double elapsed,
                    const double* val) {
  std::ostringstream row;
  row << step << "," << io::exact_text(lr) << "," << io::exact_text(loss) << "," << io::exact_text(grad_norm) << ","
      << tokens_per_s << "," << elapsed << "," << (val ? io::exact_text(*val) : "");
  return row.str();
}

}  // namespace xg::train::detail
