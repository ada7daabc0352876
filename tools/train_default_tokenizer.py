#!/usr/bin/env python3
"""train_default_tokenizer.py — the byte-level BPE tokenizer of the bundled default model (models/lily-tiny).

Trained with Hugging Face `tokenizers` on CORPUS/train.txt (from tools/extract_pydoc_corpus.py). Built like
Qwen3.5's: NFC normalizer, the Qwen3.5 pre-tokenizer regex (tests/data/tokenizers/qwen35/KNOWN.json) then
ByteLevel without its own regex, ByteLevel decoder, and Qwen's special tokens first (ids 0..8) so the real chat
template and the reasoning / tool-call parsers work.

usage: python3 tools/train_default_tokenizer.py CORPUS_DIR OUT_DIR [VOCAB=8192]
writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json
"""
import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
KNOWN = ROOT / "tests/data/tokenizers/qwen35/KNOWN.json"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<tool_response>", "</tool_response>"]
# <think> ... </tool_response> are not "special" in Qwen's tokenizer (they survive skip_special_tokens decoding)
NOT_SPECIAL = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}


def main():
    corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
    vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    out.mkdir(parents=True, exist_ok=True)
    regex = json.loads(KNOWN.read_text())["pretokenize_regex"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(s, special=s not in NOT_SPECIAL, normalized=False) for s in SPECIALS]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = (corpus / "train.txt").read_text(encoding="utf-8")
    docs = text.split("\n<|endoftext|>\n")
    tok.train_from_iterator(docs, trainer=trainer)
    assert tok.get_vocab_size() <= vocab, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "add_bos_token": False, "model_max_length": 8192, "split_special_tokens": False,
        "errors": "replace", "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    n = len(tok.encode(text[:1000000]).ids)
    print(f"vocab {tok.get_vocab_size()}; {1000000 / n:.2f} characters per token on the first 1 MB")


if __name__ == "__main__":
    main()
