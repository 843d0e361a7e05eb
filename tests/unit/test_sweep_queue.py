"""The box-side sweep queue (roles/launch_detached/files/rgt_queue.py): which cell may start on which slot (pure),
and a real queue over real cells, each started through the real job wrapper: every cell runs once, never more
at once than there are slots, each on the GPUs of its slot; a failed cell stays failed until `rgt-run retry`
(retry.json) names its last attempt; a second queue of the same sweep exits at once."""

import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_bundle

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "roles" / "launch_detached" / "files"
QUEUE = FILES / "rgt_queue.py"
PROJECT = "proj"
SWEEP = "abl"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the wrapper runs the command with bash")


def _load():
    spec = importlib.util.spec_from_file_location("rgt_queue", QUEUE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


q = _load()
rl = q.rl


# ---------------------------------------------------------------- what may start, and where (pure)

def view(state="never", live=False, attempt=0, slot=None, retry=None, moved=False):
    return {"live": live, "state": "live" if live else state, "attempt": attempt, "slot": slot, "retry": retry,
            "moved": moved}


@pytest.mark.parametrize("state", ["never", "preempted", "dead"])
def test_a_cell_that_never_ran_or_stopped_without_failing_may_start(state):
    assert q.startable(view(state, attempt=0 if state == "never" else 1)) is True


def test_a_finished_cell_never_starts_again():
    assert q.startable(view("finished", attempt=1)) is False
    assert q.startable(view("finished", attempt=1, retry=1)) is False  # even with a leftover retry.json


@pytest.mark.parametrize("failed", ["failed", "killed"])  # killed: SIGKILL, SIGSEGV (status shows it failed)
def test_a_failed_cell_starts_only_when_retry_names_its_last_attempt(failed):
    assert q.startable(view(failed, attempt=1)) is False
    assert q.startable(view(failed, attempt=1, retry=1)) is True
    # the retry was for attempt 1; attempt 2 failed too: the user has not said to retry that one
    assert q.startable(view("failed", attempt=2, retry=1)) is False
    assert q.startable(view("failed", attempt=1, retry=0)) is False


def test_a_live_cell_never_starts():
    assert q.startable(view(live=True, attempt=1, slot=0)) is False


@pytest.mark.parametrize("state", ["never", "preempted", "dead"])
def test_a_cell_moved_to_another_box_never_starts_here(state):
    assert q.startable(view(state, attempt=1, moved=True)) is False


def test_cell_view_sees_the_fence_of_a_move_newer_than_its_job(tmp_path):
    paths = rl.RunPaths(str(tmp_path), PROJECT, "abl--seed=1")
    os.makedirs(paths.meta)
    rl.atomic_write_json(paths.job, {"command": "true", "env": {}})
    assert q.cell_view(paths)["moved"] is False
    rl.atomic_write_json(os.path.join(paths.meta, rl.MOVED_MARK), {"moved_to": "b", "generation": 2, "at": 1})
    assert q.cell_view(paths)["moved"] is True  # its job.json is generation 1: the stale attempt's dir
    rl.atomic_write_json(paths.job, {"command": "true", "env": {"RGT_GENERATION": "3"}})
    assert q.cell_view(paths)["moved"] is False  # moved back here later (generation 3): it lives here again


CELLS = ["c0", "c1", "c2", "c3"]
SLOTS = ["0", "1", "2"]


def test_plan_starts_in_roster_order_on_the_lowest_free_slots():
    views = {c: view() for c in CELLS}
    assert q.plan_starts(CELLS, views, SLOTS, set(), set()) == [("c0", 0), ("c1", 1), ("c2", 2)]
    assert q.plan_starts(["c3", "c1"], views, SLOTS, set(), set()) == [("c3", 0), ("c1", 1)]


def test_plan_starts_skips_busy_slots_and_stops_when_none_is_free():
    views = {c: view() for c in CELLS}
    assert q.plan_starts(CELLS, views, SLOTS, {0, 2}, set()) == [("c0", 1)]
    assert q.plan_starts(CELLS, views, SLOTS, {0, 1, 2}, set()) == []


def test_plan_starts_passes_over_cells_that_may_not_start():
    views = {"c0": view(live=True, attempt=1, slot=0), "c1": view("finished", attempt=1),
             "c2": view("failed", attempt=1), "c3": view("failed", attempt=2, retry=2)}
    assert q.plan_starts(CELLS, views, SLOTS, {0}, set()) == [("c3", 1)]


def test_plan_starts_never_starts_a_cell_twice_in_one_generation():
    views = {"c0": view("killed", attempt=1), "c1": view("preempted", attempt=1), "c2": view(), "c3": view()}
    assert q.plan_starts(CELLS, views, SLOTS, set(), {"c0", "c2"}) == [("c1", 0), ("c3", 1)]


def test_cell_view_reads_the_run_dir(tmp_path):
    paths = rl.RunPaths(str(tmp_path), PROJECT, "abl--seed=0")
    os.makedirs(paths.meta)
    assert q.cell_view(paths) == view()
    rl.append_jsonl(paths.attempts, {"attempt": 1, "started_at": "t"})
    rl.append_jsonl(paths.attempts, {"attempt": 1, "ended_at": "u", "rc": 1, "reason": "failed"})
    rl.atomic_write_json(paths.exit, {"attempt": 1, "rc": 1, "reason": "failed"})
    rl.atomic_write_json(os.path.join(paths.meta, "slot.json"), {"slot": 1, "devices": "1"})
    rl.atomic_write_json(os.path.join(paths.meta, "retry.json"), {"after_attempt": 1})
    assert q.cell_view(paths) == view("failed", attempt=1, slot=1, retry=1)
    with open(paths.lock, "a+") as handle:  # a live wrapper holds the cell's lock
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert q.cell_view(paths) == view(live=True, attempt=1, slot=1, retry=1)


# ---------------------------------------------------------------- a real queue over real wrappers

def command(rc=0, sleep=1):
    """A cell's command: records the GPUs it sees and when it ran, then exits with `rc`."""
    return ('date +%%s.%%N > "$RGT_OUT_DIR/start"; printf %%s "$CUDA_VISIBLE_DEVICES" > "$RGT_OUT_DIR/devices"; '
            'sleep %s; date +%%s.%%N > "$RGT_OUT_DIR/end"; exit %d' % (sleep, rc))


class Sweep:
    """A sweep the way rgt_launch lays it out: each cell an ordinary run dir (the wrapper bundle and job.json under
    .rgt/), and the sweep dir with the queue bundle and queue.json (install_bundle, as rgt_launch installs them)."""

    def __init__(self, tmp_path, commands, slots, poll_s=0.2):
        self.root = str(tmp_path / "durable")
        self.code = tmp_path / "code"
        self.code.mkdir()
        self.dir = Path(self.root) / PROJECT / "sweeps" / SWEEP
        self.meta = self.dir / ".rgt"
        self.meta.mkdir(parents=True)
        (self.dir / "logs").mkdir()
        queue = rgt_bundle.build("queue")
        rl.install_bundle(str(self.meta), queue.files, queue.entry)
        wrapper = rgt_bundle.build("wrapper")
        self.cells = list(commands)
        for cell, cmd in commands.items():
            paths = self.paths(cell)
            for d in (paths.meta, paths.ckpt, paths.out, paths.logs):
                os.makedirs(d)
            rl.install_bundle(paths.meta, wrapper.files, wrapper.entry)
            self.write_job(cell, cmd)
        self.spec = {"project": PROJECT, "durable_root": self.root, "python": sys.executable, "sweep": SWEEP,
                     "cells": self.cells, "slots": slots, "generation": 1, "poll_s": poll_s}
        rl.atomic_write_json(str(self.meta / "queue.json"), self.spec)

    def paths(self, cell):
        return rl.RunPaths(self.root, PROJECT, cell)

    def write_job(self, cell, cmd):
        """job.json as rgt_launchplan.job_document writes it (the fields the wrapper reads)."""
        paths = self.paths(cell)
        rl.atomic_write_json(paths.job, {
            "schema": 1, "run_id": cell, "project": PROJECT, "run_dir": paths.run_dir, "session": paths.session(),
            "command": cmd, "python": sys.executable, "code_dir": str(self.code), "env": {"CELL": cell},
            "secrets_file": None, "proxy_hook": None, "grace_s": 5, "ckpt_glob": "*", "outputs": [],
            "log_patterns": {}, "expected_duration_s": None, "price_per_hour": None, "heartbeat_interval_s": 1,
            "gpu_sample_interval_s": 30, "stall_after_s": 600, "omp_num_threads": None,
            "launched_at": "2026-01-01T00:00:00Z", "attempt_policy": {"auto_resume": False},
            "sweep": {"name": SWEEP, "dir": str(self.dir), "params": {}}}, 0o600)

    def bump(self, **changes):
        self.spec = dict(self.spec, generation=self.spec["generation"] + 1, **changes)
        rl.atomic_write_json(str(self.meta / "queue.json"), self.spec)

    def run_queue(self, timeout=60):
        proc = subprocess.Popen([sys.executable, str(self.meta / "queue.py"), str(self.dir)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={k: v for k, v in os.environ.items()
                                                                          if k != "CUDA_VISIBLE_DEVICES"})
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail("the queue did not exit within %ss:\n%s\n%s" % (timeout, out, self.log()))
        return proc.returncode, out

    def starts(self, cell):
        return [r for r in rl.read_jsonl(self.paths(cell).attempts) if "started_at" in r]

    def state(self, cell):
        paths = self.paths(cell)
        return rl.last_state(rl.read_jsonl(paths.attempts), rl.read_json(paths.exit))

    def out(self, cell, name):
        return (Path(self.paths(cell).out) / name).read_text()

    def slot(self, cell):
        return rl.read_json(os.path.join(self.paths(cell).meta, "slot.json"))

    def queue_state(self):
        return rl.read_json(str(self.meta / "queue-state.json"))

    def log(self):
        path = self.dir / "logs" / "queue.log"
        return path.read_text() if path.exists() else ""


def most_at_once(intervals):
    return max(sum(1 for s, e in intervals if s <= t < e) for t, _e in intervals)


def test_the_queue_runs_every_cell_once_on_its_slot_and_leaves_a_failed_cell_failed_until_retried(tmp_path):
    cells = {"abl--seed=0": command(0), "abl--seed=1": command(1), "abl--seed=2": command(0)}
    sweep = Sweep(tmp_path, cells, ["0", "1"])
    began = time.time()
    rc, out = sweep.run_queue()
    assert rc == 0, out + sweep.log()

    for cell in cells:
        (start,) = sweep.starts(cell)  # exactly one attempt each
        slot = sweep.slot(cell)
        assert start["attempt"] == 1 and start["detach"] == "sweep-queue"
        assert slot["generation"] == 1 and slot["slot"] in (0, 1)
        assert slot["devices"] == ["0", "1"][slot["slot"]]
        # the job saw exactly its slot's GPUs
        assert sweep.out(cell, "devices") == slot["devices"] == start["devices"]
        assert "started %s on slot %d (CUDA_VISIBLE_DEVICES=%s)" % (cell, slot["slot"], slot["devices"]) \
            in sweep.log()
    assert {c: sweep.state(c) for c in cells} == {"abl--seed=0": "finished", "abl--seed=1": "failed",
                                                  "abl--seed=2": "finished"}
    # two slots: never three cells at once, and the two that overlapped had different GPUs
    spans = {c: (float(sweep.out(c, "start")), float(sweep.out(c, "end"))) for c in cells}
    assert all(began <= s < e for s, e in spans.values())
    assert most_at_once(list(spans.values())) <= 2
    # the first two cells in roster order took the two slots, lowest first
    assert (sweep.slot("abl--seed=0")["slot"], sweep.slot("abl--seed=1")["slot"]) == (0, 1)
    for a in cells:
        for b in cells:
            if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]:
                assert sweep.slot(a)["slot"] != sweep.slot(b)["slot"]
    # the first two cells in roster order went first; the third waited for a slot
    third = spans["abl--seed=2"][0]
    assert third >= min(spans["abl--seed=0"][1], spans["abl--seed=1"][1])
    state = sweep.queue_state()
    assert state["ended"] is True and state["pending"] == [] and state["running"] == []
    assert state["generation"] == 1 and state["pid"] is None
    assert "queue done" in sweep.log()

    # `rgt-run retry`: retry.json names the failed attempt, the command now succeeds, a new generation
    failed = sweep.paths("abl--seed=1")
    rl.atomic_write_json(os.path.join(failed.meta, "retry.json"), {"after_attempt": 1})
    sweep.write_job("abl--seed=1", command(0, sleep=0.2))
    sweep.bump()
    rc, out = sweep.run_queue()
    assert rc == 0, out + sweep.log()
    assert [r["attempt"] for r in sweep.starts("abl--seed=1")] == [1, 2]
    assert sweep.state("abl--seed=1") == "finished" and sweep.slot("abl--seed=1")["generation"] == 2
    for cell in ("abl--seed=0", "abl--seed=2"):  # finished cells are never started again
        assert len(sweep.starts(cell)) == 1 and sweep.slot(cell)["generation"] == 1
    log = sweep.log()
    assert log.count("started abl--seed=1 on slot") == 2
    assert log.count("started abl--seed=0 on slot") == 1 and log.count("started abl--seed=2 on slot") == 1
    assert sweep.queue_state()["ended"] is True and sweep.queue_state()["generation"] == 2

    # a third queue with nothing to do: no cell starts (attempt 2 of seed=1 finished; the old retry.json is spent)
    rc, out = sweep.run_queue()
    assert rc == 0 and [len(sweep.starts(c)) for c in cells] == [1, 2, 1]


def test_a_second_queue_of_the_sweep_exits_at_once_and_starts_nothing(tmp_path):
    sweep = Sweep(tmp_path, {"abl--seed=0": command(0)}, ["0"])
    with open(sweep.meta / "queue.lock", "a+") as handle:  # the queue that runs holds the sweep's lock
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        t0 = time.time()
        rc, out = sweep.run_queue(timeout=20)
    assert rc == 0 and "already running" in out and time.time() - t0 < 10
    assert sweep.starts("abl--seed=0") == [] and sweep.queue_state() is None
    assert not os.path.exists(os.path.join(sweep.paths("abl--seed=0").meta, "slot.json"))


def _until_idle(queue, limit_s=30):
    deadline = time.time() + limit_s
    while queue.tick():
        assert time.time() < deadline, "the queue kept running"
        time.sleep(0.1)


def test_a_cell_that_stops_is_started_again_only_in_a_new_generation(tmp_path):
    """The queue starts a cell at most once per generation: a cell stopped mid-run is not restarted blindly; a
    launch that rewrites queue.json (a new generation) lets it start once more."""
    sweep = Sweep(tmp_path, {"abl--seed=0": "exit 143"}, ["0"])  # bash's report of a command stopped by SIGTERM
    queue = q.Queue(str(sweep.dir))
    _until_idle(queue)
    assert [r["attempt"] for r in sweep.starts("abl--seed=0")] == [1] and sweep.state("abl--seed=0") == "preempted"
    assert queue.tick() is False and len(sweep.starts("abl--seed=0")) == 1  # same generation: left as it is
    assert sweep.queue_state()["pending"] == [] and sweep.queue_state()["running"] == []
    sweep.bump()
    _until_idle(queue)
    assert [r["attempt"] for r in sweep.starts("abl--seed=0")] == [1, 2]
    assert sweep.slot("abl--seed=0")["generation"] == 2 and sweep.queue_state()["generation"] == 2
    assert "queue.json changed (generation 2)" in sweep.log()


def test_a_slot_held_by_a_live_cell_of_an_earlier_queue_stays_busy(tmp_path):
    """A cell started by an earlier queue keeps its slot while its wrapper lives (its slot.json names it): the
    queue puts the next cell on another slot and reports the live cell as running."""
    sweep = Sweep(tmp_path, {"abl--seed=0": command(0), "abl--seed=1": command(0, sleep=0.2)}, ["0", "1"])
    live = sweep.paths("abl--seed=0")
    rl.atomic_write_json(os.path.join(live.meta, "slot.json"), {"slot": 0, "devices": "0", "generation": 0})
    queue = q.Queue(str(sweep.dir))
    with open(live.lock, "a+") as handle:  # its wrapper is alive
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert queue.tick() is True
        assert sweep.slot("abl--seed=1")["slot"] == 1 and sweep.slot("abl--seed=1")["devices"] == "1"
        assert "abl--seed=0" in sweep.queue_state()["running"]
        assert sweep.starts("abl--seed=0") == []  # the live cell was not started a second time
        deadline = time.time() + 20
        while sweep.state("abl--seed=1") != "finished":
            assert time.time() < deadline
            time.sleep(0.1)
        assert queue.tick() is True  # seed=0 still lives: the queue waits for it
    _until_idle(queue)  # once its wrapper is gone (never ran: state never), this generation may start it
    assert sweep.out("abl--seed=1", "devices") == "1" and sweep.out("abl--seed=0", "devices") == "0"
    assert [len(sweep.starts(c)) for c in sweep.cells] == [1, 1]


def test_cells_a_stopped_queue_never_started_are_not_started_and_say_why_not_dead(tmp_path):
    """The box's status of a cell whose queue died before starting it (a stop signal, a kill, a restart): it never
    ran, so it is not_started (the runner tallies it missing and watch starts the queue again), never dead."""
    import signal

    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_statusdoc

    sweep = Sweep(tmp_path, {"abl--seed=0": command(0, sleep=60), "abl--seed=1": command(0)}, ["0"])
    for cell in sweep.cells:  # the launch marks each cell as its sweep's (status finds the queue through it)
        rl.atomic_write_json(os.path.join(sweep.paths(cell).meta, "sweep.json"),
                             {"sweep": SWEEP, "sweep_dir": str(sweep.dir)})
    proc = subprocess.Popen([sys.executable, str(sweep.meta / "queue.py"), str(sweep.dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    first = sweep.paths("abl--seed=0")
    try:
        deadline = time.time() + 30
        while not rl.lock_held(first.lock):
            assert time.time() < deadline and proc.poll() is None, sweep.log()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # the queue is stopped; its running cell's wrapper lives on
        assert proc.wait(timeout=20) == 0
        assert sweep.queue_state()["stopped_by"] == signal.SIGTERM
        assert sweep.queue_state()["pending"] == ["abl--seed=1"]

        def look(cell):
            return rgt_statusdoc.status_document({"durable_root": sweep.root, "project": PROJECT, "run_id": cell,
                                                  "mounts": [sweep.root], "history_kb": 0})

        waiting = look("abl--seed=1")
        assert waiting["state"] == "not_started" and waiting["queue_alive"] is False, waiting
        assert waiting["sweep"] == SWEEP and "stopped by signal 15" in waiting["queue_reason"]
        assert "rgt-run watch" in waiting["queue_reason"]
        assert not any("no wrapper ever recorded" in w for w in waiting["warnings"])
        assert look("abl--seed=0")["state"] == "running"
        # the box restarted: the queue left no word at all
        os.unlink(str(sweep.meta / "queue-state.json"))
        assert "gone without a word" in look("abl--seed=1")["queue_reason"]
        # a cell whose wrapper a queue did start, and that never recorded anything, did die
        rl.atomic_write_json(os.path.join(sweep.paths("abl--seed=1").meta, "slot.json"), {"slot": 0})
        assert look("abl--seed=1")["state"] == "dead"
    finally:
        if proc.poll() is None:
            proc.kill()
        pid = rl.read_json(first.pid) or {}
        for key in ("job_pid", "wrapper_pid"):
            try:
                os.killpg(int(pid[key]), signal.SIGKILL) if key == "job_pid" else os.kill(int(pid[key]), 9)
            except (KeyError, TypeError, ValueError, OSError):
                pass
