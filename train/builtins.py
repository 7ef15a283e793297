"""The built-in models, datasets and loss, registered like a user's would be, and the "hf"
source (hf:PATH). Torch-free: config validation reads the names without importing torch;
builders import it when called. The package imports this module (ddpkit/train/__init__.py),
so the registry is full before any ddpkit.train module reads it."""

from __future__ import annotations

import math
from typing import Any

from ddpkit.train.errors import ConfigError
from ddpkit.train.registry import (
    HF_PREFIX,
    DatasetSpec,
    ModelSpec,
    Source,
    register_dataset,
    register_loss,
    register_model,
    register_source,
)


def _mlp(hidden: list[int]):
    def build(cfg: Any, data: Any) -> Any:
        from ddpkit.train.models import MLP

        return MLP(math.prod(data.in_shape), hidden, data.num_classes)

    return build


def _resnet18(cfg: Any, data: Any) -> Any:
    from ddpkit.train.models import ResNet

    shape = data.in_shape
    return ResNet(data.num_classes, shape[0] if len(shape) == 3 else 1)


def _gpt(cfg: Any, data: Any) -> Any:
    from ddpkit.train.models import GPT

    return GPT(cfg)


def _gpt_flops(cfg: Any, model: Any) -> float:
    from ddpkit.train.models import gpt_flops_per_token

    return gpt_flops_per_token(cfg, sum(p.numel() for p in model.parameters()))


register_model(ModelSpec("mlp", _mlp([256])))  # the article's 784-256-10
register_model(ModelSpec("mlp-deep", _mlp([2048] * 7)))  # the article's SimpleMLP: 8 Linear
register_model(ModelSpec("resnet18", _resnet18))


def _gpt_check(cfg: Any) -> None:
    if cfg.d_model % cfg.n_head:
        raise ConfigError(
            f"--d-model {cfg.d_model} is not divisible by --n-head {cfg.n_head}; "
            "pick a head count that divides it"
        )


register_model(ModelSpec("gpt", _gpt, "tokens", "cross_entropy", _gpt_flops, _gpt_check))


def _synthetic(cfg: Any, rank0_download: bool, kind: str) -> Any:
    from ddpkit.train import data

    return data.synthetic_tokens(cfg) if kind == "tokens" else data.synthetic_classification(cfg)


def _tokens(cfg: Any, rank0_download: bool, kind: str) -> Any:
    from ddpkit.train import data

    return data.token_file(cfg)


def _mnist(cfg: Any, rank0_download: bool, kind: str) -> Any:
    from ddpkit.train import data

    return data.mnist(cfg, rank0_download)


def _torchvision(cfg: Any, rank0_download: bool, kind: str) -> Any:
    from ddpkit.train import data

    return data.torchvision_dataset(cfg, rank0_download)


register_dataset(DatasetSpec("synthetic", _synthetic, "any", (1, 28, 28)))  # learnable; seeded
register_dataset(DatasetSpec("mnist", _mnist, "classes", (1, 28, 28), 10))
register_dataset(DatasetSpec("cifar10", _torchvision, "classes", (3, 32, 32), 10))
register_dataset(DatasetSpec("imagefolder", _torchvision, "classes", (3, 64, 64)))
register_dataset(DatasetSpec("tokens", _tokens, "tokens"))


def cross_entropy(output: Any, target: Any) -> Any:
    """Classes (N, C) vs (N,) or tokens (N, T, V) vs (N, T); in fp32 for bf16/fp16 logits."""
    import torch.nn.functional as F

    return F.cross_entropy(output.flatten(0, -2).float(), target.flatten())


register_loss("cross_entropy", cross_entropy)


# hf:PATH: a local Hugging Face model directory or data files. ddpkit.train.hf is imported
# only when such a name is used (it sets the HF offline variables when imported).


def _hf_model(cfg: Any) -> ModelSpec:
    from ddpkit.train import hf

    return hf.model_spec(cfg.model[len(HF_PREFIX) :])


def _hf_dataset(cfg: Any) -> DatasetSpec:
    from ddpkit.train import hf

    return hf.dataset_spec(cfg.dataset[len(HF_PREFIX) :])


register_source("hf", Source(_hf_model, _hf_dataset))
