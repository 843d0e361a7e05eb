"""`rgt-run` on a host whose profile launches through a Kubernetes Job (detach primitive k8s-job): the commands
that act on a run go through the controller's engine (rgt.k8s_engine, the real kubectl) instead of an SSH play.

- train / launch_detached: the run's manifests (rgt.k8s: the claim, the staging ConfigMap, the Job; validated
  offline before any host is touched) are applied; a Job that exists is never applied again, and what it is doing
  is reported (`action: none`). The launch is remembered in the ledger like a box's (rgt.memory), so status, logs,
  pull and teardown need no job spec again.
- status / watch: one `kubectl get job` and one `kubectl get pods` per host (k8s_engine.observe), shaped like a
  box's status document (state, attempt, queue_reason, attention, warnings) with a `k8s` block. A cluster that
  does not answer is `unreachable`: it says nothing about the Job.
- logs: `kubectl logs job/NAME -c job` (the newest pod).
- pull: seal on the claim, copy through a helper pod, verify here (k8s_engine.pull).
- teardown: the meter of a Kubernetes host is its Jobs. The gate is per remembered run: a Job that is live refuses,
  an ended one needs a verified pull here; the verb deletes only the Jobs rgt launched for this host (foreground,
  the claim is kept). Nothing else in the namespace is touched.

The cluster is reached with the host's `rgt_kubeconfig` (a path; else $KUBECONFIG or kubectl's default) and
`rgt_kube_context`, in the namespace `rgt_job.k8s.namespace`. Credentials stay in the kubeconfig.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import posixpath
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rgt import jobspec, k8s, k8s_engine, memory, paths
from rgt.errors import InputError, RgtError
from rgt.events import HostOutcome
from rgt.ledger import atomic_write_json
from rgt.phases import PhaseResult
from rgt.profiles import verb_plan

# the playbooks a kubernetes host runs through the engine (the others need a box: rgt.engines.kubernetes.plan)
PLAYBOOKS = ("train", "launch_detached")
_layout = paths.module_util("rgt_runlayout")
_gate = paths.module_util("rgt_gate")  # the teardown gate's rules, the same file the rgt_teardown module runs
# an ended Job that train (and watch's auto_resume) replaces is in rgt_states.RESUMED (its pod was evicted or
# preempted); a failed, timed out or OOMKilled one is never relaunched (as on a box), a finished one is reported.
# A Job's state as the teardown gate's (rgt_gate.judge_run: live and queued block, finished needs a pull) is
# rgt_states.gate_state.
_states = paths.module_util("rgt_states")


@dataclass
class Target:
    """One kubernetes host's run: where it lives on the claim and how the cluster is reached."""

    host: object  # rgt.inventory.Host
    job: dict
    run_paths: object  # rgt_runlayout.RunPaths on the claim
    kubeconfig: str | None
    context: str | None
    namespace: str | None

    @property
    def run_id(self) -> str:
        return self.run_paths.run_id

    @property
    def job_name(self) -> str:
        return k8s.lib().job_name(self.run_paths)

    @property
    def claim(self) -> str:
        return k8s.lib().claim_name(self.job, self.run_paths.project)

    def kubectl(self):
        return k8s_engine.Kubectl(self.kubeconfig, self.context, self.namespace)


def _plain(host, key: str, value):
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        raise InputError(f"host '{host.name}': {key} is an Ansible template ({value!r}), and a Kubernetes host is "
                         "driven from the controller without Ansible", fix=f"set {key} to a plain value", field=key)
    return value


def target(host) -> Target:
    """The run of a kubernetes host from its job spec (given, in the inventory, or remembered); InputError when
    there is none or a value it needs is missing or templated."""
    job = host.vars.get("rgt_job")
    if not isinstance(job, dict) or not job:
        raise InputError(f"host '{host.name}': no job spec and no run remembered for it in the ledger",
                         fix="pass -e @job.yml (the one you trained with), or train first", field="rgt_job")
    root = _plain(host, "rgt_durable_root", host.vars.get("rgt_durable_root") or host.profile["roots"]["durable"])
    run_id = job.get("run_id") or job.get("name")
    try:
        run_paths = _layout.RunPaths(str(root), host.project, str(run_id))
    except ValueError as exc:
        raise InputError(f"host '{host.name}': {exc}", fix="set rgt_job.run_id (or name) and rgt_project to plain "
                         "names", field="rgt_job.run_id") from exc
    kubeconfig = _plain(host, "rgt_kubeconfig", host.vars.get("rgt_kubeconfig"))
    if kubeconfig:
        kubeconfig = os.path.expanduser(str(kubeconfig))
        if not os.path.isfile(kubeconfig):
            raise InputError(f"host '{host.name}': rgt_kubeconfig {kubeconfig} is not a file",
                             fix="point rgt_kubeconfig at the cluster's kubeconfig (or leave it out to use "
                                 "$KUBECONFIG / ~/.kube/config)", field="rgt_kubeconfig")
    context = _plain(host, "rgt_kube_context", host.vars.get("rgt_kube_context"))
    namespace = (job.get("k8s") or {}).get("namespace")
    return Target(host, job, run_paths, kubeconfig, context and str(context), namespace)


# ---------------------------------------------------------------- train

def plan_launch(hosts: list, credentials: bool = True) -> dict[str, tuple[Target, dict]]:
    """Every kubernetes host's target and validated manifests, before anything is applied (bad input: exit 2),
    and, with `credentials`, every offload credential set in this shell (train makes the offload Secret from them;
    watch's relaunch keeps the Secret the train made: offload_parts)."""
    out = {}
    for host in hosts:
        tgt = target(host)
        scratch = _plain(host, "rgt_scratch_root", host.vars.get("rgt_scratch_root")
                         or host.profile["roots"].get("scratch"))
        # an inventory's relative code_dir follows the inventory file (as the upload role reads it)
        local = jobspec.resolve_paths(tgt.job, host.job_base or Path.cwd())
        ignore = _plain(host, "upload_resume_ignore_file", host.vars.get("upload_resume_ignore_file"))
        out[host.name] = (tgt, k8s.manifests_for(host.name, host.profile, tgt.job, tgt.run_paths,
                                                 scratch and str(scratch), local.get("code_dir"), ignore,
                                                 str(host.instance_id)))
        if credentials:
            k8s_engine.offload_values(tgt.job)  # every offload credential set here, before anything is applied
    return out


def start_k8s_job(planned: dict[str, tuple[Target, dict]], console, new_code: bool = True) -> dict:
    """The k8s-job primitive (rgt_registry): apply each host's manifests (an ended, preempted Job is replaced; with
    `new_code`, as `train` does on a box, its staging ConfigMap too, so the new pod runs the code and job.json of
    this spec; watch's relaunch keeps the old ones). {host: HostOutcome} with a `launch_detached_report` like a
    box's launch (state, action, attempt, detach) plus the Job, its namespace and what was created."""
    outcomes = {}
    for name, (tgt, manifests) in planned.items():
        out = HostOutcome()
        outcomes[name] = out
        try:
            kc = tgt.kubectl()
            before = k8s_engine.observe(kc, tgt.job_name)["state"]
            relaunch = before in _states.RESUMED
            if relaunch:  # its pod was taken away: the ended Job goes, a new one resumes from the newest checkpoint
                k8s_engine.delete(kc, tgt.job_name)
                if new_code:
                    kc.check("delete", "configmap", k8s.lib().stage_name(tgt.run_paths), "--ignore-not-found")
            docs = manifests["documents"]
            applied = []
            if relaunch or before == "not_started":  # a Job will be applied: its offload's rclone and Secret first
                values = offload_credentials(kc, tgt)  # before anything is applied
                claim = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
                applied = k8s_engine.apply(kc, claim)  # the helper that ships rclone mounts it
                applied += offload_parts(kc, tgt, values)
                docs = [d for d in docs if d["kind"] != "PersistentVolumeClaim"]
            applied += k8s_engine.apply(kc, docs)
            seen = k8s_engine.observe(kc, tgt.job_name)
        except k8s_engine.ClusterUnreachable as exc:
            out.unreachable = True
            out.messages.append(exc.message)
            continue
        except RgtError as exc:
            out.failed = True
            out.bad_input = isinstance(exc, InputError)
            out.messages.append(exc.message + (f" (fix: {exc.fix})" if exc.fix else ""))
            continue
        created = [f"{a['kind']} {a['name']}" for a in applied if a["action"] == "created"]
        job_created = any(a["kind"] == "Job" and a["action"] == "created" for a in applied)
        state = seen["state"]
        action = ("relaunch" if relaunch else "launch") if job_created else "none"
        msg = (f"{'re' if relaunch else ''}applied Job {tgt.job_name} in {tgt.namespace or 'the context namespace'}"
               f": {state}" if job_created else f"Job {tgt.job_name} exists ({state}): not applied twice")
        if state == "queued" and seen.get("queue_reason"):
            msg += f" ({seen['queue_reason']})"
        out.changed = len(created)
        out.ok = 1
        out.warnings += seen.get("warnings") or []
        out.results["launch_detached_report"] = {
            "state": state, "action": action, "attempt": seen.get("attempt"),
            "detach": k8s.primitive(tgt.host.profile), "session": None, "code_dir": None,
            "run_dir": tgt.run_paths.run_dir,
            "k8s_job": tgt.job_name, "namespace": tgt.namespace, "created": created, "msg": msg}
        console.print(f"[bold]{name}[/bold]: {msg}", highlight=False, markup=True)
    return outcomes


def relaunch(hosts: list, console, ledger: Path) -> int:
    """watch's auto_resume on kubernetes hosts: their Jobs again (a preempted one is replaced), remembered in the
    ledger; the exit code of the launch."""
    result = PhaseResult(playbook="kubernetes relaunch", ident="relaunch", rc=0, status="successful",
                         hosts=start_k8s_job(plan_launch(hosts, credentials=False), console, new_code=False))
    memory.remember_launches(ledger, hosts, result)
    return result.exit_code


def offload_credentials(kc, tgt: Target) -> dict[str, str] | None:
    """The offload Secret's values from this shell (k8s_engine.offload_values), or None to keep the Secret the
    run has: a relaunch from a shell without them (watch's auto_resume) when the run's Secret exists. InputError
    naming the first one unset when there is no Secret to keep."""
    try:
        return k8s_engine.offload_values(tgt.job)
    except InputError:
        if kc.get_json("secret", k8s.lib().offload_secret_name(tgt.run_paths)) is not None:
            return None
        raise


def offload_parts(kc, tgt: Target, values: dict[str, str] | None) -> list[dict]:
    """For a job with an offload to an rclone remote, before its Job is applied: the controller's rclone shipped
    onto the claim (k8s_engine.ship_rclone) and the run's offload Secret made from `values`, this shell's
    environment (k8s_engine.apply_offload_secret; None: the run's Secret is kept as it is). Entries in
    k8s_engine.apply's shape ({kind, name, action})."""
    if not k8s.pushes(tgt.job):
        return []
    done = []
    shipped = k8s_engine.ship_rclone(kc, tgt.claim, tgt.job, paths.rclone_binary())
    done.append({"kind": "rclone", "name": shipped["path"], "action": "created" if shipped["action"] == "shipped"
                 else "exists"})
    secret = k8s_engine.apply_offload_secret(kc, tgt.job, tgt.run_paths, values) if values is not None else None
    if secret is not None:
        done.append({"kind": "Secret", "name": secret["name"], "action": "created"})
    return done


# ---------------------------------------------------------------- status

def status_doc(host, now: float) -> dict:
    """A kubernetes host's status document (the shapes of rgt.observe.seen_doc / round_doc)."""
    if not isinstance(host.vars.get("rgt_job"), dict):
        return {"host": host.name, "state": "not_started", "detach": k8s.primitive(host.profile),
                "error": "no run launched on this host from this ledger"}
    tgt = target(host)
    base = {"host": host.name, "run_id": tgt.run_id, "project": tgt.run_paths.project,
            "detach": k8s.primitive(host.profile),
            "run_dir": tgt.run_paths.run_dir, "auto_resume": bool(tgt.job.get("auto_resume"))}
    try:
        seen = k8s_engine.observe(tgt.kubectl(), tgt.job_name)
    except k8s_engine.ClusterUnreachable as exc:
        return {**base, "state": "unreachable", "error": exc.message}
    except RgtError as exc:
        return {**base, "state": "error", "error": exc.message}
    return {**base, **seen, "seen_at": now}


# ---------------------------------------------------------------- logs

def logs_argv(host, run: str | None, tail: int | None, follow: bool) -> list[str]:
    """argv of `kubectl logs job/NAME -c job` for the host's run (or `run`, a run id of its project)."""
    tgt = target(host)
    if run is not None:
        tgt.run_paths = _layout.RunPaths(tgt.run_paths.durable_root, tgt.run_paths.project, run)
    return k8s_engine.logs_argv(tgt.kubectl(), tgt.job_name, tail=tail, follow=follow)


# ---------------------------------------------------------------- pull

def pull(hosts: list, runs: Path, verify_only: bool, console):
    """`rgt-run pull` on kubernetes hosts: each run sealed on the claim by a seal pod, copied off through a helper
    pod and verified here into the SSH pull's layout (k8s_engine.pull). A PhaseResult whose hosts carry a
    `collect_report` like the collect role's, so rgt.pull prints and judges them the same way."""
    result = PhaseResult(playbook="kubernetes pull", ident="pull", rc=0, status="successful")
    for host in hosts:
        out = HostOutcome()
        result.hosts[host.name] = out
        tgt = target(host)
        job = tgt.job
        params = {"project": tgt.run_paths.project, "run_id": tgt.run_id, "host": host.name,
                  "instance_id": str(host.instance_id), "job_name": job.get("name") or tgt.run_id,
                  "outputs": list(job.get("outputs") or []),
                  "declared_checkpoints": list((job.get("checkpoint") or {}).get("declared") or []),
                  "force_unfinished": False, "loader_python": job.get("python")}
        try:
            report = k8s_engine.pull(tgt.kubectl(), tgt.claim, (job.get("k8s") or {}).get("image"),
                                     job.get("python"), tgt.run_paths.durable_root, params, runs,
                                     profile=host.profile.get("name"), verify_command=job.get("verify_command"),
                                     verify_only=verify_only)
        except RgtError as exc:
            out.failed = True
            out.bad_input = exc.exit_code == 2
            out.messages.append(exc.message)
            continue
        out.results["collect_report"] = report
        out.unreachable = report.get("state") == "unreachable"
        out.failed = not report.get("verified") and not out.unreachable
        if report.get("error"):
            out.messages.append(str(report["error"]))
    return result


# ---------------------------------------------------------------- teardown

CLAIM_NOTE = ("a Kubernetes claim is not listed from here: the runs are the Jobs rgt launched for this host (the "
              "ledger); the teardown deletes only those Jobs, and the claim with every file on it is kept")


def _with_run(host, run: dict):
    """The host as it was when `run` (a remembered run, rgt.memory) was launched."""
    other = copy.copy(host)
    other.vars = {**host.vars, "rgt_job": run["job"]}
    return other


def _export(runs: Path, run_id: str, host: str) -> dict:
    """What the gate knows of a run's export: the manifest a verified pull brought here (the claim is not read)."""
    path = Path(runs) / run_id / f"{host}.manifest.json"
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    return {"sealed": True, "manifest": str(path), "manifest_b64": base64.b64encode(raw).decode(),
            "manifest_sha256": hashlib.sha256(raw).hexdigest()}


def _claim_export(tgt: Target) -> tuple[dict, dict | None]:
    """What the claim says of an ended run with an offload to an rclone remote, for the gate: (its export as
    rgt_box_runs lists a box's: the sealed manifest's bytes and SHA-256 now, {} when it is not sealed there; its
    OFFLOAD_VERIFIED.json or None), read through a read-only helper pod."""
    off = paths.module_util("rgt_offload")
    project, run_id = tgt.run_paths.project, tgt.run_id
    manifest = posixpath.join(project, "export", f"{run_id}.manifest.json")
    verified = posixpath.join(posixpath.relpath(tgt.run_paths.run_dir, tgt.run_paths.durable_root), off.VERIFIED)
    with k8s_engine.helper(tgt.kubectl(), tgt.claim) as pod:
        got = k8s_engine.read_claim_files(tgt.kubectl(), pod, (manifest, verified))
    raw = got[manifest]
    export = {} if raw is None else {
        "sealed": True, "manifest": f"claim {tgt.claim}:{posixpath.join(tgt.run_paths.durable_root, manifest)}",
        "manifest_b64": base64.b64encode(raw).decode(), "manifest_sha256": hashlib.sha256(raw).hexdigest()}
    try:
        doc = json.loads(got[verified]) if got[verified] is not None else None
    except ValueError:
        doc = None
    return export, doc if isinstance(doc, dict) else None


def _mount(profile: dict, rows: list[dict]) -> dict | None:
    """The profile's mount that holds the runs (the claim's, at the durable root): what the gate says of their
    files."""
    dirs = [row["run_dir"] for row in rows]
    best = None
    for mount in profile.get("mounts") or []:
        path = str(mount.get("path") or "").rstrip("/") + "/"
        if dirs and all(d.startswith(path) for d in dirs) and (best is None or len(path) > len(best["path"])):
            best = mount
    return best


def assess(inst, ledger: Path, runs: Path, manifest_lib) -> dict:
    """The teardown plan of a kubernetes instance (rgt.engines.ssh.assess_instance's shape): every Job rgt launched
    for its hosts, looked at with kubectl, judged by the same gate (rgt_gate.evaluate) as a box's runs."""
    item = verb_plan(inst)
    item.update(status=None, gate=None, reasons=[], k8s_jobs=[])
    rows, roots, notes = [], [], []
    for host in inst.hosts:
        for run in memory.runs_of(ledger, host.name):
            tgt = target(_with_run(host, run))
            try:
                seen = k8s_engine.observe(tgt.kubectl(), tgt.job_name)
            except RgtError as exc:
                unreachable = isinstance(exc, k8s_engine.ClusterUnreachable)
                item.update(status="unreachable" if unreachable else "failed",
                            reasons=[f"could not look at Job {tgt.job_name}: {exc.message}"])
                return item
            if seen["state"] == "not_started":  # its Job is gone already: nothing of it bills
                continue
            secret = k8s.lib().offload_secret_name(tgt.run_paths) if k8s.lib().offload_credentials(tgt.job) else None
            item["k8s_jobs"].append({"host": host.name, "job": tgt.job_name, "namespace": tgt.namespace,
                                     "state": seen["state"], "run_id": tgt.run_id, "offload_secret": secret})
            root = f"claim {tgt.claim}:{tgt.run_paths.durable_root}"
            roots.append(root)
            row = {"project": tgt.run_paths.project, "run_id": tgt.run_id, "run_dir": tgt.run_paths.run_dir,
                   "state": _states.gate_state(seen["state"]), "attempt": seen.get("attempt"),
                   "export": _export(runs, tgt.run_id, host.name), "offload": None}
            if k8s.pushes(tgt.job) and row["state"] not in ("live", "queued"):
                try:  # its export as the claim holds it now, and whether the pod offloaded it (docs/offload.md)
                    export, row["offload"] = _claim_export(tgt)
                    row["export"] = export or row["export"]
                except RgtError as exc:
                    notes.append(f"run {tgt.run_id}: its offloaded export could not be read on the claim "
                                 f"({exc.message}); only a verified pull here counts")
            rows.append(row)
    listing = {"durable_root": ", ".join(dict.fromkeys(roots)) or None, "durable_mount": _mount(inst.profile, rows),
               "runs": rows}
    check = paths.module_util("rgt_offload").target_check(paths.rclone_binary())  # the target, looked at from here
    gate = _gate.evaluate(inst.instance_id, inst.inventory_hosts, [listing], str(runs), inst.profile, manifest_lib,
                          offload_check=check)
    gate["notes"] += [CLAIM_NOTE] + notes
    item.update(gate=gate, reasons=list(gate["reasons"]), status="ready" if gate["passed"] else "refused")
    if not item["k8s_jobs"] and gate["passed"]:
        item.update(status="already gone", final_state="no Job of this host is left on the cluster")
    return item


def tear_down(inst, item: dict, ledger: Path, runs: Path, manifest_lib) -> dict:
    """After the person confirmed the instance: look at its Jobs again and re-check the gate (a Job may have been
    relaunched while the plan waited for the answer), then delete the Jobs (foreground: their pods first; the claim
    is kept). The outcome in rgt.engines.ssh.outcome_of's shape; the record in <ledger>/teardown/<host>.json
    (atomic)."""
    ran = inst.names[0]
    again = assess(inst, ledger, runs, manifest_lib)
    if again["status"] not in ("ready", "already gone"):
        return {"host": ran, "refused": again["status"] == "refused", "final_state": None, "calls": [],
                "messages": [f"looked again before deleting: {r}" for r in again["reasons"]], "report": {},
                "status": again["status"]}
    by_name = {h.name: h for h in inst.hosts}
    calls, messages, failed = [], [], False
    for entry in again["k8s_jobs"]:
        tgt = target(by_name[entry["host"]])
        kc = k8s_engine.Kubectl(tgt.kubeconfig, tgt.context, entry["namespace"])
        try:
            done = k8s_engine.delete(kc, entry["job"])
            calls.append({"call": f"kubectl delete job {entry['job']} --cascade=foreground", **done})
            if entry.get("offload_secret"):  # the run's offload credentials go with its Job
                kc.check("delete", "secret", entry["offload_secret"], "--ignore-not-found")
                calls.append({"call": f"kubectl delete secret {entry['offload_secret']}", "outcome": "deleted"})
        except RgtError as exc:
            failed = True
            messages.append(exc.message)
            calls.append({"call": f"kubectl delete job {entry['job']}", "outcome": "failed", "error": exc.message})
    final = ("unknown — check kubectl get job" if failed else
             f"{len(calls)} Job(s) deleted; the claim is kept")
    record = {"instance_id": inst.instance_id, "verb": item["verb"], "reversible": False, "calls": calls,
              "final_state": final, "keeps_billing": item["keeps_billing"],
              "at": datetime.now(UTC).isoformat(timespec="seconds")}
    atomic_write_json(ledger / "teardown" / f"{ran}.json", record)
    return {"host": ran, "refused": False, "final_state": final, "calls": calls, "messages": messages,
            "report": {"clocks": item["clocks"], "manual_steps": item["manual_steps"]},
            "status": "failed" if failed else "done", "keeps_billing": item["keeps_billing"]}
