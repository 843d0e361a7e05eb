"""The pull round: `rgt-run pull` of SSH boxes as one round per host, the way the status round looks at them
(docs/internals.md "The pull round").

Per host, in a thread of its own (at most sshround.MAX_PARALLEL at once), over the status round's connection
(rgt.sshround.target_for: the host's own SSH settings, the runner's pin, one ControlMaster):

1. one call seals every run pull acts on there: the seal zipapp (rgt.bundle.seal_zipapp: module_utils/
   rgt_sealround.py, the closeout module's own code rgt_seal.seal, shipped once by its hash like the status
   zipapp) with the runs' closeout options as JSON on stdin; it answers each run's closeout result with its
   manifest's bytes, and a view of symlinks `<view>/<run_id>/<host>` -> each sealed capsule;
2. here, each manifest is written to `<runs>/<run_id>/.incoming/<host>.manifest.json` and promoted by
   rgt_pullverify (the collect role's step 2: validated, its host and instance checked, the local files that
   differ listed for repair);
3. the files of every run move in one rsync over the same ControlMaster (rgt_rsync.Transfer: resumable, retried,
   `--files-from` of the manifests' paths under the view, `--copy-dirlinks`), after one `--ignore-times` rsync
   of the files to repair when there are any;
4. each run is verified here (rgt_pullverify.verify_pull, the hash-once reuse of step 2) and its report built
   (rgt_pullverify.build_report): the same records the collect role writes (`<host>.manifest.json`,
   `<host>.PULL_VERIFIED.json`, `<host>.PROVENANCE.md`) and the same `collect_report` per run.

Which hosts take it (`eligible`): SSH boxes the round can reach (sshround.can_round), whose runs are named by
plain names and whose collect settings the runner knows (no collect_* variable it does not read, no template);
a local connection, a host only Ansible can reach, check mode or a Kubernetes host keep the collect play
(engine.collect).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shlex
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from rgt import bundle, paths, sshround
from rgt.events import HostOutcome
from rgt.inventory import Host
from rgt.phases import PhaseResult, new_ident
from rgt.progress import ProgressTail

SEAL_TIMEOUT_S = 6 * 3600  # the seal copies the run's outputs into the capsule: as long as a closeout module may
PLAYBOOK = Path("pull round")
# the collect role's settings the round reads (roles/collect/defaults/main.yml), with their defaults; another
# collect_* variable (or a template) leaves the host to the play
SETTINGS = {"collect_timeout_s": 60, "collect_retries": 5, "collect_retry_delay_s": 3, "collect_bwlimit": None,
            "collect_force_unfinished": False, "collect_log_max_mb": None, "collect_verify_only": False,
            "collect_progress_dir": None}
JOB_KEYS = ("name", "run_id", "outputs", "checkpoint", "python", "verify_command")
ITEM_LINE = re.compile(r"^>f\S* (.+)$", re.M)  # rsync's --out-format "%i %n": a file received



def _setting(host: Host, extravars: dict, name: str):
    return extravars[name] if name in extravars else host.vars.get(name, SETTINGS[name])


def _job(host: Host) -> dict:
    job = host.vars.get("rgt_job")
    return job if isinstance(job, dict) else {}


def run_params(host: Host, extravars: dict) -> dict:
    """The closeout options of the run `host` points at, as roles/collect/defaults/main.yml derives them."""
    job = _job(host)
    durable = host.vars.get("rgt_durable_root") or ((host.profile or {}).get("roots") or {}).get("durable")
    log_max = _setting(host, extravars, "collect_log_max_mb")
    return {"durable_root": None if durable is None else str(durable),
            "project": str(host.vars.get("rgt_project", "rgt")),
            "run_id": job.get("run_id") or job.get("name"), "host": host.name,
            "instance_id": str(host.vars.get("rgt_instance_id", host.name)),
            "job_name": job.get("name") or job.get("run_id"),
            "outputs": list(job.get("outputs") or []),
            "declared_checkpoints": list((job.get("checkpoint") or {}).get("declared") or []),
            "force_unfinished": bool(_setting(host, extravars, "collect_force_unfinished")),
            "loader_python": job.get("python") or None,
            "log_max_mb": None if log_max is None else log_max}


def _problem(host: Host, extravars: dict, params: dict) -> str | None:
    """Why this host's run is left to the collect play (None: the round takes it)."""
    layout = paths.module_util("rgt_runlayout")
    for value, what in ((params["run_id"], "run id"), (params["project"], "project"), (host.name, "host name")):
        if layout.check_name(value, what):
            return f"{what} {value!r} is not a plain name (the role's assert names it)"
    for name in [*host.vars, *extravars]:
        if name.startswith(("collect_", "run_context_")) and name not in SETTINGS:
            return f"{name} is set: only the role reads it"
    values = [_setting(host, extravars, name) for name in SETTINGS] + [_job(host).get(k) for k in JOB_KEYS] + \
        [host.vars.get("rgt_project"), host.vars.get("rgt_durable_root"), params["durable_root"]]
    if any(sshround.templated(v) for v in values) or not params["durable_root"]:
        return "a collect setting is a template: only Ansible can evaluate it"
    try:
        for name in ("collect_timeout_s", "collect_retries", "collect_retry_delay_s"):
            int(_setting(host, extravars, name))
        if _setting(host, extravars, "collect_bwlimit") is not None:
            int(_setting(host, extravars, "collect_bwlimit"))
    except (TypeError, ValueError):
        return "a transfer setting is not a number: the role's argument spec names it"
    return None


def eligible(args: argparse.Namespace, hosts: list[Host], runs: dict[str, list[dict]], extravars: dict,
             point_at) -> list[Host]:
    """The hosts whose every run this round can pull (the others keep the collect play); `point_at(host, run)`
    makes a host act on one of its runs (rgt.pull._point_at)."""
    if getattr(args, "check", False):
        return []
    out = []
    for host in hosts:
        if host.is_local or not sshround.can_round(args.inventory, host, extravars):
            continue
        ok = True
        for run in runs[host.name]:
            point_at(host, run)
            if _problem(host, extravars, run_params(host, extravars)) is not None:
                ok = False
        point_at(host, runs[host.name][0])
        if ok:
            out.append(host)
    return out


# ---------------------------------------------------------------- rsync over the round's connection

class Connection:
    """rgt_rsync's Connection for the round's target: rsync's `-e` is the target's own ssh argv (pin and
    ControlMaster included), so the files ride on the seal call's master connection."""

    local = False

    def __init__(self, target: sshround.Target):
        self.name = target.name
        self.address = target.argv[-1]
        self._rsh = shlex.join(target.argv[:-1])

    def rsh(self) -> str:
        return self._rsh

    def target(self) -> str:
        host = self.address
        return f"[{host}]:" if ":" in host and not host.startswith("[") else f"{host}:"

    def path(self, path: str) -> str:
        return self.target() + path


def _transfer(rsync, connection: Connection, view: str, dest: str, names: list[str], scratch: str, label: str,
              ignore_times: bool, options: dict, tries: dict, progress=None) -> dict:
    """One rsync of `names` (paths under the view) into dest: rgt_rsync.run with --copy-dirlinks (the view's
    links are capsules) and each received file named on stdout."""
    listing = os.path.join(scratch, f"{label}.list")
    with open(listing, "wb") as handle:
        handle.write(b"".join(n.encode("utf-8") + b"\0" for n in names))

    class Transfer(rsync.Transfer):
        def argv(self, log_file=None, progress=False):
            argv = super().argv(log_file=log_file, progress=progress)
            at = argv.index("-a") + 1
            return argv[:at] + ["--copy-dirlinks", "--out-format=%i %n"] + argv[at:]

    transfer = Transfer(connection, view.rstrip("/") + "/", dest, push=False, files_from=listing,
                        ignore_times=ignore_times, label=label, **options)
    return rsync.run(transfer, progress=progress, **tries)


# ---------------------------------------------------------------- one host

def _unreachable(answer: sshround.Answer) -> HostOutcome:
    text = (answer.stderr or "").strip() or "unreachable"
    return HostOutcome(unreachable=True, host_key_mismatch=sshround.is_host_key_refusal(answer.stderr),
                       messages=[f"Failed to connect to the host via ssh: {text}"])


def _box_answer(answer: sshround.Answer) -> tuple[dict | None, str | None]:
    try:
        doc = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = sshround.first_line(answer.stderr) or sshround.first_line(answer.stdout.decode(errors="replace"))
        return None, f"the seal call gave no answer (rc={answer.rc}): {said}"
    if not isinstance(doc, dict) or doc.get("failed") or not isinstance(doc.get("runs"), list):
        return None, str((doc or {}).get("msg") or "the seal call did not return the runs' results")
    return doc, None


class Run:
    """One run of a host through the round: the collect role's registered results, step by step."""

    def __init__(self, host: Host, params: dict, root: str, extravars: dict):
        job = _job(host)
        self.params = params
        self.run_id = params["run_id"]
        self.base = os.path.join(root, self.run_id)
        self.dest = os.path.join(self.base, host.name)
        self.p = {"dest": self.dest, "manifest_path": os.path.join(self.base, f"{host.name}.manifest.json"),
                  "incoming_manifest": None, "run_id": self.run_id, "host": host.name,
                  "instance_id": params["instance_id"], "profile": (host.profile or {}).get("name"),
                  "declared_checkpoints": params["declared_checkpoints"],
                  "verify_command": job.get("verify_command") or None, "verify_timeout_s": 3600,
                  "not_pulled": None, "verify": True, "write_marker": True, "reuse_hashes": False,
                  "max_names": 20, "report": None}
        self.closeout: dict = {}
        self.promoted: dict = {}
        self.repair: list[dict] = []
        self.rsync: list[dict] = []
        self.verify: dict = {}
        self.error: str | None = None  # a step before the verification failed (the role's rescue)
        self.warnings: list[str] = []
        self.doc: dict | None = None  # the promoted manifest

    def promote(self, pv, manifest: bytes) -> None:
        """The role's step 2: the manifest into .incoming, validated and kept beside the copy; the repair list."""
        incoming = os.path.join(self.base, ".incoming")
        os.makedirs(incoming, exist_ok=True)
        path = os.path.join(incoming, f"{self.p['host']}.manifest.json")
        with open(path, "wb") as handle:
            handle.write(manifest)
        result, msg = pv.verify_pull(dict(self.p, incoming_manifest=path, verify=False))
        self.promoted = result
        if msg is not None:
            self.error = msg
            return
        self.doc = json.loads(manifest)

    def finish(self, pv, verify_only: bool) -> HostOutcome:
        """The role's steps 4 and 5: verify, then the report, the failure and the host's outcome."""
        if self.error is None:
            p = dict(self.p, reuse_hashes=not verify_only)
            if not verify_only:
                p["not_pulled"] = self.closeout.get("not_pulled")
            result, msg = pv.verify_pull(p)
            if msg is not None:
                result["msg"] = msg
            self.verify = result
        report, failure = pv.build_report(dict(self.p, report={
            "closeout": self.closeout, "promoted": self.promoted, "repair": self.repair, "rsync": self.rsync,
            "verify": self.verify, "verify_only": verify_only, "failed": self.error is not None,
            "error": self.error}))
        changed = any(bool(r.get("changed")) for r in (self.closeout, self.promoted, self.verify,
                                                       *self.repair, *self.rsync))
        out = HostOutcome(ok=1, changed=int(changed), warnings=list(self.warnings),
                          results={"collect_report": report})
        if failure is not None:
            out.failed = True
            out.messages.append(failure)
        return out


def pull_host(args: argparse.Namespace, host: Host, runs: list[dict], target: sshround.Target,
              root: str, extravars: dict, point_at, progress_dir: str | None) -> list[HostOutcome]:
    """Every run of one host: one seal call, one promotion each, one rsync (plus one for repairs), one
    verification each. A HostOutcome per run, in `runs` order."""
    pv = paths.module_util("rgt_pullverify")
    rsync = paths.module_util("rgt_rsync")
    verify_only = bool(args.verify_only)
    items = []
    for run in runs:
        point_at(host, run)
        items.append(Run(host, run_params(host, extravars), root, extravars))
    point_at(host, runs[0])
    if verify_only:  # the local copy only: the box is not touched
        return [item.finish(pv, True) for item in items]

    loader = None
    if any(item.params["loader_python"] for item in items):
        loader = bundle.flat("ckpt_loader").as_dict()
    stdin = json.dumps({"host": host.name, "runs": [item.params for item in items], "loader_bundle": loader})
    answer = run_cached(target, (stdin + "\n").encode(), SEAL_TIMEOUT_S)
    if answer.rc == sshround.SSH_FAILED_RC and (answer.timed_out or not answer.stdout):
        return [_unreachable(answer) for _ in items]
    doc, problem = _box_answer(answer)
    if doc is None or len(doc["runs"]) != len(items):
        problem = problem or "the seal call answered for another number of runs"
        return [HostOutcome(failed=True, messages=[f"{host.name}: {problem}"]) for _ in items]

    for item, sealed in zip(items, doc["runs"], strict=True):
        item.warnings = list(sealed.pop("warnings", None) or [])
        manifest = sealed.pop("manifest_b64", None)
        item.closeout = sealed
        if sealed.get("failed"):
            item.error = str(sealed.get("msg") or "the closeout failed")
            continue
        try:
            item.promote(pv, base64.b64decode(manifest or ""))
        except (OSError, ValueError) as exc:
            item.error = f"{host.name}: the manifest of {item.run_id} could not be kept here: {exc}"

    moving = [item for item in items if item.error is None and item.doc is not None]
    if moving:
        _move(rsync, host, moving, target, doc["view"], root, extravars, progress_dir)
    return [item.finish(pv, False) for item in items]


def _move(rsync, host: Host, items: list[Run], target: sshround.Target, view: str, root: str, extravars: dict,
          progress_dir: str | None) -> None:
    """The role's step 3 for every run at once: the files to repair (re-sent whatever their size and mtime), then
    every file of every manifest, each a single rsync over the master connection into <runs>/<run_id>/<host>/."""
    connection = Connection(target)
    partial = (os.path.join(items[0].base, f".rsync-partial-{host.name}") if len(items) == 1 else
               os.path.join(root, f".rsync-partial-{host.name}"))
    bwlimit = _setting(host, extravars, "collect_bwlimit")
    options = {"partial_dir": partial, "timeout_s": int(_setting(host, extravars, "collect_timeout_s")),
               "bwlimit": None if bwlimit is None else int(bwlimit)}
    tries = {"retries": max(0, int(_setting(host, extravars, "collect_retries"))),
             "delay_s": max(0, int(_setting(host, extravars, "collect_retry_delay_s")))}
    progress = None
    if progress_dir:
        total = sum(int(item.doc["totals"]["bytes"]) for item in items)
        progress = rsync.Progress(rsync.progress_file(progress_dir, host.name, "pull"), host.name, "pull", "",
                                  total)
    prefix = {item.run_id: f"{item.run_id}/{host.name}/" for item in items}
    with tempfile.TemporaryDirectory(prefix="rgt-pull-round-") as scratch:
        repairs = {item.run_id: list(item.promoted.get("repair") or []) for item in items}
        if any(repairs.values()):
            names = [prefix[rid] + path for rid, paths_ in repairs.items() for path in paths_]
            done = _transfer(rsync, connection, view, root, names, scratch, "repair", True, options, tries,
                             progress.for_part("repair") if progress else None)
            for item in items:
                if repairs[item.run_id]:
                    item.repair = [dict(done, item=rsync.repair_label(repairs[item.run_id]))]
        names = [prefix[item.run_id] + entry["path"] for item in items for entry in item.doc["files"]]
        done = _transfer(rsync, connection, view, root, names, scratch, "files", False, options, tries,
                         progress.for_part("files") if progress else None)
    received = set(ITEM_LINE.findall(done.get("stdout") or ""))
    for item in items:
        entries = paths.module_util("rgt_manifest").top_level_entries(item.doc)
        got = {name[len(prefix[item.run_id]):].split("/", 1)[0] for name in received
               if name.startswith(prefix[item.run_id])}
        item.rsync = [dict(done, item=entry, changed=done["rc"] == 0 and entry in got) for entry in entries]


def run_cached(target: sshround.Target, stdin: bytes, timeout: float) -> sshround.Answer:
    """The seal zipapp with `stdin` on the box, shipped first when the box does not have its hash (the status
    round's cache and ship, sshround.RUN_CACHED and sshround.ship: the same directory, another hash)."""
    digest, data = bundle.seal_zipapp()
    command = sshround.RUN_CACHED.format(digest=digest, python=shlex.quote(target.python),
                                         missing=sshround.MISSING_RC)
    answer = sshround.call(target, command, stdin, timeout)
    if answer.rc != sshround.MISSING_RC:
        return answer
    shipped = sshround.ship(target, digest, data, sshround.ANSWER_TIMEOUT_S)
    if shipped.rc != 0:
        return shipped
    return sshround.call(target, command, stdin, timeout)


# ---------------------------------------------------------------- every host

def pull(args: argparse.Namespace, hosts: list[Host], runs: dict[str, list[dict]], extravars: dict, root: Path,
         point_at, console: Console) -> tuple[PhaseResult, dict[str, list[HostOutcome]]]:
    """Every run of every host in `hosts` (eligible ones), the hosts in parallel: (a PhaseResult with one
    HostOutcome per host, every run's outcomes summed, {host: [HostOutcome per run, in `runs` order]}). On a
    terminal the transfers' progress is shown live, as a play's (rgt.progress.ProgressTail)."""
    real_root = os.path.realpath(os.path.expanduser(str(root)))
    cfg = sshround.ssh_config()
    targets = {h.name: sshround.target_for(args.inventory, h, extravars, cfg) for h in hosts}
    if not args.verify_only:
        bundle.seal_zipapp()  # once, before the threads start
    for name in ("rgt_pullverify", "rgt_rsync", "rgt_manifest"):
        paths.module_util(name)  # loaded here, not by the threads
    per_run: dict[str, list[HostOutcome]] = {}
    with tempfile.TemporaryDirectory(prefix="rgt-pull-progress-") as scratch:
        tail = ProgressTail(console, Path(scratch) / "progress")
        progress_dir = tail.extravars().get("rgt_progress_dir")
        try:
            tail.start()
            with ThreadPoolExecutor(max_workers=max(1, min(sshround.MAX_PARALLEL, len(hosts)))) as pool:
                futures = {h.name: pool.submit(pull_host, args, h, runs[h.name], targets[h.name], real_root,
                                               extravars, point_at, progress_dir) for h in hosts}
                per_run = {name: f.result() for name, f in futures.items()}
        finally:
            tail.stop()
    result = PhaseResult(playbook=str(PLAYBOOK), ident=new_ident(Path("pull-round")), rc=0, status="successful")
    for name, outcomes in per_run.items():
        result.hosts[name] = HostOutcome(
            ok=sum(o.ok for o in outcomes), changed=sum(o.changed for o in outcomes),
            failed=any(o.failed for o in outcomes), unreachable=any(o.unreachable for o in outcomes),
            host_key_mismatch=any(o.host_key_mismatch for o in outcomes),
            messages=list(dict.fromkeys(m for o in outcomes for m in o.messages)),
            warnings=[w for o in outcomes for w in o.warnings])
    if any(o.failed or o.unreachable for o in result.hosts.values()):
        result.rc, result.status = 2, "failed"
    return result, per_run
