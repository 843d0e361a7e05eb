"""rgt job wrapper: one instance per run, started detached (tmux or setsid) by the rgt_launch module.

Usage: <python> <run_dir>/.rgt/wrapper.py <run_dir>

Contract: docs/internals.md "Run spine". It reads <run_dir>/.rgt/job.json, holds an exclusive flock on
.rgt/lock for its whole life (a second instance prints "already running" and exits 0), numbers the attempt,
starts the job command in its own process group with the rgt job environment, records pid, heartbeat, GPU
samples and the attempt, forwards stop signals (TERM, INT, HUP) to the job's group with the grace window,
and writes .rgt/exit.json atomically when the job ends. Secrets are sourced inside bash from the secrets
file: their values never appear in any argv.

A full disk (bytes or inodes) never kills it: every record write is guarded, and .rgt/reserve (RESERVE_BYTES of
incompressible bytes, one inode), made before the job starts, is released on the first ENOSPC/EDQUOT so the end
records (final heartbeat, the attempts.jsonl end line, the job.log trailer, exit.json) still fit; the wrapper
then exits cleanly. Whatever could not be written is named on its stderr.

As a container's entrypoint (a Kubernetes Job: CONTAINER_ENV=1 in its environment) it also copies job.log to
its stdout as the job writes it (what `kubectl logs` shows), and exits with the attempt's outcome (0 finished,
the job's code when it failed, 128+n when it was stopped or killed) so the pod and the Job end the same way.

Stdlib only, Python 3.6+. Shipped as the bundle `wrapper` (module_utils/rgt_bundle): this file as wrapper.py
with the module_utils it imports beside it, each import made flat.
"""


import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from shlex import quote as shell_quote

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_inbox, rgt_offload
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_seal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GPU_FIELDS = "index,utilization.gpu,memory.used,memory.total,temperature.gpu"
GPU_HEADER = "ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c"
DEFAULTS = {"heartbeat_interval_s": 5, "gpu_sample_interval_s": 30, "grace_s": 30, "ckpt_glob": "*"}
TICK_S = 0.2
CONTAINER_ENV = "RGT_CONTAINER_ENTRYPOINT"  # set by the Kubernetes Job's pod spec (module_utils/rgt_k8s)
ECHO_CHUNK = 1 << 20  # job.log bytes copied to stdout per tick at most
# What the end records need on a full disk: a few 4 KiB blocks (heartbeat, end line, log trailer, exit.json) and
# one inode (exit.json; the heartbeat's temp file gives its inode back on rename). 64 KiB leaves room for
# filesystem metadata.
RESERVE_BYTES = 64 * 1024
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def now_iso(ts=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts if ts is not None else time.time()))


def paths_for(run_dir):
    """RunPaths of <durable_root>/<project>/active/<run_id> from the run directory itself. The path is split as
    given, never normalised (`active/..` must not turn into another directory); RunPaths refuses a project or
    run id that is not a plain name (ValueError)."""
    run_dir = run_dir.rstrip("/")
    if not os.path.isabs(run_dir):
        run_dir = os.path.join(os.getcwd(), run_dir)
    active, run_id = os.path.split(run_dir)
    project_dir, active_name = os.path.split(active)
    if active_name != "active":
        raise ValueError("%s is not <durable_root>/<project>/active/<run_id>" % run_dir)
    return rl.RunPaths(os.path.dirname(project_dir), os.path.basename(project_dir), run_id)


# ---------------------------------------------------------------- pure parts (unit tested)

def attempt_starts(records):
    return [r for r in records if "started_at" in r]


def next_attempt(records, before=0):
    """Attempt number for a new start: one more than the highest started in attempts.jsonl, or than `before` (the
    attempts the run had on its boxes before a move: RGT_ATTEMPTS_BEFORE in the job's env)."""
    return max(len(attempt_starts(records)), rl.last_attempt(records, before)) + 1


def unfinished_attempts(records):
    """Attempts with a start line but no end line (the wrapper vanished: SIGKILL, reboot, container stop)."""
    ended = set(r.get("attempt") for r in records if "ended_at" in r)
    return [r.get("attempt") for r in attempt_starts(records) if r.get("attempt") not in ended]


class LogEcho(object):
    """job.log, from where this attempt's header starts, copied to stdout as it grows (a container's log)."""

    def __init__(self, path):
        self.path = path
        try:
            self.offset = os.path.getsize(path)
        except OSError:
            self.offset = 0

    def pump(self, limit=ECHO_CHUNK):
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(limit)
            if data:
                out = getattr(sys.stdout, "buffer", None)
                (out or sys.stdout).write(data if out is not None else data.decode("utf-8", "replace"))
                sys.stdout.flush()
                self.offset += len(data)
            return len(data)
        except (OSError, ValueError):  # a log copy never kills the wrapper
            return 0


def container_exit(reason, rc, sig, stop_signal=None):
    """The entrypoint's exit code for an attempt's end: what the pod (and so the Job) reports. A stopped attempt
    is 128 + the stop signal (the wrapper's, else the job's, else SIGTERM) even when the job exited cleanly on it:
    the pod did not finish the run."""
    if reason == "finished":
        return 0
    if reason in ("preempted", "budget_stopped"):
        if stop_signal and hasattr(signal, str(stop_signal)):  # a name: "SIGTERM"
            return 128 + int(getattr(signal, str(stop_signal)))
        return 128 + int(sig or signal.SIGTERM)
    if sig:
        return min(128 + int(sig), 255)
    if isinstance(rc, int) and rc > 0:
        return min(rc, 255)
    return 1


def classify(rc, stop_signal=None, preempt_requested=False, budget_stop=False):
    """(reason, signal) for a job's end (docs/job-spec.md "How a run ends"). A death by signal n is rc < 0 from a
    process we started, or 128+n, the way bash reports a command killed by signal n (137 for the OOM killer's
    SIGKILL) and the way a job that caught a stop signal exits by convention (143 after SIGTERM, 130 after SIGINT).

    `preempted` when a stop reached the attempt, whatever rc: the wrapper got a stop signal (`stop_signal`: it
    forwarded TERM to the job), RGT_PREEMPT_FILE appeared (`preempt_requested`: the wrapper, a platform hook or the
    user asked the job to stop), or the job itself ended by a stop signal (TERM, INT, HUP: killed by it, or exited
    128+n after checkpointing on it; only the job's processes got it, e.g. a container stop or `kill` of its pid).
    `budget_stopped` when RGT_PREEMPT_FILE came with the budget marker beside it (`budget_stop`: watch stopped
    the run at its budget, rgt.budget). Otherwise rc 0 is finished, any other death by signal killed (SIGKILL,
    SIGSEGV, ...), anything else failed."""
    sig = -rc if rc is not None and rc < 0 else None
    if rc is not None and 128 < rc <= 128 + 64:
        sig = rc - 128
    if budget_stop and preempt_requested:
        return "budget_stopped", sig
    if stop_signal or preempt_requested or sig in STOP_SIGNALS:
        return "preempted", sig
    if rc == 0:
        return "finished", None
    if sig is not None:
        return "killed", sig
    return "failed", None


def start_record(job, attempt, started_at, resume_from, inc, oom_kill, environ):
    """The attempts.jsonl start line. detach: the primitive named in RGT_DETACH when rgt's batch script started the
    wrapper inside a scheduler's job (sbatch; with the Slurm job id and Slurm's restart count, which a requeue
    raises) or a sweep queue (sweep-queue; with the slot's devices), else tmux or nohup."""
    record = {"attempt": attempt, "started_at": started_at, "code_dir": job.get("code_dir"),
              "resume_from": resume_from, "incarnation": inc, "oom_kill": oom_kill,
              "detach": "tmux" if environ.get("TMUX") else "nohup",
              "session": job.get("session") if environ.get("TMUX") else None}
    if environ.get("RGT_DETACH"):
        record.update(detach=environ["RGT_DETACH"], session=None)
    if environ.get("RGT_DETACH") and environ.get("SLURM_JOB_ID"):
        record.update(slurm_job_id=environ["SLURM_JOB_ID"],
                      slurm_restart_count=int(environ.get("SLURM_RESTART_COUNT") or 0))
    if environ.get("RGT_SLOT_DEVICES") is not None:  # started by a sweep queue on this slot
        record["devices"] = environ["RGT_SLOT_DEVICES"]
    return record


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except (AttributeError, ValueError):
        return "SIG%d" % signum


def build_env(job, paths, attempt, resume_from, base_env):
    """The job's environment: the inherited (login) environment minus rgt's own, with the declared interpreter's
    directory first on PATH (rgt_runlayout.job_base_env; job.json's `rgt_prefixes` names the virtual environments
    rgt runs from), PYTHONUNBUFFERED, OMP_NUM_THREADS, job env (profile network env merged in by the launcher),
    then the RGT_* variables, which always win. Secrets are not here: bash sources the secrets file."""
    env = rl.job_base_env(base_env, job.get("python"), job.get("rgt_prefixes") or ())
    env["PYTHONUNBUFFERED"] = "1"
    threads = job.get("omp_num_threads")
    if threads:
        env["OMP_NUM_THREADS"] = str(int(threads))
    for name, value in (job.get("env") or {}).items():
        env[str(name)] = "" if value is None else str(value)
    env.update({
        "RGT_RUN_ID": str(job.get("run_id") or paths.run_id),
        "RGT_ATTEMPT": str(attempt),
        "RGT_RUN_DIR": paths.run_dir,
        "RGT_CKPT_DIR": paths.ckpt,
        "RGT_OUT_DIR": paths.out,
        "RGT_RESUME_FROM": resume_from or "",
        "RGT_PREEMPT_FILE": paths.preempt,
        "RGT_DATA_DIR": job.get("data_dir") or paths.data,
    })
    if base_env.get("RGT_SLOT_DEVICES") is not None:  # a sweep queue's slot: the GPUs this cell may see
        env["CUDA_VISIBLE_DEVICES"] = base_env["RGT_SLOT_DEVICES"]
    return env


def build_script(job):
    """The bash -c script (rgt_runlayout.command_script): proxy hook, secrets (sourced with allexport), cd to the
    code, then the command as written. Null parts are skipped; a missing secrets file or code dir stops the
    attempt before the command runs."""
    prelude = []
    if job.get("proxy_hook"):
        prelude.append(job["proxy_hook"])
    if job.get("secrets_file"):
        prelude.append("set -a; . %s || exit 98; set +a" % shell_quote(job["secrets_file"]))
    if job.get("code_dir"):
        prelude.append("cd %s || exit 97" % shell_quote(job["code_dir"]))
    return rl.command_script(job["command"], prelude)


def select_resume(job, paths):
    """Newest complete checkpoint under ckpt/ matching job.ckpt_glob, or None."""
    return rl.newest_checkpoint(paths.ckpt, job.get("ckpt_glob") or DEFAULTS["ckpt_glob"])


def append_bytes(path, data):
    """Append data to path unbuffered (a failed write leaves nothing in a buffer to fail again) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)


def ends_with_newline(path):
    """True when the file is empty, absent or unreadable, or its last byte is a newline."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return True
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return True


def gpu_rows(text, ts):
    """nvidia-smi csv,noheader,nounits rows -> gpu.csv lines (ts first); malformed rows dropped."""
    lines = []
    for row in (text or "").splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        lines.append(",".join(["%.0f" % ts] + cells))
    return lines


# ---------------------------------------------------------------- the wrapper

class Wrapper:
    def __init__(self, run_dir):
        self.paths = paths_for(run_dir)
        self.job = None
        self.proc = None
        self.pgid = None
        self.attempt = None
        self.stop_signal = None
        self.kill_deadline = None
        self.grace_s = DEFAULTS["grace_s"]
        self.lock_handle = None
        self.reserve = os.path.join(self.paths.meta, "reserve")

    # -- lock
    def take_lock(self):
        """The run's flock for the wrapper's whole life (rgt_runlayout.take_lock), or False when another wrapper
        holds it."""
        self.lock_handle = rl.take_lock(self.paths.lock)
        return self.lock_handle is not None

    # -- signals
    def on_stop(self, signum, _frame):
        if self.stop_signal:
            return  # already stopping: the grace window runs from the first signal
        self.stop_signal = signal_name(signum)
        try:
            with open(self.paths.preempt, "a") as handle:
                handle.write("%s %s\n" % (self.stop_signal, now_iso()))
        except OSError:
            pass
        self.forward_stop()

    def forward_stop(self):
        if self.proc is None or self.kill_deadline is not None:
            return
        self.kill_deadline = time.time() + self.grace_s
        self.killpg(signal.SIGTERM)

    def killpg(self, signum):
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, signum)
        except OSError:
            pass

    # -- the disk reserve and guarded writes
    def say(self, text):
        """A line on the wrapper's own stderr (tmux pane or logs/wrapper.log), never fatal."""
        try:
            sys.stderr.write("rgt wrapper: %s\n" % text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def make_reserve(self):
        """Set RESERVE_BYTES (random, so a compressing filesystem cannot shrink them) and one inode aside."""
        try:
            with open(self.reserve, "wb") as handle:
                handle.write(os.urandom(RESERVE_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
            return True
        except OSError as exc:
            self.drop_reserve()
            self.say("no disk reserve (%s): the end records may not fit if the disk fills" % exc)
            return False

    def drop_reserve(self):
        """Release the reserve; True when there was one to release."""
        try:
            os.unlink(self.reserve)
        except OSError:
            return False
        return True

    def guarded(self, what, write):
        """Run write(); on ENOSPC/EDQUOT release the reserve once and try again. Never raises: a record that
        cannot be written is named on stderr and the wrapper goes on."""
        while True:
            try:
                write()
                return True
            except OSError as exc:
                if exc.errno in DISK_FULL and self.drop_reserve():
                    self.say("disk full writing %s: released the reserve" % what)
                    continue
                self.say("could not write %s: %s" % (what, exc))
                return False

    def append_line(self, path, text):
        """Append one line that starts a line of its own: a line torn by an earlier failed write, or a job's last
        output without a newline, is ended first (so a jsonl record parses and a log marker starts its line)."""
        data = text.encode("utf-8")
        if not ends_with_newline(path):
            data = b"\n" + data
        append_bytes(path, data)

    def append_record(self, record):
        return self.guarded("the attempts.jsonl line", lambda: self.append_line(
            self.paths.attempts, json.dumps(record, sort_keys=True) + "\n"))

    # -- records
    def heartbeat(self, job_alive, guard=False):
        doc = {"ts": round(time.time(), 3), "attempt": self.attempt, "job_alive": bool(job_alive)}
        if guard:  # the final beat may use the reserve
            return self.guarded("the heartbeat", lambda: rl.atomic_write_json(self.paths.heartbeat, doc))
        try:
            rl.atomic_write_json(self.paths.heartbeat, doc)
        except OSError:
            pass  # a full disk must not kill the wrapper; the job keeps running

    def sample_gpu(self, smi):
        if not smi:
            return
        try:
            proc = subprocess.Popen([smi, "--query-gpu=" + GPU_FIELDS, "--format=csv,noheader,nounits"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
            try:
                out, _err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                return
            if proc.returncode != 0:
                return
            lines = gpu_rows(out, time.time())
            if not lines:
                return
            new = not os.path.exists(self.paths.gpu) or os.path.getsize(self.paths.gpu) == 0
            with open(self.paths.gpu, "a") as handle:
                if new:
                    handle.write(GPU_HEADER + "\n")
                handle.write("\n".join(lines) + "\n")
        except (OSError, ValueError):
            pass

    def close_previous(self, records):
        """Fold the previous attempt's exit.json into history and note attempts whose wrapper vanished."""
        previous = rl.read_json(self.paths.exit)
        ended = set(r.get("attempt") for r in records if "ended_at" in r)
        if previous and previous.get("attempt") not in ended:
            record = dict((k, previous.get(k)) for k in ("attempt", "ended_at", "rc", "signal", "reason"))
            rl.append_jsonl(self.paths.attempts, record)
            ended.add(previous.get("attempt"))
        beat = rl.read_json(self.paths.heartbeat) or {}
        for attempt in unfinished_attempts(records):
            if attempt not in ended:  # its last sign of life is the best end time known
                last = now_iso(beat["ts"]) if beat.get("attempt") == attempt and beat.get("ts") else None
                rl.append_jsonl(self.paths.attempts, {"attempt": attempt, "ended_at": last, "rc": None,
                                                      "signal": None, "reason": "dead",
                                                      "noted_at": now_iso()})
        for path in (self.paths.exit, self.paths.preempt, self.paths.budget_stop):
            try:
                os.unlink(path)
            except OSError:
                pass

    # -- offload (module_utils/rgt_offload, docs/offload.md)
    def start_offload(self, job):
        """The pusher to an rclone remote on a daemon thread of its own (a failure there is a record in
        offload.jsonl, never the job's end); (the Event that stops it, the thread, the pusher) (None, None without
        an offload to a remote)."""
        stopped = threading.Event()
        conf = rgt_offload.settings(job)
        thread = pusher = None
        if conf and rgt_offload.remote_of(conf["to"]):
            pusher = rgt_offload.Offloader(self.paths.run_dir, self.paths.project, self.paths.run_id, job,
                                           self.attempt)
            thread = threading.Thread(target=pusher.loop, args=(stopped,), name="rgt-offload")
            thread.daemon = True
            thread.start()
        return stopped, thread, pusher

    def seal_params(self, job):
        """rgt_seal.seal's options for this run: exactly what a pull's closeout passes (roles/collect), from
        job.json's `seal` (host, instance_id, job_name, declared_checkpoints, loader_python: written at launch),
        or None when job.json has none (a Kubernetes run, an older launch)."""
        conf = job.get("seal")
        if not isinstance(conf, dict) or not conf.get("host"):
            return None
        return {"durable_root": self.paths.durable_root, "project": self.paths.project,
                "run_id": self.paths.run_id, "host": conf["host"], "instance_id": conf.get("instance_id"),
                "job_name": conf.get("job_name") or self.paths.run_id, "outputs": list(job.get("outputs") or []),
                "declared_checkpoints": list(conf.get("declared_checkpoints") or []),
                "loader_python": conf.get("loader_python"), "loader": getattr(rgt_seal.mf, "__file__", None),
                "force_unfinished": False}

    def finish_offload(self, job, reason, thread, pusher):
        """After the end records, with an offload: the pusher's last round done, the last checkpoint offloaded,
        then a finished run sealed (the seal a pull's closeout would make: never over a sealed export) and its
        export offloaded and verified (OFFLOAD_VERIFIED.json). Every failure is a record; nothing raises."""
        if pusher is None:
            return
        if thread is not None:
            thread.join()
        sealed = None
        params = self.seal_params(job) if reason == "finished" else None
        if params:
            try:
                sealed = rgt_seal.seal(params)
            except rgt_seal.SealError as exc:
                pusher.record({"kind": "export", "name": self.paths.run_id, "ok": False, "verified": False,
                               "reason": "not sealed: %s" % exc.msg})
            except Exception as exc:  # a seal that broke: the pull's closeout says why again
                pusher.record({"kind": "export", "name": self.paths.run_id, "ok": False, "verified": False,
                               "reason": "seal error: %s" % exc})
        pusher.finish(sealed)

    # -- main
    def run(self):
        for directory in (self.paths.meta, self.paths.ckpt, self.paths.out, self.paths.logs):
            if not os.path.isdir(directory):
                os.makedirs(directory)
        if not self.take_lock():
            print("already running: %s holds %s" % (self.paths.run_id, self.paths.lock))
            return 0
        self.job = rl.read_json(self.paths.job)
        if not self.job or not self.job.get("command"):
            print("no usable job.json at %s" % self.paths.job, file=sys.stderr)
            return 2
        mark = rl.fenced(self.paths)
        if mark:  # `rgt-run move` took the run to another box: never a second live attempt of it
            print("not started: %s moved to %s (generation %s)" % (self.paths.run_id, mark.get("moved_to"),
                                                                 mark.get("generation")))
            return 0
        job = self.job
        self.grace_s = max(0.0, float(job.get("grace_s") or DEFAULTS["grace_s"]))
        heartbeat_s = max(0.2, float(job.get("heartbeat_interval_s") or DEFAULTS["heartbeat_interval_s"]))
        gpu_s = max(1.0, float(job.get("gpu_sample_interval_s") or DEFAULTS["gpu_sample_interval_s"]))

        for signum in STOP_SIGNALS:
            signal.signal(signum, self.on_stop)

        records = rl.read_jsonl(self.paths.attempts)
        self.attempt = next_attempt(records, rl.attempts_before(job))
        self.close_previous(records)
        resume_from = select_resume(job, self.paths)
        env = build_env(job, self.paths, self.attempt, resume_from, os.environ)
        self.make_reserve()  # before the job starts: it cannot fill this part of the disk
        started = time.time()
        inc = rl.incarnation()
        echo = LogEcho(self.paths.log) if os.environ.get(CONTAINER_ENV) == "1" else None
        self.guarded("the job.log header", lambda: self.append_line(
            self.paths.log, "== rgt attempt %d started %s resume_from=%s\n"
            % (self.attempt, now_iso(started), resume_from or "none")))
        log = open(self.paths.log, "ab")
        devnull = open(os.devnull, "rb")
        self.proc = subprocess.Popen(["bash", "-c", build_script(job)], stdin=devnull, stdout=log,
                                     stderr=subprocess.STDOUT, env=env, cwd=self.paths.run_dir,
                                     start_new_session=True, close_fds=True)
        self.pgid = self.proc.pid  # a new session: the leader's pid is the group id
        devnull.close()
        log.close()  # the job holds its own copy of the descriptor; the trailer is appended by path
        # the job runs: from here on no write may kill the wrapper (it would leave the job unsupervised)
        pid_doc = {"wrapper_pid": os.getpid(), "job_pid": self.proc.pid, "pgid": self.pgid,
                   "attempt": self.attempt, "incarnation": inc}
        self.guarded("the pid file", lambda: rl.atomic_write_json(self.paths.pid, pid_doc))
        self.append_record(start_record(job, self.attempt, now_iso(started), resume_from, inc,
                                        rl.cgroup_oom_kills(), os.environ))
        if self.stop_signal:  # a stop that arrived while starting
            self.forward_stop()
        self.heartbeat(True)

        offload_stop, offload_thread, pusher = self.start_offload(job)
        smi = shutil.which("nvidia-smi")
        next_beat = time.time() + heartbeat_s
        next_gpu = time.time()
        while True:
            rc = self.proc.poll()
            if rc is not None:
                break
            now = time.time()
            if self.kill_deadline is not None and now >= self.kill_deadline:
                self.killpg(signal.SIGKILL)
                self.kill_deadline = float("inf")
            if now >= next_beat:
                self.heartbeat(True)
                next_beat = now + heartbeat_s
            if now >= next_gpu:
                self.sample_gpu(smi)
                next_gpu = now + gpu_s
            if echo is not None:
                echo.pump()
            time.sleep(TICK_S)

        if self.stop_signal:
            self.killpg(signal.SIGKILL)  # stragglers of a stopped job (loader workers): grace is over
        offload_stop.set()  # a copy in flight finishes on its own thread; it never holds the end records back
        reason, sig = classify(rc, self.stop_signal, os.path.exists(self.paths.preempt),
                               os.path.exists(self.paths.budget_stop))
        ended = now_iso()
        # The end records, each guarded (a full disk releases the reserve once). The end line comes before
        # exit.json: status and launch fall back to it when exit.json could not be written. exit.json last:
        # whoever sees it also sees the end line, the final heartbeat and the log trailer.
        self.heartbeat(False, guard=True)
        self.append_record({"attempt": self.attempt, "ended_at": ended, "rc": rc, "signal": sig, "reason": reason})
        trailer = "== rgt attempt %d ended %s reason=%s rc=%s\n" % (self.attempt, ended, reason, rc)
        self.guarded("the job.log trailer", lambda: self.append_line(self.paths.log, trailer))
        self.guarded("exit.json", lambda: rl.atomic_write_json(self.paths.exit, {
            "attempt": self.attempt, "rc": rc, "signal": sig, "reason": reason, "ended_at": ended,
            "stop_signal": self.stop_signal}))
        self.drop_reserve()
        self.finish_offload(job, reason, offload_thread, pusher)
        # the box stops its own meter only when the launch's authorisation and every run on the box allow it
        # (module_utils/rgt_inbox: the record says what it did and why; never raises)
        rgt_inbox.carry_out(self.paths, job)
        if echo is None:
            return 0
        while echo.pump():
            pass
        return container_exit(reason, rc, sig, self.stop_signal)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: <python> <run_dir>/.rgt/wrapper.py <run_dir>", file=sys.stderr)
        return 2
    try:
        wrapper = Wrapper(argv[0])
    except ValueError as exc:  # the run dir's project or run id is not a plain name
        print("refused: %s" % exc, file=sys.stderr)
        return 2
    return wrapper.run()


if __name__ == "__main__":
    sys.exit(main())
