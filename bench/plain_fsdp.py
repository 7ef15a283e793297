"""A plain FSDP2 loop on a Hugging Face causal LM: what a user writes by hand, nothing else.

    AutoModelForCausalLM.from_config (seeded) -> fully_shard each decoder layer, then the
    root -> DistributedSampler + DataLoader -> AdamW -> logits -> cross-entropy

Used by bench.interleaved as the `plain-fsdp` variant: the same model, the same token
sequences (the kit's hf: dataset) and the same hyperparameters as the kit's run beside it.
"""

from __future__ import annotations

import time


class PlainFSDPLoop:
    """run(n) trains n more steps and returns their end times (like bench.plain_ddp.PlainLoop)."""

    def __init__(self, cfg, data) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.utils.data import DataLoader, DistributedSampler
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(cfg.seed)
        config = AutoConfig.from_pretrained(cfg.model.removeprefix("hf:"))
        self.model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in self.model.model.layers:  # Llama-style: one FSDP unit per decoder layer
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.sampler = DistributedSampler(data.train, shuffle=True, seed=cfg.seed, drop_last=True)
        self.loader = DataLoader(
            data.train, batch_size=cfg.batch_size, sampler=self.sampler, drop_last=True
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.batches = self._epochs()
        self.loss = None

    def _epochs(self):
        epoch = 0
        while True:
            self.sampler.set_epoch(epoch)
            yield from self.loader
            epoch += 1

    def run(self, n: int) -> list[float]:
        import torch.nn.functional as F

        ends = []
        for _ in range(n):
            x, y = next(self.batches)
            self.optimizer.zero_grad(set_to_none=True)
            logits = self.model(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            loss.backward()
            self.optimizer.step()
            ends.append(time.perf_counter())
        self.loss = loss
        return ends
