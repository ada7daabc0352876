#!/usr/bin/env python3
"""make_test_model.py — build tests/data/tiny-chat: a small model directory a new user can `lily run` and `lily chat`.

It is tiny-a's MLX 4-bit weights (tests/data/tiny-a/mlx4, random but well-scaled, vocab 512) plus:
  * tokenizer.json — a byte-level BPE of exactly 512 tokens trained here with Hugging Face `tokenizers`
    on English text from Python's own documentation strings, with Qwen's special tokens first
    (<|endoftext|>, <|im_start|>, <|im_end|>, <think>, </think>, <tool_call>, </tool_call>,
    <tool_response>, </tool_response>) and the Qwen3.5 pre-tokenizer regex, NFC normalizer and ByteLevel
    decoder, so the real chat template and output parser work end to end;
  * tokenizer_config.json, chat_template.jinja (the real Qwen3.6 template), generation_config.json
    (stop on <|im_end|> and <|endoftext|>), config.json (tiny-a's, with eos_token_id set to this
    tokenizer's <|endoftext|>).
The weights are random, so generated text is noise; the directory exists to exercise the whole pipeline.

usage: python3 tools/make_test_model.py [OUT_DIR]     (needs: pip install tokenizers)
"""
import json
import pydoc
import shutil
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests/data/tiny-a/mlx4"
TEMPLATE = ROOT / "tests/data/tokenizers/qwen35/chat_template.jinja"
KNOWN = ROOT / "tests/data/tokenizers/qwen35/KNOWN.json"
VOCAB = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<tool_response>", "</tool_response>"]


def corpus():
    """English text: the docstrings of a fixed list of standard-library modules (PSF licence)."""
    import collections, json as j, string, textwrap, itertools, functools, re, os, pathlib
    for mod in (collections, j, string, textwrap, itertools, functools, re, os, pathlib):
        yield pydoc.render_doc(mod, renderer=pydoc.plaintext)


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/data/tiny-chat"
    out.mkdir(parents=True, exist_ok=True)
    regex = json.loads(KNOWN.read_text())["pretokenize_regex"]

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))

    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    cfg = json.loads((SRC / "config.json").read_text())
    cfg["text_config"]["eos_token_id"] = ids["<|endoftext|>"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"],
         "max_new_tokens": 128},  # random weights never stop: lily run / chat cap replies here without -n
        indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "add_bos_token": False, "model_max_length": 8192, "split_special_tokens": False,
    }, indent=2) + "\n")
    shutil.copyfile(TEMPLATE, out / "chat_template.jinja")
    shutil.copyfile(SRC / "model.safetensors", out / "model.safetensors")
    (out / "README.md").write_text(
        "# tiny-chat — test model directory\n\n"
        "Made by `tools/make_test_model.py`: the random weights of `tests/data/tiny-a/mlx4` (MLX 4-bit layout,\n"
        "vocab 512) with a 512-token byte-level BPE tokenizer trained on Python standard-library docstrings\n"
        "(PSF licence), Qwen's special tokens, and the real Qwen3.6 chat template. Output is noise: it exists\n"
        "to test the pipeline (tokenizer, template, sampler, parser, server) end to end.\n\n"
        f"Special token ids: {json.dumps(ids)}\n")
    print(f"wrote {out}: vocab {tok.get_vocab_size()}, specials {ids}")


if __name__ == "__main__":
    main()
