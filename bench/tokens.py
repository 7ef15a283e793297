"""Token corpora at scale: data start-up, RSS and samples/s of the kit's path against the old one.

    python -m bench.tokens                         # 80 MB, 8 GB, 1 TB; 3 reps; out/bench/tokens.json
    python -m bench.tokens --sizes 80M --reps 1 --steps 20   # a quick look

Each case is a torchrun launch of 2 gloo ranks running this module's worker on a sparse
token file (`truncate -s`: no disk, every id 0): build the tokens dataset and the sampler,
fetch the first batch (that is the data start-up), then train the kit's gpt (2 layers,
d 64, seq 128) in DDP for --steps steps. `new` is the kit: ddpkit.train.data.token_file
(files stat'ed, ids checked per batch) and GlobalBatchSampler (a Feistel permutation per
batch). `old` is the path before it, kept here only: a full read of the file for its
largest id at start-up (old_max_id) and OldRandpermSampler (torch.randperm of every window
each epoch, 8 bytes per window). `old` is not run on the 1 TB file: a terabyte read per rank
and 31 GB of permutation per rank at seq 128 (this machine has 23 GB).

Each rank reports the seconds of the data start-up, VmRSS before it and after the first
batch (the data's memory: importing torch alone is ~700 MB), VmHWM (max RSS) at the end,
and samples/s after warmup. The table gives medians over --reps launches and over ranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, clean_env, table, torchrun_cmd, write_json

VOCAB, SEQ = 512, 128
SIZES = {"80M": 80 * 10**6, "8G": 8 * 10**9, "1T": 10**12}
OLD_MAX_BYTES = 10 * 10**9  # above this the old path is not run (see the module docstring)


def rss() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, VmHWM of this process in bytes (Linux /proc)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(val.split()[0]) * 1024
    return out


def sparse_file(path: Path, size: int) -> Path:
    """A file of `size` bytes that reads as zeros and takes no disk (truncate -s)."""
    if not (path.is_file() and path.stat().st_size == size):
        with open(path, "wb") as f:
            f.truncate(size)
    return path


# --- the old path, kept for the comparison only -------------------------------------------


def old_max_id(path: Path, dtype: type[np.unsignedinteger]) -> int:
    """The kit's start-up check before the per-batch one: the whole file read in 64 MiB pieces."""
    hi, count = 0, 2**26 // np.dtype(dtype).itemsize
    with open(path, "rb") as f:
        while (piece := np.fromfile(f, dtype=dtype, count=count)).size:
            hi = max(hi, int(piece.max()))
    return hi


def old_randperm_sampler(n: int, batch: int, world: int, rank: int, seed: int) -> Any:
    """GlobalBatchSampler as it was: the epoch's order materialized with torch.randperm."""
    import torch
    from ddpkit.train.data import GlobalBatchSampler

    class OldRandpermSampler(GlobalBatchSampler):
        def permutation(self, epoch: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            return torch.randperm(self.n, generator=g)

        def epoch_indices(self):
            perm = self.permutation(self.epoch)
            start = self.consumed
            while start + self.global_batch <= self.n:
                lo = start + self.rank * self.batch
                yield perm[lo : lo + self.batch].tolist()
                start += self.global_batch

    return OldRandpermSampler(n, batch, world, rank, seed)


def build_data(path: str, file: Path, batch: int, world: int, rank: int) -> tuple[Any, Any]:
    """(dataset, sampler) of one path; the cost of this is the data start-up."""
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.data import GlobalBatchSampler, TokenChunks, TokenFile, token_file

    if path == "new":
        cfg = TrainConfig(
            model="gpt", dataset="tokens", data_dir=str(file), seq_len=SEQ, vocab_size=VOCAB
        )
        ds = token_file(cfg).train
        return ds, GlobalBatchSampler(len(ds), batch, world, rank, seed=0)
    if old_max_id(file, np.uint16) >= VOCAB:
        raise SystemExit(f"{file}: an id >= {VOCAB}")
    ds = TokenChunks(TokenFile(file, np.uint16), SEQ)
    return ds, old_randperm_sampler(len(ds), batch, world, rank, seed=0)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.data import iterate_batches
    from ddpkit.train.models import build_model
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    before = rss()
    t0 = time.perf_counter()
    ds, sampler = build_data(args.path, Path(args.file), args.batch, world, rank)
    batches = iterate_batches(ds, sampler, torch.device("cpu"), 0, rank)
    first = next(batches)  # the old path materializes its permutation here
    startup_s = time.perf_counter() - t0
    after_first = rss()
    cfg = TrainConfig(model="gpt", seq_len=SEQ, vocab_size=VOCAB)
    cfg.n_layer, cfg.d_model, cfg.n_head = 2, 64, 2
    torch.manual_seed(0)
    model = DDP(build_model(cfg, (SEQ,), VOCAB))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stamps, fetch_s = [], 0.0
    for step in range(args.steps):
        t = time.perf_counter()
        x, y = first if step == 0 else next(batches)
        fetch_s += time.perf_counter() - t
        sampler.advance()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        stamps.append(time.perf_counter())
    warm = min(5, args.steps // 2)
    sps = (args.steps - 1 - warm) * args.batch * world / (stamps[-1] - stamps[warm])
    # The data path alone (indices, reads, id check), without the model: the part the two
    # paths differ in, far less noisy on a shared machine than the training step.
    t = time.perf_counter()
    for _ in range(args.fetches):
        next(batches)
        sampler.advance()
    data_sps = args.fetches * args.batch / (time.perf_counter() - t)
    rec = {
        "rank": rank,
        "startup_s": startup_s,
        "rss_before": before["VmRSS"],
        "rss_after_first_batch": after_first["VmRSS"],
        "data_rss": after_first["VmRSS"] - before["VmRSS"],
        "max_rss": rss()["VmHWM"],
        "samples_per_s": sps,
        "fetch_ms_per_batch": 1000 * fetch_s / args.steps,
        "data_only_samples_per_s": data_sps,
    }
    out: list[Any] = [None] * world
    dist.all_gather_object(out, rec)
    if rank == 0:
        Path(args.json).write_text(json.dumps(out))
    dist.destroy_process_group()


def run_case(
    path: str, file: Path, steps: int, batch: int, fetches: int, out_dir: Path
) -> list[dict]:
    js = out_dir / f"tokens-{path}-{file.stem}.json"
    cmd = torchrun_cmd(2, "bench.tokens", "--worker", "--path", path, "--file", str(file))
    cmd += ["--steps", str(steps), "--batch", str(batch), "--fetches", str(fetches)]
    cmd += ["--json", str(js)]
    p = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise SystemExit(f"error: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return json.loads(js.read_text())


def summarize(reps: list[list[dict]]) -> dict[str, float]:
    """Medians over launches and ranks of each measure."""
    keys = ("startup_s", "data_rss", "max_rss", "samples_per_s", "data_only_samples_per_s")
    return {k: statistics.median(r[k] for rep in reps for r in rep) for k in keys}


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.tokens", description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", choices=["new", "old"], default="new", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="80M,8G,1T", help=f"comma list of {', '.join(SIZES)}")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16, help="per rank")
    ap.add_argument("--fetches", type=int, default=500, help="data-only batches after training")
    ap.add_argument("--reps", type=int, default=3, help="launches per case (medians)")
    ap.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "ddpkit-bench-tokens"))
    ap.add_argument("--out", default=str(ROOT / "out" / "bench"))
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    data, out = Path(args.data_dir), Path(args.out)
    data.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [s.strip() for s in args.sizes.split(",")]
    files = {s: sparse_file(data / f"sparse-{s}.bin", SIZES[s]) for s in sizes}
    cases = [
        (p, s) for s in sizes for p in ("old", "new") if p == "new" or SIZES[s] <= OLD_MAX_BYTES
    ]
    runs: dict[str, list[list[dict]]] = {f"{p} {s}": [] for p, s in cases}
    for rep in range(args.reps):  # interleaved: the shared machine's load drifts
        for p, s in cases if rep % 2 == 0 else cases[::-1]:
            runs[f"{p} {s}"].append(
                run_case(p, files[s], args.steps, args.batch, args.fetches, out)
            )
            print(f"rep {rep + 1}: {p} {s} done", flush=True)
    med = {k: summarize(v) for k, v in runs.items()}
    rows = [["path", "file", "data start-up s", "data RSS MiB", "max RSS MiB", "samples/s"]]
    rows[0].append("data-only samples/s")
    for key, m in med.items():
        p, s = key.split()
        rows.append(
            [p, s, f"{m['startup_s']:.3f}", mib(m["data_rss"]), mib(m["max_rss"])]
            + [f"{m['samples_per_s']:.0f}", f"{m['data_only_samples_per_s']:.0f}"]
        )
    print(table(rows))
    new = [med[f"new {s}"] for s in sizes]
    # Start-up is milliseconds on every size: a ratio of two timer readings that small is
    # noise, so the spread is given in ms; RSS is a ratio.
    flat = {
        "startup_spread_ms": 1000
        * (max(m["startup_s"] for m in new) - min(m["startup_s"] for m in new)),
        "max_rss_ratio": max(m["max_rss"] for m in new) / min(m["max_rss"] for m in new),
        "data_rss_ratio": max(m["data_rss"] for m in new) / min(m["data_rss"] for m in new),
    }
    ratios = {
        f"{s} {k}": med[f"new {s}"][k] / med[f"old {s}"][k]
        for s in sizes
        if f"old {s}" in med
        for k in ("samples_per_s", "data_only_samples_per_s")
    }
    print(
        f"new path, {sizes[0]} to {sizes[-1]}: start-up spread {flat['startup_spread_ms']:.1f} ms, "
        f"max RSS max/min {flat['max_rss_ratio']:.3f}, data RSS max/min "
        f"{flat['data_rss_ratio']:.3f} (goal: flat within 1.10)"
    )
    print("new/old: " + ", ".join(f"{k} {r:.3f}" for k, r in ratios.items()))
    print(f"medians of {args.reps} launches x 2 ranks; a shared 2-core machine: expect noise")
    write_json(
        out / "tokens.json",
        {
            "steps": args.steps,
            "batch_per_rank": args.batch,
            "ranks": 2,
            "reps": args.reps,
            "runs": runs,
            "medians": med,
            "flatness": flat,
            "samples_per_s_new_over_old": ratios,
        },
    )


if __name__ == "__main__":
    main()
