# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The remote run layout (docs/internals.md "Run spine"): paths, atomic JSON, liveness, checkpoints.

Shared by the launch module, the status module and the wrapper's own copy of the same rules. Runs on the box
(Python 3.6+, stdlib only). Imports rgt_states, the run-state vocabulary (a bundle carries it beside this file)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import fnmatch
import json
import os
import pwd
import re
import sys
import tempfile
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_states

NOT_COMPLETE_SUFFIXES = (".tmp", ".partial", ".part", ".incomplete")

# The one rule for every name a path or a session is built from (docs/internals.md "Names"): a run id, a project,
# an inventory host name, an instance id. Matched in full (a trailing newline is refused, unlike `^...$`), first
# character alphanumeric (so `.`, `..`, `.partial`, `-x` are out), at most NAME_MAX characters.
NAME_MAX = 128
_NAME_RES = {
    # '=' for a sweep cell's run id (<name>--lr=3e-4--seed=1, module_utils rgt_sweep)
    "run id": re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,%d}" % (NAME_MAX - 1)),
    "project": re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,%d}" % (NAME_MAX - 1)),
    "host name": re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,%d}" % (NAME_MAX - 1)),
    "instance id": re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,%d}" % (NAME_MAX - 1)),
}
NAME_RULE = {
    "run id": "letters, digits, '.', '_', '-' and '=', starting with a letter or digit, at most %d characters"
              % NAME_MAX,
    "project": "letters, digits, '.', '_' and '-', starting with a letter or digit, at most %d characters" % NAME_MAX,
    "host name": "letters, digits, '.', '_', '-', ':' and '@', starting with a letter or digit, at most %d "
                 "characters" % NAME_MAX,
    "instance id": "letters, digits, '.', '_', '-', ':' and '@', starting with a letter or digit, at most %d "
                   "characters" % NAME_MAX,
}


def check_name(value, what="run id"):
    """None when `value` is a valid `what` (run id, project, host name, instance id), else the reason."""
    if not isinstance(value, str):
        return "%s must be a string, got %s" % (what, type(value).__name__)
    if _NAME_RES[what].fullmatch(value) is None:
        return "%s %r is not allowed: use %s" % (what, value, NAME_RULE[what])
    return None


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(name):
    """None when `name` can be an environment variable name (POSIX: letters, digits, '_', not starting with a
    digit), else the reason."""
    if not isinstance(name, str) or ENV_NAME_RE.fullmatch(name) is None:
        return ("environment variable name %r is not allowed: use letters, digits and '_', not starting with a "
                "digit (e.g. MY_SETTING)" % (name,))
    return None


# ---- the environment a job starts from (docs/internals.md "Job environment"): the login environment minus rgt's own

# Variables rgt and the tools it runs (Ansible, ansible-runner, tmux) put in the environment of its own processes.
# On the local connection the launch inherits them from rgt-run, and a tmux server started by a launch keeps them for
# every later session: none of them is the job's. (A job that needs one names it in rgt_job.env.)
OWN_ENV_PREFIXES = ("ANSIBLE_",)
RUNNER_PREFIX_ENV = "RGT_RUNNER_PREFIX"  # the runner's own virtual environment, named by rgt-run for its plays
OWN_ENV_NAMES = ("TMUX", "TMUX_PANE", "AWX_ISOLATED_DATA_DIR", "RUNNER_OMIT_EVENTS", "RUNNER_ONLY_FAILED_EVENTS",
                 "ORIGINAL_STDOUT_CALLBACK", "AD_HOC_COMMAND_ID", RUNNER_PREFIX_ENV)


def is_venv(prefix):
    """A virtual environment's prefix (venv, virtualenv, pipx: a pyvenv.cfg at its top). A system prefix (/usr) is
    never one: its bin dir belongs to everybody, so nothing under it is ever taken for rgt's own."""
    return bool(prefix) and os.path.isabs(prefix) and os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))


def own_prefixes(environ=None):
    """The virtual environments rgt itself runs from here: this interpreter's (the module's; on the local
    connection, the runner's own) and the runner's, which rgt-run names in RGT_RUNNER_PREFIX. Normalised, in that
    order, each once; [] when neither is a virtual environment."""
    environ = os.environ if environ is None else environ
    out = []
    for prefix in (sys.prefix, environ.get(RUNNER_PREFIX_ENV)):
        if prefix and is_venv(prefix) and os.path.normpath(prefix) not in out:
            out.append(os.path.normpath(prefix))
    return out


def _under(path, prefix):
    """`path` is `prefix` or inside it, as written or once symlinks are resolved."""
    for one, root in ((os.path.normpath(path), prefix), (os.path.realpath(path), os.path.realpath(prefix))):
        if one == root or one.startswith(root.rstrip("/") + "/"):
            return True
    return False


def job_base_env(environ, python, own=()):
    """The environment a job starts from (the wrapper adds the rgt contract, the job env and the secrets; env_check
    probes the interpreter in it): `environ`, the login environment, minus rgt's own (OWN_ENV_NAMES, every
    ANSIBLE_* variable, and under `own`, the virtual environments rgt runs from: their PATH and PYTHONPATH entries,
    a VIRTUAL_ENV or PYTHONHOME that points into one), with the directory of `python` (the absolute rgt_job.python)
    first on PATH, so that `python` in the command is looked up there first: the job runs the interpreter env_check
    examined. A VIRTUAL_ENV that holds the declared interpreter is kept. A new dict; `environ` is not changed."""
    own = [os.path.normpath(p) for p in own or () if p and os.path.isabs(p)]
    bindir = os.path.dirname(os.path.normpath(python)) if python and os.path.isabs(python) else None

    def rgts(path):
        return bool(path) and os.path.isabs(path) and any(_under(path, p) for p in own)

    env = dict((k, v) for k, v in environ.items()
               if k not in OWN_ENV_NAMES and not k.startswith(OWN_ENV_PREFIXES))
    if "PATH" in env or bindir:
        entries = env["PATH"].split(os.pathsep) if env.get("PATH") else []
        kept = [e for e in entries if not rgts(e) and (bindir is None or os.path.normpath(e) != bindir)]
        env["PATH"] = os.pathsep.join(([bindir] if bindir else []) + kept)
    entries = env["PYTHONPATH"].split(os.pathsep) if env.get("PYTHONPATH") else []
    if any(rgts(e) for e in entries):
        kept = [e for e in entries if not rgts(e)]
        if any(kept):
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    if rgts(env.get("PYTHONHOME")):
        del env["PYTHONHOME"]
    venv = env.get("VIRTUAL_ENV")
    if rgts(venv) and not (python and _under(python, venv)):
        del env["VIRTUAL_ENV"]
    return env


def command_script(command, prelude=None):
    """The bash script a job command runs as, the same for the launch and the smoke.

    The prelude lines (proxy hook, secrets, cd) come first; then `set -o pipefail`; stop signals are trapped so
    that bash waits for the foreground command (the wrapper sends them to the whole process group, so the
    command gets them itself and can checkpoint) and then exits with that command's status, running nothing
    after it; then the command exactly as written:
    `a && b`, `a; b`, pipes and multi-line scripts run whole, and the exit status is the whole line's (for a
    pipe, its last failing part's)."""
    lines = list(prelude or [])
    lines += ["set -o pipefail", "trap 'exit $?' TERM INT HUP", command]
    return "\n".join(lines)


def session_name(project, run_id):
    """The tmux session of one run: one-to-one with (project, run id). tmux turns '.' and ':' into '_' (so
    `a.b` and `a_b` would share a session): '.' becomes '+', and '/' separates the two; neither is allowed in
    a name, so two different runs never get the same session."""
    return "rgt-%s/%s" % (project.replace(".", "+"), run_id.replace(".", "+"))


# ---- paths on the box (docs/internals.md "Paths on the box"): the one expansion and the one relative-path rule


def login_user():
    """The user this process runs as on the box: what `{user}` means in a profile (its uid's name, else the uid)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def expand_user(text, user=None, home=None):
    """`{user}` -> the login user (login_user() unless given), then a leading `~` or `~/` -> the login user's home
    (`home`, else this process's ~). Nothing else changes: `~other/x` and a `~` inside the text stay as written.
    For profile values that are not necessarily paths (network.env); paths use expand_root."""
    if not text:
        return text
    if "{user}" in text:
        text = text.replace("{user}", login_user() if user is None else user)
    if text == "~" or text.startswith("~/"):
        text = (home or os.path.expanduser("~")).rstrip("/") + text[1:] or "/"
    return text


def expand_root(path, user=None, home=None):
    """A profile or job path on the box: expand_user, then os.path.normpath (no trailing or doubled '/')."""
    path = expand_user(path, user, home)
    return os.path.normpath(path) if path else path


def check_relpath(path):
    """None when `path` is a safe relative POSIX path (joined under a root, it stays inside it and names the same
    file on every machine), else the reason. The one rule for declared outputs and checkpoints, manifest entries
    (capsule and code tree) and the runner's job-spec check: no absolute path or drive prefix (`C:`), no
    backslash or NUL, no empty, '.' or '..' component."""
    if not isinstance(path, str) or not path:
        return "empty or non-string path"
    if path.startswith("/") or path.startswith("\\") or re.match(r"^[A-Za-z]:", path):
        return "absolute path"
    if "\\" in path or "\x00" in path:
        return "backslash or NUL in path"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "empty, '.' or '..' component"
    return None


class RunPaths(object):
    """Every path of one run, from <durable_root>/<project>/active/<run_id>. Refuses (ValueError) a project or
    run id that is not a plain name, before any path is built from it."""

    def __init__(self, durable_root, project, run_id):
        for value, what in ((project, "project"), (run_id, "run id")):
            problem = check_name(value, what)
            if problem:
                raise ValueError(problem)
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
        self.budget_stop = os.path.join(self.meta, "BUDGET_STOP")  # beside PREEMPT: the stop is the budget's
        self.uploads = os.path.join(self.meta, "uploads.jsonl")
        self.inbox_stop = os.path.join(self.meta, "inbox_stop.json")  # what the box did of its own meter (rgt_inbox)
        self.export_dir = os.path.join(self.project_dir, "export")
        self.partial_dir = os.path.join(self.export_dir, ".partial")
        self.quarantine_dir = os.path.join(self.project_dir, "quarantine")

    def code_dir(self, hash8):
        return os.path.join(self.run_dir, "code-%s" % hash8)

    def session(self):
        """tmux session name of this run (session_name)."""
        return session_name(self.project, self.run_id)

    def sweep_dir(self, name):
        """<durable_root>/<project>/sweeps/<name>: a sweep's code, data, roster and queue on this box (its cells
        are runs under active/). roles/upload_resume's upload_resume_dir spells the same path in Jinja."""
        return os.path.join(self.project_dir, "sweeps", name)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


READ_CHUNK = 1 << 20  # 1 MiB: every file rgt hashes is read in these


def read_blocks(path):
    """The file's bytes in READ_CHUNK blocks (hashing a file of any size in constant memory)."""
    with open(path, "rb") as handle:
        while True:
            block = handle.read(READ_CHUNK)
            if not block:
                return
            yield block


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


def install(path, data, mode):
    """Write `data` (bytes or text) to `path` atomically when its bytes differ, else fix the mode only; True when
    something changed. None writes nothing. The launch's wrapper files and the Kubernetes stage's."""
    if data is None:
        return False
    if not isinstance(data, bytes):
        data = data.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            same = handle.read() == data
        if same:
            if (os.stat(path).st_mode & 0o7777) == mode:
                return False
            os.chmod(path, mode)
            return True
    except (IOError, OSError):
        pass
    atomic_write(path, data, mode)
    return True


def install_bundle(directory, files, entry):
    """Install a flat bundle of box-side code (module_utils/rgt_bundle: a script and the module_utils it imports,
    side by side) into `directory`: `files` {name: text or bytes}, the entry script `entry` first (mode 0755), then
    the others in name order (0644), each with `install` (written atomically, only when its bytes differ).
    [(name, changed)]. ValueError, nothing written, for a name that is not a plain file name or an entry the files
    lack. The launch's wrapper and queue, the Kubernetes stage's wrapper, the closeout's checkpoint loader."""
    for name in files:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name or \
                name.startswith("."):
            raise ValueError("%r is not a plain file name: a bundle is one directory of files" % (name,))
    if entry not in files:
        raise ValueError("the bundle has no entry %r (it holds %s)" % (entry, ", ".join(sorted(files)) or "nothing"))
    return [(name, install(os.path.join(directory, name), files[name], 0o755 if name == entry else 0o644))
            for name in [entry] + sorted(n for n in files if n != entry)]


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


def lock_held(lock_path):
    """True when another process holds the run's flock (the wrapper holds it for its whole life)."""
    if not os.path.exists(lock_path):
        return False
    try:
        handle = open(lock_path, "a+")
    except (IOError, OSError):
        return False
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (IOError, OSError):
        return True  # held (EAGAIN), or flock unsupported here: never take a run for dead on a guess
    finally:
        handle.close()  # closing releases a lock we may have taken
    return False


LOCK_RETRY_S = 1.0  # how long a held flock is tried again: a look at it (lock_held) holds it for an instant


def take_lock(lock_path, retry_s=LOCK_RETRY_S):
    """Take the exclusive flock a process holds for its whole life (a run's wrapper: .rgt/lock; a sweep's queue:
    queue.lock): the open handle (keep it open), or None when another process holds it. A look at the lock
    (lock_held, from status, a launch or a queue) holds it for an instant, so it is tried again for `retry_s`
    before the holder is taken for live."""
    handle = open(lock_path, "a+")
    deadline = time.time() + retry_s
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except (IOError, OSError) as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                handle.close()
                raise
        if time.time() > deadline:
            handle.close()
            return None
        time.sleep(0.02)


def last_state(records, exit_doc):
    """How a run that is not live ended: never | finished | failed | preempted | budget_stopped | killed | dead.
    `records` are attempts.jsonl's lines, `exit_doc` is exit.json.

    The last attempt's exit record decides; when exit.json is missing or older than the last attempt (a wrapper
    that could not write it: a full disk), that attempt's end line in attempts.jsonl decides instead (the wrapper
    writes it first). Started with neither is `dead`: the wrapper vanished (SIGKILL, OOM, reboot)."""
    end = last_end(records, exit_doc)
    if end is None:
        starts = [r for r in records if "started_at" in r]
        return "dead" if starts else "never"
    return end.get("reason") or "dead"


# What starts a run that is not live again (docs/job-spec.md "How a run ends"), one rule for a single run and a
# sweep cell: a run that never ran, was preempted or died (its wrapper vanished) starts again with `rgt-run train`
# (a preempted one also with `rgt-run watch` when the job says auto_resume); a failed or killed one (what status
# shows as failed) only with `rgt-run retry`; a finished one never. The groups are rgt_states'.
def request_budget_stop(paths, marker):
    """Ask the run's job to checkpoint and stop because its budget is spent: the budget marker (`marker`, JSON,
    atomic) first, then RGT_PREEMPT_FILE (the job polls it; the wrapper ends the attempt `budget_stopped` when
    both are there: rgt_wrapper.classify). Returns False when the run has no job.json (nothing to stop)."""
    if not os.path.isfile(paths.job):
        return False
    atomic_write_json(paths.budget_stop, marker)
    with open(paths.preempt, "a") as handle:
        handle.write("budget %s\n" % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        handle.flush()
        os.fsync(handle.fileno())
    return True


MOVED_MARK = "moved.json"  # <run_dir>/.rgt/moved.json: the fence of `rgt-run move` (rgt.move.FENCE_PY writes it)


def generation_of(job_doc):
    """The run generation a job.json was written for: its env's RGT_GENERATION (1 for a run never moved)."""
    try:
        return int(((job_doc or {}).get("env") or {}).get("RGT_GENERATION") or 1)
    except (TypeError, ValueError, AttributeError):
        return 1


def fenced(paths):
    """The fence mark of a run dir whose run `rgt-run move` took to another box ({moved_to, generation, at}), when
    it is newer than the generation its job.json was written for; else None. A fenced run dir never starts an
    attempt again (the wrapper, a sweep's queue and launch): the run lives on `moved_to`."""
    mark = read_json(os.path.join(paths.meta, MOVED_MARK))
    if not isinstance(mark, dict):
        return None
    try:
        newer = int(mark.get("generation") or 0) > generation_of(read_json(paths.job))
    except (TypeError, ValueError):
        newer = True
    return mark if newer else None


# A run moved back to a box it once left (A -> B -> A): the run dir there still holds what its older generation
# wrote, maybe checkpoints its stale attempt made after the run left. `rgt-run move` sets that generation's
# checkpoints and offload records aside (moved, never deleted) before it places the checkpoint it verified, so the
# new attempt resumes from that one (rgt.move.set_aside, through the status round's `supersede`).
SUPERSEDED_DIR = "superseded"  # <run_dir>/superseded/gen<N>-<UTC>/: what generation N left there
SUPERSEDED_MARK = "superseded.json"  # <run_dir>/.rgt/superseded.json: the generation the last set-aside made room for
STALE_PARTS = ("ckpt", "offload.jsonl")  # rgt_offload.RECORDS: an older generation's checkpoints and their copies


def set_aside_stale(paths, generation, now=None):
    """Before generation `generation` of a run is launched in `paths`' run dir: when an older generation left it
    (its job.json), that generation's ckpt/ and offload.jsonl are moved into <run_dir>/superseded/gen<N>-<UTC>/
    and .rgt/superseded.json records it. Idempotent: a run dir whose generation (job.json, or an earlier set-aside
    for it, the mark) is not older is left as it is, so a move run again never sets aside the checkpoint it placed.
    ValueError when that older generation's wrapper is still alive there (fence it first). Returns {run_dir,
    generation (the run dir's, None when no attempt ran there), set_aside (the directory, or None), moved}."""
    out = {"run_dir": paths.run_dir, "generation": None, "set_aside": None, "moved": []}
    job = read_json(paths.job)
    if not isinstance(job, dict):
        return out  # no attempt ran here: a checkpoint in ckpt/ can only be the one a move placed
    out["generation"] = old = generation_of(job)
    mark = read_json(os.path.join(paths.meta, SUPERSEDED_MARK))
    done = mark.get("generation") if isinstance(mark, dict) and isinstance(mark.get("generation"), int) else 0
    if max(old, done) >= int(generation):
        return out
    if lock_held(paths.lock):
        raise ValueError("the attempt of generation %d still runs in %s: it must be stopped first (rgt-run watch "
                         "fences it once the box answers)" % (old, paths.run_dir))
    parts = [p for p in STALE_PARTS if os.path.lexists(os.path.join(paths.run_dir, p))]
    if parts:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        dest = base = os.path.join(paths.run_dir, SUPERSEDED_DIR, "gen%d-%s" % (old, stamp))
        n = 1
        while os.path.lexists(dest):
            n += 1
            dest = "%s-%d" % (base, n)
        os.makedirs(dest)
        for part in parts:
            os.rename(os.path.join(paths.run_dir, part), os.path.join(dest, part))
        fsync_dir(dest)
        fsync_dir(paths.run_dir)
        out.update(set_aside=dest, moved=parts)
    atomic_write_json(os.path.join(paths.meta, SUPERSEDED_MARK),
                      {"generation": int(generation), "from_generation": old, "set_aside": out["set_aside"],
                       "moved": parts, "at": time.time() if now is None else now})
    return out


def free_gib(path):
    """(free GiB for an unprivileged writer, the directory measured): `path`, or its nearest parent that exists."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe or "/")
    return st.f_bavail * st.f_frsize / float(1 << 30), probe


def spare_check(durable_root):
    """Could a run start under `durable_root` here (`rgt-run watch` looks at a spare before it moves a run there):
    {root, measured (the root, or its nearest parent that exists: a spare may not have made it yet), writable,
    free_gib, why (None, or why a file cannot be made there)}. Writes one empty file there and removes it."""
    root = expand_root(durable_root)
    free, measured = free_gib(root)
    out = {"root": root, "measured": measured, "writable": False, "free_gib": round(free, 3), "why": None}
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rgt-spare-", dir=measured)
        os.close(fd)
        os.unlink(tmp)
        out["writable"] = True
    except (IOError, OSError) as exc:
        out["why"] = "%s: %s" % (measured, exc.strerror or exc)
    return out


def attempts_before(job):
    """The attempts a moved run had on its earlier boxes (`rgt-run move` puts RGT_ATTEMPTS_BEFORE in its env), 0."""
    try:
        return max(0, int(((job or {}).get("env") or {}).get("RGT_ATTEMPTS_BEFORE") or 0))
    except (TypeError, ValueError, AttributeError):
        return 0


def last_attempt(records, before=0):
    """The highest attempt number started (attempts.jsonl's start lines), at least `before`: the attempts of the
    run on the boxes it lived on before a move (RGT_ATTEMPTS_BEFORE), so numbering goes on across boxes."""
    numbers = [r.get("attempt") for r in records if "started_at" in r and isinstance(r.get("attempt"), int)]
    return max(numbers + [int(before or 0)])


# A sweep held at its budget (rgt.budget: watch at 100% of a sweep's budget_usd): <sweep_dir>/.rgt/BUDGET_STOP, the
# budget marker, written atomically before the sweep's running cells are asked to stop. The sweep's queue starts no
# cell while it is there (rgt_queue), nor does a launch (rgt_launchsweep.budget_hold); status shows the cells it
# holds budget_stopped (rgt_reconcile.with_budget_hold). `rgt-run retry` with a higher budget_usd removes it.
SWEEP_BUDGET_STOP = "BUDGET_STOP"


def sweep_hold_path(sweep_dir):
    return os.path.join(sweep_dir, ".rgt", SWEEP_BUDGET_STOP)


def budget_held(sweep_dir):
    """The budget marker holding this sweep (a dict; {} when unreadable), or None when the sweep is not held."""
    path = sweep_hold_path(sweep_dir)
    if not os.path.lexists(path):
        return None
    doc = read_json(path)
    return doc if isinstance(doc, dict) else {}


def hold_sweep(sweep_dir, marker):
    """Hold a sweep at its budget: the marker, atomically, in <sweep_dir>/.rgt. False when the sweep has no
    directory on this box (nothing of it was laid out here)."""
    if not os.path.isdir(sweep_dir):
        return False
    meta = os.path.join(sweep_dir, ".rgt")
    if not os.path.isdir(meta):
        os.makedirs(meta)
    atomic_write_json(sweep_hold_path(sweep_dir), marker)
    return True


def release_sweep(sweep_dir):
    """Remove the sweep's budget marker (a retry with a higher budget); True when there was one."""
    try:
        os.unlink(sweep_hold_path(sweep_dir))
        return True
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
        return False


def may_start(state, retry=False):
    """Whether a run that is not live, in `state` (last_state's word), starts now: never ran, preempted or dead
    always (rgt_states.STARTABLE); failed, killed or budget_stopped only on a retry, the user's word
    (rgt_states.RETRY_ENDS); finished never."""
    if state in rgt_states.STARTABLE:
        return True
    return bool(retry) and state in rgt_states.RETRY_ENDS


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


def job_document(paths, job, code_dir, omp, python, secrets_file, env, proxy_hook, grace_s, launched_at=None):
    """The run's .rgt/job.json (the wrapper's whole input, docs/internals.md "Run spine"), one home for every
    launcher: the launch module on a box and the Kubernetes stage (built on the controller, installed by
    rgt_k8s_stage.py). `paths` is the run's RunPaths, `job` the job spec (rgt_job, a sweep cell's own), `env` the
    job's environment already merged and expanded by the caller (profile network env, then rgt_job.env), `omp` the
    OMP_NUM_THREADS or None, `secrets_file` the file bash sources or None, `launched_at` an ISO time (default now).
    Pure: nothing is read or written."""
    checkpoint = job.get("checkpoint") or {}
    return {
        "schema": 1,
        "run_id": paths.run_id,
        "project": paths.project,
        "run_dir": paths.run_dir,
        "session": paths.session(),
        "command": job["command"],
        "python": python,
        "code_dir": code_dir,
        "env": dict(env or {}),
        "secrets_file": secrets_file,
        "proxy_hook": proxy_hook or None,
        "grace_s": grace_s,
        "ckpt_glob": checkpoint.get("glob") or "*",
        "outputs": list(job.get("outputs") or []),
        # the job's own regexes only: the status reads job.log with rgt_reconcile's built-in rules where none is set
        "log_patterns": dict(job.get("log_patterns") or {}),
        "metrics": job.get("metrics"),
        "expected_duration_s": job.get("expected_duration_s"),
        "price_per_hour": job.get("price_per_hour"),
        "budget_usd": job.get("budget_usd"),  # watch's budget (rgt.budget); a retry writes the raised one
        "heartbeat_interval_s": job.get("heartbeat_interval_s") or 5,
        "gpu_sample_interval_s": job.get("gpu_sample_interval_s") or 30,
        "stall_after_s": job.get("stall_after_s") or 600,
        "omp_num_threads": omp,
        "launched_at": launched_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "attempt_policy": {"auto_resume": bool(job.get("auto_resume", False))},
        "offload": job.get("offload") or None,  # the wrapper's pusher (module_utils/rgt_offload, docs/offload.md)
    }


# argument_spec entries of the run_layout doc fragment (plugins/doc_fragments/run_layout.py)
RUN_LAYOUT_ARGS = dict(
    durable_root=dict(type="str", required=True),
    project=dict(type="str", default="rgt"),
    run_id=dict(type="str", required=True),
)


def sweep_queue(paths):
    """A sweep cell's queue as the box shows it: {sweep, sweep_dir, alive (the queue holds its flock), pending
    (cells it will still start), running, tried (a queue wrote this cell's .rgt/slot.json: it started the cell's
    wrapper at least once), ended (a queue that is not running: how it ended, from queue-state.json: "done",
    "signal <n>", or null when it left no word, e.g. killed or the box restarted), held (the budget marker holding
    the sweep, budget_held, or None)}, or None for a run that is no sweep cell (no .rgt/sweep.json)."""
    marker = read_json(os.path.join(paths.meta, "sweep.json"))
    if not isinstance(marker, dict) or not marker.get("sweep_dir"):
        return None
    meta = os.path.join(marker["sweep_dir"], ".rgt")
    alive = lock_held(os.path.join(meta, "queue.lock"))
    seen = read_json(os.path.join(meta, "queue-state.json")) or {}
    ended = None
    if not alive:
        ended = "done" if seen.get("ended") else (
            "signal %s" % seen["stopped_by"] if seen.get("stopped_by") is not None else None)
        seen = {}
    return {"sweep": marker.get("sweep"), "sweep_dir": marker["sweep_dir"], "alive": alive,
            "pending": list(seen.get("pending") or []), "running": list(seen.get("running") or []),
            "tried": os.path.exists(os.path.join(paths.meta, "slot.json")), "ended": ended,
            "held": budget_held(marker["sweep_dir"])}


def will_start(queue, run_id):
    """Does a sweep's live queue (sweep_queue's view) still mean to start this cell? Then the cell is `queued`: in
    status (rgt_reconcile.with_queue) and for the teardown gate (rgt_box_runs)."""
    return bool(queue and queue.get("alive") and run_id in (queue.get("pending") or []))


def last_end(records, exit_doc):
    """The end record of a run's last attempt: exit.json when it is that attempt's (or newer), else that attempt's
    last end line in attempts.jsonl, else None (never started, or started and vanished without a word). An end line
    with the reason `dead` is the note a later wrapper writes for a vanished attempt: it is returned as is."""
    starts = [r for r in records if "started_at" in r]
    last = max([r.get("attempt") or 0 for r in starts] or [0])
    if exit_doc and (exit_doc.get("attempt") or 0) >= last:
        return exit_doc
    if not starts:
        return None
    ends = [r for r in records if "ended_at" in r and (r.get("attempt") or 0) == last]
    return ends[-1] if ends else None
