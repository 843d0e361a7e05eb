"""The SSH engine: a box reached over SSH and driven by Ansible plays (rgt.phases), looked at by the SSH status
round (rgt.sshround) or monitor.yml. Its detach primitives are the box's: tmux, nohup (a sweep through the box's
queue) and sbatch (Slurm, a batch job submitted from the login node).

Slurm is this engine too, not one of its own: the login node is an SSH host like a box, and every play, the status
round, logs and pull reach it the same way. What differs is data of the registry (rgt_registry: sbatch runs on
the login node, reads rgt_job.slurm) and of the profile (roots on the shared filesystem), and box-side code
(rgt_detach.Sbatch and rgt_slurm: submit, squeue/sacct, scancel), which the same plays ship.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import confirmation, paths, sshround
from rgt.engines.base import Engine, LogSource, StopInterrupted
from rgt.errors import InputError
from rgt.inventory import render_vars
from rgt.ledger import read_json
from rgt.observe import first_line, poll_play, round_doc
from rgt.phases import PhaseResult, run_playbook
from rgt.profiles import verb_plan

# the host variables a round is built from (rgt.sshround.target_for, rgt_statusdoc.params_from_vars): the ones
# that are Ansible templates are rendered by Ansible before the round
ROUND_VARS = ("ansible_connection", "ansible_host", "ansible_ssh_host", "ansible_user", "ansible_ssh_user",
              "ansible_port", "ansible_ssh_port", "ansible_ssh_private_key_file", "ansible_private_key_file",
              "ansible_ssh_common_args", "ansible_ssh_args", "ansible_python_interpreter", "rgt_known_hosts",
              "rgt_durable_root", "rgt_project", "rgt_job", "monitor_durable_root", "monitor_project",
              "monitor_run_id", "run_context_project", "run_context_run_id")



def rendered(args: argparse.Namespace, hosts: list, extravars: dict) -> list:
    """`hosts`, each whose round values are Ansible templates (`{{ lookup('env', 'PWD') }}/.rgt/...`, `{{
    inventory_dir }}`) with those values as Ansible renders them for it on this machine (rgt.inventory.render_vars:
    no box contacted). The host's own values are rendered (a remembered job's too), and of rgt_job only the run id."""
    todo: dict[str, dict] = {}
    for host in hosts:
        values = {k: host.vars[k] for k in ROUND_VARS if k != "rgt_job" and sshround.templated(host.vars.get(k))}
        job = host.vars.get("rgt_job") if isinstance(host.vars.get("rgt_job"), dict) else {}
        named = {k: job[k] for k in ("run_id", "name") if sshround.templated(job.get(k))}
        if named:
            values["rgt_job"] = named
        if values:
            todo[host.name] = values
    if not todo:
        return hosts
    names = sorted(todo)
    done = render_vars(args.inventory, ",".join(names), {**extravars, "__rgt_logs_round": todo}, names,
                       "{{ __rgt_logs_round[inventory_hostname] }}")
    out = []
    for host in hosts:
        values = dict(done.get(host.name) or {})
        if "rgt_job" in values:
            values["rgt_job"] = {**host.vars["rgt_job"], **values["rgt_job"]}
        out.append(dataclasses.replace(host, vars={**host.vars, **values}) if values else host)
    return out


def sources_for(args: argparse.Namespace, hosts: list, extravars: dict) -> list[LogSource]:
    """Each host's log over the status round's connection (rgt_logread in the zipapp on the box)."""
    layout = paths.module_util("rgt_runlayout")
    cfg = sshround.ssh_config()
    out = []
    for host in rendered(args, hosts, extravars):
        try:
            target = sshround.target_for(args.inventory, host, extravars, cfg)
            params = sshround.status_params(host)
        except ValueError as exc:
            raise InputError(f"host '{host.name}': {exc}", fix="`rgt-run logs` reaches a box over plain SSH (or "
                             "runs locally): give it an SSH connection in the inventory", field=host.name) from exc
        run_id = args.run or params["run_id"]
        problem = layout.check_name(run_id, "run id")
        if problem:
            raise InputError(f"host '{host.name}' has no run to show ({problem})",
                             fix="pass --run RUN, or -e @job.yml with the job spec", field="--run")
        params = {"durable_root": params["durable_root"], "project": params["project"], "run_id": run_id,
                  "newest_attempt": not args.all_attempts, "tail": args.tail}
        out.append(LogSource(host.name, target, params))
    return out


TEARDOWN = paths.PLAYBOOKS_DIR / "teardown.yml"
_gate = paths.module_util("rgt_gate")  # the gate's rules, the same file the rgt_teardown module runs


def _offload_check():
    """The gate's look at an offloaded export's target, from here with the controller's rclone (rgt_offload)."""
    return paths.module_util("rgt_offload").target_check(paths.rclone_binary())


def assess_instance(inst, look, runs: Path, lib) -> dict:
    """The plan of one instance (rgt.teardown.Instance): the verb, and the gate over the listings the read-only play
    brought back."""
    item = verb_plan(inst)
    item.update(status=None, gate=None, reasons=[])
    outcomes = {name: look.hosts.get(name) for name in inst.names}
    reports = {name: (o.results.get("teardown_box_report") if o else None) for name, o in outcomes.items()}
    if any(o is not None and o.host_key_mismatch for o in outcomes.values()):
        item.update(status="refused", reasons=["the host key does not match its pin: check it with rgt-run pin "
                                               "(never retried)"])
        return item
    if reports and all(isinstance(r, dict) and r.get("already_gone") for r in reports.values()):
        record = next(iter(reports.values())).get("record") or {}
        item.update(status="already gone", final_state=record.get("final_state"))
        return item
    in_flight = [r for r in reports.values() if isinstance(r, dict) and r.get("in_flight")]
    if in_flight:  # the stop went out (or was about to) in an earlier run: poll it; the box may be gone already
        record = in_flight[0].get("record") or {}
        item.update(status="in flight", requested_at=record.get("requested_at") or record.get("at"),
                    final_state=record.get("final_state"), calls=record.get("calls") or [])
        return item
    listed = {n: r for n, r in reports.items() if isinstance(r, dict) and isinstance(r.get("box"), dict)}
    unlisted = sorted(set(inst.names) - set(listed))
    if unlisted and not listed:
        bad = [outcomes[n] for n in unlisted]
        status = "unreachable" if all(o is None or o.unreachable for o in bad) else "failed"
        first = next((m for o in bad if o for m in o.messages if m), "the listing play returned nothing")
        item.update(status=status, reasons=[f"could not list the runs on the box: {first.splitlines()[0]}"])
        return item
    boxes = [r["box"] for r in listed.values()]
    gate = _gate.evaluate(inst.instance_id, inst.inventory_hosts, boxes, str(runs), inst.profile, lib,
                          unlisted=unlisted, offload_check=_offload_check())
    item.update(gate=gate, reasons=list(gate["reasons"]), status="ready" if gate["passed"] else "refused")
    if item["verb"] == "scancel":  # the cluster's meter is its jobs: the same list the module cancels
        item["slurm_jobs"] = [j["job_id"] for j in paths.module_util("rgt_slurm").teardown_jobs(inst.instance_id,
                                                                                                 boxes)]
    return item


def outcome_of(inst, result, ledger: Path) -> dict:
    """What happened to one instance: the host that ran its teardown, its ledger record and report."""
    outs = {name: result.hosts.get(name) for name in inst.names}
    ran = next((n for n, o in outs.items() if o and (o.results.get("teardown_outcome_report") or o.failed)), None)
    ran = ran or inst.names[0]
    out = outs.get(ran)
    report = (out.results.get("teardown_outcome_report") if out else None) or {}
    record = read_json(ledger / "teardown" / f"{ran}.json") or {}
    outcome = {"host": ran, "refused": bool(out and out.gate_refused), "final_state": None, "calls": [],
               "messages": [m for o in outs.values() if o for m in o.messages], "report": report}
    if out is None:
        outcome["status"] = "not run"
    elif out.gate_refused:
        outcome["status"] = "refused"
    elif out.unreachable:
        outcome["status"] = "unreachable"
    elif out.failed:
        outcome.update(status="failed", final_state=record.get("final_state"), calls=record.get("calls") or [])
    else:
        outcome.update(status="done", final_state=record.get("final_state") or report.get("final_state"),
                       calls=record.get("calls") or report.get("calls") or [],
                       keeps_billing=record.get("keeps_billing") or report.get("keeps_billing"))
    return outcome


class Ssh(Engine):
    name = "ssh"
    over_ssh = True

    @classmethod
    def drives(cls, entry) -> bool:
        return entry is None or entry.runs_on in ("box", "login node")

    def play(self, playbook: Path, hosts: list, planned: object, args: argparse.Namespace, extravars: dict,
             ledger: Path, console: Console, limit: str | None) -> PhaseResult:
        return run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console, extravars=extravars,
                            limit=limit, tags=args.tags, skip_tags=args.skip_tags, check=args.check,
                            verbosity=args.verbose)

    def relaunch(self, args: argparse.Namespace, console: Console, hosts: list, extravars: dict,
                 ledger: Path) -> int:
        playbook = paths.PLAYBOOKS_DIR / "launch_detached.yml"
        result = run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console,
                              extravars={**extravars, "launch_detached_use_new_code": False},
                              limit=",".join(h.name for h in hosts), quiet=True, verbosity=args.verbose or 0)
        for name, outcome in sorted(result.hosts.items()):
            if outcome.failed or outcome.unreachable:  # the play was quiet: say why this relaunch did not happen
                why = first_line(list(reversed(outcome.messages))) or "the launch failed"
                console.print(f"  [red]not relaunched[/red] {escape(name)}: {escape(why)}")
        return result.exit_code

    def observe(self, args: argparse.Namespace, console: Console, hosts: list, extravars: dict,
                ledger: Path) -> dict[str, dict]:
        """The status round (parallel multiplexed SSH, the module's own code on the box); a host whose connection
        or status arguments are Ansible templates through monitor.yml instead (only Ansible can evaluate them)."""
        by_round = [h for h in hosts if sshround.can_round(args.inventory, h, extravars)]
        by_play = [h for h in hosts if h not in by_round]
        outcomes = sshround.status_round(args.inventory, by_round, extravars) if by_round else {}
        now = time.time()
        docs = {name: round_doc(name, outcome, now) for name, outcome in outcomes.items()}
        if by_play:
            docs.update(poll_play(args, console, by_play, extravars, ledger))
        return docs

    def log_sources(self, args: argparse.Namespace, hosts: list, extravars: dict) -> list[LogSource]:
        return sources_for(args, hosts, extravars)

    def assess(self, instances: list, args: argparse.Namespace, extravars: dict, ledger: Path, runs: Path,
               console: Console, manifest_lib) -> dict[str, dict]:
        """One teardown play over every box, in check mode: it lists the runs and ends before the gate and the
        verb; each instance is judged here over what it listed (rgt_gate)."""
        hosts = [h for inst in instances for h in inst.hosts]
        look = run_playbook(TEARDOWN, args.inventory, hosts, ledger=ledger,
                            console=console, extravars={**extravars, "rgt_runs_dir": str(runs),
                                                        "teardown_plan_only": True},
                            limit=",".join(h.name for h in hosts), check=True, quiet=not args.verbose,
                            verbosity=args.verbose)
        if look.status == "canceled":  # Ctrl-C while looking: nothing was asked or called
            raise KeyboardInterrupt
        return {inst.instance_id: assess_instance(inst, look, runs, manifest_lib) for inst in instances}

    def stop(self, instances: list, plans: dict[str, dict], confirmed: list[str], resumed: list[str],
             args: argparse.Namespace, extravars: dict, ledger: Path, runs: Path, console: Console, manifest_lib,
             done: Callable[[str, dict], None]) -> list[int]:
        """One teardown play over the confirmed and resumed boxes: its role looks again, re-checks the gate and
        calls the verb (the stop is on record before it is called)."""
        by_id = {i.instance_id: i for i in instances}
        running = [*confirmed, *resumed]
        run_hosts = [h for iid in running for h in by_id[iid].hosts]
        if not run_hosts:
            return []
        evars = {**extravars, "rgt_runs_dir": str(runs), "rgt_rclone_binary": paths.rclone_binary(),  # offload_check
                 confirmation.CHANNEL: {h.name: h.instance_id for iid in confirmed for h in by_id[iid].hosts}}
        console.print(f"\n[bold]rgt[/bold] teardown of {len(running)} instance(s): "
                      + ", ".join(escape(iid) + (" (polling the stop in flight)" if iid in resumed else "")
                                  for iid in running))
        result = run_playbook(TEARDOWN, args.inventory, run_hosts, ledger=ledger,
                              console=console, extravars=evars, limit=",".join(h.name for h in run_hosts),
                              verbosity=args.verbose)
        console.print()
        if result.status == "canceled":
            raise StopInterrupted([by_id[iid] for iid in running])
        for iid in running:
            done(iid, outcome_of(by_id[iid], result, ledger))
        return [result.exit_code]

    def collect(self, playbook: Path, hosts: list, args: argparse.Namespace, extravars: dict, ledger: Path,
                runs: Path, console: Console) -> PhaseResult:
        """The collect play (seal on the box, rsync here, verify here)."""
        return run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console, extravars=extravars,
                            limit=",".join(h.name for h in hosts), quiet=not args.verbose,
                            verbosity=args.verbose or 0)
