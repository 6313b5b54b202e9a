#!/usr/bin/python3
"""A torch.nn.MultiheadAttention into xgrad through an .npz file (docs/from-pytorch.md).

Usage: torch_mha_npz.py DIR

Writes DIR/kdim.npz (nn.MultiheadAttention(16, 4, kdim=12, vdim=12): separate q/k/v
projection weights) and DIR/packed.npz (nn.MultiheadAttention(12, 3): kdim == embed_dim, the
packed in_proj_weight), each with the module's state_dict in float64 (np.savez, names as
torch has them), the number of heads, inputs X_q [B, T, E] and X_m [B, S, kdim], source
lengths (key_padding_mask = positions at or after the length) and torch's output Y.
`npy_interop mha DIR` rebuilds the layer with nn::torch_layout::import_mha and compares.
Exit 77 (skip) without torch or numpy.
"""
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIPPED: {e}")
    sys.exit(77)


def write(path, E, H, kdim, B=2, T=3, S=5, seed=0):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True, kdim=kdim, vdim=kdim, dtype=torch.float64)
    with torch.no_grad():  # non-zero biases, so the bias paths matter
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    xq = torch.randn(B, T, E, dtype=torch.float64)
    xm = torch.randn(B, S, kdim, dtype=torch.float64)
    lengths = torch.tensor([S, S - 2])
    pad = torch.arange(S).view(1, S) >= lengths.view(B, 1)  # True = padding
    with torch.no_grad():
        y, _ = mha(xq, xm, xm, key_padding_mask=pad, need_weights=False)
    arrays = {k: v.detach().double().numpy() for k, v in mha.state_dict().items()}
    arrays.update(num_heads=np.array(H, dtype=np.int64), X_q=xq.numpy(), X_m=xm.numpy(),
                  src_lengths=lengths.numpy().astype(np.int64), Y=y.numpy())
    np.savez(path, **arrays)
    print(f"wrote {path}: {sorted(arrays)}")


def main():
    if len(sys.argv) != 2:
        print("usage: torch_mha_npz.py DIR", file=sys.stderr)
        return 2
    os.makedirs(sys.argv[1], exist_ok=True)
    write(os.path.join(sys.argv[1], "kdim.npz"), E=16, H=4, kdim=12)
    write(os.path.join(sys.argv[1], "packed.npz"), E=12, H=3, kdim=12, seed=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
