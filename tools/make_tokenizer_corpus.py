#!/usr/bin/env python3
"""make_tokenizer_corpus.py — the tokenizer parity corpus: varied strings with ids from HF `tokenizers`.

Writes tests/data/tokenizers/qwen3-parity.jsonl, one JSON object per line:
  {"mode": "qwen3" | "qwen35" | "nospecial", "text": ..., "ids": [...]}
  qwen3      tokenizer.json as it is, special tokens in the text parsed (HF encode, add_special_tokens=False)
  qwen35     the same vocabulary with the Qwen3.5 Split regex (tokenizers/qwen35/KNOWN.json) substituted
  nospecial  special tokens written in the text encoded as plain text (HF encode_special_tokens = True)
  tiny-chat  tests/data/tiny-chat/tokenizer.json (512-token BPE with the Qwen3.5 regex), every 10th string
The strings are deterministic (seeded): single fragments from many scripts and domains (code, CJK, Indic,
Thai, Vietnamese, combining marks, emoji ZWJ sequences, whitespace runs, long digit runs, special tokens
inside text), random concatenations of them, random code-point soup and random slices.

Also writes tests/data/tokenizers/pretokenizer-cases.json: a 7-token BPE with added tokens (lstrip,
rstrip) and, for each pre_tokenizer configuration (ByteLevel with add_prefix_space; Split with every
behavior, inverted or not; a String pattern), the ids HF gives for a few texts.

usage: pip install tokenizers; python3 tools/make_tokenizer_corpus.py [--out FILE]
"""
import argparse
import json
import os
import random
import unicodedata

from tokenizers import Regex, Tokenizer, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")

FRAGMENTS = [
    # code
    "def f(x: int) -> int:\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\ta[i] += b[i];\n}",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "fn main() { let v: Vec<u8> = vec![0xff; 16]; println!(\"{:?}\", v); }",
    "const x = async () => { await fetch('/api?q=1&r=2'); };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"a\">x < y && y > z</div>",
    "{\"key\": [1, 2, {\"n\": null}], \"s\": \"\\u00e9\", \"ok\": true}",
    "if [ -f ~/.bashrc ]; then . ~/.bashrc; fi  # comment",
    "    @property\n    def name(self):\n        return self._name\n\n",
    "x_1 = y__2 + __init__ - CamelCase123 * snake_case_name",
    "git commit -m 'fix: handle CRLF'\r\n",
    "$$\\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}$$",
    "https://example.com/path/to/page.html?query=a%20b&x=1#frag",
    "user.name+tag@example.co.uk",
    "| col1 | col2 |\n|------|------|\n| a    | b    |\n",
    "```python\nprint('hi')\n```",
    "    \t  mixed indentation\n\t\t\tdeep",
    # English, contractions, casing
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've won't it's we'd",
    "DON'T SHOUT 'S 'T 'RE 'VE 'M 'LL 'D",
    "don’t use curly apostrophes’s",
    "ALLCAPS lowercase MiXeD cAsE",
    "Hello,world!How are you?Fine...",
    # numbers
    "1234567890",
    "31415926535897932384626433832795028841971693993751",
    "3.14159 -1e-9 1,000,000 0x1F 0b1010 1_000",
    "2024-01-31T12:34:56.789Z",
    "v1.2.3-rc.4+build.5",
    "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ๑๒๓",
    "½ ¾ ² ³ ⅓ Ⅻ ① ⑳ ∞",
    # CJK
    "日本の首都はどこですか。一文で答えてください。",
    "我想在apple工作1314151天～",
    "人工智能是计算机科学的一个分支，它企图了解智能的实质。",
    "東京都渋谷区　カタカナ　ひらがな　漢字",
    "한국어 텍스트입니다. 안녕하세요!",
    "繁體中文測試：臺灣、香港。",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
    # Indic
    "हिन्दी पाठ में संयुक्ताक्षर क्षत्रिय",
    "বাংলা ভাষা আমার মাতৃভাষা",
    "தமிழ் மொழி மிகவும் பழமையானது",
    "తెలుగు భాష",
    "മലയാളം ഭാഷ",
    "ગુજરાતી ભાષા",
    "ਪੰਜਾਬੀ ਭਾਸ਼ਾ",
    "ಕನ್ನಡ ಭಾಷೆ",
    "සිංහල භාෂාව",
    # Thai, Lao, Khmer, Myanmar, Tibetan
    "ภาษาไทยเป็นภาษาที่ไม่มีการเว้นวรรคระหว่างคำ",
    "ພາສາລາວ",
    "ភាសាខ្មែរ",
    "မြန်မာဘာသာ",
    "བོད་ཡིག",
    # Vietnamese (NFC and NFD)
    "Tiếng Việt có dấu: người, được, những, đường",
    unicodedata.normalize("NFD", "Tiếng Việt có dấu: người, được"),
    # other scripts
    "мороз и солнце; день чудесный",
    "Ελληνικά κείμενα με τόνους",
    "עברית טקסט עם ניקוד: שָׁלוֹם",
    "العربية نص مع تشكيل: العَرَبِيَّة",
    "فارسی و اردو",
    "Ærøskøbing ß ﬁ ﬂ Œuvre",
    "ქართული ენა",
    "Հայերեն լեզու",
    "አማርኛ ቋንቋ",
    "ᐃᓄᒃᑎᑐᑦ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉",
    "𓀀𓀁 𐍈 𠀀𠀁",
    # combining marks
    "e\u0301 a\u0300 o\u0302 u\u0308 n\u0303 c\u0327",
    "é vs e\u0301 (NFC vs NFD)",
    "Å vs A\u030a vs \u212b",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "q\u0307\u0323 x\u0304\u0331 \u0301leading mark",
    "a\u20dd b\u20e3 1\ufe0f\u20e3",
    # emoji
    "emoji 👨\u200d👩\u200d👧\u200d👦 🇯🇵 🍣 👍🏽",
    "🏳️\u200d🌈 🏴\u200d☠️ 👩🏿\u200d💻 🧑🏻\u200d🤝\u200d🧑🏾",
    "🇺🇸🇬🇧🇫🇷🇩🇪🇨🇳",
    "😀😃😄😁😆😅🤣😂🙂🙃",
    "❤️ ✔️ ☺︎ #️⃣ *️⃣",
    "this is 🦙.cpp",
    # whitespace and controls
    "  leading and trailing  ",
    "a\tb\nc\r\nd",
    "\n\n\n\n",
    "                                ",
    "\t\t\t\t",
    "x \n y",
    "line1\n\n  line2\n",
    " \n \n \n",
    "\r\n\r\n\r\n",
    "\u00a0nbsp\u00a0and\u3000ideographic space",
    "zero\u200bwidth\u200djoin\u200cnon\u2060joiner",
    "\u2028line sep\u2029para sep\u0085nel",
    " \u180e1 x\u180e\u180ey \u180e \u0085\u0085z",
    "control\x01\x02\x1b[0m\x7f chars",
    "\ufeffBOM at start",
    "replacement \ufffd char",
    "\x00nul\x00byte",
    "\v\f vertical tab and form feed",
    # punctuation runs
    "------------------------------------------------------------",
    "!!!???...,,,;;;:::",
    "''''''```````\"\"\"\"",
    "....................................................",
    "«quotes» „German“ 「Japanese」 『double』",
    "—–-‐‑‒ dashes … ellipsis",
    # special tokens inside text
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "<|endoftext|><|im_start|><|im_end|>",
    "text<|im_end|>more",
    "not a token: <|im_start <|im_end| |im_end|>",
    "<|vision_start|><|image_pad|><|video_pad|><|vision_end|>",
    "<tool_response>\n{\"temp\": 21}\n</tool_response>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<|repo_name|>lily<|file_sep|>src/main.c",
    "a<<|im_end|>>b <|<|im_start|>|>",
    "word<think>inside</think>word",
]

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
           "<|object_ref_start|>", "<|box_end|>", "<|fim_pad|>", "<tool_response>", "</tool_response>"]

SEPARATORS = ["", " ", "  ", "\n", "\n\n", "\t", " \t ", "\r\n", "   \n", "\n    ", "\u3000", "\u00a0", ". ", ", "]

RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
          (0x900, 0x97f), (0x980, 0xdff), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x1e00, 0x1eff), (0x2000, 0x206f),
          (0x20a0, 0x20ff), (0x2100, 0x27bf), (0x3000, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
          (0xfe00, 0xfe0f), (0xff00, 0xffef), (0x1f300, 0x1faff), (0x1d400, 0x1d7ff), (0x20000, 0x2a6df),
          (0x0, 0x1f), (0xe0000, 0xe007f)]


def soup(rng):
    n = rng.randint(1, 16)
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        out.append(chr(rng.randint(lo, hi)))
        if rng.random() < 0.15:
            out.append(rng.choice(["\u200d", "\u0301", " ", "\n", "\ufe0f"]))
    return "".join(out)


def concat(rng):
    parts = []
    for _ in range(rng.randint(2, 3)):
        r = rng.random()
        if r < 0.12:
            parts.append(rng.choice(SPECIAL))
        elif r < 0.2:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 24))))
        elif r < 0.25:
            parts.append(rng.choice([" ", "\t", "\n", "\r\n"]) * rng.randint(1, 12))
        else:
            f = rng.choice(FRAGMENTS)
            if len(f) > 20:
                a = rng.randint(0, len(f) - 5)
                f = f[a:a + rng.randint(5, 20)]
            parts.append(f)
        parts.append(rng.choice(SEPARATORS))
    return "".join(parts)


def random_slice(rng):
    f = rng.choice(FRAGMENTS)
    a = rng.randint(0, len(f))
    return f[a:a + rng.randint(1, 24)]


def strings():
    rng = random.Random(20261130)
    out = list(FRAGMENTS)
    out += [s * 3 for s in SPECIAL]
    out += ["9" * n for n in (1, 2, 3, 4, 7, 20, 64)] + [" " * n for n in (1, 2, 3, 5, 17, 70)]
    out += ["\n" * n for n in (1, 2, 3, 9)] + [" \t" * 5, "\t \n" * 4]
    for _ in range(1260):
        out.append(concat(rng))
    for _ in range(400):
        out.append(soup(rng))
    for _ in range(300):
        out.append(random_slice(rng))
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


TINY_BPE = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [
        {"id": 7, "content": "<x>", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False, "special": True},
        {"id": 8, "content": "<y>", "single_word": False, "lstrip": False, "rstrip": True, "normalized": False, "special": False}],
    "normalizer": None, "pre_tokenizer": None, "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
              "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "\u0120": 5, "bc": 6}, "merges": ["a b", "ab c"]},
}


def pretokenizer_cases(path):
    def byte_level(prefix, regex):
        return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": regex}
    configs = [byte_level(True, True), byte_level(False, True)]
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            configs.append({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "b+|\\s"}, "behavior": behavior, "invert": invert},
                byte_level(False, False)]})
    configs.append({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "b"}, "behavior": "MergedWithPrevious", "invert": False},
        byte_level(True, False)]})
    texts = ["abc abc", "bbcab  abbbc", "a<y>bc<x> cb", " b", ""]
    cases = []
    for config in configs:
        spec = dict(TINY_BPE, pre_tokenizer=config)
        tok = Tokenizer.from_str(json.dumps(spec))
        cases.append({"pre_tokenizer": config, "texts": texts,
                      "ids": [tok.encode(t, add_special_tokens=False).ids for t in texts]})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": TINY_BPE, "cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"{path}: {len(cases)} pre_tokenizer configurations")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(DATA, "qwen3-parity.jsonl"))
    args = ap.parse_args()
    path = os.path.join(DATA, "qwen3", "tokenizer.json")
    qwen3 = Tokenizer.from_file(path)
    nospecial = Tokenizer.from_file(path)
    nospecial.encode_special_tokens = True
    with open(os.path.join(DATA, "qwen35", "KNOWN.json")) as f:
        regex35 = json.load(f)["pretokenize_regex"]
    qwen35 = Tokenizer.from_file(path)
    qwen35.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex35), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tiny = Tokenizer.from_file(os.path.join(ROOT, "tests", "data", "tiny-chat", "tokenizer.json"))
    texts = strings()
    rng = random.Random(7)
    n = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            modes = ["qwen3"]
            if any(unicodedata.category(c).startswith("M") for c in text):
                modes.append("qwen35")
            if "<|" in text and rng.random() < 0.5:
                modes.append("nospecial")
            if i % 10 == 0:
                modes.append("tiny-chat")
            for mode in modes:
                tok = {"qwen3": qwen3, "qwen35": qwen35, "nospecial": nospecial, "tiny-chat": tiny}[mode]
                ids = tok.encode(text, add_special_tokens=False).ids
                f.write(json.dumps({"mode": mode, "text": text, "ids": ids}, ensure_ascii=False,
                                   separators=(",", ":")) + "\n")
                n += 1
    print(f"{args.out}: {n} records from {len(texts)} strings")
    pretokenizer_cases(os.path.join(DATA, "pretokenizer-cases.json"))


if __name__ == "__main__":
    main()
