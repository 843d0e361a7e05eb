"""`rgt-run watch` moves a run by itself when its box is gone, only where the job opted in (docs/move.md "Moved by
watch"): `offload.spares` (hosts of the inventory kept for it) and `offload.move_after_s`.

Once per tick, for each host of the tick that holds such a run and did not answer: the box is gone when the
platform's API (the profile's meter_stop.api client, read-only `state`, the key from this shell) says it is
terminated or unavailable, or when it has not answered for move_after_s. Then the run moves, with `rgt-run move`'s
own function (rgt.move: the newest verified offloaded checkpoint, the fence on the old box), to the first free
spare: a host of the inventory the ledger knows no run on, not tried for this run before, that passes a look (one
SSH call of the status round, `spare`: it answers, its durable root takes a file, its free disk meets the job's
disk_floor_gib; one that fails is skipped for this tick: a line, a `spare_skipped` event, one notification per
outage). No free spare: a line and one reminder per outage (notify `moved`). Each move is a line, an event and a
notification (`moved`).

`<ledger>/automove/<host>.json` (atomic, schema rgt/automove/v1) keeps when the host was first seen unreachable
(a restarted watcher goes on counting) and, per run, the move: `moving` (written before the move: a watcher
stopped mid-move moves the run to that same spare again, where the launch is idempotent and never starts a
second attempt), `moved`, or `failed` with the spares tried. A run is moved once: the ledger then holds it on the
spare (rgt.memory), and it is no run of the old host any more.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import errors, memory, move, paths, sshround
from rgt.errors import InputError
from rgt.inventory import load_hosts
from rgt.ledger import append_jsonl, atomic_write_json, read_json
from rgt.plan import DEFAULT_DISK_FLOOR_GIB
from rgt.safetext import printable

_offload = paths.module_util("rgt_offload")
_states = paths.module_util("rgt_states")

SCHEMA = "rgt/automove/v1"
# what the platform's API says of a box that is gone for good: rgt_cloud's `gone` (a 404, RunPod's TERMINATED,
# Lambda's terminated, ...; tests/unit/test_start_cost.py holds the two equal), and the words a client may pass on as
# they are. rgt_cloud itself is imported only when an API is asked: its HTTP helper (ansible's urls, ~0.1 s) is no
# part of a status or watch tick whose boxes all answer.
PLATFORM_GONE = ("gone", "terminated", "unavailable")
API_TIMEOUT_S = 10.0
SPARE_TIMEOUT_S = 60.0  # one look at a spare: its connect, the zipapp shipped the first time, one file made


def opted_in(job: dict | None) -> dict | None:
    """{spares, move_after_s (None: only the platform's word)} of a job that opted in, else None."""
    offload = (job or {}).get("offload")
    if not isinstance(offload, dict) or not offload.get("spares") or not _offload.remote_of(offload.get("to")):
        return None
    after = offload.get("move_after_s")
    return {"spares": list(offload["spares"]), "move_after_s": float(after) if after is not None else None}


def decide(reachable: bool, platform: str | None, first_unreachable_at: float | None, now: float,
           move_after_s: float | None) -> str | None:
    """Why the run's box is gone (a move is due), or None. Pure: a box that answered is never gone; one that did
    not is gone when the platform says so (PLATFORM_GONE) or when it has not answered for move_after_s since it was
    first seen unreachable."""
    if reachable:
        return None
    if platform in PLATFORM_GONE:
        return f"the platform's API says it is {platform}"
    if move_after_s is not None and first_unreachable_at is not None and now - first_unreachable_at >= move_after_s:
        return f"unreachable for {now - first_unreachable_at:.0f} s (move_after_s {move_after_s:g})"
    return None


def first_free(spares: list[str], own: str, unavailable: set[str]) -> str | None:
    """The first spare, in the job's order, that is not the run's host and not unavailable (busy, tried, taken)."""
    return next((s for s in spares if s != own and s not in unavailable), None)


def spare_problem(answer: dict | None, floor_gib: float | None, why_none: str = "") -> str | None:
    """Why a spare cannot take the run now, or None. Pure: `answer` is the spare's `spare` look (module_util
    rgt_runlayout.spare_check: {root, measured, writable, free_gib, why}), None when it did not answer (`why_none`
    says what ssh said); `floor_gib` the job's disk_floor_gib (its launch's disk gate; 0 or None: no floor)."""
    if not isinstance(answer, dict):
        return f"it does not answer ({why_none or 'no answer'})"
    if not answer.get("writable"):
        return f"its durable root {answer.get('root')} is not writable ({answer.get('why') or 'no file can be made'})"
    free = answer.get("free_gib")
    if floor_gib and (not isinstance(free, (int, float)) or free < floor_gib):
        return f"{free} GiB free on {answer.get('measured') or answer.get('root')}, below the job's disk floor of " \
               f"{floor_gib:g} GiB"
    return None


def look_at_spare(inventory: str, host, extravars: dict | None = None) -> tuple[dict | None, str]:
    """The spare's `spare` look over one SSH call of the status round (rgt.sshround: its pinned connection, the
    status zipapp): (its answer, or None with what ssh said). A spare only Ansible can reach is not looked at:
    ({"writable": True, "not_looked_at": why}, "") lets the move's own play find out."""
    durable = sshround.durable_root_of(host)
    if not durable or sshround.templated(durable):
        return {"writable": True, "not_looked_at": "no durable root the runner can read"}, ""
    try:
        target = sshround.target_for(inventory, host, extravars)
    except ValueError as exc:
        return {"writable": True, "not_looked_at": str(exc)}, ""
    doc, answer = sshround.ask(target, "spare", {"durable_root": durable}, timeout=SPARE_TIMEOUT_S)
    spare = (doc or {}).get("spare")
    if isinstance(spare, dict):
        return spare, ""
    return None, (doc or {}).get("msg") or sshround.first_line(answer.stderr) or f"rc {answer.rc}"


def platform_state(host) -> str | None:
    """What the platform's API says of the host's instance (rgt_cloud's `state`, read-only), or None when its
    profile has no API client, no key is exported, or the API does not answer."""
    api = ((host.profile or {}).get("meter_stop") or {}).get("api")
    if not isinstance(api, dict) or not api.get("client") or not host.instance_id:
        return None
    try:
        client = paths.module_util("rgt_cloud").make_client(api, http_timeout=API_TIMEOUT_S, max_retry_after=5.0)
        return client.state(str(host.instance_id))
    except Exception:  # noqa: BLE001 - no word from the API is no word: move_after_s still counts
        return None


def idle_spares(hosts: list) -> set[str]:
    """The hosts watch need not look at: spares some run of these hosts names that hold no run (no job spec and
    nothing the ledger knows on them). They are looked at once a run moves there."""
    named = {s for h in hosts for r in runs_of(h) for s in (opted_in(r.get("job")) or {}).get("spares", [])}
    return {h.name for h in hosts if h.name in named and not isinstance(_vars(h).get("rgt_job"), dict)}


def _vars(host) -> dict:
    return getattr(host, "vars", None) or {}


def runs_of(host) -> list[dict]:
    """The runs a prepared host acts on (its recalled runs, or the one its job spec names)."""
    runs = memory.runs_acted_on(host)
    if runs:
        return runs
    job = _vars(host).get("rgt_job")
    if isinstance(job, dict) and not job.get("sweep"):
        return [{"run_id": job.get("run_id") or job.get("name"), "job": job}]
    return []


class Watcher:
    """watch's automatic move: `tick` once per watch tick, after the poll."""

    def __init__(self, args: argparse.Namespace, console: Console, ledger: Path, notifier, events: Path,
                 extravars: dict | None = None):
        self.args, self.console, self.ledger, self.notifier, self.events = args, console, ledger, notifier, events
        self.extravars = extravars or {}
        self.left: set[str] = set()  # old hosts every opted-in run of which moved away
        self._inventory: dict | None = None

    def _path(self, host: str) -> Path:
        return self.ledger / "automove" / f"{host}.json"

    def _load(self, host: str) -> dict:
        doc = read_json(self._path(host))
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("runs"), dict):
            doc = {"schema": SCHEMA, "host": host, "first_unreachable_at": None, "runs": {}}
        return doc

    def _save(self, host: str, doc: dict) -> None:
        atomic_write_json(self._path(host), doc)

    def _hosts(self) -> dict:
        if self._inventory is None:
            self._inventory = {h.name: h for h in load_hosts(self.args.inventory, None, {})}
        return self._inventory

    def _busy(self, name: str) -> bool:
        host = self._hosts().get(name)
        if host is None:
            return True  # no host of the inventory (any more)
        try:
            return bool(memory.host_runs(self.ledger, host))
        except InputError:
            return True

    def tick(self, docs: dict[str, dict], by_name: dict) -> list[dict]:
        """Move each opted-in run whose box is gone. Returns the moves made ({run_id, from, to, gone}: gone when
        the platform said so)."""
        now = time.time()
        done, taken = [], set()
        for name, doc in docs.items():
            host = by_name.get(name)
            runs = [r for r in runs_of(host) if opted_in(r.get("job"))] if host is not None else []
            if not runs:
                continue
            state = self._load(name)
            if doc.get("state") != "unreachable":
                if state.get("first_unreachable_at") is not None:
                    state["first_unreachable_at"] = None
                    self._save(name, state)
                continue
            if state.get("first_unreachable_at") is None:
                state["first_unreachable_at"] = now
                self._save(name, state)
            platform, asked = None, False
            for run in runs:
                run_id = run["run_id"]
                if [h for h, _e in move.find_run(self.ledger, run_id)] != [name]:
                    continue  # moved already (by hand, or by an earlier watcher), or not this host's
                mine = state["runs"].get(run_id) or {}
                settings = opted_in(run["job"])
                if not asked:
                    platform, asked = platform_state(host), True
                why = decide(False, platform, state["first_unreachable_at"], now, settings["move_after_s"])
                if why is None:
                    continue
                if mine.get("state") == "moving":
                    spare = mine.get("to")  # a watcher stopped mid-move: the same spare (its launch is idempotent)
                else:
                    unavailable = set(mine.get("tried") or []) | taken
                    unavailable |= {s for s in settings["spares"] if s not in unavailable and self._busy(s)}
                    spare = first_free(settings["spares"], name, unavailable)
                    while spare is not None and self._skip(name, run_id, spare, run["job"], state):
                        unavailable.add(spare)  # for this tick: the next tick looks at it again
                        spare = first_free(settings["spares"], name, unavailable)
                if spare is None:
                    self._remind(name, run_id, state, why, settings["spares"])
                    continue
                taken.add(spare)
                mine = {**mine, "state": "moving", "to": spare, "at": now, "reason": why}
                state["runs"][run_id] = mine
                self._save(name, state)  # before the move: a watcher stopped during it goes on, never repeats it
                self.console.print(f"[yellow]{escape(name)}: {escape(run_id)}: its box is gone ({escape(why)}): "
                                   f"moving it to the spare {escape(spare)}[/yellow]")
                code = self._move(run_id, spare)
                entry = {"t": time.time(), "event": "moved" if code == errors.OK else "move_failed", "host": name,
                         "run_id": run_id, "to": spare, "reason": why, "exit_code": code, "automatic": True}
                arrived = memory.arrival(self.ledger, spare, run.get("project") or host.project, run_id) or {}
                if code == errors.OK and arrived.get("superseded"):  # a move back: what it set aside there
                    entry["superseded"] = arrived["superseded"]
                append_jsonl(self.events, entry)
                if code == errors.OK:
                    mine["state"] = "moved"
                    detail = f"its box is gone ({why}): moved to the spare {spare} by watch"
                    done.append({"run_id": run_id, "from": name, "to": spare, "gone": platform in PLATFORM_GONE})
                else:
                    mine.update(state="failed", tried=[*(mine.get("tried") or []), spare])
                    detail = f"its box is gone ({why}): the move to the spare {spare} failed (exit {code})"
                    self.console.print(f"[red]{escape(name)}: {escape(run_id)}: not moved to {escape(spare)} (exit "
                                       f"{code})[/red]; the next tick tries the next free spare")
                self._notify(name, f"moved:{name}:{run_id}:{spare}:{int(now)}", run_id, detail)
                self._save(name, state)
            if all(self._moved(state, r["run_id"]) for r in runs):
                self.left.add(name)
        return done

    def _skip(self, name: str, run_id: str, spare: str, job: dict, state: dict) -> bool:
        """Look at the spare before the run moves there (one SSH call): one that does not answer, whose durable
        root is not writable or has less free disk than the job's floor is skipped this tick, with a line, a
        `spare_skipped` event and a notification once per outage and spare."""
        host = self._hosts().get(spare)
        floor = job.get("disk_floor_gib")
        floor = DEFAULT_DISK_FLOOR_GIB if floor is None else float(floor)
        answer, said = look_at_spare(self.args.inventory, host, self.extravars) if host is not None else (None, "")
        problem = spare_problem(answer, floor, said)
        if problem is None:
            return False
        self.console.print(f"[yellow]{escape(name)}: {escape(run_id)}: the spare {escape(spare)} is skipped this "
                           f"tick: {escape(printable(problem))}[/yellow]; the next free spare is tried")
        append_jsonl(self.events, {"t": time.time(), "event": "spare_skipped", "host": name, "run_id": run_id,
                                   "spare": spare, "reason": problem, "automatic": True})
        mine = state["runs"].setdefault(run_id, {})
        noted = mine.setdefault("spares_skipped", {})
        if noted.get(spare) != state.get("first_unreachable_at"):  # once per outage and spare
            noted[spare] = state.get("first_unreachable_at")
            self._save(name, state)
            self._notify(name, f"spare_skipped:{name}:{run_id}:{spare}:{state.get('first_unreachable_at')}", run_id,
                         f"its box is gone: the spare {spare} was skipped ({problem})")
        return True

    @staticmethod
    def _moved(state: dict, run_id: str) -> bool:
        return (state["runs"].get(run_id) or {}).get("state") == "moved"

    def _move(self, run_id: str, spare: str) -> int:
        ns = argparse.Namespace(**{**vars(self.args), "run": run_id, "to": spare, "json": False, "extra_vars": [],
                                   "limit": None})
        try:
            return move.cmd_move(ns, self.console)
        except InputError as exc:
            self.console.print(f"[red]move refused[/red]: {escape(printable(exc.message))}")
            return errors.BAD_INPUT
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - the watch goes on and says why
            self.console.print(f"[red]move failed[/red]: {type(exc).__name__}: {escape(printable(str(exc)))}")
            return errors.FAILED

    def _remind(self, name: str, run_id: str, state: dict, why: str, spares: list[str]) -> None:
        self.console.print(f"[red]{escape(name)}: {escape(run_id)}: its box is gone ({escape(why)}) and no spare is "
                           f"free ({escape(', '.join(spares))})[/red]: free one, or "
                           f"`rgt-run move -i INV {escape(run_id)} --to HOST`")
        mine = state["runs"].setdefault(run_id, {})
        if mine.get("reminded_for") != state.get("first_unreachable_at"):  # once per outage
            mine["reminded_for"] = state.get("first_unreachable_at")
            self._save(name, state)
            self._notify(name, f"nospare:{name}:{run_id}:{state.get('first_unreachable_at')}", run_id,
                         f"its box is gone ({why}) and no spare is free ({', '.join(spares)}): not moved")

    def _notify(self, host: str, event_id: str, run_id: str, detail: str, kind: str = _states.MOVED) -> None:
        if self.notifier is None:
            return
        try:
            self.notifier.queue(host, kind, event_id, {"host": host, "run_id": run_id}, detail)
        except Exception as exc:  # noqa: BLE001 - a notification never fails the watch
            self.console.print(f"notify: {kind} message not queued ({type(exc).__name__}: {exc})", highlight=False,
                               markup=False)

    def fenced(self, entries: list[dict]) -> None:
        """Notify each fence watch made this tick (rgt.move.fence's entries)."""
        for e in entries:
            what = "its stale attempt there was stopped" if e.get("stopped") else "no attempt of it ran there"
            self._notify(e["host"], f"fence:{e['host']}:{e['run_id']}:{e.get('generation')}", e["run_id"],
                         f"moved to {e.get('moved_to')} (generation {e.get('generation')}): {what}", _states.FENCED)
