#!/usr/bin/python3
"""xgrad's llama2.c tokenizer (text/tokenizer_llama2c.cpp) against two references (run by
run_llama2c_tokenizer.sh as the ctest llama2c_tokenizer_interop).

Usage: llama2c_tokenizer_check.py XGRAD WORKDIR

1. run.c's encode written again here, literally (the byte loop that groups a byte with its
   continuation bytes, byte fallback to id byte + 3, then the merge loop that rescans every
   adjacent pair and takes the best score, leftmost on ties), and run.c's decode. Hand-made
   vocabularies (ties, whitespace pieces, pieces with bytes that are not UTF-8, a vocabulary
   without " ") and random byte strings (invalid UTF-8, stray continuation bytes, NUL, long
   runs) go through `xgrad tokenizer encode --json`: the ids must be the reference's, and
   `xgrad tokenizer decode` must give the bytes back.
2. A Llama-style BPE model trained by Python's sentencepiece (byte fallback, identity
   normalisation, dummy prefix, whitespace kept, as llama2.c's tinystories.py trains its
   vocabularies) is written to tokenizer.bin the way llama2.c's tokenizer.py exports one (ids in
   order, U+2581 written as a space, BOS and EOS as "\\n<s>\\n" and "\\n</s>\\n"). Lines of
   English, accented Latin, CJK, emoji and characters the vocabulary lacks (byte fallback) must
   encode to [1] + sp.encode(line) (run.c's encoding of valid UTF-8 is SentencePiece's, except
   for text with U+2581, which SentencePiece reads as a space) and to the reference's ids; every
   line decodes back.

3. A text model trained with that (dummy-prefix) .model: `xgrad generate` prints the prompt and
   the continuation decoded together by the documented rule (the first word's space dropped,
   every other kept). Skipped when xgrad has no SentencePiece.

Exit status: 0 if everything passed, 1 otherwise, 77 (skip) when this Python has no
sentencepiece.
"""
import json
import os
import random
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

FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    if len(FAILURES) <= 20:
        print("FAILED", msg)


# --- the format and run.c's algorithm, written from llama2.c's source ----------------------------

def write_bin(path, pieces, scores):
    """tokenizer.bin: uint32 max_token_length, then per piece float32 score, uint32 length, bytes."""
    with open(path, "wb") as f:
        f.write(struct.pack("<I", max(len(p) for p in pieces)))
        for p, s in zip(pieces, scores):
            f.write(struct.pack("<fI", s, len(p)))
            f.write(p)


def byte_vocab():
    """<unk>, BOS, EOS and the 256 byte pieces, as llama2.c's files start."""
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [("<0x%02X>" % b).encode() for b in range(256)]
    return pieces, [0.0] * len(pieces)


def ref_encode(pieces, scores, text):
    """run.c's encode(text, bos=1, eos=0), loop for loop, on bytes (a NUL is one more byte)."""
    f32 = [struct.unpack("<f", struct.pack("<f", s))[0] for s in scores]
    lookup = {}
    for i, p in enumerate(pieces):
        lookup.setdefault(p, i)  # the lower id when two pieces have the same bytes
    tokens = [1]
    if text:
        tokens.append(lookup.get(b" ", 0x20 + 3))
    buf = b""
    i = 0
    while i < len(text):
        c = text[i]
        if (c & 0xC0) != 0x80:
            buf = b""
        buf += bytes([c])
        if i + 1 < len(text) and (text[i + 1] & 0xC0) == 0x80 and len(buf) < 4:
            i += 1
            continue
        if buf in lookup:
            tokens.append(lookup[buf])
        else:
            tokens.extend(b + 3 for b in buf)
        buf = b""
        i += 1
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for k in range(len(tokens) - 1):
            j = lookup.get(pieces[tokens[k]] + pieces[tokens[k + 1]], -1)
            if j != -1 and f32[j] > best_score:
                best_score, best_id, best_idx = f32[j], j, k
        if best_idx == -1:
            break
        tokens[best_idx:best_idx + 2] = [best_id]
    return tokens


def ref_decode(pieces, ids):
    """run.c's decode piece by piece; BOS and EOS give nothing (generate never prints them)."""
    out = b""
    prev = -1
    for t in ids:
        if t in (1, 2):
            prev = t
            continue
        p = bytes([t - 3]) if 3 <= t < 259 else pieces[t]
        if prev == 1 and p[:1] == b" ":
            p = p[1:]
        out += p
        prev = t
    return out


# --- xgrad ---------------------------------------------------------------------------------------

def xgrad_encode(xgrad, tok, text):
    r = subprocess.run([xgrad, "tokenizer", "encode", "--tokenizer", tok, "--json"], input=text, capture_output=True,
                       timeout=60)
    if r.returncode != 0:
        fail(f"encode {text!r}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
        return None
    return json.loads(r.stdout)["ids"]


def xgrad_encode_all(xgrad, tok, texts):
    """`xgrad tokenizer encode --json FILES...` in one process: each text a file of its own.
    The first two texts also go through stdin, one process each, and must give the same ids."""
    folder = tok + ".lines"
    shutil.rmtree(folder, ignore_errors=True)
    try:
        ids = [o["ids"] for o in encode_texts(xgrad, tok, texts, folder)]
    except RuntimeError as e:
        sys.exit(f"FAILED: {e}")
    for text, got in list(zip(texts, ids))[:2]:
        if xgrad_encode(xgrad, tok, text) != got:
            fail(f"{os.path.basename(tok)} {text!r}: stdin and FILES give different ids")
    return ids


def xgrad_decode(xgrad, tok, ids):
    r = subprocess.run([xgrad, "tokenizer", "decode", "--tokenizer", tok, "--ids", " ".join(map(str, ids))],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        fail(f"decode {ids}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
        return None
    return r.stdout


def check_line(xgrad, tok, pieces, scores, text, sp=None, decode=True, lossy=False, got=None):
    """got: xgrad's ids when already encoded (xgrad_encode_all); else encoded here through stdin."""
    want = ref_encode(pieces, scores, text)
    if got is None:
        got = xgrad_encode(xgrad, tok, text)
    if got is None:
        return
    if got != want:
        fail(f"{os.path.basename(tok)} {text!r}: xgrad {got}, run.c's rule {want}")
    # SentencePiece reads U+2581 in the text as a space; run.c (and xgrad) see a character.
    if sp is not None and "\u2581".encode() not in text:
        spids = [1] + sp.encode(text.decode())
        if got != spids:
            fail(f"{os.path.basename(tok)} {text!r}: xgrad {got}, [1] + sentencepiece {spids}")
    # Lossless, except where a merge spelled a piece from a byte piece's text (run.c does too:
    # the hand vocabulary's '<0x41>b'); there xgrad must decode as run.c does.
    expect = text if not lossy else ref_decode(pieces, want)
    if not lossy and ref_decode(pieces, want) != text:
        fail(f"the reference decode of {text!r} gives {ref_decode(pieces, want)!r}")
    if decode or lossy:
        back = xgrad_decode(xgrad, tok, got)
        if back is not None and back != expect:
            fail(f"{os.path.basename(tok)}: decode(encode({text!r})) = {back!r}, want {expect!r}")


# --- 1. hand-made vocabularies, random bytes ----------------------------------------------------

def hand_vocabularies(work):
    out = []
    # Merges with ties (two pieces share a score), whitespace pieces, a two-byte character
    # with its own piece and merges over it, a piece that is not UTF-8.
    pieces, scores = byte_vocab()
    extra = [(b" ", 0.0), (b"a", 0.0), (b"b", 0.0), (b"c", 0.0), (b"\n", 0.0), (b"\xc3\xa9", 0.0),
             (b"ab", -1.0), (b" a", -1.0), (b"bc", -2.0), (b"abc", -3.0), (b" ab", -0.5), (b"  ", -4.0),
             (b"   ", -6.0), (b"ca", -1.0), (b"\xc3\xa9a", -1.5), (b" \xc3\xa9", -2.5), (b"\n\n", -0.25),
             (b"cc", -1.0), (b"ccc", -1.0), (b"\xff", -0.1), (b"a\xff", -0.2), (b"<0x41>b", -0.3),
             (b"veryunlikely", -1e11)]
    pieces = pieces + [p for p, _ in extra]
    scores = scores + [s for _, s in extra]
    out.append(("hand.bin", pieces, scores))
    # No " " piece (the dummy prefix falls back to <0x20>), a duplicate piece (the lower id wins).
    pieces, scores = byte_vocab()
    extra = [(b"x", 0.0), (b"y", 0.0), (b"xy", -1.0), (b"xy", -0.5), (b" x", -2.0), (b"yx", -1.0)]
    pieces = pieces + [p for p, _ in extra]
    scores = scores + [s for _, s in extra]
    out.append(("nospace.bin", pieces, scores))
    paths = []
    for name, p, s in out:
        path = os.path.join(work, name)
        write_bin(path, p, s)
        paths.append((path, p, s))
    return paths


def random_bytes(rng):
    alphabet = [b"a", b"b", b"c", b" ", b"  ", b"\n", b"\xc3\xa9", b"\xc3", b"\xa9", b"\x80", b"\xff", b"\x00",
                b"\xe2\x96\x81", b"\xf0\x9f\x98\x80", b"\xf0\x9f\x98\x80\x80\x80", b"x", b"y", b"<0x41>", b"\t"]
    return b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 24)))


def part1(xgrad, work, rng):
    fixed = [b"", b"a", b" ", b"ab", b"abc", b" ab", b"cab", b"ccc", b"cccc", b"\xc3\xa9a", b"a\xff", b"\xff",
             b"\x80\x80\x80\x80\x80", b"a\x00b", b"\n\n\n", b"<0x41>b", b"xy", b"yxy", b"veryunlikely", b"  a  b   c"]
    for path, pieces, scores in hand_vocabularies(work):
        texts = fixed + [random_bytes(rng) for _ in range(60)]
        for text, got in zip(texts, xgrad_encode_all(xgrad, path, texts)):
            check_line(xgrad, path, pieces, scores, text, decode=len(text) % 3 == 0, got=got)
    path, pieces, scores = hand_vocabularies(work)[0]
    check_line(xgrad, path, pieces, scores, b"Ab", lossy=True)
    if ref_decode(pieces, ref_encode(pieces, scores, b"Ab")) != b"<0x41>b":
        fail("the hand vocabulary no longer shows the merge through a byte piece's text")


# --- 2. a Llama-style SentencePiece model exported as tokenizer.py does ------------------------

WORDS = ["once", "upon", "a", "time", "there", "was", "little", "girl", "named", "Lily", "she", "liked", "to",
         "play", "with", "her", "big", "red", "ball", "in", "the", "park", "one", "day", "saw", "dog", "and",
         "happy", "said", "Tom", "mom"]
LATIN = ["café", "naïve", "élève", "Grüße", "señor", "façade"]


def corpus_line(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randrange(4, 14))]
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), rng.choice(LATIN))
    if rng.random() < 0.05:
        words.insert(rng.randrange(len(words)), "日本語")
    return " ".join(words) + rng.choice([".", "!", ",", ""])


def test_line(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return corpus_line(rng)
    if kind == 1:  # whitespace runs, newlines, digits
        return rng.choice(["  ", " ", "\n", "\n\n"]).join(corpus_line(rng).split(" ")) + " 12345"
    if kind == 2:  # characters the vocabulary lacks: byte fallback
        return corpus_line(rng) + " " + rng.choice(["😀", "ß", "Ωmega", "中文", "\u2581", "\x07", "€"])
    if kind == 3:
        return rng.choice(LATIN) + " " + "".join(chr(rng.randrange(0x4E00, 0x4E00 + 200)) for _ in range(3))
    if kind == 4:
        return " " + corpus_line(rng) + " "
    return "Once upon a time"


def part2(xgrad, work, rng, compare=True):
    corpus = os.path.join(work, "stories.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for _ in range(3000):
            f.write(corpus_line(rng) + "\n")
    prefix = os.path.join(work, "tok400")
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=400,
                                   self_test_sample_size=0, input_format="text", character_coverage=1.0,
                                   num_threads=1, split_digits=True, allow_whitespace_only_pieces=True,
                                   byte_fallback=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    pieces, scores = [], []
    for i in range(sp.vocab_size()):
        t = sp.id_to_piece(i)
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        pieces.append(t.replace("\u2581", " ").encode("utf-8"))
        scores.append(sp.get_score(i))
    path = prefix + ".bin"
    write_bin(path, pieces, scores)
    if not compare:
        return
    lines = ["Once upon a time", "", " ", "a", "Lily and Tom played.", "café 😀 日本語", "x\ny", "  two  spaces  "]
    lines += [test_line(rng) for _ in range(120)]
    texts = [line.encode() for line in lines]
    for i, (text, got) in enumerate(zip(texts, xgrad_encode_all(xgrad, path, texts))):
        check_line(xgrad, path, pieces, scores, text, sp=sp, decode=i % 4 == 0, got=got)
    # Bytes that are not UTF-8 (sentencepiece cannot take them): the reference alone.
    texts = [test_line(rng).encode() + bytes([rng.choice([0x80, 0xC3, 0xFF, 0xE2])]) + b"the" for _ in range(30)]
    for text, got in zip(texts, xgrad_encode_all(xgrad, path, texts)):
        check_line(xgrad, path, pieces, scores, text, decode=True, got=got)


# --- 3. generate decodes with a dummy-prefix SentencePiece model's own rule ------------------------

def sp_text(sp, ids):
    """xgrad's documented decoding of SentencePiece ids (docs/cli.md), on bytes: byte pieces give
    their byte, text pieces their text with U+2581 as a space, control pieces nothing; with a dummy
    prefix the first id that is not a control piece loses its leading space."""
    out, first = b"", True
    for i in ids:
        if sp.is_control(i):
            continue
        if sp.is_byte(i):
            piece = bytes([int(sp.id_to_piece(i)[3:5], 16)])
        else:
            piece = sp.id_to_piece(i).replace("\u2581", " ").encode()
        if first and piece.startswith(b" "):
            piece = piece[1:]
        first = False
        out += piece
    return out


def part3(xgrad, work):
    """A text model trained with a Llama-style (dummy prefix) SentencePiece model: generate prints
    the prompt and the continuation decoded together, so the words keep their spaces (before, each
    id was decoded alone, which dropped the leading space of every word)."""
    model = os.path.join(work, "tok400.model")
    if subprocess.run([xgrad, "tokenizer", "encode", "--tokenizer", model, "--string", "a"],
                      capture_output=True).returncode != 0:
        print("part 3 skipped: xgrad has no SentencePiece")
        return
    sp = spm.SentencePieceProcessor(model_file=model)
    corpus = os.path.join(work, "text")
    os.makedirs(corpus, exist_ok=True)
    for i in range(3):
        with open(os.path.join(corpus, f"{i}.txt"), "w") as f:
            f.write("once upon a time there was a little girl named Lily she liked to play.\n" * 50)
    run = os.path.join(work, "textrun")
    r = subprocess.run([xgrad, "train", "--task", "text", "--text", corpus, "--tokenizer", model, "--out", run,
                        "--steps", "30", "--batch", "8", "--context", "32", "--d-model", "32", "--heads", "2",
                        "--layers", "1", "--no-progress", "--no-plot", "--threads", "1"], capture_output=True)
    if r.returncode != 0:
        fail(f"part 3: xgrad train: {r.stderr.decode(errors='replace')}")
        return
    ckpt = os.path.join(run, "model.safetensors")
    args = [xgrad, "generate", "--checkpoint", ckpt, "--prompt", "once upon a", "--max-new", "8"]
    line = subprocess.run(args, capture_output=True).stdout
    j = json.loads(subprocess.run(args + ["--json", "-"], capture_output=True).stdout)
    ids = [t["id"] for t in j["prompt"]["tokens"]] + [t["id"] for t in j["generated"]["tokens"]]
    want = sp_text(sp, ids) + b"\n"
    if line != want:
        fail(f"part 3: generate printed {line!r}, the ids {ids} decode to {want!r}")
    if not line.startswith(b"once upon a "):
        fail(f"part 3: generate printed {line!r}: the words lost their spaces")


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: llama2c_tokenizer_check.py XGRAD WORKDIR [PARTS, e.g. 23]")
    xgrad, work = sys.argv[1], sys.argv[2]
    parts = sys.argv[3] if len(sys.argv) == 4 else "123"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = random.Random(19)
    if "1" in parts:
        part1(xgrad, work, rng)
    part2(xgrad, work, rng, "2" in parts)
    if "3" in parts:
        part3(xgrad, work)
    if FAILURES:
        print(f"{len(FAILURES)} failures")
        return 1
    print("llama2c tokenizer: xgrad's encodings equal run.c's rule and sentencepiece's, and decode back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
