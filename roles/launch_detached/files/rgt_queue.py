"""rgt sweep queue: one per sweep per box, started detached by the rgt_launch module (option `sweep`).

Usage: <python> <sweep_dir>/.rgt/queue.py <sweep_dir>

Contract: docs/internals.md "Sweeps". It holds an exclusive flock on <sweep_dir>/.rgt/queue.lock for its whole life
(a second queue exits 0 at once), and works through the cells the launch wrote into <sweep_dir>/.rgt/queue.json:
`{project, durable_root, python, cells: [run id, ...], slots: [CUDA_VISIBLE_DEVICES, ...], generation, poll_s}`.
Each cell is an ordinary run (<durable_root>/<project>/active/<cell>) whose job.json the launch wrote; the queue
starts its wrapper (<run_dir>/.rgt/wrapper.py, in a new session, output appended to logs/wrapper.log) with
RGT_SLOT_DEVICES set to a free slot, and records the slot in <run_dir>/.rgt/slot.json first.

What may start (`startable`, the rule of rgt_runlayout.may_start): a cell whose wrapper is not live (its lock) and
that never ran, or was preempted or died; a failed or killed cell only when <run_dir>/.rgt/retry.json names its last
attempt (`rgt-run retry`); a finished cell never. A slot is busy while a live cell's slot.json names it (a cell
started by an earlier queue keeps its slot) or while this queue's child on it has not exited. The queue starts each
cell at most once per generation (a launch that changes queue.json bumps it), so a cell that stops is not restarted
blindly; it writes <sweep_dir>/.rgt/queue-state.json (atomic: pending, running, generation) every poll, and exits
when nothing runs and nothing is left to start (`ended: true`). While the sweep's budget marker is there
(<sweep_dir>/.rgt/BUDGET_STOP: watch at 100% of the sweep's budget_usd) it starts nothing: the cells it would have
started are `held` in queue-state.json, not pending, and it ends once nothing runs. A stop signal (TERM, INT, HUP: a preemption) ends it
without starting anything more (`stopped_by: <signal>`, the cells it left pending); the cells get their own signal
through their wrappers.

Stdlib only, Python 3.6+. Shipped as the bundle `queue` (module_utils/rgt_bundle): this file as queue.py with
the module_utils it imports beside it, each import made flat.
"""

import os
import signal
import subprocess
import sys
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl

START_WAIT_S = 15
MAX_FAILED_TICKS = 60


def now_iso(ts=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def cell_view(paths):
    """{live, state, attempt, slot, retry}: a cell as its run dir says it is."""
    records = rl.read_jsonl(paths.attempts)
    exit_doc = rl.read_json(paths.exit)
    started = [r.get("attempt") for r in records if "started_at" in r and isinstance(r.get("attempt"), int)]
    slot = rl.read_json(os.path.join(paths.meta, "slot.json")) or {}
    retry = rl.read_json(os.path.join(paths.meta, "retry.json")) or {}
    live = rl.lock_held(paths.lock)
    return {"live": live, "state": "live" if live else rl.last_state(records, exit_doc),
            "attempt": max(started) if started else 0, "slot": slot.get("slot"),
            "retry": retry.get("after_attempt"), "moved": bool(rl.fenced(paths))}


def startable(view):
    """May this cell be started now (its wrapper is not live)?"""
    if view["live"] or view.get("moved"):  # moved: `rgt-run move` took the cell to another box (its fence)
        return False
    return rl.may_start(view["state"], view["retry"] is not None and view["retry"] == view["attempt"])


def plan_starts(cells, views, slots, busy, started):
    """[(cell, slot index)] to start now: the startable cells not yet started in this generation, in roster order,
    each on the lowest free slot. `busy` is the set of slot indexes taken."""
    free = [i for i in range(len(slots)) if i not in busy]
    out = []
    for cell in cells:
        if not free:
            break
        if cell in started or not startable(views[cell]):
            continue
        out.append((cell, free.pop(0)))
    return out


def budget_hold(sweep_dir):
    """The budget marker holding the sweep (watch at 100% of the sweep's budget_usd: rgt_runlayout.hold_sweep), or
    None: while it is there the queue starts no cell; the cells it would have started are `held`."""
    return rl.budget_held(sweep_dir)


class Queue(object):
    def __init__(self, sweep_dir):
        self.sweep_dir = sweep_dir
        self.meta = os.path.join(sweep_dir, ".rgt")
        self.spec_path = os.path.join(self.meta, "queue.json")
        self.state_path = os.path.join(self.meta, "queue-state.json")
        self.log_path = os.path.join(sweep_dir, "logs", "queue.log")
        self.children = {}  # slot index -> (cell, Popen)
        self.started = set()
        self.generation = None
        self.lock_handle = None
        self.stopping = None  # the stop signal received: start nothing more, leave the cells to their wrappers
        self.pending = []  # the cells the last tick left to start
        self.held = []  # the cells the sweep's budget marker holds (budget_hold)

    def on_stop(self, signum, _frame):
        self.stopping = signum

    def say(self, text):
        try:
            with open(self.log_path, "a") as handle:
                handle.write("%s %s\n" % (now_iso(), text))
        except (IOError, OSError):
            pass

    def take_lock(self):
        """The sweep's queue lock for the queue's whole life (rgt_runlayout.take_lock), or False when another queue
        holds it."""
        self.lock_handle = rl.take_lock(os.path.join(self.meta, "queue.lock"))
        return self.lock_handle is not None

    def paths(self, spec, cell):
        return rl.RunPaths(rl.expand_root(spec["durable_root"]), spec["project"], cell)

    def start(self, spec, paths, slot_index):
        devices = str(spec["slots"][slot_index])
        rl.atomic_write_json(os.path.join(paths.meta, "slot.json"),
                             {"slot": slot_index, "devices": devices, "queue_pid": os.getpid(),
                              "generation": self.generation, "at": now_iso()})
        for directory in (paths.logs,):
            if not os.path.isdir(directory):
                os.makedirs(directory)
        env = dict(os.environ)
        env.pop("TMUX", None)
        env.pop("TMUX_PANE", None)
        env["RGT_SLOT_DEVICES"] = devices
        env["RGT_DETACH"] = "sweep-queue"
        log = open(os.path.join(paths.logs, "wrapper.log"), "ab")
        try:
            proc = subprocess.Popen([spec["python"], paths.wrapper, paths.run_dir], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, cwd=paths.run_dir, env=env,
                                    start_new_session=True, close_fds=True)
        finally:
            log.close()
        self.children[slot_index] = (paths.run_id, proc)
        # the slot counts as busy from here on (its child), and the cell as live once its wrapper holds the lock
        deadline = time.time() + START_WAIT_S
        while time.time() < deadline and proc.poll() is None and not rl.lock_held(paths.lock):
            time.sleep(0.05)
        self.say("started %s on slot %d (CUDA_VISIBLE_DEVICES=%s), wrapper pid %d" % (
            paths.run_id, slot_index, devices, proc.pid))

    def spec_changed(self):
        """A launch wrote a new generation after this tick read queue.json: look again before ending (the launch
        saw this queue alive and started none)."""
        return (rl.read_json(self.spec_path) or {}).get("generation") != self.generation

    def tick(self):
        """One pass; False when the queue is done."""
        spec = rl.read_json(self.spec_path)
        if not spec or not spec.get("cells"):
            self.say("no usable queue.json: exiting")
            return False
        if spec.get("generation") != self.generation:
            if self.generation is not None:
                self.say("queue.json changed (generation %s): every cell may start once more" % spec["generation"])
            self.generation = spec.get("generation")
            self.started = set()
        for index, (cell, proc) in list(self.children.items()):
            if proc.poll() is not None:
                del self.children[index]
                self.say("%s on slot %d ended (wrapper rc %s)" % (cell, index, proc.returncode))
        views = dict((cell, cell_view(self.paths(spec, cell))) for cell in spec["cells"])
        busy = set(self.children)
        busy.update(v["slot"] for v in views.values() if v["live"] and isinstance(v["slot"], int))
        hold = budget_hold(self.sweep_dir)
        for cell, slot_index in [] if hold is not None else plan_starts(spec["cells"], views, spec["slots"], busy,
                                                                         self.started):
            if self.stopping:
                break
            self.started.add(cell)
            self.start(spec, self.paths(spec, cell), slot_index)
            views[cell] = cell_view(self.paths(spec, cell))
        pending = [c for c in spec["cells"] if c not in self.started and startable(views[c])]
        held, pending = (pending, []) if hold is not None else ([], pending)
        if held and held != self.held:
            self.say("the sweep's budget is spent (.rgt/%s): holding %s; `rgt-run retry` with a higher budget_usd "
                     "resumes them" % (rl.SWEEP_BUDGET_STOP, ", ".join(held)))
        self.held = held
        self.pending = pending
        running = sorted(c for c, v in views.items() if v["live"])
        running += sorted(cell for cell, _proc in self.children.values() if cell not in running)
        rl.atomic_write_json(self.state_path, {"pid": os.getpid(), "generation": self.generation,
                                               "pending": pending, "running": running, "held": held,
                                               "at": now_iso()})
        return bool(pending or running)

    def run(self):
        for directory in (self.meta, os.path.dirname(self.log_path)):
            if not os.path.isdir(directory):
                os.makedirs(directory)
        if not self.take_lock():
            print("already running: a queue holds %s/queue.lock" % self.meta)
            return 0
        self.say("queue started (pid %d)" % os.getpid())
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_stop)
        poll_s, failures = 1.0, 0
        while not self.stopping:
            try:
                if not self.tick() and not self.spec_changed():
                    break
                failures = 0
                poll_s = max(0.2, float((rl.read_json(self.spec_path) or {}).get("poll_s") or 1.0))
            except Exception as exc:  # a passing fault (a full disk) must not end the queue with cells waiting
                failures += 1
                self.say("queue tick failed (%d in a row): %r" % (failures, exc))
                if failures >= MAX_FAILED_TICKS:
                    self.say("giving up after %d failed ticks: run train again to restart the queue" % failures)
                    return 1
            time.sleep(poll_s)
        if self.stopping:  # a preemption or a stop: the cells get the same signal and record how they ended
            # the word status reads (rgt_runlayout.sweep_queue): a cell it never started is waiting, not dead
            rl.atomic_write_json(self.state_path, {"pid": None, "generation": self.generation,
                                                   "pending": self.pending, "running": [], "at": now_iso(),
                                                   "stopped_by": self.stopping})
            self.say("queue stopped by signal %d: nothing more is started; `rgt-run watch` or `rgt-run train` "
                     "starts it again" % self.stopping)
            return 0
        rl.atomic_write_json(self.state_path, {"pid": None, "generation": self.generation, "pending": [],
                                               "running": [], "held": self.held, "at": now_iso(), "ended": True})
        self.say("queue done: nothing runs and nothing is left to start")
        return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: queue.py <sweep_dir>", file=sys.stderr)
        return 2
    return Queue(os.path.abspath(argv[0])).run()


if __name__ == "__main__":
    sys.exit(main())
