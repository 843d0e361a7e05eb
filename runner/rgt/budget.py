"""Budgets and idle meters (docs/unattended.md "Budgets and idle meters"): what `rgt-run watch` does with money.

- A budget (`rgt_job.budget_usd`) is per run, or per sweep when the job has `sweep:` (every cell's spend summed).
  Spend is the cost of the run's attempts as the report computes it (rgt.runreport.run_facts `attempts_cost`:
  price_per_hour, the box's price, x the wall time of the attempts); the box's price is the platform's own where
  its API says it (rgt.prices: RunPod, vast.ai), else the configured one (`source`: platform | inventory).
  Watch notifies at 50, 80 and 100% of it, once each (the kind `budget` of a notify rule, and a line of watch's
  output); at 100% it asks every live run of the budget to checkpoint and stop: the budget marker and
  RGT_PREEMPT_FILE on the box, in one call of the status round (op budget_stop: rgt_runlayout.request_budget_stop).
  A sweep is held first on each of its boxes (op budget_hold: <sweep_dir>/.rgt/BUDGET_STOP, so its queue starts no
  cell into a freed slot, and its pending Slurm array tasks are scancelled); the cells it holds show
  budget_stopped (stop_reason budget_held). The wrapper ends that attempt `budget_stopped`; only `rgt-run retry`
  with a higher budget_usd starts it again (check_retry), from its newest checkpoint; `rgt-run retry SWEEP` lifts
  a sweep's hold on every box.
- An idle meter is a box with no live run, every run on it pulled and verified, and no valid authorisation of its
  meter stop (rgt.unattended.authorises): it bills for nothing. Watch says so with its cost so far (price x time
  since its last run ended: runreport's `idle_cost` rule), then again every IDLE_EVERY_S.

`<ledger>/budget.json` (atomic, schema rgt/budget/v1; one watcher per ledger: rgt.watchlock) keeps what was
notified and which stops were sent, so a watch started again notifies nothing twice; a new budget_usd for the
same run or sweep starts its thresholds over.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from rgt import engines, errors, paths, runreport, sshround, unattended
from rgt.ledger import atomic_write_json, read_json, runs_dir
from rgt.prices import INVENTORY, PLATFORM, Prices
from rgt.runs import pull_state
from rgt.safetext import printable

_states = paths.module_util("rgt_states")
SCHEMA = "rgt/budget/v1"
THRESHOLDS = (50, 80, 100)
IDLE_EVERY_S = 1800.0


# ---------------------------------------------------------------- the arithmetic

def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def spend(doc: dict, now: float | None = None) -> float | None:
    """The spend of one run: the cost of its attempts (rgt.runreport.run_facts: price x attempts' wall time);
    None without a price."""
    try:
        return runreport.run_facts(doc, now=now)["attempts_cost"]
    except Exception:  # noqa: BLE001 - a figure a box's odd document cannot give counts as none
        return None


def budget_of(doc: dict) -> float | None:
    value = _number(doc.get("budget_usd"))
    return value if value is not None and value > 0 else None


def key_of(doc: dict) -> str:
    """The budget a run counts against: its sweep's (a cell), else its own."""
    sweep = doc.get("sweep")
    if isinstance(sweep, dict):
        sweep = sweep.get("name")
    if isinstance(sweep, str) and sweep:
        return f"sweep:{sweep}"
    return f"run:{doc.get('host')}:{doc.get('run_id')}"


def crossed(pct: float, done: list) -> list[int]:
    """The thresholds `pct` reached that were not notified yet, lowest first."""
    return [t for t in THRESHOLDS if pct >= t and t not in done]


def tally(runs: list[dict], now: float | None = None, prices: dict[str, float] | None = None) -> dict[str, dict]:
    """{budget key: {budget_usd, spent_usd, pct, scope, source, runs}} of every run with a budget (a sweep: the sum
    of its cells' spend, the budget of its cells). `prices`: {host: the platform's price} (rgt.prices), used
    instead of a run's configured price_per_hour; `source` is platform when every priced run's price is the
    platform's, else inventory."""
    prices = prices or {}
    out: dict[str, dict] = {}
    for doc in runs:
        budget = budget_of(doc)
        if budget is None or not _states.from_the_box(doc.get("state")):
            continue
        key = key_of(doc)
        entry = out.setdefault(key, {"budget_usd": budget, "spent_usd": 0.0, "priced": False,
                                     "scope": key.split(":", 1)[0], "sources": set(), "runs": []})
        entry["budget_usd"] = max(entry["budget_usd"], budget)  # cells of one sweep launched with one job
        price = prices.get(str(doc.get("host")))
        cost = spend({**doc, "price_per_hour": price} if price is not None else doc, now)
        if cost is not None:
            entry["spent_usd"] = round(entry["spent_usd"] + cost, 4)
            entry["priced"] = True
            entry["sources"].add(PLATFORM if price is not None else INVENTORY)
        entry["runs"].append(doc)
    for entry in out.values():
        entry["pct"] = round(100.0 * entry["spent_usd"] / entry["budget_usd"], 1)
        entry["source"] = PLATFORM if entry.pop("sources") == {PLATFORM} else INVENTORY
    return {k: v for k, v in out.items() if v["priced"]}


def annotate(runs: list[dict], now: float | None = None, prices: dict[str, float] | None = None) -> dict[str, dict]:
    """Give each run with a budget its `budget` field ({budget_usd, spent_usd, pct, scope, source}: status's
    column and --json); returns the tally."""
    tallied = tally(runs, now, prices)
    for entry in tallied.values():
        view = {k: entry[k] for k in ("budget_usd", "spent_usd", "pct", "scope", "source")}
        for doc in entry["runs"]:
            doc["budget"] = view
    return tallied


def column(doc: dict) -> str:
    """Status's budget column: `$spent/$budget (pct%)`, a sweep's marked; `-` without a budget."""
    b = doc.get("budget")
    if not isinstance(b, dict):
        return "-"
    scope = " sweep" if b.get("scope") == "sweep" else ""
    return f"${b['spent_usd']:.2f}/${b['budget_usd']:.2f}{scope} ({b['pct']:.0f}%)"


def platform_prices(runs: list[dict], prices: Prices) -> dict[str, float]:
    """{host: the platform's price} for the hosts of the runs with a budget (rgt.prices: asked when due, cached in
    <ledger>/prices.json; a host without one counts at its configured price)."""
    names = sorted({str(r.get("host")) for r in runs if budget_of(r) is not None})
    prices.refresh(names)
    return {name: price for name in names if (price := prices.of(name)) is not None}


# ---------------------------------------------------------------- retry

def check_retry(ledger: Path, host: str, run_id: str, job: dict | None, sweep: str | None = None) -> None:
    """Refuse (exit 3) to retry a run stopped at its budget while the job's budget_usd is no more than what the
    run (or its sweep) spent: the budget it is retried with must be higher."""
    record = (_load(ledger)["budgets"]).get(f"sweep:{sweep}" if sweep else f"run:{host}:{run_id}")
    if not isinstance(record, dict) or not record.get("stopped"):
        return
    spent = _number(record.get("spent_usd")) or 0.0
    budget = budget_of(job or {})
    if budget is not None and budget <= spent:
        what = f"sweep {sweep}" if sweep else f"run {run_id}"
        raise errors.GateRefused(
            f"{what} was stopped at its budget: it spent ${spent:.2f} and rgt_job.budget_usd is ${budget:.2f}; "
            f"retry it with a higher budget (rgt_job.budget_usd above {spent:.2f}, e.g. -e @job.yml)")


def stopped(ledger: Path, sweep: str) -> bool:
    """Did watch stop (and hold) this sweep at its budget (`<ledger>/budget.json`)?"""
    record = _load(ledger)["budgets"].get(f"sweep:{sweep}")
    return isinstance(record, dict) and bool(record.get("stopped"))


# ---------------------------------------------------------------- the watcher's pass

def _load(ledger: Path) -> dict:
    doc = read_json(ledger / "budget.json")
    fresh = {"schema": SCHEMA, "budgets": {}, "idle": {}}
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return fresh
    return {**fresh, **{k: doc[k] for k in ("budgets", "idle") if isinstance(doc.get(k), dict)}}


def authorised(ledger: Path, host, now: float | None = None) -> bool:
    """Is this host's meter stop authorised (rgt.unattended: an intact, unexpired authorisation naming its
    instance)? A box whose stop is authorised is the watcher's to stop, not an idle meter."""
    instance = str((getattr(host, "vars", None) or {}).get("rgt_instance_id") or "")
    return bool(instance) and unattended.authorises(ledger, instance, now)


class Watcher:
    """One per watch: `tick(latest)` after each status tick (rgt.status.cmd_watch)."""

    def __init__(self, args, console: Console, ledger: Path, hosts: list, extravars: dict, notifier=None,
                 clock=time.time, prices: Prices | None = None):
        self.args, self.console, self.ledger = args, console, ledger
        self.hosts = {h.name: h for h in hosts}
        self.extravars = extravars
        self.notifier = notifier
        self.clock = clock
        self.prices = prices or Prices(ledger, hosts, console, clock=clock)

    def tick(self, latest: dict[str, dict]) -> None:
        """Notify the thresholds reached, stop what is over budget, say the idle meters; never raises."""
        try:
            self._tick(latest)
        except Exception as exc:  # noqa: BLE001 - the budget pass never fails the watch
            self.console.print(f"budget: skipped this tick ({type(exc).__name__}: {exc})", highlight=False,
                               markup=False)

    def _tick(self, latest: dict[str, dict]) -> None:
        state = _load(self.ledger)
        now = self.clock()
        runs = [r for doc in latest.values() for r in (doc, *(doc.get("other_runs") or [])) if isinstance(r, dict)]
        changed = False
        for key, entry in sorted(annotate(runs, now, platform_prices(runs, self.prices)).items()):
            changed |= self._budget(state, key, entry, now)
        for name, doc in sorted(latest.items()):
            changed |= self._idle(state, name, doc, now)
        if changed:
            atomic_write_json(self.ledger / "budget.json", state)

    # -- budgets
    def _budget(self, state: dict, key: str, entry: dict, now: float) -> bool:
        record = state["budgets"].get(key)
        if not isinstance(record, dict) or record.get("budget_usd") != entry["budget_usd"]:
            record = {"budget_usd": entry["budget_usd"], "notified": [], "stops": {}, "stopped": False}
        record.update(spent_usd=entry["spent_usd"], pct=entry["pct"], seen_at=now)
        state["budgets"][key] = record
        what = key.replace(":", " ", 1)
        for threshold in crossed(entry["pct"], record["notified"]):
            record["notified"].append(threshold)
            detail = (f"{what}: ${entry['spent_usd']:.2f} of its ${entry['budget_usd']:.2f} budget "
                      f"({entry['pct']:.0f}%, threshold {threshold}%; {entry['source']} price)"
                      + ("; asking it to checkpoint and stop" if threshold == 100 else ""))
            self.console.print(printable(f"budget {threshold}%: {detail}"), highlight=False, markup=False)
            view = entry["runs"][0]
            self._notify(view.get("host"), f"budget:{key}:{entry['budget_usd']}:{threshold}", view, detail)
        if entry["pct"] >= 100:
            if entry["scope"] == "sweep":  # first the hold, so that no queue starts a cell into a freed slot
                self._hold_sweep(record, key.split(":", 1)[1], entry, now)
            for doc in entry["runs"]:
                if doc.get("state") in _states.ACTIVE:
                    stop_key = f"{doc.get('host')}:{doc.get('run_id')}:{doc.get('attempt')}"
                    if stop_key not in record["stops"]:
                        sent = self._stop(doc, entry)
                        if sent is not False:  # asked, or cannot be from here (said once)
                            record["stops"][stop_key] = now
                            record["stopped"] = record["stopped"] or bool(sent)
        if any(d.get("state") == "budget_stopped" for d in entry["runs"]):
            record["stopped"] = True
        return True

    def _hold_sweep(self, record: dict, sweep: str, entry: dict, now: float) -> None:
        """Hold the sweep on each of its hosts not held yet (`record["holds"]`): its budget marker
        (<sweep_dir>/.rgt/BUDGET_STOP, the queue starts no cell while it is there) and its pending Slurm tasks
        cancelled, in one call of the status round (op budget_hold)."""
        holds = record.setdefault("holds", {})
        cells: dict[str, list[str]] = {}
        for doc in entry["runs"]:
            cells.setdefault(str(doc.get("host")), []).append(str(doc.get("run_id")))
        for name, ids in sorted(cells.items()):
            if name in holds:
                continue
            held = self._hold(name, sweep, sorted(ids), entry)
            if held is not False:  # held, or cannot be from here (said once)
                holds[name] = now
                record["stopped"] = record["stopped"] or bool(held)

    def _hold(self, name: str, sweep: str, cells: list[str], entry: dict) -> bool | None:
        """One host's hold (op budget_hold): True held, False not this time (tried again next tick), None cannot
        be from here (no SSH round to its box)."""
        host = self.hosts.get(name)
        label = printable(f"{name}:{sweep}")
        if (host is None or not engines.engine_of(host.profile).over_ssh
                or not sshround.can_round(self.args.inventory, host, self.extravars)):
            self.console.print(f"budget: cannot hold sweep {label} from here (no SSH round to its box): its queue "
                               "may start more cells; stop them by hand", highlight=False, markup=False)
            return None
        params = sshround.status_params(host)
        marker = {"reason": "budget", "sweep": sweep, "spent_usd": entry["spent_usd"],
                  "budget_usd": entry["budget_usd"], "scope": "sweep",
                  "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        request = {"op": "budget_hold", "durable_root": params["durable_root"], "project": params["project"],
                   "sweep": sweep, "cells": cells, "marker": marker}
        doc = self._round(host, request)
        if not doc.get("held"):
            self.console.print(printable(f"budget: could not hold sweep {label} ({doc.get('msg') or doc.get('why')}); "
                                         "trying again next tick"), highlight=False, markup=False)
            return False
        cancelled = doc.get("cancelled") or []
        self.console.print(printable(f"budget: held sweep {label}: its queue starts no more cells"
                                     + (f"; cancelled pending Slurm task(s) {', '.join(cancelled)}" if cancelled
                                        else "")), highlight=False, markup=False)
        for error in doc.get("errors") or []:
            self.console.print(printable(f"budget: sweep {label}: could not cancel {error}"), highlight=False,
                               markup=False)
        return True

    def _round(self, host, request: dict) -> dict:
        """One call of the status round with `request`: its answer's last line as a dict ({"why": ...} when
        there is none)."""
        answer = sshround.run_cached(sshround.target_for(self.args.inventory, host, self.extravars),
                                     (json.dumps(request) + "\n").encode())
        try:
            doc = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError, AttributeError):
            doc = None
        if not isinstance(doc, dict):
            return {"why": f"rc {answer.rc}: {sshround.first_line(answer.stderr)}"}
        return doc

    def _stop(self, doc: dict, entry: dict) -> bool | None:
        """The budget marker and RGT_PREEMPT_FILE on the run's box (the status round's op budget_stop): True
        asked, False not this time (tried again next tick), None cannot be from here (no SSH round to its box)."""
        name = doc.get("host")
        host = self.hosts.get(name)
        label = printable(f"{name}:{doc.get('run_id')}")
        if (host is None or not engines.engine_of(host.profile).over_ssh
                or not sshround.can_round(self.args.inventory, host, self.extravars)):
            self.console.print(f"budget: cannot stop {label} from here (no SSH round to its box): stop it by hand",
                               highlight=False, markup=False)
            return None
        params = sshround.status_params(host)
        marker = {"reason": "budget", "run_id": doc.get("run_id"), "attempt": doc.get("attempt"),
                  "spent_usd": entry["spent_usd"], "budget_usd": entry["budget_usd"], "scope": entry["scope"],
                  "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        request = {"op": "budget_stop", "durable_root": params["durable_root"], "project": params["project"],
                   "run_id": str(doc.get("run_id")), "marker": marker}
        answer = sshround.run_cached(sshround.target_for(self.args.inventory, host, self.extravars),
                                     (json.dumps(request) + "\n").encode())
        try:
            stopped = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1]).get("stopped")
        except (ValueError, IndexError, AttributeError):
            stopped = False
        if stopped:
            self.console.print(f"budget: asked {label} to checkpoint and stop (RGT_PREEMPT_FILE)", highlight=False,
                               markup=False)
        else:
            self.console.print(printable(f"budget: could not ask {label} to stop (rc {answer.rc}: "
                                         f"{sshround.first_line(answer.stderr)}); trying again next tick"),
                               highlight=False, markup=False)
        return bool(stopped)

    # -- idle meters
    def _idle(self, state: dict, name: str, doc: dict, now: float) -> bool:
        runs = [r for r in (doc, *(doc.get("other_runs") or [])) if isinstance(r, dict)]
        host = self.hosts.get(name)
        seen = [r for r in runs if _states.from_the_box(r.get("state")) and r.get("state") != "not_started"]
        idle = (host is not None and bool(seen) and not any(_states.is_live(r.get("state")) for r in runs)
                and all(pull_state(runs_dir(getattr(self.args, "runs_dir", None)), str(r.get("run_id")), name)
                        == "verified" for r in seen)
                and not authorised(self.ledger, host, now))
        record = state["idle"].get(name)
        if not idle:
            if record is not None:
                state["idle"].pop(name)
                return True
            return False
        if isinstance(record, dict) and now - (record.get("said_at") or 0) < IDLE_EVERY_S:
            return False
        facts = [runreport.run_facts(r, now=now) for r in seen]
        idle_s = min((f["idle_after_end_s"] for f in facts if f.get("idle_after_end_s") is not None), default=None)
        price = next((f["price_per_hour"] for f in facts if f.get("price_per_hour") is not None), None)
        cost = (f"${price * idle_s / 3600.0:.2f}" if price is not None and idle_s is not None
                else "cost unknown (no price_per_hour)")
        minutes = f"{idle_s / 60:.0f} min" if idle_s is not None else "a while"
        detail = (f"idle meter: nothing runs, every run is pulled and verified, no authorisation; billing for "
                  f"{minutes} since its last run ended: {cost} so far; tear it down (rgt-run teardown)")
        self.console.print(printable(f"{name}: {detail}"), highlight=False, markup=False)
        self._notify(name, f"idle:{name}:{int(now)}", doc, detail, kind=_states.IDLE_METER)
        state["idle"][name] = {"said_at": now, "idle_s": idle_s}
        return True

    def _notify(self, host: str | None, event_id: str, view: dict, detail: str, kind: str = _states.BUDGET) -> None:
        if self.notifier is None or host is None:
            return
        try:
            self.notifier.queue(host, kind, event_id, view, detail)
        except Exception as exc:  # noqa: BLE001 - a notification never fails the watch
            self.console.print(f"notify: budget message not queued ({type(exc).__name__}: {exc})", highlight=False,
                               markup=False)
