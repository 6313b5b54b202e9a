// The default set of `xgrad gradcheck`, in table order: ops, the attention core (gradients,
// closed form, invariants), the attention layers, then the layers and models built on them.
#include <xgrad/checks/builtin.hpp>

namespace xg::checks {

void register_builtin_checks(GradcheckSuite& suite) {
  register_op_checks(suite);
  // "attention" is the library's default (the fused path); "attention-composed" the chapter's
  // composition of engine ops. Both get the gradient and closed-form checks.
  const AttentionFn attn = library_attention();
  register_attention_gradient_checks(suite, "attention", attn);
  register_attention_gradient_checks(suite, "attention-composed", attention_with(nn::SdpaImpl::composed));
  register_attention_dropout_checks(suite);
  register_attention_reference_checks(suite, "attention", attn);
  register_attention_reference_checks(suite, "attention-composed", attention_with(nn::SdpaImpl::composed));
  register_attention_implementation_checks(suite);
  register_attention_invariant_checks(suite, "attention", attn);
  register_attention_layer_checks(suite);
  register_model_checks(suite);
  register_window_checks(suite);
  register_position_checks(suite);
}

}  // namespace xg::checks
