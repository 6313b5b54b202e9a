#!/usr/bin/python3
"""Hugging Face Llama names (tools/xgrad_torch.py hf_llama_to_xgrad / xgrad_to_hf_llama) against
xgrad itself (ctest torch_hf_llama_names).

Usage: /usr/bin/python3 hf_llama_names_check.py XGRAD WORKDIR

For GQA tied, GQA untied and MQA untied shapes: `xgrad train --arch llama` writes a small
checkpoint (for its metadata); a random Hugging Face-style LlamaForCausalLM state dict of the
same shapes, in float64, is mapped to xgrad's names with each RoPE layout (interleaved:
Q/K rows un-permuted to Meta's order; half_split: kept) and written as a float64 xgrad
checkpoint with that rope_layout. `xgrad generate --json-top-k 256` (greedy, with and without
the KV cache) gives xgrad's logits at every generated position; the Hugging Face forward pass
written here from the published definition (LlamaRMSNorm, rotate_half with the angles repeated
over the two halves, repeat_kv, SiLU MLP, causal softmax attention) on the same tokens must
give the same logits within 1e-10 relative to max(1, |torch|). Negative control: the
interleaved mapping run as half_split must not match. Round trips xgrad -> HF -> xgrad and
HF -> xgrad -> HF are exact (torch.equal) in both layouts.

Exit status: 0 all pass, 1 any fails, 77 (skip) without torch.
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIPPED: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import xgrad_torch as xt  # noqa: E402

TOL = 1e-10
FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


# --- Hugging Face's Llama, written from its published definition (modeling_llama.py) -----------

def rms_norm(h, w, eps):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_forward(sd, tokens, H_q, H_kv, eps, base):
    """LlamaForCausalLM.forward without a cache: logits [T, V] of one sequence."""
    T = len(tokens)
    h = sd["model.embed_tokens.weight"][torch.tensor(tokens)]
    d = h.shape[-1]
    d_h = d // H_q
    inv_freq = 1.0 / (base ** (torch.arange(0, d_h, 2, dtype=torch.float64) / d_h))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    L = 0
    while f"model.layers.{L}.input_layernorm.weight" in sd:
        L += 1
    for i in range(L):
        p = f"model.layers.{i}."
        x = rms_norm(h, sd[p + "input_layernorm.weight"], eps)
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(T, H_q, d_h).transpose(0, 1)
        k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(T, H_kv, d_h).transpose(0, 1)
        v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(T, H_kv, d_h).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H_q // H_kv, dim=0)  # repeat_kv
        v = v.repeat_interleave(H_q // H_kv, dim=0)
        a = torch.softmax(q @ k.transpose(-1, -2) / d_h ** 0.5 + mask, dim=-1) @ v
        h = h + a.transpose(0, 1).reshape(T, H_q * d_h) @ sd[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, sd[p + "post_attention_layernorm.weight"], eps)
        h = h + (F.silu(x @ sd[p + "mlp.gate_proj.weight"].T) * (x @ sd[p + "mlp.up_proj.weight"].T)) @ \
            sd[p + "mlp.down_proj.weight"].T
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return rms_norm(h, sd["model.norm.weight"], eps) @ head.T


def random_hf(gen, V, d, H_q, H_kv, L, d_ff, tied):
    d_h = d // H_q

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    sd = {"model.embed_tokens.weight": r(V, d, scale=1.0)}
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = r(H_q * d_h, d)
        sd[p + "self_attn.k_proj.weight"] = r(H_kv * d_h, d)
        sd[p + "self_attn.v_proj.weight"] = r(H_kv * d_h, d)
        sd[p + "self_attn.o_proj.weight"] = r(d, H_q * d_h)
        sd[p + "mlp.gate_proj.weight"] = r(d_ff, d)
        sd[p + "mlp.up_proj.weight"] = r(d_ff, d)
        sd[p + "mlp.down_proj.weight"] = r(d, d_ff)
        sd[p + "input_layernorm.weight"] = 1 + r(d, scale=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + r(d, scale=0.1)
    sd["model.norm.weight"] = 1 + r(d, scale=0.1)
    if tied:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # one tensor, as tie_word_embeddings
    else:
        sd["lm_head.weight"] = r(V, d)
    return sd


# --- xgrad ---------------------------------------------------------------------------------------

def run(xgrad, work, *args):
    return subprocess.run([xgrad, *args], cwd=work, capture_output=True, text=True, errors="replace", timeout=600)


def xgrad_logits(xgrad, work, ckpt, prompt, cache):
    """xgrad's greedy continuation of `prompt` (bytes tokenizer) and its logits at each step."""
    r = run(xgrad, work, "generate", "--checkpoint", ckpt, "--tokenizer", "bytes", "--prompt", prompt, "--max-new", "6",
            "--json", "-", "--json-top-k", "256", *([] if cache else ["--no-kv-cache"]))
    if r.returncode != 0:
        raise RuntimeError(f"xgrad generate: {r.stderr}")
    j = json.loads(r.stdout)
    ids = [t["id"] for t in j["prompt"]["tokens"]] + [t["id"] for t in j["generated"]["tokens"]]
    steps = []
    for s in j["steps"]:
        row = torch.zeros(256, dtype=torch.float64)
        for t in s["top"]:
            row[t["id"]] = t["logit"]
        steps.append(row)
    return ids, len(j["prompt"]["tokens"]), torch.stack(steps)


def main():
    if len(sys.argv) != 3:
        print("usage: hf_llama_names_check.py XGRAD WORKDIR")
        return 2
    xgrad, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "corpus"))
    for i in range(3):
        with open(os.path.join(work, "corpus", f"{i}.txt"), "w") as f:
            f.write(f"Once upon a time there was a model number {i}.\n" * 40)
    gen = torch.Generator().manual_seed(19)
    worst = 0.0
    for name, H_q, H_kv, tied in (("gqa_tied", 4, 2, True), ("gqa_untied", 4, 2, False), ("mqa_untied", 2, 1, False)):
        out = os.path.join(work, name)
        r = run(xgrad, work, "train", "--task", "text", "--text", "corpus", "--tokenizer", "bytes", "--arch", "llama",
                "--heads", str(H_q), "--kv-heads", str(H_kv), "--d-model", "32", "--layers", "2", "--context", "24",
                "--multiple-of", "16", "--batch", "2", "--steps", "1", "--no-progress", "--no-plot", "--threads", "1",
                "--out", out, *([] if tied else ["--no-tie-embeddings"]))
        if r.returncode != 0:
            check(False, f"{name}: xgrad train: {r.stderr.strip()}")
            continue
        trained, meta = xt.read_safetensors(os.path.join(out, "model.safetensors"))
        V, d = trained["tok.weight"].shape
        d_ff = trained["blocks.0.ffn.gate.W"].shape[1]
        eps, base = float(meta["norm_eps"]), float(meta["rope_base"])
        check(meta["rope_layout"] == "interleaved" and float(meta["rope_fraction"]) == 1.0,
              f"{name}: xgrad's default RoPE is interleaved over the whole head")

        # The xgrad checkpoint's own tensors: xgrad -> HF -> xgrad is exact in both layouts.
        for layout in ("interleaved", "half_split"):
            hf = xt.xgrad_to_hf_llama(trained, H_q, H_kv, layout)
            back, back_tied = xt.hf_llama_to_xgrad(hf, H_q, H_kv, layout)
            check(back_tied == tied and set(back) == set(trained) and all(torch.equal(back[k], trained[k]) for k in back),
                  f"{name}: xgrad -> HF -> xgrad is exact ({layout})")
        check(("lm_head.weight" in xt.xgrad_to_hf_llama(trained, H_q, H_kv)) == (not tied),
              f"{name}: lm_head.weight only for an untied model")

        sd = random_hf(gen, V, d, H_q, H_kv, 2, d_ff, tied)
        prompt = "Once upon"
        for layout in ("interleaved", "half_split"):
            x, x_tied = xt.hf_llama_to_xgrad(sd, H_q, H_kv, layout)
            check(x_tied == tied, f"{name}: tied read from lm_head ({layout})")
            again = xt.xgrad_to_hf_llama(x, H_q, H_kv, layout, lm_head_when_tied=tied)
            check(set(again) == set(sd) and all(torch.equal(again[k], sd[k]) for k in sd),
                  f"{name}: HF -> xgrad -> HF is exact ({layout})")
            m = dict(meta, dtype="float64", rope_layout=layout.replace("_", "-"))
            ckpt = os.path.join(work, f"{name}_{layout}.safetensors")
            xt.save_safetensors(ckpt, {k: x[k] for k in trained}, m)
            for cache in (True, False):
                ids, P, got = xgrad_logits(xgrad, work, ckpt, prompt, cache)
                ref = hf_forward(sd, ids, H_q, H_kv, eps, base)[P - 1:P - 1 + got.shape[0]]
                err = ((got - ref).abs() / ref.abs().clamp(min=1.0)).max().item()
                worst = max(worst, err)
                check(err <= TOL, f"{name}: xgrad ({layout}, {'KV cache' if cache else 'no cache'}) = HF logits over "
                                  f"{got.shape[0]} steps: {err:.2e}")
        # Negative control: Hugging Face's rows run with the interleaved layout (or the other way)
        # are another model.
        x, _ = xt.hf_llama_to_xgrad(sd, H_q, H_kv, "interleaved")
        ckpt = os.path.join(work, f"{name}_wrong.safetensors")
        xt.save_safetensors(ckpt, {k: x[k] for k in trained}, dict(meta, dtype="float64", rope_layout="half-split"))
        ids, P, got = xgrad_logits(xgrad, work, ckpt, prompt, True)
        ref = hf_forward(sd, ids, H_q, H_kv, eps, base)[P - 1:P - 1 + got.shape[0]]
        check(((got - ref).abs() / ref.abs().clamp(min=1.0)).max().item() > 1e-3,
              f"{name}: negative control: un-permuted rows with half_split RoPE do not match")

    # Bad input.
    try:
        xt.hf_llama_to_xgrad({"model.embed_tokens.weight": torch.zeros(3, 4)}, 2, 1)
        check(False, "a state dict without layers is refused")
    except ValueError as e:
        check("missing" in str(e) and "model.norm.weight" in str(e), f"a state dict without layers is refused: {e}")
    print(f"HF Llama names: max error {worst:.3e}, {'FAILED' if FAILURES else 'passed'}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
