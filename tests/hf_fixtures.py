"""A tiny Hugging Face model, tokenizer and text corpus built locally (no download)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "bird",
    "sees",
    "chases",
    "likes",
    "eats",
    "runs",
    "sleeps",
    "over",
    "under",
    "near",
    "big",
    "small",
    "red",
    "green",
    "quick",
    "slow",
    "old",
    "young",
    "house",
    "tree",
    "river",
    "hill",
]


def corpus(n_docs: int = 400, seed: int = 0) -> list[str]:
    """Documents of a small grammar: learnable, deterministic."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sents = []
        for _ in range(rng.randint(1, 3)):
            s = [rng.choice(WORDS[:2]), rng.choice(WORDS[14:20]), rng.choice(WORDS[2:5])]
            s += [rng.choice(WORDS[5:10]), rng.choice(WORDS[:2]), rng.choice(WORDS[20:])]
            sents.append(" ".join(s) + " .")
        docs.append(" ".join(sents))
    return docs


def make_tokenizer(out: Path, docs: list[str]) -> int:
    """A word-level tokenizer saved with save_pretrained; returns its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>")
    fast.save_pretrained(str(out))
    return len(fast)


SIZES = {  # hidden, layers: "test" for the tests, "bench" for make bench (~ms per step)
    "test": (32, 2),
    "bench": (64, 4),
}


def make_model_dir(out: Path, vocab: int, arch: str = "llama", size: str = "test") -> None:
    """config.json only: the kit initialises it from --seed."""
    from transformers import GPT2Config, LlamaConfig

    hidden, layers = SIZES[size]
    if arch == "llama":
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    else:
        cfg = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    cfg.save_pretrained(str(out))


def make_all(root: Path, arch: str = "llama", size: str = "test") -> tuple[Path, Path]:
    """(model dir: config + tokenizer, data dir: two JSON-lines shards of the corpus)"""
    docs = corpus(400 if size == "test" else 4000)
    model = root / "model"
    model.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(model, docs)
    make_model_dir(model, vocab, arch, size)
    data = root / "data"
    data.mkdir(exist_ok=True)
    half = len(docs) // 2
    (data / "part-0.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:half]))
    (data / "part-1.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[half:]))
    return model, data


if __name__ == "__main__":
    import sys

    print(make_all(Path(sys.argv[1]), *(sys.argv[2:3] or [])))
