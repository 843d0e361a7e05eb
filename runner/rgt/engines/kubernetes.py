"""The Kubernetes engine: a host whose detach primitive is the k8s-job (the registry: run from the controller,
reads rgt_job.k8s). Its run is a Job applied from here with kubectl; every operation is rgt.k8s_run's (the
manifests: rgt.k8s; kubectl: rgt.k8s_engine). There is no box: nothing is pinned, no secret is read here (the Job
reads a Secret by reference), and a playbook other than train / launch_detached is refused."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import errors, k8s, k8s_engine, k8s_run, memory, paths
from rgt.engines.base import Engine, LogSource
from rgt.errors import InputError
from rgt.phases import PhaseResult, new_ident


class Kubernetes(Engine):
    name = "kubernetes"
    over_ssh = False
    programs = ("kubectl",)
    code_in_image = True  # rgt_job.k8s.workdir: the code may be in the image (manifests_for checks)
    reports_after_pull = False  # a run's report needs its box's records: there is no box

    @classmethod
    def drives(cls, entry) -> bool:
        # the primitive that reads rgt_job.k8s and is applied from the controller
        return entry is not None and entry.runs_on == "controller" and "k8s" in entry.job_fields

    def plan(self, stem: str, hosts: list) -> dict:
        """A playbook the engine does not run is refused at input (exit 2); every host's manifests validated."""
        if hosts and stem not in k8s_run.PLAYBOOKS:
            raise InputError(f"{', '.join(h.name for h in hosts)}: a Kubernetes host has no box to run "
                             f"playbooks/{stem}.yml on (its run is a Job on the cluster)",
                             fix="use rgt-run train, status, watch, logs, pull and teardown on it, or --limit the "
                                 "play to the other hosts", field="rgt_profile")
        return k8s_run.plan_launch(hosts) if hosts else {}

    def plan_manifests(self, host, job: dict, run_paths, scratch_root: str | None, code_src: str | None,
                       ignore_file: str | None) -> dict:
        manifests = k8s.manifests_for(host.name, host.profile, job, run_paths, scratch_root, code_src=code_src,
                                      ignore_file=ignore_file, instance_id=str(host.instance_id))
        manifests.pop("documents")  # the full manifests (base64 code included) are the engine's; `files` is shown
        return manifests

    def play(self, playbook: Path, hosts: list, planned: object, args: argparse.Namespace, extravars: dict,
             ledger: Path, console: Console, limit: str | None) -> PhaseResult:
        shown = playbook.relative_to(paths.REPO_ROOT) if playbook.is_relative_to(paths.REPO_ROOT) else playbook
        result = PhaseResult(playbook=str(shown), ident=new_ident(playbook), rc=0, status="successful")
        if planned and not args.check:
            result.hosts.update(k8s_run.start_k8s_job(planned, console))
            memory.remember_launches(ledger, hosts, result)
        return result

    def relaunch(self, args: argparse.Namespace, console: Console, hosts: list, extravars: dict,
                 ledger: Path) -> int:
        return k8s_run.relaunch(hosts, console, ledger)

    def check_retry(self, cell: str, host) -> None:
        raise InputError(f"{cell} on {host.name} is a Kubernetes Job: a failed Job is never started again "
                         "(docs/kubernetes.md)", fix="start it as a new run: give rgt_job a new run_id and run "
                         "`rgt-run train`", field="cell")

    def observe(self, args: argparse.Namespace, console: Console, hosts: list, extravars: dict,
                ledger: Path) -> dict[str, dict]:
        now = time.time()
        return {h.name: k8s_run.status_doc(h, now) for h in hosts}  # kubectl get job, pods

    def assess(self, instances: list, args: argparse.Namespace, extravars: dict, ledger: Path, runs: Path,
               console: Console, manifest_lib) -> dict[str, dict]:
        """Every Job rgt launched for the instance's hosts, looked at with kubectl, judged by the same gate."""
        return {inst.instance_id: k8s_run.assess(inst, ledger, runs, manifest_lib) for inst in instances}

    def stop(self, instances: list, plans: dict[str, dict], confirmed: list[str], resumed: list[str],
             args: argparse.Namespace, extravars: dict, ledger: Path, runs: Path, console: Console, manifest_lib,
             done: Callable[[str, dict], None]) -> list[int]:
        """Each confirmed instance's Jobs deleted (looked at and gated again first; the claim is kept)."""
        by_id = {i.instance_id: i for i in instances}
        codes = []
        for iid in confirmed:
            console.print(f"\n[bold]rgt[/bold] teardown of {escape(iid)}: deleting its Jobs")
            outcome = k8s_run.tear_down(by_id[iid], plans[iid], ledger, runs, manifest_lib)
            done(iid, outcome)
            codes.append({"done": errors.OK, "refused": errors.REFUSED,
                          "unreachable": errors.UNREACHABLE}.get(outcome["status"], errors.FAILED))
        return codes

    def log_sources(self, args: argparse.Namespace, hosts: list, extravars: dict) -> list[LogSource]:
        """`kubectl logs job/NAME -c job` of each host's run (or --run's), run here."""
        return [LogSource(h.name, None, {}, argv=k8s_run.logs_argv(h, args.run, args.tail, args.follow),
                          what="kubectl logs", explain=_log_failure) for h in hosts]

    def collect(self, playbook: Path, hosts: list, args: argparse.Namespace, extravars: dict, ledger: Path,
                runs: Path, console: Console) -> PhaseResult:
        """Seal on the claim, copy through a helper pod, verify here."""
        return k8s_run.pull(hosts, runs, bool(args.verify_only), console)


def _log_failure(argv: list[str], stderr: str) -> dict:
    """What a failed `kubectl logs` says: the cluster did not answer (unreachable), or an error."""
    exc = k8s_engine.failure(argv[argv.index("logs"):argv.index("logs") + 2], stderr)
    return {"state": "unreachable" if isinstance(exc, k8s_engine.ClusterUnreachable) else "error",
            "error": exc.message}
