"""Hugging Face causal LMs and local text data in the kit's trainer (`--model hf:DIR`,
`--dataset hf:FILES`). Imported only when a config names `hf:`; nothing is downloaded.

Model: `DIR` holds a `config.json` (e.g. `LlamaConfig(...).save_pretrained(DIR)`): config only
= a fresh init from --seed (the same weights on every rank); weights too (safetensors or
.bin) = `from_pretrained`. The decoder layers are the blocks (the largest ModuleList of one
layer class), so FSDP2 wraps each one. Token-level cross-entropy; MFU from the config
(6 N + 12 L d T FLOPs per token, as for the built-in gpt).

Data: `FILES` is a file or a directory of `.txt` (one document per line), `.jsonl`/`.json`
(a `text` field) or `.parquet` (a `text` column) files, loaded with `datasets`, tokenized
with a local tokenizer (dataset_args `tokenizer = DIR`, default the hf: model's DIR), one EOS
between documents, and cut into fixed-length `--seq-len` sequences (the last
`val_fraction` of the tokens, default 0.05, is the held-out split). The kit's sampler serves
them, so exactly-once across resumes and world-size changes holds as for every dataset.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Only local directories and files are supported: never reach for the Hub (air-gapped
# nodes would otherwise wait on network timeouts). A value the user set wins.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from ddpkit.train.errors import ConfigError  # noqa: E402
from ddpkit.train.registry import HF_PREFIX, DatasetSpec, ModelSpec  # noqa: E402

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
DATA_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def has_weights(d: Path) -> bool:
    return any((d / f).is_file() for f in WEIGHT_FILES)


def load_config(d: Path, flag: str = "--model") -> Any:
    if not (d / "config.json").is_file():
        raise ConfigError(
            f"{flag} hf:{d}: no config.json in {d}; save one with "
            "AutoConfig/LlamaConfig(...).save_pretrained(DIR) (weights optional)"
        )
    check_config_types(d, flag)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(d))
    except (OSError, ValueError, KeyError, TypeError, *_strict_config_errors()) as e:
        found = " ".join(str(e).split())  # transformers' validation errors span lines
        raise ConfigError(
            f"{flag} hf:{d}: {d / 'config.json'} is not a valid config ({found})"
        ) from None


# The sizes in config.json that the kit reads or that shape the model's layers. transformers
# >= 5 refuses a wrong type in a multi-line traceback; older ones fail later, in the model's
# constructor (`range("2")`), without naming the key. A key that is absent or null is the
# architecture's default.
SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "n_embd",
    "n_layer",
    "n_head",
    "n_positions",
    "n_ctx",
)


def check_config_types(d: Path, flag: str = "--model") -> None:
    """One line naming the file and the key for a config.json that is not a JSON object or
    whose size keys are not positive integers."""
    path = d / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{flag} hf:{d}: unreadable config.json ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{flag} hf:{d}: {path} holds a JSON {type(raw).__name__}, not an object of "
            "config keys; save it with AutoConfig/LlamaConfig(...).save_pretrained(DIR)"
        )
    for key in SIZE_KEYS:
        value = raw.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ConfigError(
                f"{flag} hf:{d}: {path}'s {key} is {value!r} ({type(value).__name__}), not a "
                "positive integer; fix the model's config.json"
            )


def _strict_config_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's dataclass validation error (transformers >= 5), where it exists."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _wrapper_class() -> type:
    from torch import nn

    class HFCausalLM(nn.Module):
        """The HF model under `.hf`; forward(input_ids) -> logits (what the kit's loss takes)."""

        def __init__(self, model: nn.Module):
            super().__init__()
            self.hf = model

        def forward(self, input_ids: Any) -> Any:
            return self.hf(input_ids=input_ids, use_cache=False).logits

    return HFCausalLM


def build(d: Path, cfg: Any) -> Any:
    """The wrapped model on the current device (meta for checks; CPU to train)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = load_config(d)
    check_fits(d, config, cfg)
    meta = torch.get_default_device().type == "meta"
    try:
        if has_weights(d) and not meta:
            model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
        else:  # fresh init from the caller's seed (same on every rank)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except (ValueError, KeyError, OSError, TypeError) as e:  # TypeError: a key of a wrong type
        raise ConfigError(
            f"--model hf:{d}: not loadable as a causal LM ({type(e).__name__}: {e})"
        ) from None
    return _wrapper_class()(model)


def check_fits(d: Path, config: Any, cfg: Any) -> None:
    n_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0)
    if n_pos and cfg.seq_len > n_pos:
        raise ConfigError(
            f"--seq-len {cfg.seq_len} exceeds hf:{d}'s max_position_embeddings {n_pos}; "
            f"pass --seq-len {n_pos} or less"
        )
    if cfg.dataset == "synthetic" and cfg.vocab_size > config.vocab_size:
        raise ConfigError(
            f"--vocab-size {cfg.vocab_size} exceeds hf:{d}'s vocabulary ({config.vocab_size}); "
            f"pass --vocab-size {config.vocab_size} or less for the synthetic tokens"
        )


def flops_per_token(cfg: Any, model: Any) -> float:
    c = model.hf.config
    n = sum(p.numel() for p in model.parameters())
    return 6 * n + 12 * c.num_hidden_layers * c.hidden_size * cfg.seq_len


def model_spec(path: str) -> ModelSpec:
    d = Path(path)
    return ModelSpec(
        HF_PREFIX + path, lambda cfg, data: build(d, cfg), "tokens", flops_per_token=flops_per_token
    )


# --- data --------------------------------------------------------------------------------------


def data_files(path: Path) -> tuple[str, list[str]]:
    """(datasets builder, sorted files) for a file or a directory of one kind of file."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    files = [p for p in files if p.suffix in DATA_BUILDERS]
    kinds = {DATA_BUILDERS[p.suffix] for p in files}
    if len(kinds) != 1:
        found = "no .txt/.jsonl/.json/.parquet files" if not kinds else f"mixed {sorted(kinds)}"
        raise ConfigError(
            f"--dataset hf:{path}: {found}; point it at one file or a directory of one kind"
        )
    return kinds.pop(), [str(p) for p in files]


def tokenizer_dir(cfg: Any) -> Path:
    tok = cfg.dataset_args.get("tokenizer")
    if tok is None and cfg.model.startswith(HF_PREFIX):
        tok = cfg.model[len(HF_PREFIX) :]
    if tok is None:
        raise ConfigError(
            f"--dataset {cfg.dataset}: no tokenizer; set dataset_args tokenizer = DIR "
            "(a directory saved by a tokenizer's save_pretrained), or use an hf: model"
        )
    return Path(tok)


def load_tokens(cfg: Any, path: Path) -> tuple[Any, int]:
    """All documents as one int64 tensor of ids (EOS between documents), and the vocab size."""
    import datasets
    import torch
    from transformers import AutoTokenizer

    builder, files = data_files(path)
    tok_dir = tokenizer_dir(cfg)
    try:
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
    except (OSError, ValueError) as e:
        raise ConfigError(f"--dataset {cfg.dataset}: no tokenizer in {tok_dir} ({e})") from None
    column = cfg.dataset_args.get("text_column", "text")
    datasets.disable_progress_bars()
    ds = datasets.load_dataset(builder, data_files=files, split="train")
    if column not in ds.column_names:
        raise ConfigError(
            f"--dataset {cfg.dataset}: no {column!r} column (found {ds.column_names}); set "
            "dataset_args text_column"
        )
    texts = [t for t in ds[column] if t]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    flat = [i for doc in ids for i in (*doc, *eos)]
    return torch.tensor(flat, dtype=torch.int64), len(tok)


def build_dataset(cfg: Any, path: Path) -> Any:
    from ddpkit.train.data import DataBundle, TokenChunks

    toks, vocab = load_tokens(cfg, path)
    if cfg.model.startswith(HF_PREFIX):
        model_vocab = load_config(Path(cfg.model[len(HF_PREFIX) :])).vocab_size
        if vocab > model_vocab:
            raise ConfigError(
                f"--dataset {cfg.dataset}: the tokenizer has {vocab} ids, the model's vocabulary "
                f"{model_vocab}; use the model's own tokenizer"
            )
    elif vocab > cfg.vocab_size:  # e.g. the built-in gpt: its embedding has --vocab-size rows
        raise ConfigError(
            f"--dataset {cfg.dataset}: the tokenizer has {vocab} ids, more than --vocab-size "
            f"{cfg.vocab_size}; pass --vocab-size {vocab} or more"
        )
    frac = float(cfg.dataset_args.get("val_fraction", 0.05))
    split = len(toks) - int(len(toks) * frac)
    if split < cfg.seq_len + 1:
        raise ConfigError(
            f"--dataset {cfg.dataset}: {split} training tokens, fewer than one sequence "
            f"(--seq-len {cfg.seq_len} + 1); add text or lower --seq-len"
        )
    val = TokenChunks(toks[split:], cfg.seq_len) if len(toks) - split > cfg.seq_len else None
    return DataBundle(
        TokenChunks(toks[:split], cfg.seq_len), val, (cfg.seq_len,), vocab, cfg.seq_len
    )


def dataset_spec(path: str) -> DatasetSpec:
    p = Path(path)
    data_files(p)  # fail early (before the process group) on an empty or mixed directory
    return DatasetSpec(HF_PREFIX + path, lambda cfg, rank0, kind: build_dataset(cfg, p), "tokens")


# --- export ------------------------------------------------------------------------------------


def export(model_state: dict[str, Any], model_dir: Path, out: Path) -> dict[str, Any]:
    """A directory that AutoModelForCausalLM.from_pretrained(out) loads (safetensors), with
    the tokenizer files of model_dir when it has them."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr carry the tool's one result line
    config = load_config(model_dir, "export")
    sd = {k.removeprefix("hf."): v for k, v in model_state.items() if isinstance(v, torch.Tensor)}
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ConfigError(
            f"export: the checkpoint does not fit {model_dir}'s config (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]}); pass the model dir it was trained with"
        )
    model.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)  # never a half-written export under the final name
    return {"out": str(out), "tensors": len(sd), "bytes": sum(v.nbytes for v in sd.values())}
