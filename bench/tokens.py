"""Token files at scale: RSS per rank and samples/s of the windowed reads against the old copy.

    python -m bench.tokens                 # 2 GB file + small file, 2 ranks; out/bench/tokens.json
    python -m bench.tokens --gb 0.2 --reps 1 --steps 20   # a quick look

Cases, each a torchrun launch of 2 gloo ranks running this module's worker: build the
tokens dataset, wrap the kit's gpt model (2 layers, d 64, seq 128) in DDP, train --steps
steps. `new` is ddpkit.train.data.token_file (uint16 windows read per batch with pread, widened then);
`old` is the previous path, kept here as OldTokenChunks (the whole file copied to int64,
then a DataLoader collating per sample). Each rank reports VmRSS before and after the data
is built and at the end, its RssAnon/RssFile split, and samples/s after warmup. Importing
torch alone costs ~700 MB of RSS (~430 MB of it shared library pages), so the data's cost is
the growth from the RSS before the data was built.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, clean_env, torchrun_cmd, write_json

VOCAB, SEQ = 512, 128
RSS_TARGET_MB = 300  # the data's RSS growth per rank on the 2 GB file


def rss() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, VmHWM of this process in bytes (Linux /proc)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(val.split()[0]) * 1024
    return out


def make_file(path: Path, n_tokens: int) -> Path:
    """n_tokens random uint16 ids < VOCAB, written in 64 MiB pieces (never all in memory)."""
    if path.is_file() and path.stat().st_size == 2 * n_tokens:
        return path
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        left = n_tokens
        while left:
            k = min(left, 2**25)
            rng.integers(0, VOCAB, k, dtype=np.uint16).tofile(f)
            left -= k
    os.replace(tmp, path)
    return path


class OldTokenChunks:
    """The path before: the whole token file as one int64 tensor (8 bytes per 2-byte id)."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        import torch

        self.tokens = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int):
        chunk = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.data import GlobalBatchSampler, iterate_batches, token_file
    from ddpkit.train.models import build_model
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = TrainConfig(
        model="gpt", dataset="tokens", data_dir=args.file, seq_len=SEQ, vocab_size=VOCAB
    )
    cfg.n_layer, cfg.d_model, cfg.n_head = 2, 64, 2
    before = rss()
    t0 = time.perf_counter()
    if args.path == "new":
        ds = token_file(cfg).train
    else:
        ds = OldTokenChunks(np.memmap(args.file, dtype=np.uint16, mode="r"), SEQ)
    build_s = time.perf_counter() - t0
    built = rss()
    torch.manual_seed(0)
    model = DDP(build_model(cfg, (SEQ,), VOCAB))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = GlobalBatchSampler(len(ds), args.batch, world, rank, seed=0)
    batches = iterate_batches(ds, sampler, torch.device("cpu"), 0, rank)
    stamps, fetch_s = [], 0.0
    for _ in range(args.steps):
        t = time.perf_counter()
        x, y = next(batches)
        fetch_s += time.perf_counter() - t
        sampler.advance()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        stamps.append(time.perf_counter())
    warm = min(5, args.steps // 2)
    sps = (args.steps - 1 - warm) * args.batch * world / (stamps[-1] - stamps[warm])
    rec = {
        "rank": rank,
        "before": before,
        "built": built,
        "end": rss(),
        "build_s": build_s,
        "samples_per_s": sps,
        "fetch_ms_per_batch": 1000 * fetch_s / args.steps,
    }
    out: list[Any] = [None] * world
    dist.all_gather_object(out, rec)
    if rank == 0:
        Path(args.json).write_text(json.dumps(out))
    dist.destroy_process_group()


def run_case(path: str, file: Path, steps: int, batch: int, out_dir: Path) -> list[dict]:
    js = out_dir / f"tokens-{path}-{file.stem}.json"
    cmd = torchrun_cmd(2, "bench.tokens", "--worker", "--path", path, "--file", str(file))
    cmd += ["--steps", str(steps), "--batch", str(batch), "--json", str(js)]
    launch_env = clean_env()
    import subprocess

    p = subprocess.run(cmd, cwd=ROOT, env=launch_env, capture_output=True, text=True, timeout=900)
    if p.returncode:
        raise SystemExit(f"error: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return json.loads(js.read_text())


def mb(n: float) -> float:
    return round(n / 2**20, 1)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.tokens", description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", choices=["new", "old"], default="new", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--gb", type=float, default=2.0, help="size of the big token file")
    ap.add_argument("--small-mb", type=float, default=16.0, help="size of the small file")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16, help="per rank")
    ap.add_argument("--reps", type=int, default=3, help="old/new pairs on the small file")
    ap.add_argument(
        "--data-dir", default=os.path.join(tempfile.gettempdir(), "ddpkit-bench-tokens")
    )
    ap.add_argument("--out", default=str(ROOT / "out" / "bench"))
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    data, out = Path(args.data_dir), Path(args.out)
    data.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    big = make_file(data / "big.bin", int(args.gb * 1e9 / 2))
    small = make_file(data / "small.bin", int(args.small_mb * 2**20 / 2))
    print(
        f"token files ready in {time.perf_counter() - t:.0f} s: {big} ({big.stat().st_size:,} B), {small}"
    )
    result: dict[str, Any] = {"steps": args.steps, "batch_per_rank": args.batch, "ranks": 2}
    big_new = run_case("new", big, args.steps, args.batch, out)
    result["big_new"] = big_new
    small_new = run_case("new", small, args.steps, args.batch, out)
    result["small_new"] = small_new
    # What the file costs: RSS when the dataset is built, over RSS just before; and the RSS
    # at the end of training on the big file over the same training on the small one.
    growth = [r["built"]["VmRSS"] - r["before"]["VmRSS"] for r in big_new]
    vs_small = [
        b["end"]["VmRSS"] - s["end"]["VmRSS"] for b, s in zip(big_new, small_new, strict=True)
    ]
    result["big_data_rss_growth"] = growth
    result["big_minus_small_end_rss"] = vs_small
    for r, g, d in zip(big_new, growth, vs_small, strict=True):
        print(
            f"new path, {big.stat().st_size / 1e9:.1f} GB file, rank {r['rank']}: RSS "
            f"{mb(r['before']['VmRSS'])} MiB before the data, +{mb(g)} MiB building it "
            f"({r['build_s']:.1f} s), {mb(r['end']['VmRSS'])} MiB after {args.steps} steps "
            f"({mb(d):+} MiB against the {args.small_mb:g} MB file)"
        )
    worst = max(max(growth), max(vs_small))
    met = worst < RSS_TARGET_MB * 2**20
    print(
        f"  target: the file's RSS cost < {RSS_TARGET_MB} MiB per rank: "
        f"{'met' if met else 'NOT met'} (worst {mb(worst)} MiB; torch itself is ~700 MiB)"
    )
    ratios, pairs = [], []
    for rep in range(args.reps):  # alternate the order: the shared machine's load drifts
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        got = {p: run_case(p, small, args.steps, args.batch, out) for p in order}
        sps = {p: statistics.mean(r["samples_per_s"] for r in got[p]) for p in got}
        fetch = {p: statistics.mean(r["fetch_ms_per_batch"] for r in got[p]) for p in got}
        ratios.append(sps["new"] / sps["old"])
        pairs.append({"old": got["old"], "new": got["new"], "ratio_new_over_old": ratios[-1]})
        print(
            f"small file rep {rep + 1}: old {sps['old']:.0f} samples/s "
            f"(RSS +{mb(max(r['end']['VmRSS'] - r['before']['VmRSS'] for r in got['old']))} MiB), "
            f"new {sps['new']:.0f} samples/s "
            f"(RSS +{mb(max(r['end']['VmRSS'] - r['before']['VmRSS'] for r in got['new']))} MiB): "
            f"new/old {ratios[-1]:.3f}; data fetch {fetch['old']:.3f} -> "
            f"{fetch['new']:.3f} ms/batch"
        )
    result["small_pairs"] = pairs
    result["median_ratio_new_over_old"] = statistics.median(ratios)
    print(f"samples/s new/old on the small file: median {statistics.median(ratios):.3f}")
    write_json(out / "tokens.json", result)


if __name__ == "__main__":
    main()
