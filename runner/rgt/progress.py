"""Live transfer progress on a terminal: tail the rsync progress files the roles write and show a line per host.

When rgt-run's console (stderr) is a terminal, run_playbook passes the roles `rgt_progress_dir`; upload_resume and
collect then run rsync with --info=progress2 through the rgt_transfer action (plugins/module_utils/rgt_rsync.py,
Progress), which appends JSON lines to <dir>/<host>.<upload|pull>.jsonl. A thread here tails those files and
shows, below the event lines,

    host             upload  12.3 MiB / 40.0 MiB  4.1 MiB/s  ETA 0:07

through a transient rich Live on the same Console the EventSink prints with (so event lines scroll above it and
are never overwritten); the line goes when that transfer ends. Not a terminal: no directory, no extra var, no
thread, and rsync runs without --info=progress2, as in a plain ansible-playbook run.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

POLL_S = 0.25
SHOW_AFTER_S = 0.5  # a transfer that ends sooner never flashes a line
RATE_WINDOW_S = 5.0
STALLED_S = 3.0  # no progress record for this long: the rate shows 0


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@dataclass
class Transfer:
    """One host's upload or pull: one or more rsync runs (parts: code/data, one per pulled entry; retries)."""

    host: str
    what: str
    parts: dict[str, int] = field(default_factory=dict)  # part -> bytes its latest rsync run reported
    total: int | None = None
    running: set[str] = field(default_factory=set)
    started: float | None = None  # local monotonic time the current run of parts began
    last_record: float = 0.0
    samples: deque = field(default_factory=lambda: deque(maxlen=64))  # (wall t, bytes done)

    @property
    def done(self) -> int:
        return sum(self.parts.values())

    def apply(self, record: dict, now: float) -> None:
        part = str(record.get("part") or "")
        event = record.get("event")
        self.last_record = now
        if isinstance(record.get("total"), int):
            self.total = record["total"]
        if event == "start":
            if not self.running:
                self.started = now
            self.running.add(part)
            if self.parts.get(part):  # a retry of a part starts over from rsync's point of view: so does the rate
                self.samples.clear()
            self.parts[part] = 0
        elif event == "progress" and isinstance(record.get("bytes"), int):
            self.parts[part] = record["bytes"]
        elif event == "end":
            self.running.discard(part)
            return
        if isinstance(record.get("t"), (int, float)):
            self.samples.append((float(record["t"]), self.done))

    def visible(self, now: float) -> bool:
        return bool(self.running) and self.started is not None and now - self.started >= SHOW_AFTER_S

    def rate(self, now: float) -> float | None:
        if now - self.last_record > STALLED_S:
            return 0.0
        if len(self.samples) < 2:
            return None
        newest_t, newest = self.samples[-1]
        window = [(t, b) for t, b in self.samples if newest_t - t <= RATE_WINDOW_S]
        oldest_t, oldest = window[0]
        if newest_t - oldest_t < 1.0:  # rsync reports in bursts: a shorter span gives a wild rate and ETA
            return None
        return max(newest - oldest, 0) / (newest_t - oldest_t)

    def line(self, now: float) -> Text:
        done, total, rate = self.done, self.total, self.rate(now)
        amount = f"{human_bytes(done)} / {human_bytes(total)}" if total else human_bytes(done)
        speed = f"{human_bytes(rate)}/s" if rate is not None else "…"
        if total and rate:
            eta = clock(max(total - done, 0) / rate)
        else:
            eta = "-"
        return Text.assemble(f"  {self.host:<16} ", (f"{self.what:<7}", "cyan"), f" {amount}  {speed}  ETA {eta}")


class ProgressTail:
    """Tails <directory>/*.jsonl on a thread and renders the running transfers; everything is off when the
    console is not a terminal. Use: evars.update(tail.extravars()); tail.start(); ...; tail.stop() (in finally)."""

    def __init__(self, console: Console, directory: Path):
        self.console = console
        self.directory = directory
        self.enabled = console.is_terminal and not console.is_dumb_terminal
        self.transfers: dict[tuple[str, str], Transfer] = {}
        self._offsets: dict[Path, int] = {}
        self._rests: dict[Path, bytes] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None
        if self.enabled:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def extravars(self) -> dict:
        return {"rgt_progress_dir": str(self.directory)} if self.enabled else {}

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="rgt-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop tailing and take the live lines away; safe to call twice, after an error or a KeyboardInterrupt."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        live, self._live = self._live, None
        if live is not None:
            with contextlib.suppress(Exception):
                live.stop()

    # -- the thread

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
                self._render()
            except Exception:  # progress is a courtesy: it never takes the run down
                if self._stop.wait(1.0):
                    break
            self._stop.wait(POLL_S)

    def poll(self, now: float | None = None) -> None:
        """Read what the wrappers appended since the last call (complete lines only)."""
        now = time.monotonic() if now is None else now
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except OSError:
                continue
            if not chunk:
                continue
            self._offsets[path] = offset + len(chunk)
            *lines, rest = (self._rests.pop(path, b"") + chunk).split(b"\n")
            if rest:
                self._rests[path] = rest
            for raw in lines:
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(record, dict) or not record.get("host") or not record.get("what"):
                    continue
                key = (str(record["host"]), str(record["what"]))
                self.transfers.setdefault(key, Transfer(*key)).apply(record, now)

    def lines(self, now: float | None = None) -> list[Text]:
        now = time.monotonic() if now is None else now
        return [t.line(now) for _, t in sorted(self.transfers.items()) if t.visible(now)]

    def _render(self) -> None:
        lines = self.lines()
        if self._live is None:
            if not lines:
                return
            # started on the first visible transfer; an empty Group renders nothing between transfers
            self._live = Live(Group(*lines), console=self.console, transient=True, auto_refresh=False,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start(refresh=True)
            return
        self._live.update(Group(*lines), refresh=True)
