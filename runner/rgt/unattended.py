"""A meter stop authorised at launch (`rgt-run train --down`), carried out by the watcher after a verified result
(docs/unattended.md "An authorised meter stop").

At launch (`authorise_at_launch`, before any box is touched): the teardown plan of each box the job launches on
(its verb, what it deletes, what keeps billing: rgt.profiles.verb_plan, the plan `rgt-run teardown` shows), then
the instance ids, typed (rgt.teardown.confirmations, the teardown's own typed confirmation) or `--down-confirm ID`.
`--down` is refused (exit 3, nothing launched) when nothing would verify the results: no watcher holds this
ledger's watch lock, none is installed as a service (rgt.watchlock), and no run has an offload (`rgt_job.offload.to`).
After a launch that went well (`record_launch`), the authorisation is kept in the ledger, atomically:
`<ledger>/authorisations/<instance>.json` (the instance, its hosts, the runs it covers, when it was made and when
it expires, and a SHA-256 over its own content, so an edit by hand is seen and refused).

In the watcher (`tick`, once per watch tick from rgt.status.cmd_watch): for each authorised instance whose runs
have all ended, it pulls what finished and is not pulled yet (rgt.pull.cmd_pull), looks at the box as `rgt-run
teardown` does (its engine's `assess`: every run on the box, the teardown gate at that moment), and stops the meter
through the same engine `stop` only when the authorisation is intact, unexpired and names that exact instance,
every run on the box is one it covers, and every run it covers is pulled and verified against the manifest on the
box now. The stop is on record before it is called (teardown's ledger record): a watcher killed mid-stop and
started again finds it in flight and polls it, never calls again. The end is a receipt,
`<ledger>/authorisations/<instance>.receipt.json`, re-listing what still bills. Anything else is a refusal: said
once (and notified once, rgt.notify), reminded every REMIND_S while it lasts, the meter left running.

The box stops its own meter (`rgt_job.offload.stop_box`, `inbox_at_launch`; docs/unattended.md "The box stops its
own meter"): the same authorisation, `in_box: true`, goes into each run's job.json, and the box's wrapper decides
with module_utils/rgt_inbox after its export is offloaded and verified. The watcher leaves the box to decide
(`_box_may_still_stop`, at most INBOX_WAIT_S), and a stop the box made (its record, seen by status) becomes the
teardown record's stop in flight: polled to a receipt (`by: the box itself`), never called.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import engines, errors, memory, paths, pull, teardown, watchlock
from rgt.errors import GateRefused, InputError
from rgt.ledger import atomic_write_json, read_json, runs_dir
from rgt.prepare import prepare
from rgt.profiles import verb_plan
from rgt.safetext import printable

SCHEMA = "rgt/authorisation/v1"
DIR = "authorisations"
DEFAULT_EXPIRES = "7d"
REMIND_S = 6 * 3600  # a refusal that lasts is said again this often (and notified again)
RETRY_S = 600  # a watcher looks again at an instance it refused to stop this often (a new watcher at once)
_tried: dict[str, float] = {}  # instance id -> when this process last refused it (time.monotonic)
INBOX_WAIT_S = 900  # an in-box stop: how long the watcher leaves the box to decide after its runs ended
_ended_at: dict[str, float] = {}  # instance id -> when this process first saw its runs ended (time.monotonic)
_states = paths.module_util("rgt_states")
_inbox = paths.module_util("rgt_inbox")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_down_arguments(p: argparse.ArgumentParser) -> None:
    """train's --down options."""
    p.add_argument("--down", action="store_true",
                   help="authorise the meter stop now: once every run on the box is pulled and verified, the "
                        "watcher stops it (prints the teardown plan and asks you to type each instance id)")
    p.add_argument("--down-confirm", dest="down_confirm", nargs="+", action="extend", default=[],
                   metavar="INSTANCE_ID", help="--down without the prompt (for agents): the instance ids, each box's")
    p.add_argument("--down-expires", dest="down_expires", default=DEFAULT_EXPIRES, metavar="DURATION",
                   help=f"the authorisation lapses after this long ({DEFAULT_EXPIRES}; 12h, 90m)")


# ---------------------------------------------------------------- the record

def _name(instance_id: str) -> str:
    """The file name of an instance's records: its id where that is a plain name, else a hash of it."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", instance_id):
        return instance_id
    return "id-" + hashlib.sha256(instance_id.encode()).hexdigest()[:32]


def auth_path(ledger: Path, instance_id: str) -> Path:
    return ledger / DIR / f"{_name(instance_id)}.json"


def receipt_path(ledger: Path, instance_id: str) -> Path:
    return ledger / DIR / f"{_name(instance_id)}.receipt.json"


def _box_path(ledger: Path, instance_id: str) -> Path:
    """The record of the box that stopped its own meter, as the watcher saw it (module_utils/rgt_inbox)."""
    return ledger / DIR / f"{_name(instance_id)}.box.json"


def _state_path(ledger: Path, instance_id: str) -> Path:
    return ledger / DIR / f"{_name(instance_id)}.watch.json"


def digest(doc: dict) -> str:
    """The SHA-256 over an authorisation's content (every field but `sha256`, canonical JSON): the box's rule
    (module_utils/rgt_inbox.digest), so the copy the box carries checks the same way."""
    return _inbox.digest(doc)


def parse_expiry(text: str) -> int:
    """`--down-expires`: 7d, 12h, 90m, 3600s (a bare number is days); seconds. InputError when it is none of those."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", str(text))
    seconds = int(match.group(1)) * _UNITS[match.group(2) or "d"] if match else 0
    if seconds <= 0:
        raise InputError(f"--down-expires {text!r} is not a duration", fix="--down-expires 7d (or 12h, 90m)",
                         field="--down-expires")
    return seconds


def problem(doc: object, instance_id: str, now: float | None = None) -> str | None:
    """Why an authorisation does not allow a meter stop of `instance_id` now (None: it does)."""
    if not isinstance(doc, dict):
        return "no authorisation is in the ledger (or it is not readable)"
    if doc.get("schema") != SCHEMA or doc.get("sha256") != digest(doc):
        return "the authorisation was changed after it was made (its SHA-256 does not match its content): refused"
    if doc.get("instance_id") != instance_id:
        return f"the authorisation names instance {doc.get('instance_id')!r}, not {instance_id!r}"
    expires = doc.get("expires_ts")
    if not isinstance(expires, (int, float)) or (time.time() if now is None else now) >= expires:
        return f"the authorisation expired at {doc.get('expires_at')}"
    return None


def authorises(ledger: Path, instance_id: str, now: float | None = None) -> bool:
    """Does the ledger hold an intact, unexpired authorisation to stop `instance_id`'s meter?"""
    return problem(read_json(auth_path(ledger, instance_id)), instance_id, now) is None


def covered(doc: dict) -> set[tuple[str, str]]:
    return {(str(r.get("project")), str(r.get("run_id"))) for r in doc.get("runs") or [] if isinstance(r, dict)}


# ---------------------------------------------------------------- at launch

def _host_runs(host) -> list[dict]:
    """The runs a launching host starts: each sweep cell it holds, else its job's run."""
    runs = [{"project": host.project, "run_id": r["run_id"], "host": host.name} for r in memory.runs_acted_on(host)]
    if runs:
        return runs
    job = host.vars.get("rgt_job") if isinstance(host.vars.get("rgt_job"), dict) else {}
    run_id = job.get("run_id") or job.get("name")
    return [{"project": host.project, "run_id": str(run_id), "host": host.name}] if run_id else []


def _offload(host) -> bool:
    job = host.vars.get("rgt_job") if isinstance(host.vars.get("rgt_job"), dict) else {}
    offload = job.get("offload")
    # an rclone remote the box pushes to by itself; `to: controller` copies only while a watcher runs
    return isinstance(offload, dict) and paths.module_util("rgt_offload").remote_of(offload.get("to")) is not None


def authorise_at_launch(args: argparse.Namespace, hosts: list, ledger: Path, console: Console) -> dict | None:
    """`train --down`: the plan, the refusal when nothing would verify, the typed ids. Returns what
    `record_launch` keeps after the launch ({instance id: plan}); None without --down. Nothing is written here."""
    if not getattr(args, "down", False) and not getattr(args, "down_confirm", None):
        return None
    expires_s = parse_expiry(getattr(args, "down_expires", None) or DEFAULT_EXPIRES)
    instances = teardown.instances_of(hosts, args.inventory, args.limit)
    ids = [i.instance_id for i in instances]
    given = list(getattr(args, "down_confirm", None) or [])
    for iid in given:
        if iid not in ids:
            raise InputError(f"--down-confirm {iid!r} is not one of the boxes this launch is on ({', '.join(ids)})",
                             fix="--down-confirm " + " ".join(ids), field="--down-confirm")
    interactive = sys.stdin.isatty() and not getattr(args, "json", False)
    if not given and not interactive:
        raise InputError("--down needs each instance id typed, and there is no terminal to ask on; nothing was "
                         "launched", fix="--down-confirm " + " ".join(ids), field="--down-confirm")
    plans = [verb_plan(inst) for inst in instances]
    nothing = [p for p in plans if p["verb"] == "none"]
    if nothing:
        raise InputError(f"--down: {', '.join(p['instance_id'] for p in nothing)} ({nothing[0]['profile']}) has no "
                         "meter to stop", fix="drop --down for this inventory", field="--down")
    watcher = watchlock.holder(ledger)
    service = watchlock.installed(ledger)
    if watcher is None and service is None and not any(_offload(h) for h in hosts):
        raise GateRefused(f"--down: nothing would verify the results before the meter stops: no watcher holds the "
                          f"ledger {ledger} and none is installed for it, and no run has an offload "
                          "(rgt_job.offload.to); nothing was launched",
                          fix=f"start one first (rgt-run watch -i {args.inventory} --detach, or rgt-run service "
                              "install), then launch again with --down", field="--down")
    by = (f"the watcher, {watchlock.describe(watcher)}" if watcher is not None
          else "the installed watch service" if service is not None else "the offload's check")
    console.print(f"[bold]rgt[/bold] train --down: each box's meter is stopped once its runs are pulled and "
                  f"verified ({escape(by)}); the authorisation expires in {_duration(expires_s)}")
    for item in plans:
        console.print(f"  [bold]{escape(item['instance_id'])}[/bold] ({escape(str(item['profile']))}; host "
                      f"{escape(', '.join(item['hosts']))}): {escape(str(item['label']))} ({item['verb']}), "
                      + ("reversible" if item["reversible"] else "[bold red]IRREVERSIBLE[/bold red]"))
        if item["deletes"]:
            console.print("    deletes: " + escape(", ".join(item["deletes"])))
        for line in item["keeps_billing"]:
            console.print(f"    [yellow]keeps billing:[/yellow] {escape(line)}")
        for line in item["clocks"]:
            console.print(f"    [red]clock after {escape(str(item['label']))}:[/red] {escape(line)}")
    asked = [{**p, "verb": f"authorise the {p['label']} (after the verified pull) of"} for p in plans]
    confirmed, refused = teardown.confirmations(console, asked, given, interactive)
    if given and refused:
        raise InputError(f"--down-confirm does not name the instance(s) {', '.join(sorted(refused))}: each box this "
                         "launch is on needs its own id; nothing was launched", fix="--down-confirm " + " ".join(ids),
                         field="--down-confirm")
    if refused:
        reason = next(iter(refused.values())).replace("nothing was called", "nothing was launched")
        raise GateRefused(f"--down: {reason}", fix="launch again and type each instance id", field="--down")
    return {p["instance_id"]: {**p, "expires_s": expires_s} for p in plans if p["instance_id"] in confirmed}


def _stop_box(host) -> bool:
    job = host.vars.get("rgt_job") if isinstance(host.vars.get("rgt_job"), dict) else {}
    return isinstance(job.get("offload"), dict) and job["offload"].get("stop_box") is True


def build_doc(ledger: Path, hosts: list, iid: str, item: dict, now: float, in_box: bool = False) -> dict:
    """The authorisation `record_launch` keeps for an instance (and the box's copy, with in_box), merging the runs
    of an earlier intact one of the same instance."""
    mine = [h for h in hosts if h.instance_id == iid]
    runs = [r for h in mine for r in _host_runs(h)]
    old = read_json(auth_path(ledger, iid))
    if problem(old, iid, now) is None:
        seen = {(r["project"], r["run_id"]) for r in runs}
        runs = [r for r in old["runs"] if (r["project"], r["run_id"]) not in seen] + runs
    expires = now + item["expires_s"]
    doc = {"schema": SCHEMA, "instance_id": iid, "hosts": sorted(h.name for h in mine),
           "profile": item["profile"], "verb": item["verb"], "label": item["label"], "runs": runs,
           "created_at": _iso(now), "created_ts": now, "expires_at": _iso(expires), "expires_ts": expires,
           "in_box": bool(in_box)}
    doc["sha256"] = digest(doc)
    return doc


def inbox_at_launch(ledger: Path, hosts: list, pending: dict | None, down: bool = True) -> dict | None:
    """`rgt_job.offload.stop_box` (docs/unattended.md "The box stops its own meter"), before any box is touched:
    refused (exit 2, nothing launched) without `train --down` naming the instance, without an offload to an rclone
    remote, or on a profile that does not allow an in-box stop (`meter_stop.in_box`). Returns what goes onto each
    box ({instance id: {authorisation, command, self_id_env}}: the extra var `rgt_inbox_stop`, written into
    job.json by the launch), or None when no host asks; the authorisation is the one `record_launch` then keeps.
    Called first with `pending` None (before --down's prompt, so no id is typed for a launch refused anyway):
    `down` says whether --down was given."""
    asking = [h for h in hosts if _stop_box(h)]
    if not asking:
        return None
    field = "rgt_job.offload.stop_box"
    now = time.time()
    out: dict[str, dict] = {}
    for host in asking:
        iid = str(host.instance_id)
        in_box = (host.profile.get("meter_stop") or {}).get("in_box") or {}
        name = host.profile.get("name")
        if not in_box.get("allowed"):
            why = in_box.get("reason") or "the profile does not say an in-box stop is safe (no meter_stop.in_box)"
            raise InputError(f"{field}: profile {name} (host {host.name}) refuses a meter stop from the box itself: "
                             f"{why}; nothing was launched", field=field,
                             fix="drop offload.stop_box: with train --down the watcher stops the meter after the "
                                 "verified pull")
        if not _offload(host):
            raise InputError(f"{field} needs an offload to an rclone remote (offload.to: remote:bucket/prefix): the "
                             f"box stops its meter only after its own export is offloaded and verified; nothing was "
                             "launched", field=field, fix="name an rclone remote in offload.to, or drop stop_box")
        if down and pending is None:
            continue  # the check before --down's prompt: the ids come next
        if not pending or iid not in pending:
            raise InputError(f"{field} needs rgt-run train --down naming this instance ({iid}): the box stops its "
                             "own meter only with an authorisation made at launch; nothing was launched",
                             field=field, fix=f"rgt-run train ... --down --down-confirm {iid}, or drop stop_box")
        item = pending[iid]
        if "doc" not in item:
            item["doc"] = build_doc(ledger, hosts, iid, item, now, in_box=True)
        out[iid] = _box_copy(item["doc"], in_box)
    return out or None


def _box_copy(doc: dict, in_box: dict) -> dict:
    """The box's copy of its authorisation (job.json's `inbox_stop`): the ledger's document, the profile's in-box
    command and how the box knows its own id."""
    return {"authorisation": doc, "command": list(in_box["command"]), "self_id_env": in_box["self_id"]["env"]}


def inbox_for_relaunch(ledger: Path, hosts: list) -> dict | None:
    """What a relaunch (watch's auto_resume, a sweep's queue started again) puts back onto each box that asks for
    an in-box stop: the ledger's own authorisation of its instance, when it is intact, unexpired, made with in_box
    and covers every run the host relaunches (else nothing: that attempt leaves the stop to the watcher, as ever).
    The same copy train --down wrote into job.json; never a new authorisation."""
    out: dict[str, dict] = {}
    for host in hosts:
        iid = str(host.instance_id)
        in_box = (host.profile.get("meter_stop") or {}).get("in_box") or {}
        if not _stop_box(host) or not in_box.get("allowed") or iid in out:
            continue
        doc = read_json(auth_path(ledger, iid))
        if problem(doc, iid) is not None or not doc.get("in_box"):
            continue
        if not {(r["project"], r["run_id"]) for r in _host_runs(host)} <= covered(doc):
            continue
        out[iid] = _box_copy(doc, in_box)
    return out or None


def record_launch(ledger: Path, hosts: list, pending: dict | None, code: int, console: Console) -> None:
    """After the launch: keep each confirmed instance's authorisation (only when the launch went well), merging
    the runs of an earlier intact one of the same instance: the very document a box that stops its own meter
    carries (inbox_at_launch), else one made now."""
    if not pending:
        return
    if code != errors.OK:
        console.print("[yellow]--down[/yellow]: the launch did not go well; no meter stop is authorised"
                      + (" (a box that started its run carries its copy and may still stop its own meter once "
                         "its export is offloaded and verified)" if any("doc" in i for i in pending.values())
                         else ""))
        return
    now = time.time()
    for iid, item in pending.items():
        doc = item.get("doc") or build_doc(ledger, hosts, iid, item, now)
        runs = doc["runs"]
        atomic_write_json(auth_path(ledger, iid), doc)
        receipt_path(ledger, iid).unlink(missing_ok=True)  # a new launch on the box: a new stop to carry out
        _state_path(ledger, iid).unlink(missing_ok=True)
        _box_path(ledger, iid).unlink(missing_ok=True)
        console.print(f"[green]authorised[/green]: the {escape(str(item['label']))} of {escape(iid)} once "
                      f"{', '.join(escape(r['project'] + '/' + r['run_id']) for r in runs)} are pulled and verified "
                      f"(until {doc['expires_at']}; ledger {escape(str(auth_path(ledger, iid)))})")


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- in the watcher

def _ended(docs: dict[str, dict], names: list[str]) -> bool:
    """Have all the runs seen on these hosts ended (none live, none unseen, no host unreachable)?"""
    runs = [r for n in names if n in docs for r in (docs[n], *(docs[n].get("other_runs") or []))]
    return bool(runs) and all(n in docs for n in names) and all(_states.is_terminal(r.get("state")) for r in runs)


def tick(args: argparse.Namespace, console: Console, ledger: Path, hosts: list, latest: dict[str, dict],
         notifier=None) -> None:
    """One pass of the watcher over the authorised instances of these hosts (never raises: a watch goes on)."""
    if getattr(args, "follow", False) or not (ledger / DIR).is_dir():
        return
    by_id: dict[str, list] = {}
    for host in hosts:
        by_id.setdefault(str(host.instance_id), []).append(host)
    for iid, mine in sorted(by_id.items()):
        if not auth_path(ledger, iid).exists() or _done(ledger, iid):
            continue
        names = sorted(h.name for h in mine)
        # a stop on record (this watcher, or an earlier one, was stopped mid-stop; the box may be gone) is polled
        # to its end at once; otherwise the runs on the box must all have ended first
        on_record = _stop_on_record(ledger, iid, names)
        if not on_record and _box_stop_seen(console, ledger, iid, names, latest, mine):
            on_record = True  # the box stopped its own meter: the same stop in flight, polled here, never called
        if not on_record and _box_stopped_unseen(console, ledger, iid, names, latest, mine):
            continue  # the box stopped before a poll saw its record: the platform says so; a receipt, no call
        if not on_record and not _ended(latest, names):
            _ended_at.pop(iid, None)
            continue
        if not on_record and _box_may_still_stop(ledger, iid, names, latest):
            continue
        if not on_record and iid in _tried and time.monotonic() - _tried[iid] < RETRY_S:
            continue
        try:
            _carry_out(args, console, ledger, iid, names, notifier, on_record)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - the meter stays running; the watch goes on and says why
            _refuse(console, ledger, iid, [f"the authorised stop could not be carried out ({type(exc).__name__}: "
                                           f"{exc})"], notifier, names)


def _box_records(latest: dict[str, dict], names: list[str], sha: object) -> list[dict]:
    """The in-box stop records (<run_dir>/.rgt/inbox_stop.json, module_utils/rgt_inbox) the last status of these
    hosts brought back, made under this authorisation (its SHA-256)."""
    runs = [r for n in names if n in latest for r in (latest[n], *(latest[n].get("other_runs") or []))]
    return [r["inbox_stop"] for r in runs if isinstance(r.get("inbox_stop"), dict)
            and r["inbox_stop"].get("authorisation") == sha and r["inbox_stop"].get("action")]


def _box_stop_seen(console: Console, ledger: Path, iid: str, names: list[str], latest: dict[str, dict],
                   hosts: list) -> bool:
    """Did a box of this instance stop its own meter (its record says `stop`)? Then the stop is put on the ledger's
    teardown record as one in flight (teardown's own record: what `_stop_on_record` reads and the teardown play
    polls, never calling again), once."""
    doc = read_json(auth_path(ledger, iid))
    if not isinstance(doc, dict) or not doc.get("in_box"):
        return False
    stops = [r for r in _box_records(latest, names, doc.get("sha256")) if r.get("action") == _inbox.STOP]
    if not stops:
        return False
    box = stops[0]
    meter = (hosts[0].profile.get("meter_stop") or {}) if hosts else {}
    cloud = paths.module_util("rgt_cloud")
    record = {"instance_id": iid, "verb": meter.get("verb") or doc.get("verb"),
              "reversible": bool(meter.get("reversible")), "calls": [], "final_state": cloud.REQUESTED,
              "keeps_billing": list(meter.get("keeps_billing") or []), "at": box.get("at"),
              "requested_at": box.get("at"), "by": "the box itself"}
    atomic_write_json(_box_path(ledger, iid), box)  # the teardown's own record is rewritten by the poll
    for name in names:
        atomic_write_json(ledger / "teardown" / f"{name}.json", record)
    console.print(f"[bold]rgt[/bold] {escape(iid)}: {escape(printable(_inbox.describe(box) or ''))}; polling the "
                  "platform until it reports the stop (never calling it again)")
    return True


def _box_stopped_unseen(console: Console, ledger: Path, iid: str, names: list[str], latest: dict[str, dict],
                        hosts: list) -> bool:
    """A box authorised to stop its own meter that powered off before any status poll saw its record shows as
    unreachable. Then the platform's API is asked, read-only (never a stop): when it reports the instance stopped
    (the profile client's terminal state), the receipt says the box made the stop and its record was not seen,
    with what still bills, and the watcher is done with that instance. Any other answer (running, no API, no key,
    no answer): nothing, as before."""
    doc = read_json(auth_path(ledger, iid))
    if not isinstance(doc, dict) or not doc.get("in_box") or problem(doc, iid) is not None:
        return False
    if not names or not hosts or any((latest.get(n) or {}).get("state") != "unreachable" for n in names):
        return False
    meter = hosts[0].profile.get("meter_stop") or {}
    api = meter.get("api")
    if not isinstance(api, dict) or not api.get("client"):
        return False
    cloud = paths.module_util("rgt_cloud")
    try:
        client = cloud.make_client(api, http_timeout=10.0, max_retry_after=5.0)
        state = client.state(iid)
    except Exception:  # noqa: BLE001 - no word from the API is no word: the box stays unreachable
        return False
    if not client.gone(state, True):
        return False
    item = {"profile": doc.get("profile"), "verb": meter.get("verb") or doc.get("verb"),
            "label": meter.get("label") or doc.get("label"), "keeps_billing": list(meter.get("keeps_billing") or []),
            "clocks": list(meter.get("starts_clocks") or []),
            "gate": {"runs": [{"project": r.get("project"), "run_id": r.get("run_id"),
                               "pull": "not seen: the box stopped before a status poll saw its record; it stops "
                                       "only after its sealed export is offloaded and verified (rgt-run pull "
                                       "fetches it from the offload target)"} for r in doc.get("runs") or []]}}
    _receipt(console, ledger, iid, doc, item, {"final_state": client.done_label, "calls": []},
             extra={"by": "the box itself (its record unseen)", "platform_state": state})
    return True


def _box_may_still_stop(ledger: Path, iid: str, names: list[str], latest: dict[str, dict]) -> bool:
    """With an in-box authorisation, the box decides first: the watcher waits (at most INBOX_WAIT_S from when it
    saw every run ended) until the box's record says it refused (or its command failed); then it stops the meter
    itself as ever."""
    doc = read_json(auth_path(ledger, iid))
    if not isinstance(doc, dict) or not doc.get("in_box") or problem(doc, iid) is not None:
        return False
    if any(r.get("action") != _inbox.STOP for r in _box_records(latest, names, doc.get("sha256"))):
        return False  # the box refused (the record says why): the watcher's own stop, from here
    first = _ended_at.setdefault(iid, time.monotonic())
    return time.monotonic() - first < INBOX_WAIT_S


def _stop_on_record(ledger: Path, iid: str, names: list[str]) -> bool:
    """Does the ledger's teardown record (teardown's own, written before the call) hold a stop of this instance
    that is in flight, or one that ended?"""
    cloud = paths.module_util("rgt_cloud")
    return any(cloud.record_state(read_json(ledger / "teardown" / f"{name}.json"), iid) != cloud.RECORD_NONE
               for name in names)


def _done(ledger: Path, iid: str) -> bool:
    receipt = read_json(receipt_path(ledger, iid))
    return isinstance(receipt, dict) and bool(receipt.get("final_state")) and receipt.get("status") == "done"


def _carry_out(args: argparse.Namespace, console: Console, ledger: Path, iid: str, names: list[str], notifier,
               on_record: bool) -> None:
    doc = read_json(auth_path(ledger, iid))
    why = problem(doc, iid)
    if why and not on_record:  # a stop already called is polled whatever: polling stops nothing new
        _refuse(console, ledger, iid, [why], notifier, names)
        return
    root = runs_dir(getattr(args, "runs_dir", None))
    base = {"inventory": args.inventory, "extra_vars": args.extra_vars, "ledger": args.ledger,
            "verbose": getattr(args, "verbose", 0), "json": False, "runs_dir": str(root)}
    if not on_record:
        # the watcher pulls first, every time, with `rgt-run pull`'s own function: a run not pulled yet is pulled,
        # one pulled before is verified again against the bytes on the box now (a byte changed there fails it, and
        # a failed pull leaves no PULL_VERIFIED marker, so the gate below refuses too)
        console.print(f"[bold]rgt[/bold] authorised stop of {escape(iid)}: its runs ended; pulling and verifying "
                      "first")
        code = pull.cmd_pull(argparse.Namespace(**base, limit=",".join(names), verify_only=False), console)
        if code != errors.OK:
            _refuse(console, ledger, iid, [f"the pull before the stop did not verify (exit {code}): see above"],
                    notifier, names)
            return
    ns = argparse.Namespace(**base, playbook=str(paths.PLAYBOOKS_DIR / "teardown.yml"), limit=",".join(names),
                            confirm=[])
    _playbook, hosts, extravars = prepare(ns, pins=True)
    instances = [i for i in teardown.instances_of(hosts, args.inventory, ns.limit) if i.instance_id == iid]
    lib = teardown.manifest_lib()
    ((engine, group),) = engines.split_instances(instances)
    item = engine.assess(group, ns, extravars, ledger, root, console, lib)[iid]
    status = item["status"]
    if status == "already gone":
        _receipt(console, ledger, iid, doc, item, {"status": "done", "final_state": item.get("final_state"),
                                                   "calls": [], "messages": []})
        return
    if status != "in flight":  # a stop in flight (this watcher was stopped mid-stop) is polled, not judged again
        reasons = list(item["reasons"]) if status != "ready" else []
        gate = item.get("gate") or {"runs": []}
        on_box = {(str(r["project"]), str(r["run_id"])): r for r in gate["runs"]}
        for key in sorted(set(on_box) - covered(doc)):
            reasons.append(f"run {key[0]}/{key[1]} is on the box and the authorisation does not cover it")
        for key in sorted(covered(doc)):
            row = on_box.get(key)
            if row is None:
                reasons.append(f"run {key[0]}/{key[1]} (authorised) is not on the box")
            elif not teardown.run_verified(row):
                reasons.append(f"run {key[0]}/{key[1]} ({row.get('state')}) is not verified (pulled, or its "
                               f"export offloaded): {row.get('pull')}")
        if reasons:
            teardown.render_plan(console, item)
            _refuse(console, ledger, iid, reasons, notifier, names)
            return
    outcomes: dict[str, dict] = {}
    console.print(f"[bold]rgt[/bold] authorised stop of {escape(iid)} ({escape(str(item['label']))}): "
                  + ("polling the stop in flight" if status == "in flight" else
                     "every run on the box is covered and verified (pulled, or its export offloaded); the gate passed"))
    engine.stop(group, {iid: item}, [iid] if status == "ready" else [], [iid] if status == "in flight" else [],
                ns, extravars, ledger, root, console, lib, lambda i, outcome: outcomes.__setitem__(i, outcome))
    outcome = outcomes.get(iid) or {"status": "not run", "final_state": None, "messages": []}
    if outcome["status"] == "done":
        _receipt(console, ledger, iid, doc, item, outcome)
    else:
        _refuse(console, ledger, iid, [f"the stop did not end ({outcome['status']}): "
                                       + "; ".join(printable(m.splitlines()[0]) for m in outcome["messages"][:2]
                                                   if m)], notifier, names)


def _receipt(console: Console, ledger: Path, iid: str, doc: dict, item: dict, outcome: dict,
             extra: dict | None = None) -> None:
    """The meter-stop receipt (atomic) and its lines; `extra` (a stop seen only on the platform's API: who made it,
    the platform's state) goes over what the ledger's records say."""
    gate = item.get("gate") or {}
    receipt = {"schema": "rgt/meter-stop-receipt/v1", "instance_id": iid, "hosts": doc["hosts"],
               "profile": item.get("profile"), "verb": item.get("verb"), "label": item.get("label"),
               "status": "done", "final_state": outcome.get("final_state") or "gone",
               "stopped_at": _iso(time.time()), "stopped_ts": time.time(), "authorisation": doc["sha256"],
               "runs": [{k: r.get(k) for k in ("project", "run_id", "state", "pull", "files", "bytes")}
                        for r in gate.get("runs") or []],
               "calls": outcome.get("calls") or [],
               "keeps_billing": list(outcome.get("keeps_billing") or item.get("keeps_billing") or []),
               "clocks": list(item.get("clocks") or [])}
    box = read_json(_box_path(ledger, iid))  # the box stopped its own meter; the watcher only polled the platform
    if isinstance(box, dict) and box.get("authorisation") == doc.get("sha256"):
        receipt.update(by="the box itself", box_record=box,
                       runs=receipt["runs"] or [{"project": r.get("project"), "run_id": r.get("run_id"),
                                                 "state": r.get("state"), "pull": "export offloaded to "
                                                 + str(r.get("offload"))} for r in box.get("runs") or []])
    receipt.update(extra or {})
    atomic_write_json(receipt_path(ledger, iid), receipt)
    said = (f"the platform says {receipt['platform_state']}, no call made here; " if receipt.get("platform_state")
            else "")
    console.print(f"[green]meter stopped[/green]: {escape(iid)} {escape(str(receipt['final_state']))} "
                  f"({escape(said)}{'by ' + escape(receipt['by']) + ', ' if receipt.get('by') else ''}authorised at "
                  f"launch; receipt {escape(str(receipt_path(ledger, iid)))})")
    _still_billing(console, receipt)


def _still_billing(console: Console, receipt: dict) -> None:
    """What a receipt re-lists after the stop: what keeps billing and the clocks it started (the profile's words)."""
    for line in receipt["keeps_billing"]:
        console.print(f"  [yellow]still billing:[/yellow] {escape(line)}")
    for line in receipt["clocks"]:
        console.print(f"  [red]clock now running:[/red] {escape(line)}")


def _refuse(console: Console, ledger: Path, iid: str, reasons: list[str], notifier, names: list[str]) -> None:
    """The meter stays running: said (and notified) once per reason, again every REMIND_S while it lasts."""
    now = time.time()
    _tried[iid] = time.monotonic()
    path = _state_path(ledger, iid)
    state = read_json(path) or {}
    key = hashlib.sha256("\n".join(reasons).encode()).hexdigest()[:12]
    remind = state.get("key") == key and now - float(state.get("said_at") or 0) >= REMIND_S
    if state.get("key") == key and not remind:
        return
    word = "still not stopped" if remind else "NOT stopped"
    console.print(f"[red]authorised stop of {escape(iid)}: {word}[/red] (the meter keeps running):")
    for reason in reasons:
        console.print(f"  - {escape(printable(reason))}")
    atomic_write_json(path, {"instance_id": iid, "key": key, "reasons": reasons, "said_at": now,
                             "first_at": state.get("first_at") if state.get("key") == key else now,
                             "reminders": int(state.get("reminders") or 0) + 1 if remind else 0})
    if notifier is not None:
        text = f"rgt: the authorised meter stop of {iid} is {word}: " + "; ".join(reasons)
        for name in names:
            notifier.announce(name, f"meter-stop-{iid}-{key}-{int(now)}", "meter_stop_refused", text)
