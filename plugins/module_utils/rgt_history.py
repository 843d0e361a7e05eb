# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""A run's history from what the box already records, small enough to travel with every status document.

Pure functions (no I/O but what the caller hands in), Python 3.6+, stdlib only. Used by the rgt_status module
(the `history` key of the status document) and, through rgt.paths.module_util, by the runner's report.

- loss and the job's metrics (rgt_job.metrics, else eval loss and learning rate) over steps, per attempt, from
  logs/job.log (the wrapper's `== rgt attempt N started` lines split it; rgt_reconcile.LogReader reads the lines);
- GPU utilisation and memory over time, per GPU, from the wrapper's .rgt/gpu.csv, and the idle stretches;
- the attempt records of .rgt/attempts.jsonl as written, and the last error line of the log.
Bounded: the caller reads at most a fixed number of bytes from the end of each file; points are thinned to a
fixed count (first, last and non-finite points always kept), GPU samples averaged into time buckets.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# the log's rules (step, loss, metrics), the attempt marker and the number rules are the status scan's (one copy)
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_reconcile import (  # noqa: E402
    ATTEMPT_MARKER,
    GPU_IDLE_PCT,
    LogReader,
    json_number,
)

SCHEMA = 1
MAX_LOSS_POINTS = 600
MAX_METRIC_POINTS = 200  # per metric (at most rgt_reconcile.MAX_METRICS of them)
MAX_GPU_POINTS = 240
MAX_IDLE_STRETCHES = 50
ERROR_LINE = re.compile(r"(Traceback \(most recent call last\)|\b\w*(Error|Exception)\b:|CUDA out of memory|"
                        r"\bKilled\b|Segmentation fault|core dumped)")
RESUME_STEP = re.compile(r"(\d+)(?!.*\d)")


def thin(items, limit, keep=None):
    """At most about `limit` items, evenly spread; the first, the last and every index in `keep` are kept."""
    n = len(items)
    if n <= limit:
        return list(items)
    chosen = set(i for i in (keep or ()) if 0 <= i < n)
    chosen.update((0, n - 1))
    room = limit - len(chosen)
    if room > 1:
        stride = (n - 1) / float(room - 1)
        chosen.update(int(round(k * stride)) for k in range(room))
    return [items[i] for i in sorted(chosen)]


ERROR_WINDOW = 64 * 1024
EDGE_LINES = 20
BACK_LINES = 5


def _segments(text):
    """[(attempt or None, lines)] split at the wrapper's `== rgt attempt N started` lines (str.find, no regex
    over the whole text: a 4 MiB log costs milliseconds)."""
    out, pos, attempt, at = [], 0, None, 0
    while True:
        at = text.find("== rgt attempt ", at)
        if at < 0:
            break
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        match = ATTEMPT_MARKER.match(text[at:end]) if at == 0 or text[at - 1] == "\n" else None
        if match:
            out.append((attempt, text[pos:at]))
            attempt, pos = int(match.group(1)), end + 1
        at = end
    out.append((attempt, text[pos:]))
    return [(a, [ln for ln in body.splitlines() if not ln.startswith("== rgt attempt ")])
            for a, body in out if a is not None or body.strip()]


def _last_error(text):
    """(line, traceback seen) of the last error-looking line near the end of an attempt's log."""
    window = text[-ERROR_WINDOW:]
    line, traceback = None, False
    for match in ERROR_LINE.finditer(window):
        start = window.rfind("\n", 0, match.start()) + 1
        stop = window.find("\n", match.end())
        line = window[start:stop if stop >= 0 else len(window)].strip()[:200]
        traceback = traceback or match.group(0).startswith("Traceback")
    return line, traceback


def loss_history(text, patterns=None, partial_first_line=False, max_points=MAX_LOSS_POINTS, metrics=None):
    """{points: [[attempt, step, loss]], metrics: {name: [[attempt, step, value]]}, attempts: [{attempt,
    first_step, last_step, losses}], error_line (the last error-looking line of the newest attempt), traceback
    (bool), truncated}. Lines before the first attempt marker (a tail that began mid-run) belong to attempt None.
    `metrics` is the job's {name: regex} (None: rgt_reconcile.DEFAULT_METRICS); a metric the job declared is
    listed even with no value, a built-in one only when the log shows it.

    Bounded work on a long log: per attempt, only an even sample of its lines (about 2 x max_points overall) and
    its first and last EDGE_LINES lines are parsed (a non-finite loss between samples is the status document's
    `nonfinite_loss`); a loss or metric line without a step takes the step of the nearest of the BACK_LINES lines
    before it, else the latest step of the lines read before it (HF Trainer writes its evaluation results after
    its evaluation bar, far from the training bar)."""
    text = text or ""
    if partial_first_line:
        text = text.split("\n", 1)[1] if "\n" in text else ""
    segments = _segments(text)
    total = sum(len(lines) for _a, lines in segments) or 1
    points, per_attempt, series = [], {}, {}
    declared = metrics is not None
    for attempt, lines in segments:
        reader = LogReader(patterns, metrics)
        if declared:
            for name, _rule in reader.metrics:
                series.setdefault(name, [])
        slot = per_attempt.setdefault(attempt, {"attempt": attempt, "first_step": None, "last_step": None,
                                                "losses": 0})
        n = len(lines)
        stride = max(1, int(n / max(1.0, 2.0 * max_points * n / total)))
        chosen = set(range(0, n, stride))
        chosen.update(range(min(n, EDGE_LINES)))
        chosen.update(range(max(0, n - EDGE_LINES), n))
        for i in sorted(chosen):
            line = lines[i]
            latest = reader.step
            step, loss, values = reader.read(line)
            if step is not None:
                if slot["first_step"] is None:
                    slot["first_step"] = step
                slot["last_step"] = step if slot["last_step"] is None else max(slot["last_step"], step)
            if loss is None and not values:
                continue
            back = i - 1
            while step is None and back >= max(0, i - BACK_LINES):
                step = reader.step_of(lines[back], commit=False)
                back -= 1
            step = latest if step is None else step
            if step is None:
                continue
            if loss is not None:
                slot["losses"] += 1
                points.append([attempt, step, json_number(loss)])
            for name, value in values:
                series.setdefault(name, []).append([attempt, step, json_number(value)])
    error_line, traceback = _last_error("\n".join(segments[-1][1])) if segments else (None, False)
    order = [name for name, _rule in LogReader(patterns, metrics).metrics if name in series]  # as declared
    return {"points": thin(points, max_points, _keep(points, 50)),
            "metrics": dict((name, thin(series[name], MAX_METRIC_POINTS, _keep(series[name], 10)))
                            for name in order),
            "attempts": [per_attempt[k] for k in sorted(per_attempt, key=lambda a: -1 if a is None else a)],
            "error_line": error_line, "traceback": traceback, "truncated": bool(partial_first_line)}


def _keep(points, nonfinite):
    """The indexes thinning keeps: the first `nonfinite` non-finite values, and every attempt's first and last
    point (a relaunch must stay visible however thin the curve)."""
    keep = [i for i, p in enumerate(points) if isinstance(p[2], str)][:nonfinite]
    seen = {}
    for i, p in enumerate(points):
        seen.setdefault(p[0], [i, i])[1] = i
    for first, last in seen.values():
        keep.extend((first, last))
    return keep


def _cell_number(text):
    text = (text or "").strip()
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def gpu_csv_rows(text):
    """The wrapper's gpu.csv ("ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c") -> [{ts (as written), index,
    util_pct, mem_used_mib, mem_total_mib}], skipping the header and a line cut at the start of a tail. The one
    reader of that file: the status sample (rgt_status) and the history below."""
    rows = []
    for line in (text or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5 or _cell_number(cells[1]) is None:
            continue
        rows.append({"ts": cells[0], "index": _cell_number(cells[1]), "util_pct": _cell_number(cells[2]),
                     "mem_used_mib": _cell_number(cells[3]), "mem_total_mib": _cell_number(cells[4])})
    return rows


def gpu_history(text, partial_first_line=False, max_points=MAX_GPU_POINTS, idle_pct=GPU_IDLE_PCT):
    """gpu.csv ("ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c") -> {series: {index: [[ts, util, mem_used,
    mem_total]]} (time buckets: mean util, max memory), idle: [{index, start, end, samples}], interval_s,
    samples, truncated}."""
    lines = (text or "").splitlines()
    if partial_first_line and lines:
        lines = lines[1:]
    raw = {}
    for row in gpu_csv_rows("\n".join(lines)):
        ts = _cell_number(row["ts"])
        if ts is None:
            continue
        raw.setdefault(int(row["index"]), []).append(
            (float(ts), row["util_pct"], row["mem_used_mib"], row["mem_total_mib"]))
    series, idle, gaps = {}, [], []
    for index in sorted(raw):
        rows = sorted(raw[index])
        mine = sorted(rows[i][0] - rows[i - 1][0] for i in range(1, len(rows)) if rows[i][0] > rows[i - 1][0])
        gaps.extend(mine)
        # the wrapper samples only while an attempt runs: a pause of 3 intervals or more (a preemption) ends a stretch
        idle.extend(_idle_stretches(index, rows, idle_pct, 3 * mine[len(mine) // 2] if mine else None))
        series[str(index)] = _buckets(rows, max_points)
    interval = sorted(gaps)[len(gaps) // 2] if gaps else None
    return {"series": series, "idle": idle[:MAX_IDLE_STRETCHES], "interval_s": interval,
            "samples": sum(len(r) for r in raw.values()), "truncated": bool(partial_first_line)}


def _idle_stretches(index, rows, idle_pct, max_gap=None):
    """Runs of at least two consecutive samples at or below idle_pct utilisation, no two of them more than max_gap
    seconds apart: {index, start, end, samples}."""
    out, run = [], []
    for row in rows + [None]:
        idle = row is not None and row[1] is not None and row[1] <= idle_pct
        if idle and (not run or max_gap is None or row[0] - run[-1][0] < max_gap):
            run.append(row)
            continue
        if len(run) >= 2:
            out.append({"index": index, "start": run[0][0], "end": run[-1][0], "samples": len(run)})
        run = [row] if idle else []
    return out


def _buckets(rows, limit):
    if len(rows) <= limit:
        return [[r[0], r[1], r[2], r[3]] for r in rows]
    start, end = rows[0][0], rows[-1][0]
    width = (end - start) / float(limit) or 1.0
    buckets = {}
    for row in rows:
        buckets.setdefault(min(limit - 1, int((row[0] - start) / width)), []).append(row)
    out = []
    for key in sorted(buckets):
        group = buckets[key]
        utils = [r[1] for r in group if r[1] is not None]
        mems = [r[2] for r in group if r[2] is not None]
        totals = [r[3] for r in group if r[3] is not None]
        out.append([group[0][0], round(sum(utils) / len(utils), 1) if utils else None,
                    max(mems) if mems else None, max(totals) if totals else None])
    return out


def resume_step(resume_from):
    """The step a checkpoint path names (the last number in its file name), or None."""
    name = str(resume_from or "").rstrip("/").rsplit("/", 1)[-1]
    match = RESUME_STEP.search(name)
    return int(match.group(1)) if match else None


def build(log_text, log_partial, gpu_text, gpu_partial, attempts, patterns=None, metrics=None):
    """The `history` key of the status document (`metrics`: the job's rgt_job.metrics, None for the built-in)."""
    log = loss_history(log_text, patterns, log_partial, metrics=metrics)
    keep = ("attempt", "started_at", "ended_at", "rc", "signal", "reason", "resume_from", "noted_at")
    records = [dict((k, r.get(k)) for k in keep if k in r) for r in attempts or [] if isinstance(r, dict)]
    return {"schema": SCHEMA, "loss": {"points": log["points"], "attempts": log["attempts"],
                                       "truncated": log["truncated"]}, "metrics": log["metrics"],
            "log_error": {"line": log["error_line"], "traceback": log["traceback"]} if log["error_line"] else None,
            "gpu": gpu_history(gpu_text, gpu_partial), "attempts": records}
