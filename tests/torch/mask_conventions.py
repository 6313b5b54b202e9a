#!/usr/bin/python3
"""Checks, in torch itself, the PyTorch rows of the mask table in docs/from-pytorch.md.

Each claim is checked against an explicit masked softmax over an ALLOWED set (True = the
query may see the key, xgrad's convention):
  * nn.MultiheadAttention: bool attn_mask True = NOT allowed; float attn_mask is added to the
    scores; bool key_padding_mask True = padding, ignored;
  * nn.Transformer.generate_square_subsequent_mask(T): float, -inf above the diagonal, 0 on
    and below it;
  * a query row with no allowed key comes out NaN;
  * F.scaled_dot_product_attention (torch >= 2.0 only; reported as not checked otherwise):
    bool attn_mask True = allowed; float mask added; is_causal=True is the top-left
    triangle j <= i, also for L != S (not bottom-right).
Exit 0 if every claim holds, 1 otherwise, 77 (skip) without torch.
"""
import math
import sys

try:
    import torch
except ImportError:
    print("SKIPPED: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(77)
import torch.nn.functional as F

failed = 0


def check(ok, what):
    global failed
    print(("  ok    " if ok else "  FAIL  ") + what)
    failed += 0 if ok else 1


def reference(q, k, v, allowed=None, bias=None):
    """softmax(q k^T / sqrt(d) + bias, over the allowed keys) v; q [B, H, T, d]."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s.softmax(-1) @ v


def mha_parts(mha, x, m, B, T, S, E, H):
    """q, k, v heads [B, H, T|S, d] of nn.MultiheadAttention(batch_first) for query x, memory m."""
    W, b = mha.in_proj_weight, mha.in_proj_bias
    d = E // H
    q = F.linear(x, W[:E], b[:E]).view(B, T, H, d).transpose(1, 2)
    k = F.linear(m, W[E:2 * E], b[E:2 * E]).view(B, S, H, d).transpose(1, 2)
    v = F.linear(m, W[2 * E:], b[2 * E:]).view(B, S, H, d).transpose(1, 2)
    return q, k, v


def main():
    torch.manual_seed(0)
    B, T, S, E, H = 2, 3, 5, 8, 2
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64).eval()
    x = torch.randn(B, T, E, dtype=torch.float64)
    m = torch.randn(B, S, E, dtype=torch.float64)
    q, k, v = mha_parts(mha, x, m, B, T, S, E, H)

    def out(o):  # merge heads and project, as the module does
        return mha.out_proj(o.transpose(1, 2).reshape(B, T, E))

    with torch.no_grad():
        mask = torch.rand(T, S) < 0.4
        mask[:, 0] = False  # every row keeps key 0
        y, _ = mha(x, m, m, attn_mask=mask, need_weights=False)
        check(torch.allclose(y, out(reference(q, k, v, allowed=~mask)), atol=1e-12),
              "nn.MultiheadAttention bool attn_mask: True = NOT allowed")
        check(not torch.allclose(y, out(reference(q, k, v, allowed=mask | (torch.arange(S) == 0))), atol=1e-6),
              "  (and reading it as True = allowed gives a different output)")
        M = torch.randn(T, S, dtype=torch.float64)
        y, _ = mha(x, m, m, attn_mask=M, need_weights=False)
        check(torch.allclose(y, out(reference(q, k, v, bias=M)), atol=1e-12),
              "nn.MultiheadAttention float attn_mask: added to the scores")
        pad = torch.tensor([[False] * 3 + [True] * 2, [False] * 5])
        y, _ = mha(x, m, m, key_padding_mask=pad, need_weights=False)
        check(torch.allclose(y, out(reference(q, k, v, allowed=~pad.view(B, 1, 1, S))), atol=1e-12),
              "nn.MultiheadAttention bool key_padding_mask: True = padding, ignored")
        full = torch.zeros(T, S, dtype=torch.bool)
        full[1] = True  # query 1 sees nothing
        y, _ = mha(x, m, m, attn_mask=full, need_weights=False)
        check(bool(torch.isnan(y[:, 1]).all()) and not bool(torch.isnan(y[:, 0]).any()),
              "nn.MultiheadAttention: a query row with no allowed key is NaN")

        sq = torch.nn.Transformer.generate_square_subsequent_mask(4)
        want = torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)
        check(sq.dtype.is_floating_point and torch.equal(sq, want),
              "nn.Transformer.generate_square_subsequent_mask(4): float, -inf above the diagonal, 0 elsewhere")

    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is None:
        print(f"  not checked: F.scaled_dot_product_attention does not exist in torch {torch.__version__} "
              "(bool True = allowed, float added, is_causal top-left come from the PyTorch documentation)")
    else:
        with torch.no_grad():
            allowed = torch.rand(T, S) < 0.6
            allowed[:, 0] = True
            check(torch.allclose(sdpa(q, k, v, attn_mask=allowed), reference(q, k, v, allowed=allowed), atol=1e-12),
                  "F.scaled_dot_product_attention bool attn_mask: True = allowed")
            M = torch.randn(T, S, dtype=torch.float64)
            check(torch.allclose(sdpa(q, k, v, attn_mask=M), reference(q, k, v, bias=M), atol=1e-12),
                  "F.scaled_dot_product_attention float attn_mask: added to the scores")
            top_left = torch.ones(T, S, dtype=torch.bool).tril()
            bottom_right = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
            y = sdpa(q, k, v, is_causal=True)
            check(torch.allclose(y, reference(q, k, v, allowed=top_left), atol=1e-12)
                  and not torch.allclose(y, reference(q, k, v, allowed=bottom_right), atol=1e-6),
                  f"F.scaled_dot_product_attention is_causal=True with L={T} < S={S}: top-left (j <= i), "
                  "not bottom-right")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
