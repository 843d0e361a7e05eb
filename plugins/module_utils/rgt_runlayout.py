# -*- coding: utf-8 -*-
"""The remote run layout (docs/internals.md "Run spine"): paths, atomic JSON, liveness, checkpoints.

Shared by the launch module, the status module and the wrapper's own copy of the same rules. Runs on the box
(Python 3.6+, stdlib only)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import json
import os
import tempfile
import time

NOT_COMPLETE_SUFFIXES = (".tmp", ".partial", ".part", ".incomplete")


def expand_root(path, user=None, home=None):
    """Expand `~` and `{user}` the way profiles write roots."""
    if not path:
        return path
    if user is None:
        import getpass
        user = getpass.getuser()
    path = path.replace("{user}", user)
    if path == "~" or path.startswith("~/"):
        path = (home or os.path.expanduser("~")) + path[1:]
    return os.path.normpath(path)


class RunPaths(object):
    """Every path of one run, from <durable_root>/<project>/active/<run_id>."""

    def __init__(self, durable_root, project, run_id):
        self.durable_root = durable_root
        self.project = project
        self.run_id = run_id
        self.project_dir = os.path.join(durable_root, project)
        self.run_dir = os.path.join(self.project_dir, "active", run_id)
        self.meta = os.path.join(self.run_dir, ".rgt")
        self.ckpt = os.path.join(self.run_dir, "ckpt")
        self.out = os.path.join(self.run_dir, "out")
        self.logs = os.path.join(self.run_dir, "logs")
        self.log = os.path.join(self.logs, "job.log")
        self.data = os.path.join(self.run_dir, "data")
        self.job = os.path.join(self.meta, "job.json")
        self.wrapper = os.path.join(self.meta, "wrapper.py")
        self.lock = os.path.join(self.meta, "lock")
        self.pid = os.path.join(self.meta, "pid")
        self.heartbeat = os.path.join(self.meta, "heartbeat")
        self.attempts = os.path.join(self.meta, "attempts.jsonl")
        self.exit = os.path.join(self.meta, "exit.json")
        self.gpu = os.path.join(self.meta, "gpu.csv")
        self.preempt = os.path.join(self.meta, "PREEMPT")
        self.uploads = os.path.join(self.meta, "uploads.jsonl")
        self.export_dir = os.path.join(self.project_dir, "export")
        self.partial_dir = os.path.join(self.export_dir, ".partial")
        self.quarantine_dir = os.path.join(self.project_dir, "quarantine")

    def code_dir(self, hash8):
        return os.path.join(self.run_dir, "code-%s" % hash8)

    def session(self):
        """tmux session name: one per run (tmux forbids '.' and ':' in names)."""
        return "rgt-" + self.run_id.replace(".", "_").replace(":", "_")


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data, mode=0o644):
    """tmp in the same directory + fsync + rename + fsync(dir): readers see the old or the new file, never half."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def atomic_write_json(path, doc, mode=0o644):
    atomic_write(path, json.dumps(doc, sort_keys=True, indent=1) + "\n", mode)


def append_jsonl(path, record):
    with open(path, "a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_json(path):
    """The document, or None when absent or unreadable (a torn write cannot happen with atomic_write)."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def read_jsonl(path):
    out = []
    try:
        with open(path) as handle:
            for line in handle:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue  # a line cut by a crash mid-append
    except (IOError, OSError):
        pass
    return out


def incarnation():
    """`<boot_id>:<start time of PID 1>`: changes on a reboot and on a container restart."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
    except (IOError, OSError):
        boot = "?"
    try:
        with open("/proc/1/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        start = fields[19]  # field 22 overall: starttime, in clock ticks since boot
    except (IOError, OSError, IndexError):
        start = "?"
    return "%s:%s" % (boot, start)


def pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except OSError as exc:
        return exc.errno == 1  # EPERM: exists, not ours
    try:  # a zombie is not alive
        with open("/proc/%d/stat" % int(pid)) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (IOError, OSError, IndexError):
        return True


def is_complete_checkpoint(name):
    return not name.startswith(".") and not name.endswith(NOT_COMPLETE_SUFFIXES)


def newest_checkpoint(ckpt_dir, pattern="*"):
    """Newest complete checkpoint (file or directory) under ckpt_dir matching pattern, by mtime then name."""
    best = None
    try:
        names = os.listdir(ckpt_dir)
    except OSError:
        return None
    for name in names:
        if not is_complete_checkpoint(name) or not fnmatch.fnmatch(name, pattern):
            continue
        path = os.path.join(ckpt_dir, name)
        try:
            key = (os.stat(path).st_mtime, name)
        except OSError:
            continue
        if best is None or key > best[0]:
            best = (key, path)
    return best[1] if best else None


def age_s(path, now=None):
    try:
        return max(0.0, (now or time.time()) - os.stat(path).st_mtime)
    except OSError:
        return None


def cgroup_oom_kills():
    """The cgroup's oom_kill counter now (v2 memory.events, v1 memory.oom_control), or None if unreadable.

    The wrapper records it at each attempt start so status can tell a new OOM kill from an old one."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == "oom_kill":
                        return int(parts[1])
        except (IOError, OSError, ValueError):
            continue
    return None


# argument_spec entries of the run_layout doc fragment (plugins/doc_fragments/run_layout.py)
RUN_LAYOUT_ARGS = dict(
    durable_root=dict(type="str", required=True),
    project=dict(type="str", default="rgt"),
    run_id=dict(type="str", required=True),
)
