#!/usr/bin/python3
"""xgrad's SentencePiece tokenizers against Python's sentencepiece (run by run_sentencepiece.sh).

Usage: sentencepiece_check.py XGRAD WORKDIR

1. `xgrad tokenizer train` trains a bpe and a unigram model on a generated mixed corpus.
2. Python's SentencePieceTrainer trains models the way users bring them: Llama-style (byte
   fallback, identity normalisation, a dummy prefix), one whose normalisation rule changes a
   character (é -> e), and three xgrad must refuse (Python's defaults, which remove extra
   whitespace; one without byte fallback; one with a dummy prefix and a piece for every control
   character, so no separator).
3. Thousands of generated lines (ASCII, accented Latin, CJK, emoji, control bytes, tabs, CR/LF,
   NUL; a share with invalid UTF-8, U+2581 and U+FFFD) go through `xgrad tokenizer encode
   --json FILES...` (each line a file of its own; the first 20 also through stdin, which must
   give the same ids). A line of valid UTF-8 without U+2581 must give exactly sp.encode(line)
   (for the models whose normaliser keeps the line as it is); any other line must give what
   reference_encode() below computes: xgrad's documented rule (text/tokenizer.hpp, docs/cli.md)
   written again here on Python's sentencepiece and Python's own UTF-8 decoder. Every line
   must decode back to its bytes (decoded here, and through `xgrad tokenizer decode` for a
   sample).

Exit status: 0 if everything passed, 1 otherwise, 77 (skip) when this Python has no
sentencepiece or xgrad was built without it.
"""
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from encode_files import encode_texts  # noqa: E402

try:
    import sentencepiece as spm
except ImportError:
    print(f"SKIPPED: sentencepiece is not importable by {sys.executable} (apt-get install python3-sentencepiece)")
    sys.exit(77)

MARK = "\u2581"
FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    if len(FAILURES) <= 20:
        print("FAILED", msg)


# --- generated text ---------------------------------------------------------------------------

WORDS = ["the", "license", "software", "free", "copy", "of", "and", "to", "program", "you", "may", "work",
         "source", "code", "terms", "conditions", "without", "warranty", "distribute", "modify"]
LATIN = ["café", "naïve", "élève", "Grüße", "Ångström", "œuvre", "señor", "façade", "Øresund", "jalapeño"]
CONTROL = ["\x01", "\x02", "\x07", "\x1b", "\x7f", "\x0b", "\x0c"]


def cjk(rng):
    return "".join(chr(rng.randrange(0x4E00, 0x4E00 + 300)) for _ in range(rng.randrange(1, 6)))


def kana(rng):
    return "".join(chr(rng.randrange(0x3041, 0x3097)) for _ in range(rng.randrange(1, 5)))


def emoji(rng):
    return chr(rng.randrange(0x1F600, 0x1F650))


def clean_line(rng, nul=True, newlines=True):
    parts = []
    for _ in range(rng.randrange(1, 14)):
        k = rng.random()
        if k < 0.45:
            parts.append(rng.choice(WORDS))
        elif k < 0.6:
            parts.append(rng.choice(LATIN))
        elif k < 0.72:
            parts.append(cjk(rng))
        elif k < 0.78:
            parts.append(kana(rng))
        elif k < 0.83:
            parts.append(emoji(rng))
        elif k < 0.88:
            parts.append(str(rng.randrange(100000)))
        elif k < 0.92:
            parts.append(rng.choice(CONTROL))
        else:
            parts.append(rng.choice([",", ".", ";", "(", ")", "\"", "'", "-", "!"]))
    seps = [" ", " ", " ", "  ", "\t", ""] + (["\r\n", "\n"] if newlines else []) + (["\x00"] if nul else [])
    s = ""
    for p in parts:
        s += p + rng.choice(seps)
    if rng.random() < 0.2:
        s = " " + s
    return s.encode("utf-8")


BAD = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98", b"\xc0\x80", b"\xe0\x80\x80",
       b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", MARK.encode(), "\ufffd".encode()]


def dirty_line(rng):
    b = clean_line(rng)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(b) + 1)
        # Between characters: a position inside a multibyte character would make more invalid UTF-8, also fine.
        b = b[:at] + rng.choice(BAD) + b[at:]
    return b


def corpus_text(rng, lines):
    return b"".join(clean_line(rng, nul=False) + b"\n" for _ in range(lines))  # xgrad refuses NUL bytes in a corpus


# --- xgrad's rule, written again on Python's sentencepiece -------------------------------------

class Reference:
    """The lossless rule of text/tokenizer.hpp on top of Python's sentencepiece."""

    def __init__(self, path):
        self.sp = spm.SentencePieceProcessor(model_file=path)
        self.byte = {b: self.sp.piece_to_id(f"<0x{b:02X}>") for b in range(256)}
        probe = "".join(self.spell(self.sp.encode(" a  b ")))
        self.dummy = probe == MARK * 2 + "a" + MARK * 2 + "b" + MARK
        # Runs are cut into lines unless a piece joins a newline to what follows it.
        self.lines = not any(re.search("\n[^\n]", self.sp.id_to_piece(i)) for i in range(self.sp.get_piece_size())
                             if not (self.sp.is_byte(i) or self.sp.is_control(i) or self.sp.is_unknown(i)))
        # With a dummy prefix: the first control character the model writes as its byte piece.
        self.separator, self.separator_ids = None, None
        for c in list(range(1, 0x20)) + [0x7F]:
            ids = self.sp.encode(chr(c))
            if self.dummy and len(ids) >= 2 and ids[-1] == self.byte[c] and "".join(self.spell(ids[:-1])) == MARK:
                self.separator, self.separator_ids = chr(c), ids
                break
        self.behind = 0  # runs encoded behind the separator
        self.fallbacks = 0  # runs written as bytes because SentencePiece changed them

    def spell(self, ids):
        out = []
        for i in ids:
            if self.sp.is_byte(i):
                out.append(chr(int(self.sp.id_to_piece(i)[3:5], 16)))
            else:
                out.append(self.sp.id_to_piece(i))
        return out

    def text(self, i):
        """The bytes one id decodes to."""
        if self.sp.is_byte(i):
            return bytes([int(self.sp.id_to_piece(i)[3:5], 16)])
        if self.sp.is_control(i):
            return b""
        if self.sp.is_unknown(i):
            return " \u2047 ".encode()
        return self.sp.id_to_piece(i).replace(MARK, " ").encode()

    def decode(self, ids, strip=None):
        strip = self.dummy if strip is None else strip
        out = b""
        for i in ids:
            t = self.text(i)
            if strip and not self.sp.is_control(i):
                strip = False
                if self.sp.id_to_piece(i).startswith(MARK) and not self.sp.is_byte(i) and not self.sp.is_unknown(i):
                    t = t[1:]
            out += t
        return out

    def segments(self, data):
        """(bytes, raw) pieces of the pre-split, found with Python's own UTF-8 decoder: every
        byte it cannot decode comes back as a lone surrogate U+DC80..U+DCFF. Runs also end
        after a stretch of newlines that something else follows (when self.lines)."""
        segs, run = [], ""
        for ch in data.decode("utf-8", errors="surrogateescape"):
            if 0xDC80 <= ord(ch) <= 0xDCFF or ch == MARK:
                if run:
                    segs.append((run.encode(), False))
                    run = ""
                raw = bytes([ord(ch) - 0xDC00]) if ch != MARK else ch.encode()
                segs.append((raw, True))
            else:
                if self.lines and run.endswith("\n") and ch != "\n":
                    segs.append((run.encode(), False))
                    run = ""
                run += ch
        if run:
            segs.append((run.encode(), False))
        return segs

    def encode(self, data):
        out, at = [], 0
        for seg, raw in self.segments(data):
            if raw:
                out += [self.byte[b] for b in seg]
            else:
                if self.dummy and at > 0:
                    ids = self.sp.encode(self.separator + seg.decode())
                    n = len(self.separator_ids)
                    ids = ids[n:] if ids[:n] == self.separator_ids else None
                    self.behind += 1
                else:
                    ids = self.sp.encode(seg.decode())
                if ids is None or self.decode(ids, strip=self.dummy and at == 0) != seg:
                    ids = [self.byte[b] for b in seg]
                    self.fallbacks += 1
                out += ids
            at += len(seg)
        return out


# --- running xgrad ------------------------------------------------------------------------------

def xgrad_encode(xgrad, model, data):
    r = subprocess.run([xgrad, "tokenizer", "encode", "--tokenizer", model, "--json"], input=data,
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"xgrad tokenizer encode failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    return json.loads(r.stdout)


def xgrad_encode_many(xgrad, model, lines, folder, chunk=250):
    """Each line as a file of its own, encoded by a few xgrad processes (FILES), two at a time;
    a sample of lines also goes through stdin, one process each, and must give the same."""
    chunks = [lines[i:i + chunk] for i in range(0, len(lines), chunk)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        parts = pool.map(lambda ic: encode_texts(xgrad, model, ic[1], os.path.join(folder, str(ic[0]))),
                         enumerate(chunks))
        results = [o for part in parts for o in part]
    for data, res in list(zip(lines, results))[:20]:
        via_stdin = xgrad_encode(xgrad, model, data)
        if via_stdin["ids"] != res["ids"]:
            fail(f"{folder}: line {data!r}: ids through stdin {via_stdin['ids']} != through FILES {res['ids']}")
    return results


def xgrad_decode(xgrad, model, ids):
    r = subprocess.run([xgrad, "tokenizer", "decode", "--tokenizer", model], input=" ".join(map(str, ids)).encode(),
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"xgrad tokenizer decode failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    return r.stdout


def check_model(xgrad, name, model, lines, exact_clean, decode_sample, dummy, fallbacks, cut=True):
    """exact_clean: clean lines must equal sp.encode. dummy: whether the model must be found to
    add a dummy prefix (and the rule then took it off some runs). fallbacks: whether some runs
    must have been written as bytes (SentencePiece's normaliser changed them) or none. cut:
    whether the model allows cutting text into lines (no piece joins a newline to what follows)."""
    ref = Reference(model)
    sp = ref.sp
    results = xgrad_encode_many(xgrad, model, lines, os.path.join(os.path.dirname(model), "lines", name.replace(" ", "_")))
    same_as_sp = by_rule = with_newlines = 0
    for data, res in zip(lines, results):
        ids = res["ids"]
        where = f"{name}: line {data!r}"
        if res["bytes"] != len(data) or res["tokens"] != len(ids) or len(res["pieces"]) != len(ids):
            fail(f"{where}: bytes/tokens/pieces do not match: {res['bytes']} {res['tokens']} {len(res['pieces'])}")
        if res["pieces"] != [sp.id_to_piece(i) for i in ids]:
            fail(f"{where}: pieces {res['pieces']} are not sentencepiece's pieces of the ids")
        if res["tokenizer"]["vocab_size"] != sp.get_piece_size():
            fail(f"{where}: vocab_size {res['tokenizer']['vocab_size']}, sentencepiece says {sp.get_piece_size()}")
        try:
            text = data.decode("utf-8")
            clean = MARK not in text
        except UnicodeDecodeError:
            clean = False
        if clean and exact_clean:
            want = sp.encode(text)
            same_as_sp += 1
            with_newlines += "\n" in text.rstrip("\n")
            if ids != want:
                fail(f"{where}: xgrad {ids} != sp.encode {want}")
        else:
            want = ref.encode(data)
            by_rule += 1
            if ids != want:
                fail(f"{where}: xgrad {ids} != the rule's {want} (pieces {res['pieces']})")
        if ref.decode(ids) != data:
            fail(f"{where}: the ids decode to {ref.decode(ids)!r}")
    for data, res in list(zip(lines, results))[:decode_sample]:
        back = xgrad_decode(xgrad, model, res["ids"])
        if back != data:
            fail(f"{name}: xgrad tokenizer decode gave {back!r} for {data!r}")
    if ref.dummy != dummy or (dummy and ref.behind == 0):
        fail(f"{name}: dummy prefix {ref.dummy} (expected {dummy}), {ref.behind} runs behind the separator")
    if (ref.fallbacks > 0) != fallbacks:
        fail(f"{name}: {ref.fallbacks} runs written as bytes, expected {'some' if fallbacks else 'none'}")
    if ref.lines != cut or (exact_clean and cut and with_newlines < 50):
        fail(f"{name}: cut into lines {ref.lines} (expected {cut}), {with_newlines} lines with newlines inside")
    if by_rule < 100:
        fail(f"{name}: only {by_rule} lines checked against the rule")
    print(f"{name}: {len(lines)} lines, {same_as_sp} equal to sp.encode ({with_newlines} of them with newlines "
          f"inside), {by_rule} equal to the rule "
          f"(cut into lines: {ref.lines}; dummy prefix: {ref.dummy}, separator {ref.separator!r}, "
          f"{ref.behind} runs behind it; {ref.fallbacks} runs as bytes), "
          f"{decode_sample} decoded by xgrad")


def python_trained(path, lines, **options):
    m = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=m, minloglevel=2, **options)
    with open(path, "wb") as f:
        f.write(m.getvalue())


def expect_refused(xgrad, model, words):
    r = subprocess.run([xgrad, "tokenizer", "encode", "--tokenizer", model, "--string", "x"], capture_output=True)
    err = r.stderr.decode(errors="replace")
    if r.returncode != 1 or not all(w in err for w in words) or not err.startswith("xgrad: "):
        fail(f"{model}: expected exit 1 naming {words}, got {r.returncode}: {err}")
    else:
        print(f"refused as expected: {err.strip()}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    xgrad, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "corpus"))
    rng = random.Random(20240518)
    for i in range(3):
        with open(os.path.join(work, "corpus", f"part{i}.txt"), "wb") as f:
            f.write(corpus_text(rng, 3000))

    models = {}
    for kind in ("bpe", "unigram"):
        out = os.path.join(work, f"xgrad_{kind}.model")
        r = subprocess.run([xgrad, "tokenizer", "train", "--vocab-size", "800", "--model-type", kind, "--out", out,
                            os.path.join(work, "corpus")], capture_output=True, text=True)
        if r.returncode == 2 and "built without SentencePiece" in r.stderr:
            print(f"SKIPPED: {r.stderr.strip()}")
            sys.exit(77)
        if r.returncode != 0:
            sys.exit(f"FAILED: xgrad tokenizer train --model-type {kind}: {r.stderr}")
        print(r.stdout.strip())
        models[f"xgrad {kind}"] = out

    # Lines without newlines, as SentencePiece's own trainer reads a file: no piece holds one.
    train_lines = [clean_line(rng, newlines=False).decode() for _ in range(4000)]
    llama = os.path.join(work, "llama_style.model")
    python_trained(llama, train_lines, vocab_size=1200, character_coverage=0.98, model_type="bpe", byte_fallback=True,
                   normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
                   split_digits=True)
    rule_tsv = os.path.join(work, "e_acute.tsv")
    with open(rule_tsv, "w") as f:
        f.write("E9\t65\n")  # é -> e: a normaliser that changes text the load-time probe cannot see
    rule = os.path.join(work, "rule.model")
    python_trained(rule, train_lines, vocab_size=1200, character_coverage=0.98, model_type="unigram", byte_fallback=True,
                   normalization_rule_tsv=rule_tsv, add_dummy_prefix=False, remove_extra_whitespaces=False)
    defaults = os.path.join(work, "python_defaults.model")
    python_trained(defaults, train_lines, vocab_size=1200, byte_fallback=True)
    no_separator = os.path.join(work, "no_separator.model")
    python_trained(no_separator, train_lines, vocab_size=1200, character_coverage=0.98, byte_fallback=True,
                   normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
                   user_defined_symbols=[chr(c) for c in list(range(1, 0x20)) + [0x7F]])
    no_bytes = os.path.join(work, "no_byte_fallback.model")
    python_trained(no_bytes, train_lines, vocab_size=1200, character_coverage=0.98, normalization_rule_name="identity",
                   remove_extra_whitespaces=False)

    lines = [clean_line(rng) for _ in range(1100)] + [dirty_line(rng) for _ in range(500)]
    rng.shuffle(lines)
    edge = [b"", b" ", b"  ", b"\x00", b"\n", b"\xff", MARK.encode(), b" " + MARK.encode() + b" ", b"\xffabc",
            b"abc\xff", b"the\xffthe", b"\xff the", b" \xff ", b"\xe6\x97\xa5\xff\xe6\x97\xa5"]
    lines = edge + lines
    check_model(xgrad, "xgrad bpe", models["xgrad bpe"], lines, True, 60, False, False)
    check_model(xgrad, "xgrad unigram", models["xgrad unigram"], lines[:400], True, 30, False, False)
    check_model(xgrad, "python llama-style", llama, lines[:700], True, 40, True, False)
    # The é -> e rule: a line with é is not kept by SentencePiece, so only the rule applies.
    check_model(xgrad, "python e-acute rule", rule, [l for l in lines if "é".encode() in l][:150] + lines[:100],
                False, 30, False, True)
    expect_refused(xgrad, defaults, ["python_defaults.model", "changes whitespace"])
    expect_refused(xgrad, no_bytes, ["no_byte_fallback.model", "no byte piece <0x00>"])
    expect_refused(xgrad, no_separator, ["no_separator.model", "adds a dummy prefix and has a piece for every control"])

    if FAILURES:
        print(f"sentencepiece interop: {len(FAILURES)} failures")
        sys.exit(1)
    print("sentencepiece interop: all checks passed")


if __name__ == "__main__":
    main()
