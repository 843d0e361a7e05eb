"""`rgt-run report`: one self-contained HTML page per run, with plots, cost and lost compute (docs/report.md).

The data is what the box already records, fetched in the status round trip (the `history` key of the status
document: loss over steps per attempt from job.log, the wrapper's GPU samples, attempts.jsonl), plus what the
controller knows: the pull's PULL_VERIFIED marker and the teardown record. The page (`runs/<run_id>/report.html`)
embeds its PNGs as data: URIs, so it opens anywhere with no network; the PNGs are written beside it too, and the
data behind it as `runs/<run_id>/<host>.report.json` (a later report of a box that is gone reads it back).

`run_facts` (pure) turns one status document into the figures; `glance` turns several into the one line `watch`
ends with and every notification carries. A sweep (rgt.sweeps) gets one page for all its cells instead,
`runs/<sweep>/report.html`: `sweep_facts` (pure) gives a row per cell of the roster from the cells' documents (the
status round reports a sweep host's cells as its run and `other_runs`), `sweep_loss_figure` draws every cell's loss.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import functools
import hashlib
import io
import json
import struct
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import errors, memory, output, paths, rosters, sweeps
from rgt.engines import poll
from rgt.ledger import atomic_write_bytes, atomic_write_json, ledger_dir, read_json, runs_dir
from rgt.prepare import prepare_hosts
from rgt.safetext import printable

HELP = "write a report per run: loss over steps, GPU use, attempts, cost, compute lost to preemptions (HTML + PNG)"
DESCRIPTION = """\
Look at each box once (read-only, like `rgt-run status`) and write one self-contained HTML page per run into
runs/<run_id>/report.html, with its plots also as PNG files beside it: the loss and the job's metrics over steps
on one step axis, across attempts, with each relaunch marked and the recomputed steps shaded; the attempts and the
GPUs' utilisation and memory on one wall-clock axis, with the time between attempts and the GPUs' idle stretches
shaded; and the figures: wall time, GPU-hours, steps/s, compute lost to preemptions, the cost (price per hour x
wall time, plus the time the box billed after the job ended; every duration on one clock, whatever the box's clock
says) and the pull's verification. A sweep gets one page, runs/<sweep>/report.html: a row per cell of its roster
(host, params, state, attempts, final loss, wall time, cost, pull verified) and the loss of every cell in one plot.
A box that is gone is reported from the data saved by the last report or status.
`rgt-run pull` writes the report on its own after a verified pull.
Exit codes: 0 every report written, 1 a run got no report (the box gave no status, no data), 2 --run names no run of the
inventory, 4 every run without a report is on a box that did not answer, with nothing saved about the run."""

_states = paths.module_util("rgt_states")  # end reasons (billed after the end, lost compute), colours, groups


def _hist():
    return paths.module_util("rgt_history")


def _epoch(value) -> float | None:
    return paths.module_util("rgt_reconcile").to_epoch(value)


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# ---------------------------------------------------------------- figures (pure)

def clock_offset(doc: dict) -> float:
    """This machine's clock minus the box's, when the box wrote the document: its `seen_at` (stamped here when
    the document arrived) minus its `collected_at` (the box's clock). 0 when either is missing. Every duration
    is one clock's end minus the same clock's start: box records against box records, this machine's times
    against this machine's (a box clock a day behind must not bill a day)."""
    seen, collected = _num(doc.get("seen_at")), _num(doc.get("collected_at"))
    return seen - collected if seen is not None and collected is not None else 0.0


def attempt_rows(doc: dict, now: float) -> list[dict]:
    """One row per attempt: start, end (None while it runs), reason, rc, resume point, steps, wall, rate. `now`
    is this machine's time; a running attempt counts up to it on the box's clock (clock_offset)."""
    history = doc.get("history") or {}
    slots: dict[int, dict] = {}
    for record in history.get("attempts") or []:
        number = record.get("attempt")
        if not isinstance(number, int):
            continue
        slot = slots.setdefault(number, {"start": None, "end": None})
        slot["start" if "started_at" in record else "end"] = record
    logged = {a.get("attempt"): a for a in (history.get("loss") or {}).get("attempts") or []}
    live = doc.get("state") in _states.ACTIVE
    box_now = now - clock_offset(doc)
    rows = []
    for number in sorted(slots):
        start_rec, end_rec = slots[number]["start"] or {}, slots[number]["end"] or {}
        started, ended = _epoch(start_rec.get("started_at")), _epoch(end_rec.get("ended_at"))
        running = not end_rec and live and number == doc.get("attempt")
        reason = end_rec.get("reason") or ("running" if running else "unknown")
        until = box_now if running else ended
        wall = max(0.0, until - started) if started is not None and until is not None else None
        resume_from = start_rec.get("resume_from") or ""
        resumed = _hist().resume_step(resume_from) if resume_from else (0 if start_rec else None)
        log = logged.get(number) or {}
        last = log.get("last_step")
        done = last - (resumed or 0) if isinstance(last, int) else None
        rows.append({"attempt": number, "started_at": started, "ended_at": ended, "running": running,
                     "reason": reason, "rc": end_rec.get("rc"), "signal": end_rec.get("signal"),
                     "resume_from": resume_from or None, "resumed_from_step": resumed,
                     "first_step": log.get("first_step"), "last_step": last, "wall_s": wall,
                     "steps_per_s": done / wall if done and done > 0 and wall else None,
                     "recomputed_steps": None, "lost_s": None})
    for row, following in zip(rows, rows[1:], strict=False):
        if row["reason"] not in _states.LOST_REASONS or row["last_step"] is None:
            continue
        resumed = following["resumed_from_step"]
        if resumed is None:
            continue
        row["recomputed_steps"] = max(0, row["last_step"] - resumed)
        rate = row["steps_per_s"]
        row["lost_s"] = row["recomputed_steps"] / rate if rate else (0.0 if not row["recomputed_steps"] else None)
    return rows


def run_facts(doc: dict, *, now: float | None = None, teardown_at: float | None = None,
              verified: dict | None = None, gpu_count: int | None = None) -> dict:
    """The figures of one run from its status document (with `history`) and the controller's records. Times from
    this machine (`now`, `teardown_at`) are moved onto the box's clock before they meet the box's records."""
    now = time.time() if now is None else now
    offset = clock_offset(doc)
    rows = attempt_rows(doc, now)
    price = _num(doc.get("price_per_hour"))
    walls = [r["wall_s"] for r in rows if r["wall_s"] is not None]
    wall = sum(walls) if walls else _num(doc.get("elapsed_s"))
    for row in rows:
        row["cost"] = round(price * row["wall_s"] / 3600.0, 4) if price is not None and row["wall_s"] else None
    last = rows[-1] if rows else None
    idle_s = None
    billed_until = None
    if last and not last["running"] and last["reason"] in _states.BILLED_AFTER_END and last["ended_at"] is not None:
        billed_until = teardown_at if teardown_at is not None else now
        idle_s = max(0.0, billed_until - offset - last["ended_at"])
    series = ((doc.get("history") or {}).get("gpu") or {}).get("series") or {}
    gpus = len(series) or gpu_count
    attempts_cost = round(price * wall / 3600.0, 4) if price is not None and wall is not None else None
    idle_cost = round(price * idle_s / 3600.0, 4) if price is not None and idle_s is not None else None
    lost = [r["lost_s"] for r in rows if r["lost_s"] is not None]
    recomputed = [r["recomputed_steps"] for r in rows if r["recomputed_steps"] is not None]
    final_step = max([r["last_step"] for r in rows if r["last_step"] is not None], default=doc.get("step"))
    facts = {
        "host": doc.get("host"), "run_id": doc.get("run_id"), "state": doc.get("state"),
        "attempts": rows, "attempt_count": len(rows),
        "preemptions": sum(1 for r in rows if r["reason"] == "preempted"),
        "final_step": final_step, "final_loss": doc.get("loss"),
        "wall_s": wall, "gpus": gpus, "gpu_hours": round(gpus * wall / 3600.0, 4) if gpus and wall else None,
        "steps_per_s": final_step / wall if isinstance(final_step, int) and wall else None,
        "lost_s": sum(lost) if lost else (0.0 if rows else None), "recomputed_steps": sum(recomputed),
        "price_per_hour": price, "attempts_cost": attempts_cost, "idle_after_end_s": idle_s,
        "idle_cost": idle_cost, "billed_until": billed_until, "torn_down": teardown_at is not None,
        "cost": round((attempts_cost or 0) + (idle_cost or 0), 4) if attempts_cost is not None else None,
        "verified": verified, "log_error": (doc.get("history") or {}).get("log_error"),
        "gpu_idle": ((doc.get("history") or {}).get("gpu") or {}).get("idle") or [],
        "clock_offset_s": round(offset, 1),
    }
    return facts


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def glance(docs: dict[str, dict], facts: dict[str, dict] | None = None, label: str = "") -> str:
    """One line a person reads at a glance: "2/2 finished, 1 preemption, 31 min of compute lost; $4.12 so far"."""
    facts = facts if facts is not None else {h: run_facts(d) for h, d in docs.items()
                                             if d.get("state") != "unreachable"}
    counts: dict[str, list[str]] = {}
    for host, doc in sorted(docs.items()):
        counts.setdefault(str(doc.get("state") or "?"), []).append(host)
    total = len(docs)
    parts = [f"{len(counts.get('finished', []))}/{total} finished"]
    for state in _states.GLANCE:
        hosts = counts.get(state)
        if not hosts:
            continue
        text = f"{len(hosts)} {state.replace('_', ' ')}"
        if state in _states.EXPLAINED:
            text += " (" + "; ".join(why_failed(h, docs[h]) for h in hosts) + ")"
        parts.append(text)
    line = ", ".join(parts) + "; " + losses_and_cost(facts.values())
    return f"{label}: {line}" if label else line


def losses_and_cost(facts) -> str:
    """The second half of the one-glance line: "1 preemption, 31 min of compute lost; $4.12 so far"."""
    facts = list(facts)
    preempted = sum(f.get("preemptions") or 0 for f in facts)
    lost = sum(f.get("lost_s") or 0 for f in facts)
    minutes = f"{lost / 60:.0f}" if lost >= 600 or lost == 0 else f"{lost / 60:.1f}"
    line = f"{preempted} preemption{'s' if preempted != 1 else ''}, {minutes} min of compute lost"
    costs = [f["cost"] for f in facts if f.get("cost") is not None]
    if costs:
        line += f"; ${sum(costs):.2f} so far"
    return line


def failure_bits(doc: dict) -> list[str]:
    """Why a run failed or died, from its document: its exit code (else the error), the last error line of its
    log (box text, made printable: rgt.safetext)."""
    exit_doc = (doc.get("evidence") or {}).get("exit") or {}
    bits = []
    if exit_doc.get("rc") is not None:
        bits.append(f"exit {printable(exit_doc['rc'])}")
    elif doc.get("error"):
        bits.append(printable(str(doc["error"])[:80]))
    log_error = (doc.get("history") or {}).get("log_error") or {}
    if log_error.get("traceback"):
        bits.append(f"Traceback in log: {printable(log_error.get('line'))}")
    elif log_error.get("line"):
        bits.append(f"log: {printable(log_error['line'])}")
    return bits


def why_failed(host: str, doc: dict) -> str:
    return f"{host}: {', '.join(failure_bits(doc)) or printable(doc.get('state'))}"


# ---------------------------------------------------------------- plots (matplotlib, Agg)

def _pyplot():
    # matplotlib: 0.37 s with pyplot (more than a whole `rgt-run status` start); only a report's plots need it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig, key: str | None = None) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight",
                metadata={"Software": None, **({FIGURE_KEY: key} if key else {})})
    _pyplot().close(fig)
    return buf.getvalue()


# A figure's PNG carries the content hash of what it was drawn from (a tEXt chunk): a report whose data did not
# change since the last one (a re-pull, a second `rgt-run report` of a settled run) keeps the PNG on disk as it is,
# and draws nothing (matplotlib's import and the drawing are most of a report's time). The hash covers this
# module's source too: a change to how a figure is drawn redraws it.
FIGURE_KEY = "rgt-figure"


@functools.cache
def _code_hash() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def figure_key(inputs) -> str | None:
    """The content hash of a figure's inputs (JSON data) and of the code that draws it; None when they are not
    JSON data (the figure is then always drawn)."""
    try:
        text = json.dumps(inputs, sort_keys=True, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(f"{_code_hash()}\n{text}".encode()).hexdigest()


def png_key(data: bytes | None) -> str | None:
    """The figure key a PNG written by _png carries, else None (no PNG, no key, a damaged file)."""
    if not data or not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"tEXt":
            word, _, text = data[at + 8:at + 8 + length].partition(b"\0")
            if word == FIGURE_KEY.encode():
                return text.decode("latin-1")
        at += 12 + length
    return None


def figure_png(draw, inputs, previous: bytes | None) -> bytes | None:
    """The PNG of a figure: `previous` (the PNG on disk) when it was drawn from the same inputs, else `draw()`'s
    figure drawn now (None when draw gives no figure)."""
    key = figure_key(inputs)
    if key is not None and png_key(previous) == key:
        return previous
    fig = draw()
    return _png(fig, key) if fig is not None else None


def _read_png(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


ATTEMPT_COLORS = ("#1565c0", "#6a1b9a", "#00838f", "#ef6c00", "#558b2f", "#ad1457", "#4e342e", "#283593")
GAP_COLOR = "#9e9e9e"  # the time between attempts: no job ran
IDLE_COLOR = "#ffcc80"  # a GPU at or below the idle threshold
RECOMPUTED_COLOR = "#f9a825"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) != float("inf")


def _attempt_key(attempt) -> int:
    return -1 if attempt is None else attempt


def _attempt_label(attempt) -> str:
    return f"attempt {attempt}" if attempt is not None else "before the log tail"


def _figure_legend(fig, axes) -> None:
    """One legend for the whole figure, below it: one entry per label (an attempt's colour is the same in every
    plot of the figure, so its entry stands for all of them)."""
    handles: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=min(3, len(handles)), fontsize=7, frameon=False)


def steps_figure(doc: dict, facts: dict):
    """Loss and each metric of the history (`history.metrics`) over steps: one plot each, one shared step axis.
    One line per attempt, in the attempt's colour in every plot (an attempt's curve ends where it ended: no
    line joins two attempts); each relaunch a dashed line at the step it resumed from, coloured by why the
    previous attempt ended; the steps computed twice shaded; non-finite values as red crosses. Returns the
    matplotlib figure, or None when the log showed no loss and no metric."""
    history = doc.get("history") or {}
    panels = [("loss", (history.get("loss") or {}).get("points") or [])]
    panels += [(name, rows) for name, rows in (history.get("metrics") or {}).items() if rows]
    if not any(rows for _name, rows in panels):
        return None
    if not panels[0][1]:
        panels = panels[1:]
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 1.2 + 2.3 * len(panels)), sharex=True, squeeze=False)
    axes = list(axes[:, 0])
    attempts = sorted({p[0] for _name, rows in panels for p in rows}, key=_attempt_key)
    colour = {a: ATTEMPT_COLORS[i % len(ATTEMPT_COLORS)] for i, a in enumerate(attempts)}
    for ax, (name, rows) in zip(axes, panels, strict=True):
        finite = [v for _a, _s, v in rows if _finite(v)]
        top = max(finite) if finite else 1.0
        for attempt in attempts:
            mine = [(s, v) for a, s, v in rows if a == attempt]
            xs = [s for s, v in mine if _finite(v)]
            if xs:
                ax.plot(xs, [v for _s, v in mine if _finite(v)], lw=1.3, color=colour[attempt],
                        label=_attempt_label(attempt))
            bad = [s for s, v in mine if not _finite(v)]
            if bad:
                ax.plot(bad, [top] * len(bad), "x", color="red", label="non-finite value")
        nonfinite = doc.get("nonfinite_loss") or {}
        if name == "loss" and isinstance(nonfinite.get("step"), int):  # the status scan's, in the current attempt
            ax.plot([nonfinite["step"]], [top], "x", color="red", ms=9, label="non-finite value")
        if finite and min(finite) > 0 and max(finite) / min(finite) > 50:
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    for row, following in zip(facts["attempts"], facts["attempts"][1:], strict=False):
        resumed = following["resumed_from_step"]
        if resumed is None:
            continue
        for ax in axes:
            ax.axvline(resumed, color=_states.REPORT_COLORS.get(row["reason"], "#555"), ls="--", lw=1,
                       label=f"{row['reason']}, then resumed from this step")
            if row["recomputed_steps"]:
                ax.axvspan(resumed, row["last_step"], color=RECOMPUTED_COLOR, alpha=0.2,
                           label="steps computed twice (lost to the relaunch)")
    axes[-1].set_xlabel("step (every plot of this figure)")
    axes[0].set_title(f"{doc.get('run_id')} on {doc.get('host')}: loss and metrics over steps")
    _figure_legend(fig, axes)
    return fig


def _breaks(times: list[float], starts: list[float], max_gap: float | None) -> list[int]:
    """Indexes i where a line must stop between sample i-1 and sample i: they belong to two attempts (an attempt
    start lies between them) or lie further apart than max_gap (the wrapper did not sample: no box)."""
    return [i for i in range(1, len(times))
            if bisect.bisect_right(starts, times[i - 1]) != bisect.bisect_right(starts, times[i])
            or (max_gap is not None and times[i] - times[i - 1] > max_gap)]


def _with_nan_breaks(xs: list[float], ys: list, breaks: list[int]) -> tuple[list, list]:
    """xs, ys with a NaN point inserted before each break (matplotlib draws no line across a NaN)."""
    out_x, out_y, cut = [], [], set(breaks)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i in cut:
            out_x.append((xs[i - 1] + x) / 2.0)
            out_y.append(float("nan"))
        out_x.append(x)
        out_y.append(float("nan") if y is None else y)
    return out_x, out_y


def idle_spans(doc: dict, facts: dict) -> dict[str, list[tuple[float, float]]]:
    """The stretches the time figure shades, in the box's epoch seconds: `between` (from one attempt's end to the
    next one's start: no job ran) and `gpu` (a GPU at or below the idle threshold for two or more samples in a row,
    widened by half a sample interval on each side, so a stretch of k samples covers k intervals)."""
    rows = [r for r in facts["attempts"] if r["started_at"] is not None]
    between = [(r["ended_at"], nxt["started_at"]) for r, nxt in zip(rows, rows[1:], strict=False)
               if r["ended_at"] is not None and nxt["started_at"] > r["ended_at"]]
    gpu = (doc.get("history") or {}).get("gpu") or {}
    half = (_num(gpu.get("interval_s")) or 0.0) / 2.0
    stretches = [(s["start"] - half, s["end"] + half) for s in gpu.get("idle") or []
                 if _num(s.get("start")) is not None and _num(s.get("end")) is not None]
    return {"between": between, "gpu": stretches}


def time_figure(doc: dict, facts: dict):
    """The attempts and the GPUs over wall-clock time (the box's clock), on one shared time axis: a bar per
    attempt coloured by how it ended, a hatched bar for the time the box billed after the job ended; GPU
    utilisation and memory per GPU, each line broken (NaN) between attempts and where the wrapper took no
    samples; the time between attempts and the GPUs' idle stretches shaded. The log has no per-line times, so
    steps are not on this axis (the steps figure has them). Returns the figure, or None without attempts or
    GPU samples."""
    rows = [r for r in facts["attempts"] if r["started_at"] is not None]
    gpu = (doc.get("history") or {}).get("gpu") or {}
    series = {k: v for k, v in (gpu.get("series") or {}).items() if v}
    if not rows and not series:
        return None
    t0 = rows[0]["started_at"] if rows else min(r[0] for v in series.values() for r in v)

    def minutes(t: float) -> float:
        return (t - t0) / 60.0

    plt = _pyplot()
    count = 1 + (2 if series else 0)
    ratios = [0.8 + 0.35 * (len(rows) + 1)] + [2.0] * (count - 1)
    fig, axes = plt.subplots(count, 1, figsize=(8, 1.2 + sum(ratios) * 0.9), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": ratios})
    axes = list(axes[:, 0])
    bars = axes[0]
    for y, row in enumerate(rows):
        width = (row["wall_s"] or 0) / 60.0
        bars.broken_barh([(minutes(row["started_at"]), max(width, 0.01))], (y - 0.35, 0.7),
                         color=_states.REPORT_COLORS.get(row["reason"], _states.REPORT_COLORS["unknown"]),
                         label=row["reason"])
        step = f" at step {row['last_step']}" if row["last_step"] is not None else ""
        bars.text(minutes(row["started_at"]) + width, y, f"  {row['reason']}{step}", va="center", fontsize=7)
    labels = [f"attempt {r['attempt']}" for r in rows]
    if facts.get("idle_after_end_s") and rows and rows[-1]["ended_at"] is not None:
        start, width = minutes(rows[-1]["ended_at"]), facts["idle_after_end_s"] / 60.0
        bars.broken_barh([(start, width)], (len(rows) - 0.35, 0.7), facecolor="none", edgecolor="#616161",
                         hatch="///", label="box billed after the job ended"
                         + (" (until teardown)" if facts["torn_down"] else " (until this report)"))
        labels.append("after the end")
    labels = labels or ["no attempt recorded"]  # GPU samples without attempts.jsonl: the GPU plots still line up
    bars.set_yticks(range(len(labels)), labels)
    bars.set_ylim(len(labels) - 0.5, -0.5)
    spans = idle_spans(doc, facts)
    for ax in axes:
        for begin, end in spans["between"]:
            ax.axvspan(minutes(begin), minutes(end), color=GAP_COLOR, alpha=0.25,
                       label="between attempts (no job ran)")
    if series:
        util_ax, mem_ax = axes[1], axes[2]
        starts = sorted(r["started_at"] for r in rows)
        totals: set = set()
        for n, (index, samples) in enumerate(sorted(series.items(), key=lambda kv: int(kv[0]))):
            samples = sorted(samples)
            times = [r[0] for r in samples]
            gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False) if b > a)
            step = max(_num(gpu.get("interval_s")) or 0.0, gaps[len(gaps) // 2] if gaps else 0.0)
            cut = _breaks(times, starts, 3 * step if step else None)
            xs = [minutes(t) for t in times]
            line_colour = f"C{n % 10}"
            for ax, column in ((util_ax, 1), (mem_ax, 2)):
                bx, by = _with_nan_breaks(xs, [r[column] for r in samples], cut)
                ax.plot(bx, by, lw=1.1, color=line_colour, label=f"GPU {index}")
            totals.update(r[3] for r in samples if _num(r[3]))
        for total in sorted(totals):
            mem_ax.axhline(total, color="#616161", lw=0.8, ls=":", label="GPU memory total")
        for begin, end in spans["gpu"]:
            for ax in (util_ax, mem_ax):
                ax.axvspan(minutes(begin), minutes(end), color=IDLE_COLOR, alpha=0.45,
                           label="a GPU idle (at or below 5 % for 2+ samples)")
        util_ax.set_ylabel("GPU util %")
        util_ax.set_ylim(-2, 102)
        mem_ax.set_ylabel("GPU memory MiB")
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    since = f"attempt {rows[0]['attempt']} started" if rows else "the first GPU sample"
    axes[-1].set_xlabel(f"minutes since {since} ({_when(t0)} on the box's clock; every plot of this figure)")
    axes[0].set_title(f"{doc.get('run_id')} on {doc.get('host')}: attempts and GPUs over time")
    _figure_legend(fig, axes)
    return fig


def _plot(figure, uses=None):
    """A figure of one run as PNG bytes; `uses` picks what of the facts the figure reads (its content hash covers
    that and the document; default: all the facts)."""
    def draw(doc: dict, facts: dict, previous: bytes | None = None) -> bytes | None:
        used = uses(facts) if uses else facts
        return figure_png(lambda: figure(doc, facts), [figure.__name__, doc, used], previous)

    return draw


def plot_notes(doc: dict) -> list[str]:
    """What the page says under the plots about data they lack: no GPU samples, a declared metric with no value."""
    history = doc.get("history") or {}
    notes = []
    if not ((history.get("loss") or {}).get("points")) and any((history.get("metrics") or {}).values()):
        notes.append("no loss lines in the log (rgt_job.log_patterns sets the patterns): the steps figure shows the "
                     "metrics only")
    if not ((history.get("gpu") or {}).get("series")):
        notes.append("no GPU samples: the wrapper found no nvidia-smi on the box")
    empty = [name for name, rows in (history.get("metrics") or {}).items() if not rows]
    if empty:
        notes.append(f"no value in the log for the metric(s) {', '.join(empty)} (rgt_job.metrics sets the patterns)")
    return notes


# key, the figure, its heading in the page, and what the page says when there is no figure
PLOTS = (("steps", _plot(steps_figure, uses=lambda facts: facts["attempts"]), "Loss and metrics over steps",
          "no loss lines in the log (rgt_job.log_patterns sets the patterns)"),
         ("time", _plot(time_figure), "Attempts and GPUs over time", "no attempts recorded yet"))


# ---------------------------------------------------------------- HTML

# The page's HTML is in runner/rgt/templates/ (page.html.j2 the frame, report.html.j2 and sweep.html.j2 the pages,
# parts.html.j2 a macro per part of a run's page). This file decides and formats every value shown ("-" for none);
# the templates only lay them out, autoescaped.
@functools.cache
def _env():
    """The templates' Jinja2 environment, made once. jinja2 is imported here, not at the top: its import costs about
    30 ms of CPU (time.process_time around it, after this module), and `rgt-run status` imports this module (through
    rgt.notify) without making a page."""
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("rgt", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def _part(name: str, *args) -> str:
    """One macro of parts.html.j2, rendered (Markup: inserted as it is into the page, never escaped twice)."""
    return getattr(_env().get_template("parts.html.j2").module, name)(*args)


def _d(value) -> str:
    """A value as the page shows it: "-" for none."""
    return "-" if value is None else str(value)


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M:%S")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _row(key: str, label: str, value, note: str = "") -> dict:
    return {"key": key, "label": label, "value": _d(value), "note": note}


CLOCK_NOTE_S = 60  # the figures table names a box clock this far from this machine's


def figures_table(f: dict) -> str:
    price = f["price_per_hour"]
    idle_note = ""
    if f["idle_after_end_s"] is not None:
        idle_note = (f"{_minutes(f['idle_after_end_s'])} after the job ended, until "
                     + ("teardown" if f["torn_down"] else "this report (no teardown recorded)"))
    rows = [
        _row("state", "state", f["state"]),
        _row("attempts", "attempts", f["attempt_count"]),
        _row("preemptions", "preemptions", f["preemptions"]),
        _row("final_step", "final step", f["final_step"]),
        _row("final_loss", "final loss", f["final_loss"]),
        _row("wall_min", "wall time (all attempts)", _fmt(f["wall_s"] and f["wall_s"] / 60, ".2f"), "minutes"),
        _row("gpus", "GPUs sampled", f["gpus"] if f["gpus"] else "none"),
        _row("gpu_hours", "GPU-hours", _fmt(f["gpu_hours"], ".3f")),
        _row("steps_per_s", "steps/s (final step / wall time)", _fmt(f["steps_per_s"], ".3f")),
        _row("lost_min", "compute lost to preemptions", _fmt(f["lost_s"] and f["lost_s"] / 60, ".2f"),
             f"minutes; {f['recomputed_steps']} step(s) recomputed"),
        _row("price_per_hour", "price per hour", _fmt(price, ".2f"), "" if price is not None else
             "no rgt_job.price_per_hour: no cost"),
        _row("attempts_cost", "cost of the attempts", _fmt(f["attempts_cost"], ".4f"), "price x wall time"),
        _row("idle_cost", "cost after the job ended", _fmt(f["idle_cost"], ".4f"), idle_note),
        _row("cost", "cost", _fmt(f["cost"], ".4f"), "so far" if not f["torn_down"] else "until teardown"),
    ]
    if f.get("moved"):
        rows.insert(1, _row("moved", "moved", f["moved"]))
    offset = f.get("clock_offset_s") or 0.0
    if abs(offset) >= CLOCK_NOTE_S:
        rows.append(_row("clock_offset_h", "box clock", f"{-offset / 3600:+.2f} h",
                         f"{'behind' if offset > 0 else 'ahead of'} this machine's: every duration above is measured "
                         "on one clock (the box's records against each other, this machine's against its own)"))
    return _part("figures_table", rows)


def attempts_table(f: dict) -> str:
    rows = []
    for r in f["attempts"]:
        exit_text = "-" if r["rc"] is None and r["signal"] is None else f"rc {r['rc']}" + (
            f" signal {r['signal']}" if r["signal"] else "")
        rows.append({"attempt": r["attempt"], "start": _short(r["started_at"]),
                     "end": "running" if r["running"] else _short(r["ended_at"]), "reason": _d(r["reason"]),
                     "exit": exit_text, "resumed_from_step": _d(r["resumed_from_step"]),
                     "last_step": _d(r["last_step"]), "wall_min": _fmt(r["wall_s"] and r["wall_s"] / 60, ".2f"),
                     "steps_per_s": _fmt(r["steps_per_s"], ".3f"), "recomputed_steps": _d(r["recomputed_steps"]),
                     "lost_min": _fmt(r["lost_s"] and r["lost_s"] / 60, ".2f"), "cost": _fmt(r["cost"], ".4f")})
    return _part("attempts_table", rows)


def verification_html(f: dict) -> str:
    v = f["verified"]
    if not v:
        return _part("verification", None)
    loaded = [c for c in v.get("checkpoints") or []]
    bad = [c.get("path") for c in loaded if not c.get("ok")]
    return _part("verification", {"files": _d(v.get("files")), "bytes": _d(v.get("bytes")),
                                  "manifest": str(v.get("manifest_sha256") or "")[:16], "at": _d(v.get("verified_at")),
                                  "loaded": len(loaded), "bad": ", ".join(bad)})


def logs_html(out: Path, host: str) -> str:
    """Links to the pulled logs beside the page (<host>/logs/job.log and attempts.jsonl, as the seal puts them into
    the export), with the seal's word on a capped one (the local manifest's `logs` record); "" when none is here."""
    links = [name for name in ("job.log", "attempts.jsonl") if (out / host / "logs" / name).is_file()]
    if not links:
        return _part("logs", [])
    manifest = read_json(out / f"{host}.manifest.json")
    logs = manifest.get("logs") if isinstance(manifest, dict) else None
    records = (logs.get("files") or []) if isinstance(logs, dict) else []
    said = {r.get("path"): r.get("reason") for r in records if isinstance(r, dict) and r.get("reason")}
    return _part("logs", [{"path": f"{_d(host)}/logs/{name}", "said": said.get(f"logs/{name}")} for name in links])


def host_section(doc: dict, facts: dict, images: dict[str, bytes], names: dict[str, str], logs: str = "") -> str:
    plots = [{"key": key, "title": title, "missing": missing, "name": names.get(key),
              "data": base64.b64encode(images[key]).decode() if key in images else None}
             for key, _draw, title, missing in PLOTS]
    truncated = ((doc.get("history") or {}).get("loss") or {}).get("truncated")
    return _part("host_section", {
        "host": _d(doc.get("host")), "source": doc.get("_source"), "figures": figures_table(facts),
        "log_error": (facts.get("log_error") or {}).get("line"), "attempts": attempts_table(facts), "plots": plots,
        "notes": plot_notes(doc), "truncated": bool(truncated), "verification": verification_html(facts),
        "logs": logs})


def page(run_id: str, sections: list[str], line: str, generated: float) -> str:
    return _env().get_template("report.html.j2").render(title=run_id, glance=line, written=_when(generated),
                                                          sections=sections)


# ---------------------------------------------------------------- a sweep: one page for all its cells

def cell_label(params: dict) -> str:
    """A cell named by its params, as the legend and the table show it: "lr=0.1, seed=2"."""
    return ", ".join(f"{k}={v}" for k, v in (params or {}).items())


def cell_curve(doc: dict | None) -> tuple[list, list]:
    """One loss curve of a cell across its attempts: each attempt up to the step the next one started from (the
    newest attempt's value for a step computed twice); non-finite losses left out."""
    points = ((doc or {}).get("history") or {}).get("loss") or {}
    by_attempt: dict = {}
    for attempt, step, loss in points.get("points") or []:
        by_attempt.setdefault(-1 if attempt is None else attempt, []).append((step, loss))
    kept, cut = [], float("inf")
    for attempt in sorted(by_attempt, reverse=True):
        steps = [s for s, _v in by_attempt[attempt] if _num(s) is not None]
        kept.extend((s, float(v)) for s, v in by_attempt[attempt] if _num(s) is not None and s < cut
                    and _num(v) is not None)
        cut = min([cut, *steps])
    kept.sort()
    return [s for s, _v in kept], [v for _s, v in kept]


def sweep_facts(roster: dict, docs: list[dict], *, now: float | None = None,
                teardown_at: dict[str, float | None] | None = None, verified: dict[str, dict | None] | None = None,
                down: set[str] | frozenset = frozenset()) -> dict:
    """The sweep page's data (pure): one row per cell of the roster, in roster order, from the status documents of
    its cells (each with host, run_id, state, history; a cell's figures come from the document its roster host
    sent, run_facts as for a single run), the pull's marker per cell, and the one-glance line (the sweep's tally,
    rgt.sweeps, then compute lost and cost). A cell with no document is `missing` (`unreachable` when its host, in
    `down`, did not answer)."""
    now = time.time() if now is None else now
    teardown_at, verified = teardown_at or {}, verified or {}
    mine = {(d.get("host"), d.get("run_id")): d for d in docs}
    runs = list(docs) + [{"host": c["host"], "run_id": c["id"], "state": "unreachable"}
                         for c in roster.get("cells") or [] if c["host"] in down and (c["host"], c["id"]) not in mine]
    tally = sweeps.tally(roster, runs)
    states = {c["id"]: c["state"] for c in tally["cells"]}
    rows, all_facts = [], []
    for cell in roster.get("cells") or []:
        doc = mine.get((cell["host"], cell["id"]))
        facts = run_facts(doc, now=now, teardown_at=teardown_at.get(cell["host"]),
                          verified=verified.get(cell["id"])) if doc else None
        if facts:
            all_facts.append(facts)
        rows.append({"cell": cell["id"], "host": cell["host"], "params": dict(cell.get("params") or {}),
                     "label": cell_label(cell.get("params")) or cell["id"], "state": states.get(cell["id"]),
                     "run_state": (doc or {}).get("state"), "missing": doc is None,
                     "attempts": facts["attempt_count"] if facts else None,
                     "final_step": facts["final_step"] if facts else None,
                     "final_loss": facts["final_loss"] if facts else None,
                     "wall_s": facts["wall_s"] if facts else None, "cost": facts["cost"] if facts else None,
                     "verified": verified.get(cell["id"]), "source": (doc or {}).get("_source"), "facts": facts})
    line = sweeps.tally_line(tally) + "; " + losses_and_cost(all_facts)
    return {"sweep": roster.get("sweep"), "project": roster.get("project"), "rows": rows, "tally": tally,
            "glance": line}


def sweep_loss_figure(rows: list[dict], docs: dict[str, dict], title: str):
    """The loss curves of every cell in one figure, one line per cell with loss lines, labelled by its params.
    Returns the matplotlib figure (not yet saved), or None when no cell logged a loss."""
    curves = [(row["label"], *cell_curve(docs.get(row["cell"]))) for row in rows]
    curves = [c for c in curves if c[1]]
    if not curves:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for label, steps, losses in curves:
        ax.plot(steps, losses, lw=1.2, label=label)
    finite = [v for _label, _steps, losses in curves for v in losses]
    if min(finite) > 0 and max(finite) / min(finite) > 50:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right", ncol=1 + len(curves) // 12)
    ax.grid(alpha=0.3)
    return fig


def sweep_rows(s: dict) -> list[dict]:
    """The sweep table's rows as the page shows them."""
    rows = []
    for r in s["rows"]:
        state = r["state"] if r["run_state"] in (None, r["state"]) else f"{r['state']} ({r['run_state']})"
        v = r["verified"]
        rows.append({"cell": r["cell"], "host": _d(r["host"]), "label": _d(r["label"]), "state": _d(state),
                     "bad": r["state"] in _states.CELL_BAD,
                     "attempts": _d(r["attempts"]), "final_loss": _d(r["final_loss"]),
                     "wall_min": _fmt(r["wall_s"] and r["wall_s"] / 60, ".2f"), "cost": _fmt(r["cost"], ".4f"),
                     "pulled": bool(v), "verified_files": _d(v.get("files")) if v else None, "source": r["source"],
                     "moved": r.get("moved")})
    return rows


def sweep_page(s: dict, image: bytes | None, image_name: str, generated: float, no_loss: list[str]) -> str:
    return _env().get_template("sweep.html.j2").render(
        title=f"sweep {s['sweep']}", glance=s["glance"], written=_when(generated), rows=sweep_rows(s),
        image=base64.b64encode(image).decode() if image else None, image_name=image_name,
        no_loss=", ".join(no_loss))


# ---------------------------------------------------------------- gathering and writing

def teardown_time(ledger: Path, host: str) -> float | None:
    record = read_json(ledger / "teardown" / f"{host}.json")
    if isinstance(record, dict) and str(record.get("final_state") or "") not in ("", "None") \
            and not str(record.get("final_state")).startswith("unknown"):
        return _epoch(record.get("at"))
    return None


def verified_marker(root: Path, run_id: str, host: str) -> dict | None:
    marker = read_json(root / run_id / f"{host}.PULL_VERIFIED.json")
    return marker if isinstance(marker, dict) and marker.get("run_id") == run_id else None


def _saved(root: Path, run_id: str | None, host: str) -> dict | None:
    if not run_id:
        return None
    saved = read_json(root / run_id / f"{host}.report.json")
    return saved.get("doc") if isinstance(saved, dict) and isinstance(saved.get("doc"), dict) else None


def _host_run_id(host, extravars: dict) -> str | None:
    job = extravars.get("rgt_job") if isinstance(extravars.get("rgt_job"), dict) else None
    job = job or (getattr(host, "vars", None) or {}).get("rgt_job") or (host.recalled or {}).get("job") or {}
    return job.get("run_id") or job.get("name") if isinstance(job, dict) else None


def best_doc(fresh: dict, before: dict | None, saved: dict | None) -> dict | None:
    """The box's fresh document when it came with a history, else the newest data saved about the run."""
    if fresh.get("history") is not None:
        return fresh
    for older, where in ((before, "the last status"), (saved, "the last report")):
        if isinstance(older, dict) and older.get("history") is not None:
            seen = older.get("seen_at")
            return {**older, "_source": f"{fresh.get('host')} is {fresh.get('state')} now: data as of {where}"
                    + (f" ({_when(seen)})" if seen else "")}
    return None


def _any_arrival(ledger: Path, host: str, run_id: str) -> dict | None:
    """The move that brought run_id to host, whatever its project (a status document may not name it)."""
    try:
        runs = memory.runs_of(ledger, host)
    except errors.InputError:
        return None
    return next((memory.arrival(ledger, host, r.get("project") or "", run_id) for r in runs
                 if r.get("run_id") == run_id and r.get("moved_from")), None)


def write_report(root: Path, ledger: Path, run_id: str, docs: list[dict], now: float | None = None) -> dict:
    """Write runs/<run_id>/report.html (+ PNGs, + <host>.report.json) for the hosts that ran run_id."""
    now = time.time() if now is None else now
    out = root / run_id
    sections, facts_by_host, written = [], {}, []
    for doc in sorted(docs, key=lambda d: str(d.get("host"))):
        host = str(doc.get("host"))
        facts = run_facts(doc, now=now, teardown_at=teardown_time(ledger, host),
                          verified=verified_marker(root, run_id, host))
        move = _any_arrival(ledger, host, run_id)
        if move:
            facts["moved"] = memory.move_words(move)
        facts_by_host[host] = facts
        images, names = {}, {}
        for key, plot, _title, _missing in PLOTS:
            name = f"report-{host}-{key}.png"
            previous = _read_png(out / name)
            data = plot(doc, facts, previous)
            if data:
                if data is not previous:
                    atomic_write_bytes(out / name, data)
                images[key], names[key] = data, name
                written.append(str(out / name))
        sections.append(host_section(doc, facts, images, names, logs_html(out, host)))
        atomic_write_json(out / f"{host}.report.json", {"schema": "rgt/report-data/v1", "run_id": run_id,
                                                         "saved_at": now, "doc": doc, "facts": facts})
    line = glance({d.get("host"): d for d in docs}, facts_by_host, label=run_id)
    html_path = out / "report.html"
    atomic_write_bytes(html_path, page(run_id, sections, line, now).encode())
    return {"run_id": run_id, "html": str(html_path), "pngs": written, "glance": line, "hosts": facts_by_host}


def write_sweep_report(root: Path, ledger: Path, roster: dict, docs: list[dict], now: float | None = None,
                       down: set[str] | frozenset = frozenset()) -> dict:
    """Write runs/<sweep>/report.html (+ report-loss.png) for a sweep: a row per cell of its roster and every cell's
    loss in one figure; and runs/<cell>/<host>.report.json per cell seen (read back when the box is gone)."""
    now = time.time() if now is None else now
    name = roster["sweep"]
    out = root / name
    cells = roster.get("cells") or []
    verified = {c["id"]: verified_marker(root, c["id"], c["host"]) for c in cells}
    teardown = {h: teardown_time(ledger, h) for h in sorted({c["host"] for c in cells})}
    s = sweep_facts(roster, docs, now=now, teardown_at=teardown, verified=verified, down=down)
    for row in s["rows"]:  # a cell `rgt-run move` took to another host: the page says so, and the work lost
        move = memory.arrival(ledger, row["host"], str(roster.get("project") or ""), row["cell"])
        row["moved"] = memory.move_words(move) if move else None
    by_cell = {(d.get("host"), d.get("run_id")): d for d in docs}
    cell_docs, hosts = {}, {}
    for row in s["rows"]:
        doc = by_cell.get((row["host"], row["cell"]))
        if doc is None:
            continue
        cell_docs[row["cell"]] = doc
        hosts.setdefault(row["host"], {})[row["cell"]] = row["facts"]
        atomic_write_json(root / row["cell"] / f"{row['host']}.report.json",
                          {"schema": "rgt/report-data/v1", "run_id": row["cell"], "sweep": name, "saved_at": now,
                           "doc": doc, "facts": row["facts"]})
    written, image = [], None
    title = f"sweep {name}: loss over steps, one line per cell"
    previous = _read_png(out / "report-loss.png")
    image = figure_png(lambda: sweep_loss_figure(s["rows"], cell_docs, title),
                       ["sweep_loss_figure", title, [(r["label"], cell_curve(cell_docs.get(r["cell"])))
                                                     for r in s["rows"]]], previous)
    if image is not None:
        if image is not previous:
            atomic_write_bytes(out / "report-loss.png", image)
        written.append(str(out / "report-loss.png"))
    no_loss = [c for c, d in cell_docs.items() if not cell_curve(d)[0]]
    html_path = out / "report.html"
    atomic_write_bytes(html_path, sweep_page(s, image, "report-loss.png", now, no_loss).encode())
    rows = [{k: v for k, v in r.items() if k != "facts"} for r in s["rows"]]
    return {"sweep": name, "run_id": name, "html": str(html_path), "pngs": written, "glance": s["glance"],
            "hosts": hosts, "cells": rows}


def _settled(doc: dict | None, run_id: str | None) -> bool:
    """A status the box cannot change any more: the run ended, and the document carries its history."""
    return (isinstance(doc, dict) and doc.get("state") in _states.SETTLED and doc.get("history") is not None
            and run_id is not None and doc.get("run_id") == run_id)


def _runs_of(doc) -> dict[str, dict]:
    """{run_id: document} over a host's status document and the other runs in it (a sweep host's other cells)."""
    if not isinstance(doc, dict):
        return {}
    runs = (doc, *(doc.get("other_runs") or []))
    return {str(r["run_id"]): r for r in runs if isinstance(r, dict) and r.get("run_id")}


def _cells_of(host) -> list[str]:
    """The run ids of a sweep host's cells (rgt.sweeps.expand), in roster order: each cell's job names its run by
    `run_id`, else by `name` (one rule with a run's id everywhere: rgt.memory.record_launch)."""
    return [c.get("run_id") or c.get("name") for c in (host.recalled or {}).get("cells") or [] if isinstance(c, dict)]


def _host_settled(host, doc: dict | None, extravars: dict) -> bool:
    """Every run of the host settled in this document (a sweep host: every one of its cells)."""
    if host.sweep:
        cells, runs = _cells_of(host), _runs_of(doc)
        return bool(cells) and all(_settled(runs.get(c), c) for c in cells)
    return _settled(doc, _host_run_id(host, extravars))


def build_reports(args: argparse.Namespace, console: Console, hosts: list, extravars: dict, ledger: Path,
                  root: Path, only_run: str | None = None,
                  reuse_settled: bool = False) -> tuple[list[dict], dict[str, str]]:
    """Poll the hosts once (monitor.yml) and write a report per run, and one per sweep for the hosts that run a
    sweep's cells. Returns (reports, {host (host:cell for a cell): why not}).
    reuse_settled: a host whose last status in the ledger is a settled run with its history (a sweep host: every
    cell) is not polled again (after a pull: the run ended, nothing on the box can change its figures)."""
    before = {h.name: read_json(ledger / "status" / f"{h.name}.json") for h in hosts}
    reuse = {h.name for h in hosts if reuse_settled and _host_settled(h, before[h.name], extravars)}
    to_poll = [h for h in hosts if h.name not in reuse]
    fresh = poll(args, console, to_poll, extravars, ledger) if to_poll else {}
    fresh.update({name: before[name] for name in reuse})
    by_run: dict[str, list[dict]] = {}
    skipped: dict[str, str] = {}
    for host in hosts:
        if host.sweep:
            continue
        doc = fresh.get(host.name) or {"host": host.name, "state": "error"}
        run_id = doc.get("run_id") or _host_run_id(host, extravars)
        if only_run and run_id != only_run:
            continue
        chosen = best_doc(doc, before.get(host.name), _saved(root, run_id, host.name))
        if chosen is None or not run_id:
            skipped[host.name] = f"{doc.get('state')}: {doc.get('error') or 'no history from the box'}"
            continue
        chosen = {**chosen, "host": host.name, "run_id": chosen.get("run_id") or run_id}
        by_run.setdefault(run_id, []).append(chosen)
    reports = [write_report(root, ledger, run_id, docs) for run_id, docs in sorted(by_run.items())]
    reports += sweep_reports(ledger, root, [h for h in hosts if h.sweep], fresh, before, skipped, only_run)
    return reports, skipped


def _cell_doc(host: str, cell: str, doc: dict, prev: dict | None, root: Path) -> tuple[dict | None, str]:
    """The document a cell's row uses: the box's fresh one with its history, else the newest data saved about the
    cell (best_doc); (None, why) when there is none."""
    now_doc = _runs_of(doc).get(cell) or {"host": host, "state": doc.get("state"),
                                          "error": doc.get("error") or "no status of this cell from the box"}
    chosen = best_doc({**now_doc, "host": host}, _runs_of(prev).get(cell), _saved(root, cell, host))
    if chosen is None:
        return None, f"{now_doc.get('state')}: {now_doc.get('error') or 'no history from the box'}"
    return {**{k: v for k, v in chosen.items() if k != "other_runs"}, "host": host, "run_id": cell}, ""


def _roster_of(project: str, name: str, members: list) -> dict:
    """A sweep's cells from its hosts, when the ledger keeps no roster of it (another ledger): the params are read
    back from the cell ids (`<name>--k=v--k=v`, rgt_sweep's rule)."""
    cells = []
    for host in members:
        for cell in _cells_of(host):
            rest = cell[len(name) + 2:].split("--") if cell.startswith(name + "--") else []
            cells.append({"id": cell, "host": host.name, "params": dict(p.split("=", 1) for p in rest if "=" in p)})
    return {"sweep": name, "project": project, "cells": cells}


def sweep_reports(ledger: Path, root: Path, hosts: list, fresh: dict, before: dict, skipped: dict[str, str],
                  only_run: str | None = None) -> list[dict]:
    """One report per sweep of these (sweep) hosts, over the cells of its roster (`<ledger>/sweeps/`). A cell on a
    host outside this play (--limit) is shown from the ledger's last status of that host or the last report, else
    as missing; a cell of a host in the play with no data at all goes into `skipped` as host:cell."""
    groups: dict[tuple[str, str], list] = {}
    for host in hosts:
        groups.setdefault((host.project, host.sweep), []).append(host)
    reports = []
    for (project, name), members in sorted(groups.items()):
        roster = rosters.read_roster(ledger, project, name) or _roster_of(project, name, members)
        if only_run and only_run != name and only_run not in {c["id"] for c in roster.get("cells") or []}:
            continue
        here = {h.name for h in members}
        docs, down = [], set()
        for cell in roster.get("cells") or []:
            host = cell["host"]
            if host in here:
                doc, prev = fresh.get(host) or {"host": host, "state": "error"}, before.get(host)
            else:
                doc, prev = {"host": host, "state": "outside this play"}, read_json(ledger / "status" / f"{host}.json")
            chosen, why = _cell_doc(host, cell["id"], doc, prev, root)
            if chosen is not None:
                docs.append(chosen)
            elif host in here:
                skipped[f"{host}:{cell['id']}"] = why
                if doc.get("state") == "unreachable":
                    down.add(host)
        reports.append(write_sweep_report(root, ledger, roster, docs, down=down))
    return reports


def print_reports(console: Console, reports: list[dict], skipped: dict[str, str]) -> None:
    for rep in reports:
        console.print(f"report: {rep['html']}", highlight=False, markup=False)
        console.print(f"  {printable(rep['glance'])}", highlight=False, markup=False)
    for host, why in sorted(skipped.items()):
        console.print(f"  [yellow]no report[/yellow] for {escape(host)}: {escape(printable(why))}", highlight=False)


def after_pull(args: argparse.Namespace, console: Console, hosts: list, extravars: dict, ledger: Path,
               root: Path) -> list[dict]:
    """The report beside a verified pull. Never raises: a report that cannot be written is a warning."""
    if not hosts:
        return []
    for host in hosts:  # the pull pointed a sweep host at the cell it pulled last; the status looks at its first
        if host.sweep and (host.recalled or {}).get("cells"):
            host.recalled = {**host.recalled, "job": host.recalled["cells"][0]}
    try:
        reports, skipped = build_reports(args, console, hosts, extravars, ledger, root, reuse_settled=True)
        print_reports(console, reports, skipped)
        return reports
    except Exception as exc:  # noqa: BLE001 - the pull is verified; the report is a convenience on top
        console.print(f"[yellow]warning[/yellow]: the report could not be written ({type(exc).__name__}: "
                      f"{escape(str(exc))}); the pull itself is verified. Run `rgt-run report` to try again.",
                      highlight=False)
        return []


# ---------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", metavar="RUN", help="only this run id, or this sweep (a cell id names its sweep) "
                   "(default: every run of the inventory)")
    p.add_argument("--runs-dir", dest="runs_dir", metavar="DIR",
                   help="where reports land, beside the pulled results (default $RGT_RUNS_DIR or ./runs)")


def run(args: argparse.Namespace, console: Console) -> int:
    only = getattr(args, "run", None)
    if only:
        problem = paths.module_util("rgt_runlayout").check_name(only, "run id")
        if problem:
            raise errors.InputError(problem, fix="--run takes a run id (rgt_job.run_id or rgt_job.name)",
                                    field="--run")
    hosts, extravars = prepare_hosts(args)
    ledger = ledger_dir(getattr(args, "ledger", None))
    root = runs_dir(getattr(args, "runs_dir", None))
    runs = {r for h in hosts for r in (_host_run_id(h, extravars), h.sweep, *(_cells_of(h) if h.sweep else ())) if r}
    if only and only not in runs:
        known = sorted({r for h in hosts for r in ((h.sweep,) if h.sweep else (_host_run_id(h, extravars),)) if r})
        raise errors.InputError(f"--run {only} is no run of this inventory",
                                fix=f"one of: {', '.join(known) or '(none: give the job spec)'}", field="--run")
    reports, skipped = build_reports(args, console, hosts, extravars, ledger, root, only)
    print_reports(console, reports, skipped)
    if reports and not skipped:
        code = errors.OK
    elif skipped and all(why.startswith("unreachable") for why in skipped.values()):
        code = errors.UNREACHABLE
    else:
        code = errors.FAILED
    output.emit({"command": "report", "runs_dir": str(root), "reports": reports, "skipped": skipped,
                 "exit_code": code}, getattr(args, "json", False))
    return code
