"""`xgrad tokenizer encode --json FILES...` for the tokenizer cross-checks (tests/interop): each
text written to a file of its own, all encoded by one xgrad process, one JSON object per file."""
import json
import os
import subprocess


def encode_texts(xgrad, model, texts, folder, timeout=300):
    """Writes texts[i] to folder/NNNNN.txt and returns xgrad's objects for them, in order. Raises
    RuntimeError when xgrad fails or its objects do not name the files in order."""
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, f"{i:05d}.txt") for i in range(len(texts))]
    for path, text in zip(paths, texts):
        with open(path, "wb") as f:
            f.write(text)
    r = subprocess.run([xgrad, "tokenizer", "encode", "--tokenizer", model, "--json", "-"] + paths, capture_output=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"xgrad tokenizer encode FILES with {model} failed ({r.returncode}): "
                           f"{r.stderr.decode(errors='replace')}")
    out = [json.loads(line) for line in r.stdout.splitlines()]
    if [o.get("file") for o in out] != paths:
        raise RuntimeError(f"xgrad tokenizer encode FILES with {model}: {len(out)} objects for {len(paths)} files, "
                           "or out of order")
    return out
