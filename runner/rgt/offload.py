"""`offload: {to: controller}`: watch pulls the copies (docs/offload.md "to: controller").

For each live run whose job says `offload.to: controller`, at most every `every` s, one round: the box is asked
(the status round's connection, runner/rgt/sshround.py: module_utils rgt_statusround `op: offload_pick`) for its
newest complete checkpoint entry, chosen by rgt_offload's own rule (two looks agree) and hashed there (the SHA-256
manifest); it is rsynced (module_utils rgt_rsync, over the round's ssh argv: the host-key pin and the
ControlMaster) into `runs/<run>/<host>.offload/checkpoints/<entry>/<entry>`, hashed here against the manifest,
and the box is asked for the entry's signature again: a copy counts only when both agree (an entry written while
it copied never counts). Each copy is one record in `runs/<run>/<host>.offload/offload.jsonl`, in the box's record
shape (rgt_offload.newest_verified and health read it); the newest `keep` stay. The offload lives beside the pull's
capsule `runs/<run>/<host>/`, never in it: the pull verifies that directory against the export's manifest exactly.
When the run has ended, the watcher pulls its sealed export with `rgt-run pull`'s own function (a normal verified
pull: PULL_VERIFIED). `annotate` puts the newest verified copy and its health into each run's status document.
Nothing here raises into the watch: a failed round is a record with its reason.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import time
from pathlib import Path

from rich.console import Console

from rgt import errors, paths, pull, sshround
from rgt.ledger import runs_dir

_offload = paths.module_util("rgt_offload")
_rsync = paths.module_util("rgt_rsync")
_rl = paths.module_util("rgt_runlayout")
_states = paths.module_util("rgt_states")
_statusdoc = paths.module_util("rgt_statusdoc")

VERIFY = "sha256 on the controller"
_next: dict[tuple, float] = {}  # (host, run_id) -> monotonic time of its next round
_pulled: set[tuple] = set()  # (host, run_id, attempt) whose export this watcher pulled (or tried to)


def conf_of(doc: dict) -> dict | None:
    """The run's offload settings ({every, keep, bwlimit}, from the box's status document: rgt_offload.status_of)
    when it offloads to the controller, else None."""
    shown = doc.get("offload")
    if not isinstance(shown, dict) or shown.get("to") != _offload.CONTROLLER:
        return None
    return {key: shown.get(key) if shown.get(key) is not None else default
            for key, default in _offload.DEFAULTS.items()}


def local_dir(root: Path, run_id: str, host: str) -> Path:
    return root / run_id / f"{host}.offload"


def _runs(doc: dict) -> list[dict]:
    return [doc, *(doc.get("other_runs") or [])]


# ---------------------------------------------------------------- one copy, verified

def verify_copy(entry_dir: Path, name: str, manifest: list) -> str | None:
    """None when entry_dir holds exactly the manifest's files (under `name`) with those hashes, else why not."""
    expected = {rel: sha for sha, rel in manifest}
    got = {}
    for path in sorted(entry_dir.rglob("*")):
        if path.is_file() and path.name != _offload.MANIFEST and _rsync.PARTIAL_DIR not in path.parts:
            got[str(path.relative_to(entry_dir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    problem = _offload.compare_sums(expected, got)
    return problem.replace("on the target", "here") if problem else None


def copy_entry(folder: Path, entry: dict, fetch, look, clock=time.time) -> dict:
    """Copy one entry the box picked into folder/checkpoints/<name>/ with fetch(dest dir) -> error or None, verify
    it against the box's manifest, look(name) -> the entry's signature on the box now; record the outcome."""
    name = entry["name"]
    dest = folder / "checkpoints" / name
    started = clock()
    lines = [tuple(x) for x in entry["manifest"]]
    text = _offload.manifest_text(lines)
    base = {"kind": "checkpoint", "name": name, "step": _offload.step_of(name), "dest": str(dest), "ok": False,
            "verified": False, "bytes": entry.get("bytes"), "files": len(lines),
            "manifest_sha256": hashlib.sha256(text.encode()).hexdigest()}
    dest.mkdir(parents=True, exist_ok=True)
    problem = fetch(dest)
    if problem is None:
        problem = verify_copy(dest, name, lines)
        problem = f"not verified: {problem}" if problem else None
    if problem is None and look(name) != entry["signature"]:
        problem = f"not verified: {name} changed on the box during the copy"
    if problem:
        shutil.rmtree(dest, ignore_errors=True)
        return record(folder, dict(base, reason=problem, took_s=round(clock() - started, 3)), clock)
    _rl.atomic_write(str(dest / _offload.MANIFEST), text)
    return record(folder, dict(base, ok=True, verified=True, verify=VERIFY, signature=[list(x) for x in
                                                                                        entry["signature"]],
                               took_s=round(clock() - started, 3)), clock)


def record(folder: Path, doc: dict, clock=time.time) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    now = clock()
    doc.setdefault("ts", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    doc.setdefault("ts_epoch", round(now, 3))
    _rl.append_jsonl(str(folder / _offload.RECORDS), doc)
    return doc


def prune(folder: Path, keep: int, clock=time.time) -> None:
    """Remove the copies beyond the newest `keep` verified ones (a prune record each)."""
    for name in _offload.beyond_keep(_offload.read_records(str(folder)), keep):
        shutil.rmtree(folder / "checkpoints" / name, ignore_errors=True)
        record(folder, {"kind": "prune", "name": name, "dest": str(folder / "checkpoints" / name), "ok": True}, clock)


# ---------------------------------------------------------------- the box

def _params(host, doc: dict) -> dict:
    durable = ((host.profile or {}).get("roots") or {}).get("durable")
    base = _statusdoc.params_from_vars(host.vars, durable)
    return {"durable_root": base["durable_root"], "project": base["project"], "run_id": doc.get("run_id")}


def _ask(target, params: dict) -> dict:
    answer = sshround.run_cached(target, (json.dumps({"op": "offload_pick", **params}) + "\n").encode())
    try:
        doc = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"the box gave no answer (rc={answer.rc}): {sshround.first_line(answer.stderr)}") from None
    if doc.get("failed"):
        raise RuntimeError(str(doc.get("msg")))
    return doc


def _connection(target, host):
    if target.local:
        return _rsync.Connection(host.name, local=True)
    # the round's own ssh argv (the pin, the ControlMaster): rsync rides the connection the status round opened;
    # the port given again, since rsync's `ssh -p` comes before it and ssh keeps the first value
    port = host.vars.get("ansible_port") or host.vars.get("ansible_ssh_port")
    return _rsync.Connection(host.name, host=target.argv[-1], port=port, common_args=shlex.join(target.argv[1:-1]))


def round_once(inventory: str, host, doc: dict, root: Path, extravars: dict | None = None) -> dict | None:
    """One round for one run: the record written, or None when there was nothing new to copy."""
    conf = conf_of(doc)
    folder = local_dir(root, doc["run_id"], host.name)
    target = sshround.target_for(inventory, host, extravars)
    params = _params(host, doc)
    picked = _ask(target, params).get("entry")
    if not picked:
        return None
    last = _offload.newest_verified(_offload.read_records(str(folder)))
    if last and last.get("name") == picked["name"] and last.get("signature") == picked["signature"]:
        return None  # already here
    conn = _connection(target, host)

    def fetch(dest: Path) -> str | None:
        transfer = _rsync.Transfer(conn, picked["path"], str(dest), push=False, timeout_s=120,
                                   bwlimit=_bwlimit(conf.get("bwlimit")), label=picked["name"])
        result = _rsync.run(transfer)
        return None if result["rc"] == 0 else (f"rsync failed (rc {result['rc']}): "
                                               f"{_offload.last_error(result['stderr'])}")

    def look(name: str):
        entry = _ask(target, {**params, "name": name}).get("entry")
        return (entry or {}).get("signature")

    out = copy_entry(folder, picked, fetch, look)
    if out.get("ok"):
        prune(folder, conf["keep"])
    return out


def _bwlimit(value) -> int | None:
    """rsync's --bwlimit (KiB/s) from the offload's rate (20M: 20 MiB/s; a bare number: KiB/s)."""
    if not value:
        return None
    text = str(value).strip().upper()
    scale = {"K": 1, "M": 1024, "G": 1024 * 1024}.get(text[-1:], None)
    try:
        return int(float(text[:-1]) * scale) if scale else int(float(text))
    except ValueError:
        return None


# ---------------------------------------------------------------- in the watcher, and in status

def tick(args: argparse.Namespace, console: Console, hosts: list, docs: dict[str, dict],
         extravars: dict | None = None, follow: bool = False, clock=time.monotonic) -> None:
    """One pass over this tick's documents: a round for each live controller-offload run that is due, the export
    pulled for one that ended (not under --follow), then `annotate`. Never raises: a watch goes on."""
    root = runs_dir(getattr(args, "runs_dir", None))
    by_name = {h.name: h for h in hosts}
    for name, doc in docs.items():
        host = by_name.get(name)
        for run in _runs(doc) if host is not None and not follow else []:
            conf = conf_of(run)
            if not conf or not run.get("run_id"):
                continue
            key = (name, run["run_id"])
            try:
                if _states.is_live(run.get("state")) and clock() >= _next.get(key, 0.0):
                    _next[key] = clock() + float(conf["every"])
                    rec = round_once(args.inventory, host, run, root, extravars)
                    if rec is not None:
                        console.print(f"offload {name}:{run['run_id']}: " + (
                            f"{rec['name']} copied, verified" if rec.get("ok") else f"failed: {rec.get('reason')}"),
                            highlight=False, markup=False)
                elif _states.is_terminal(run.get("state")) and (*key, run.get("attempt")) not in _pulled:
                    _pulled.add((*key, run.get("attempt")))
                    _pull_export(args, console, name, run)
            except Exception as exc:  # noqa: BLE001 - the job and the watch go on; the failure is on record
                record(local_dir(root, run["run_id"], name), {"kind": "checkpoint", "ok": False, "verified": False,
                                                              "reason": f"offload error: {exc}"})
    annotate(docs, root)


def _pull_export(args: argparse.Namespace, console: Console, name: str, run: dict) -> int:
    """The run's sealed export, home: `rgt-run pull`'s own function for this host (PULL_VERIFIED when verified)."""
    console.print(f"offload {name}:{run['run_id']}: the run ended; pulling its sealed export", highlight=False,
                  markup=False)
    base = {"inventory": args.inventory, "extra_vars": args.extra_vars, "ledger": args.ledger,
            "verbose": getattr(args, "verbose", 0), "json": False,
            "runs_dir": str(runs_dir(getattr(args, "runs_dir", None)))}
    code = pull.cmd_pull(argparse.Namespace(**base, limit=name, verify_only=False), console)
    if code != errors.OK:  # attention (exit 5): the result is not home; `rgt-run pull` says why
        message = f"the pull of the sealed export did not verify (exit {code}); run `rgt-run pull --limit {name}`"
        console.print(f"offload {name}:{run['run_id']}: {message}", highlight=False, markup=False)
        run.setdefault("attention", []).append({"id": "offload_export_pull", "message": message})
    return code


def annotate(docs: dict[str, dict], root: Path, now: float | None = None) -> None:
    """Each controller-offload run's `offload` ({host: doc}) from the local records (the newest verified copy;
    failing or behind: attention, in rgt_offload.health's words)."""
    for name, doc in docs.items():
        for run in _runs(doc):
            conf = conf_of(run)
            if not conf or not run.get("run_id"):
                continue
            box = run.get("offload") or {}
            shown = _offload.health(_offload.read_records(str(local_dir(root, run["run_id"], name))),
                                    conf["every"], now, box.get("newest_ckpt_mtime"))
            run["offload"] = {**conf, "to": _offload.CONTROLLER, "newest": shown["newest"],
                              "failing": shown["failing"], "behind_s": shown["behind_s"]}
            if shown["attention"] and _states.is_live(run.get("state")):
                run.setdefault("attention", []).append({"id": shown["attention_id"], "message": shown["attention"]})
