#!/usr/bin/python3
"""`xgrad tokenizer export --format llama2c` against llama2.c's converter rule and Python's
sentencepiece (run by run_llama2c_tokenizer.sh as the ctest tokenizer_export_interop).

Usage: tokenizer_export_check.py XGRAD WORKDIR

For three SentencePiece models -- a BPE and a unigram model trained by `xgrad tokenizer train`
on Debian's licence texts (no dummy prefix), and a Llama-style BPE model (dummy prefix) trained
by Python's sentencepiece on the same texts:

1. The bytes. `xgrad tokenizer export --format llama2c MODEL OUT` must write exactly the bytes
   that llama2.c's tokenizer.py rule gives, computed here from Python's sentencepiece alone:
   for each id, sp.id_to_piece with U+2581 replaced by a space (BOS as "\\n<s>\\n", EOS as
   "\\n</s>\\n"), UTF-8; then struct "<fI" (score, length) and the bytes, after "<I"
   max_token_length, the longest piece.
2. The written file in use. Lines and paragraphs of the licence texts, and lines with characters
   the vocabulary lacks (byte fallback), digits and whitespace runs, encoded by `xgrad tokenizer
   encode --tokenizer OUT` (xgrad's llama2.c encoder, run.c's algorithm) must give BOS followed
   by the SentencePiece ids of the text as run.c sees it (run.c always adds a dummy prefix " ",
   so for a model without one that is sp.encode(" " + text); for the Llama-style model
   sp.encode(text)); and `xgrad tokenizer decode --tokenizer OUT` of those ids must give the text
   back. This holds for BPE models, where run.c's merge loop (the best-scored adjacent pair first)
   is SentencePiece's BPE algorithm. A unigram model is a different algorithm (Viterbi over piece
   log-probabilities, not greedy merges), so there only decode(encode(text)) == text is asserted
   and the number of lines whose ids differ from SentencePiece's is printed.
3. Refusals: a model whose BOS is not id 1 (run.c's fixed BOS) is one line, exit 1, and OUT
   is not written.

Exit status: 0 if everything passed, 1 otherwise, 77 (skip) when this Python has no
sentencepiece or xgrad was built without SentencePiece.
"""
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from encode_files import encode_texts  # noqa: E402

try:
    import sentencepiece as spm
except ImportError:
    print(f"SKIPPED: sentencepiece is not importable by {sys.executable} (apt-get install python3-sentencepiece)")
    sys.exit(77)

LICENCES = ["/usr/share/common-licenses/" + n for n in ("GPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1")]
FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


def converter_bytes(model_path):
    """tokenizer.bin by the rule of llama2.c's tokenizer.py (export()), from sentencepiece alone."""
    sp = spm.SentencePieceProcessor(model_file=model_path)
    tokens, scores = [], []
    for i in range(sp.get_piece_size()):
        t = sp.id_to_piece(i)
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        tokens.append(t.replace("\u2581", " ").encode("utf-8"))
        scores.append(sp.get_score(i))
    out = struct.pack("<I", max(len(t) for t in tokens))
    for t, s in zip(tokens, scores):
        out += struct.pack("<fI", s, len(t)) + t
    return out


def run(xgrad, *args):
    return subprocess.run([xgrad, *args], capture_output=True, timeout=300)


def test_texts():
    texts = []
    for path in LICENCES:
        with open(path, encoding="utf-8") as f:
            body = f.read()
        paragraphs = [p for p in body.split("\n\n") if p.strip()]
        texts += [p.encode() for p in paragraphs[:25]]  # several lines each, newlines inside
        texts += [line.encode() for line in body.splitlines()[:80] if line.strip()]
    texts += [t.encode() for t in ("the", "", " ", "  two  spaces  ", "Copyright (C) 2007 Free Software Foundation",
                                   "licence café, naïve, 日本語 😀 €", "12345 67890", "a\n\nb\tc", "GNU GENERAL PUBLIC")]
    return texts


def check_model(xgrad, work, name, model, dummy_prefix, bpe):
    out = os.path.join(work, name + ".bin")
    r = run(xgrad, "tokenizer", "export", "--format", "llama2c", model, out)
    check(r.returncode == 0, f"{name}: export exits 0 ({r.stderr.decode(errors='replace').strip()})")
    if r.returncode != 0:
        return
    with open(out, "rb") as f:
        got = f.read()
    want = converter_bytes(model)
    first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
    check(got == want, f"{name}: the written {len(got)} bytes equal the converter rule's {len(want)} bytes"
                       + ("" if got == want else f" (first difference at byte {first})"))

    sp = spm.SentencePieceProcessor(model_file=model)
    texts = test_texts()
    encoded = encode_texts(xgrad, out, texts, os.path.join(work, name + ".lines"))
    differ = 0
    for text, obj in zip(texts, encoded):
        ids = obj["ids"]
        s = text.decode()
        want_ids = [1] + sp.encode(s if dummy_prefix or not s else " " + s)
        if ids != want_ids:
            differ += 1
            if bpe:
                check(False, f"{name}: {s[:60]!r}: tokenizer.bin ids {ids[:20]}..., sentencepiece {want_ids[:20]}...")
    if bpe:
        check(differ == 0, f"{name}: {len(texts)} texts: the tokenizer.bin gives [BOS] + sentencepiece's ids")
    else:
        print(f"note {name}: {differ} of {len(texts)} texts get other ids than sentencepiece's unigram encoding "
              "(run.c merges by score; unigram is Viterbi): expected, not asserted")
    # Decoding: the ids back to the text, through the written file.
    bad = 0
    for text, obj in zip(texts, encoded):
        ids = obj["ids"]
        r = run(xgrad, "tokenizer", "decode", "--tokenizer", out, "--ids", " ".join(map(str, ids)))
        if r.returncode != 0 or r.stdout != text:
            bad += 1
            if bad <= 5:
                check(False, f"{name}: decode(encode({text[:40]!r})) = {r.stdout[:40]!r} ({r.returncode})")
    check(bad == 0, f"{name}: {len(texts)} texts decode back to their bytes through the tokenizer.bin")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tokenizer_export_check.py XGRAD WORKDIR")
    xgrad, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if run(xgrad, "tokenizer", "encode", "--tokenizer", LICENCES[0], "--string", "a").stderr.find(
            b"without SentencePiece") >= 0:
        print("SKIPPED: xgrad was built without SentencePiece")
        return 77

    models = []
    for kind, size in (("bpe", 1024), ("unigram", 600)):
        model = os.path.join(work, f"xgrad_{kind}.model")
        r = run(xgrad, "tokenizer", "train", "--vocab-size", str(size), "--model-type", kind, "--out", model, *LICENCES)
        check(r.returncode == 0, f"xgrad tokenizer train {kind} ({r.stderr.decode(errors='replace').strip()})")
        if r.returncode == 0:
            models.append((f"xgrad_{kind}", model, False, kind == "bpe"))
    # Llama-style: a dummy prefix, as llama2.c's own scripts train their vocabularies.
    prefix = os.path.join(work, "llama_style")
    spm.SentencePieceTrainer.train(input=",".join(LICENCES), model_prefix=prefix, model_type="bpe", vocab_size=800,
                                   self_test_sample_size=0, input_format="text", character_coverage=1.0,
                                   num_threads=1, split_digits=True, allow_whitespace_only_pieces=True,
                                   byte_fallback=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, minloglevel=2)
    models.append(("llama_style", prefix + ".model", True, True))
    for name, model, dummy, bpe in models:
        check_model(xgrad, work, name, model, dummy, bpe)

    # A model run.c cannot use: BOS at id 0. One line, exit 1, nothing written.
    prefix = os.path.join(work, "bos0")
    spm.SentencePieceTrainer.train(input=LICENCES[0], model_prefix=prefix, model_type="bpe", vocab_size=400,
                                   byte_fallback=True, bos_id=0, unk_id=1, eos_id=2, minloglevel=2,
                                   num_threads=1)
    out = os.path.join(work, "bos0.bin")
    r = run(xgrad, "tokenizer", "export", "--format", "llama2c", prefix + ".model", out)
    err = r.stderr.decode(errors="replace")
    check(r.returncode == 1 and err.count("\n") == 1 and "<s> (BOS) is id 0" in err and not os.path.exists(out),
          f"BOS at id 0: one line, exit 1, no file ({r.returncode}: {err.strip()})")
    left = [f for f in os.listdir(work) if ".tmp." in f]
    check(not left, f"no temporary file left in the work folder ({left})")

    if FAILURES:
        print(f"{len(FAILURES)} failures")
        return 1
    print("tokenizer export: the written tokenizer.bin is llama2.c's converter's, and encodes as sentencepiece does")
    return 0


if __name__ == "__main__":
    sys.exit(main())
