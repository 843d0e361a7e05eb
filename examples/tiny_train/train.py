#!/usr/bin/env python3
"""tiny_train: a small deterministic trainer that behaves like a real long job under rgt.

Linear regression by mini-batch SGD in plain Python (no numpy needed). It follows the rgt job contract:
- resumes from $RGT_RESUME_FROM (a checkpoint file) when set and non-empty;
- checkpoints atomically (tmp, fsync, rename, fsync dir) every --ckpt-every steps into $RGT_CKPT_DIR;
- on SIGTERM or when $RGT_PREEMPT_FILE appears, checkpoints at the next step and exits 0 with reason=preempted;
- logs `step=N loss=X` lines; writes final weights and metrics into $RGT_OUT_DIR.
The same seed gives byte-identical final weights whether or not the run was interrupted, because the data
stream and the weights are a pure function of (seed, step) and the checkpoint stores the exact floats.
Test knobs: --nan-at K emits a NaN loss at step K and stops; --sleep S slows each step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import struct
import sys
import time

DIM = 8


def atomic_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pack(weights: list[float]) -> bytes:
    return struct.pack(f"<{len(weights)}d", *weights)


def batch(seed: int, step: int, size: int) -> list[tuple[list[float], float]]:
    """The data for one step depends only on (seed, step): resuming replays the same stream."""
    rng = random.Random(seed * 1_000_003 + step)
    truth = [((i % 3) - 1) * 0.5 + 0.1 * i for i in range(DIM)]
    out = []
    for _ in range(size):
        x = [rng.uniform(-1, 1) for _ in range(DIM)]
        y = sum(a * b for a, b in zip(truth, x, strict=True)) + rng.gauss(0, 0.01)
        out.append((x, y))
    return out


def sgd_step(w: list[float], data: list[tuple[list[float], float]], lr: float) -> tuple[list[float], float]:
    grad = [0.0] * DIM
    loss = 0.0
    for x, y in data:
        err = sum(a * b for a, b in zip(w, x, strict=True)) - y
        loss += err * err
        for i in range(DIM):
            grad[i] += 2 * err * x[i]
    n = len(data)
    return [wi - lr * gi / n for wi, gi in zip(w, grad, strict=True)], loss / n


def save_ckpt(ckpt_dir: str, step: int, w: list[float], seed: int) -> str:
    path = os.path.join(ckpt_dir, f"step_{step:08d}.ckpt")
    header = json.dumps({"step": step, "seed": seed, "dim": DIM}).encode()
    atomic_write(path, struct.pack("<I", len(header)) + header + pack(w))
    return path


def load_ckpt(path: str) -> tuple[int, list[float], int]:
    with open(path, "rb") as fh:
        raw = fh.read()
    (hlen,) = struct.unpack("<I", raw[:4])
    meta = json.loads(raw[4:4 + hlen])
    weights = list(struct.unpack(f"<{meta['dim']}d", raw[4 + hlen:]))
    return meta["step"], weights, meta["seed"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (tests)")
    p.add_argument("--nan-at", type=int, default=-1, help="emit a NaN loss at this step (tests)")
    args = p.parse_args(argv)

    ckpt_dir = os.environ.get("RGT_CKPT_DIR", "ckpt")
    out_dir = os.environ.get("RGT_OUT_DIR", "out")
    preempt_file = os.environ.get("RGT_PREEMPT_FILE", "")
    os.makedirs(ckpt_dir, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)

    stop = {"flag": False}

    def on_term(signum, _frame):  # only set a flag: checkpoint at a safe step boundary
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_term)

    step, w = 0, [0.0] * DIM
    resume = os.environ.get("RGT_RESUME_FROM", "")
    if resume:
        step, w, seed = load_ckpt(resume)
        if seed != args.seed:
            print(f"refusing to resume: checkpoint seed {seed} != --seed {args.seed}", file=sys.stderr)
            return 2
        print(f"resumed from {resume} at step={step}", flush=True)

    # resumed from the last step's checkpoint (stopped after its last checkpoint, before it exited): nothing is left
    # to train, and the loss is the weights' own on the last batch, never an unset NaN
    loss = sgd_step(w, batch(args.seed, max(0, step - 1), args.batch), args.lr)[1]
    while step < args.steps:
        w, loss = sgd_step(w, batch(args.seed, step, args.batch), args.lr)
        step += 1
        if step == args.nan_at:
            loss = float("nan")
        print(f"step={step} loss={loss:.6f}", flush=True)
        if not math.isfinite(loss):
            print("non-finite loss: stopping without a checkpoint", file=sys.stderr, flush=True)
            return 3
        if step % args.ckpt_every == 0:
            save_ckpt(ckpt_dir, step, w, args.seed)
        if stop["flag"] or (preempt_file and os.path.exists(preempt_file)):
            path = save_ckpt(ckpt_dir, step, w, args.seed)
            print(f"preempted: checkpoint {path} at step={step}", flush=True)
            return 0
        if args.sleep:
            time.sleep(args.sleep)

    atomic_write(os.path.join(out_dir, "weights.bin"), pack(w))
    atomic_write(os.path.join(out_dir, "metrics.json"),
                 (json.dumps({"final_loss": loss, "steps": step, "seed": args.seed}, sort_keys=True) + "\n").encode())
    print(f"done step={step} loss={loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
