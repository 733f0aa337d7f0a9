"""Checkpoint seconds vs checkpoint bytes: the trainer's own write + push path at several model sizes.

    python bench/ckpt_bench.py --layers -1 0 8 22 44 --repeat 1 --dir /tmp/ckpt_bench [--jsonl rows.jsonl]

For each size: the frozen geometry (ounce100m-22l) with `n_layer` blocks (-1 = the tiny test model;
0 = embedding and final norm only; 22 = the frozen model, 1,274,331,680 B of fp32 weights + AdamW moments), fp32 weights and AdamW
state as the trainer holds them (one optimizer step on CPU fills exp_avg/exp_avg_sq), then, timed apart:
  write   trainer.ckpt.checkpointer.write_checkpoint_dir (safetensors + optimizer.pt + rng.pt + sha256 of each),
  push    Checkpointer.push to a file:// store (commit = copy + fsync, sha256 verify of the stored files,
          pointer write + read-back, prune),
the two steps the trainer's push thread runs after the snapshot. Everything is on the host: no GPU is
needed (the device machine's disk is the one the trainer's runs used). The fit at the end is least
squares seconds = a + b * GB over the sizes (median of --repeat each).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.ckpt.checkpointer import Checkpointer, write_checkpoint_dir  # noqa: E402
from trainer.model.model import GEOMETRIES, Llama  # noqa: E402
from trainer.store.url import open_store  # noqa: E402


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    ts = list(model.parameters()) + [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in ts)


def one_size(n_layer: int, base: str, workdir: Path, repeat: int) -> dict:
    # n_layer < 0: the tiny test geometry (~1.4 MB), for the fixed cost of a push
    cfg = GEOMETRIES["tiny"] if n_layer < 0 else dataclasses.replace(GEOMETRIES[base], n_layer=n_layer)
    torch.manual_seed(0)
    model = Llama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    nbytes = state_bytes(model, opt)
    writes, pushes, totals, file_bytes = [], [], [], 0
    for r in range(repeat):
        run = workdir / f"L{n_layer}_r{r}"
        shutil.rmtree(run, ignore_errors=True)
        out, store_dir = run / "out", run / "store"
        store_dir.mkdir(parents=True)
        store = open_store(f"file://{store_dir}/probe/ckpt")
        store.create()
        ckp = Checkpointer(store, log=lambda s: None, prune=True)
        t0 = time.monotonic()
        files = write_checkpoint_dir(
            out,
            model=model,
            cfg=cfg,
            trainer_state={"step": 1},
            optimizer_state={"optimizer": opt.state_dict()},
            rng_states=[{"torch": torch.get_rng_state()}],
        )
        t1 = time.monotonic()
        ckp.push(1, out, files, tokens=0, config_hash="0" * 64)
        t2 = time.monotonic()
        file_bytes = sum((out / n).stat().st_size for n in files)
        writes.append(t1 - t0)
        pushes.append(t2 - t1)
        totals.append(t2 - t0)
        shutil.rmtree(run, ignore_errors=True)
    return {
        "n_layer": n_layer,
        "state_bytes": nbytes,
        "file_bytes": file_bytes,
        "write_s": round(statistics.median(writes), 3),
        "push_s": round(statistics.median(pushes), 3),
        "total_s": round(statistics.median(totals), 3),
        "total_s_all": [round(t, 3) for t in totals],
    }


def fit(rows: list[dict], key: str) -> dict:
    xs = [r["file_bytes"] / 1e9 for r in rows]
    ys = [r[key] for r in rows]
    n, mx, my = len(xs), statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    res = [y - (a + b * x) for x, y in zip(xs, ys)]
    ss_tot = sum((y - my) ** 2 for y in ys) or 1e-12
    return {
        "what": key,
        "intercept_s": round(a, 3),
        "s_per_GB": round(b, 3),
        "GB_per_s": round(1 / b, 3) if b > 0 else None,
        "r2": round(1 - sum(e * e for e in res) / ss_tot, 4),
        "n": n,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="ounce100m-22l", choices=sorted(GEOMETRIES))
    p.add_argument("--layers", type=int, nargs="+", default=[0, 8, 22, 44])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--dir", type=Path, default=Path("/tmp/ckpt_bench"))
    p.add_argument("--jsonl", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(4)
    rows = []
    for n in args.layers:
        row = one_size(n, args.base, args.dir, args.repeat)
        rows.append(row)
        print("CKPT_ROW " + json.dumps(row), flush=True)
    fits = [fit(rows, k) for k in ("write_s", "push_s", "total_s")] if len(rows) >= 2 else []
    for f in fits:
        print("CKPT_FIT " + json.dumps(f), flush=True)
    if args.jsonl:
        with open(args.jsonl, "a") as fh:
            for r in rows:
                fh.write(json.dumps({"task": "ckpt", **r}) + "\n")
            for f in fits:
                fh.write(json.dumps({"task": "ckpt_fit", **f}) + "\n")
    print(f"{'layers':>6} {'file GB':>8} {'write s':>8} {'push s':>8} {'total s':>8}")
    for r in rows:
        print(
            f"{r['n_layer']:>6} {r['file_bytes'] / 1e9:>8.3f} {r['write_s']:>8.3f} {r['push_s']:>8.3f} {r['total_s']:>8.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
