"""A fake Kubernetes API server on 127.0.0.1 for the real `kubectl`: in-memory Jobs, Pods, PVCs, ConfigMaps and
Secrets, shaped after the Kubernetes REST API (core/v1, batch/v1). Without a kubelet it has no controllers (tests
walk the state with hooks); `FakeKubernetes(ns, kubelet="podman")` adds the podman kubelet and a Job controller
(tests/fakes/k8s_kubelet.py), so pods really run.

What it serves, exactly what kubectl asks for in the verbs rgt uses (found with `kubectl -v=8` against it):

- discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/batch/v1` (the legacy, unaggregated documents; kubectl
  falls back to them), and `/openapi/v3` with a minimal document per group-version that says PATCH and POST take
  the `fieldValidation` parameter, so `--validate=strict` is done by the server (query `fieldValidation=Strict`);
- jobs, pods, persistentvolumeclaims, configmaps, secrets: GET one, LIST (labelSelector and fieldSelector equality
  terms, `key` existence), POST, PATCH as server-side apply (`application/apply-patch+yaml`: create, or merge into
  the existing object; a ConfigMap's or Secret's `data` / `binaryData` is replaced whole, a Secret's `stringData`
  is folded into `data`), DELETE (a Job's pods go with it, whatever the propagation), and `watch=true` on a LIST,
  which sends the objects that match as ADDED (then, for a watch-list `sendInitialEvents=true`, the BOOKMARK that
  ends the initial events) and MODIFIED / DELETED as they change (`kubectl wait`, `kubectl delete --wait`). Bodies
  are JSON only: a protobuf body (`kubectl create configmap|secret` sends one) is answered 415;
- `pods/<name>/log` (`tailLines`, `follow` ends at the end of the text; with the kubelet: `podman logs`, `follow`
  streams until the container ends);
- `pods/<name>/exec`, only with the kubelet (without it the path is 404, and kubectl's exec fails): the
  remotecommand WebSocket protocol, `v5.channel.k8s.io` (or `v4.channel.k8s.io` when kubectl offers only that,
  which cannot close stdin), with kubectl 1.32 and 1.37 (`kubectl exec`, `kubectl cp`). The 101 answer names the
  chosen subprotocol; then each chunk is one binary message whose first byte is the channel (0 stdin, 1 stdout,
  2 stderr, 3 the Status: Success, or Failure with `details.causes [{reason: ExitCode, message: "<rc>"}]`, 4 resize
  (ignored), 255 close: `[255, 0]` closes the command's stdin); kubectl's masked frames are read, its pings
  answered; the server closes with a close frame after the Status. No tty (`-t` runs without one), no SPDY.

A Job created here gets what the API server's defaulting gives it: a uid, `spec.selector` on
`batch.kubernetes.io/controller-uid`, and the pod template labels `controller-uid`, `job-name` and their
`batch.kubernetes.io/` forms. Without the kubelet, a Pod created directly (rgt's helper pod) is Running and Ready
at once and Job pods exist only through `add_pod`. With it, a Pod created directly is Pending until its podman
container runs; a Job gets its pod `<job>-<5 chars>` (template labels, ownerReference), Complete when it
succeeds, a new pod per failure until `backoffLimit`, then Failed (BackoffLimitExceeded); DELETE of a pod or Job is
graceful (deletionTimestamp, containers stopped with terminationGracePeriodSeconds, the object gone after; a Job
after its pods); `stop()` removes every container of the session.

Hooks: `set_job_status(name, active=, succeeded=, failed=, conditions=)`, `job_finished(name)`,
`job_failed(name, reason, message)`, `add_pod(job, phase, container_state, restarts, ...)`, `set_pod(...)`,
`evict(pod)` (with the kubelet: DisruptionTarget and reason Evicted, then the containers stopped with the pod's
grace; it returns the Failed pod), `set_log(pod, text)`, `secret_values[name] = {key: value}` (env values for
`secretKeyRef` besides Secret objects). Every request is recorded (`requests`, `calls(method, path_prefix)`).
`kubeconfig(path)` writes a kubeconfig that points at the server (plain HTTP, no credentials). `pvc_dir(claim,
dir)` backs a claim with a local directory (the kubelet bind-mounts it); `local_path(pod, path)` maps a path in a
pod onto it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import os
import random
import socket
import struct
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.fakes.httpfake import LocalHTTPFake
from tests.fakes.k8s_kubelet import PodmanKubelet, pending_status

# resource -> (API path prefix, apiVersion, kind)
RESOURCES = {
    "pods": ("/api/v1", "v1", "Pod"),
    "persistentvolumeclaims": ("/api/v1", "v1", "PersistentVolumeClaim"),
    "configmaps": ("/api/v1", "v1", "ConfigMap"),
    "secrets": ("/api/v1", "v1", "Secret"),
    "jobs": ("/apis/batch/v1", "batch/v1", "Job"),
}
KINDS = {kind: resource for resource, (_p, _v, kind) in RESOURCES.items()}
VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-rgt-fake", "platform": "linux/amd64",
           "goVersion": "go1.23", "compiler": "gc", "gitCommit": "0" * 40, "gitTreeState": "clean",
           "buildDate": "2026-01-01T00:00:00Z"}

Reply = tuple[int, object, dict]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_doc(code: int, reason: str, message: str, **details) -> dict:
    """A metav1.Status failure, as the API server answers an error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details, "code": code}


SHORT_NAMES = {"pods": ["po"], "persistentvolumeclaims": ["pvc"], "configmaps": ["cm"], "namespaces": ["ns"]}


def _resource_list(group_version: str, names: list[tuple[str, str, bool, list[str]]]) -> dict:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": [
        {"name": name, "singularName": "" if "/" in name else kind.lower(), "namespaced": namespaced, "kind": kind,
         "verbs": verbs, "shortNames": SHORT_NAMES.get(name, [])} for name, kind, namespaced, verbs in names]}


OBJECT_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/api/v1": _resource_list("v1", [
        ("pods", "Pod", True, OBJECT_VERBS), ("pods/log", "Pod", True, ["get"]),
        ("pods/exec", "PodExecOptions", True, ["create", "get"]), ("pods/status", "Pod", True, ["get", "patch"]),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True, OBJECT_VERBS),
        ("configmaps", "ConfigMap", True, OBJECT_VERBS), ("secrets", "Secret", True, OBJECT_VERBS),
        ("namespaces", "Namespace", False, ["get", "list"])]),
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"}}]},
    "/apis/batch/v1": _resource_list("batch/v1", [("jobs", "Job", True, OBJECT_VERBS),
                                                  ("jobs/status", "Job", True, ["get", "patch", "update"])]),
}


def _openapi_v3(prefix: str) -> dict:
    """A minimal OpenAPI v3 document for one group-version: enough for kubectl to see that the server validates
    fields itself (the `fieldValidation` query parameter on PATCH and POST)."""
    param = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
    paths = {}
    for resource, (res_prefix, api_version, kind) in RESOURCES.items():
        if res_prefix == prefix:
            group, _, version = api_version.rpartition("/")
            op = {"parameters": [param],
                  "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind}}
            base = f"{prefix}/namespaces/{{namespace}}/{resource}"
            paths[base] = {"post": op}
            paths[base + "/{name}"] = {"patch": op, "put": op}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]}, "paths": paths,
            "components": {"schemas": {}}}


def parse_selector(text: str | None) -> list[tuple[str, str, str | None]]:
    """`a=b,c!=d,e` -> [(key, op, value)]: the equality-based label/field selector terms."""
    terms = []
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in term:
            key, value = term.split("=", 1)
            terms.append((key.strip(), "=", value.strip().lstrip("=")))
        elif term.startswith("!"):
            terms.append((term[1:], "!", None))
        else:
            terms.append((term, "exists", None))
    return terms


def _matches(values: dict, terms) -> bool:
    for key, op, value in terms:
        have = values.get(key)
        if (op == "=" and have != value) or (op == "!=" and have == value) or (op == "exists" and key not in values) \
                or (op == "!" and key in values):
            return False
    return True


def _field_values(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    return {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
            "status.phase": (obj.get("status") or {}).get("phase")}


def _merge(base: dict, patch: dict) -> dict:
    """A JSON merge of an applied configuration into the live object (maps merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


PAYLOAD_FIELDS = ("data", "binaryData", "stringData")  # a ConfigMap's or Secret's content


def _secret_data(obj: dict) -> dict:
    """A Secret as stored: `stringData` folded into `data` (base64), as the API server does on write."""
    strings = obj.pop("stringData", None) or {}
    if strings:
        obj["data"] = dict(obj.get("data") or {}, **{k: base64.b64encode(v.encode()).decode()
                                                     for k, v in strings.items()})
    return obj


class FakeKubernetes(LocalHTTPFake):
    """The fake API server. `start()` / `stop()` (or a `with` block); `url`, `kubeconfig(path)`, the hooks."""

    name = "k8s"
    nodelay = True  # headers and body are two writes: no 40 ms delayed-ACK stall

    def __init__(self, namespace: str = "default", kubelet: str | None = None):
        self.namespace = namespace
        self.kubelet = None
        if kubelet == "podman":
            self.kubelet = PodmanKubelet(self)
        elif kubelet is not None:
            raise ValueError(f"kubelet={kubelet!r}: the fake has only the podman kubelet (or none)")
        self.objects: dict[tuple[str, str, str], dict] = {}  # (resource, namespace, name) -> object
        self.logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> log text
        self.pvc_dirs: dict[str, Path] = {}  # claim name -> the directory that holds its bytes
        self.secret_values: dict[str, dict[str, str]] = {}  # Secret name -> {key: value} (besides Secret objects)
        self._counted: set[str] = set()  # uids of ended Job pods the Job controller has counted
        self.requests: list[dict] = []
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._rv = 1

    def kubeconfig(self, path: str | os.PathLike, context: str = "fake") -> Path:
        """Write a kubeconfig whose context `context` points at this server (plain HTTP, no credentials)."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": context,
               "clusters": [{"name": "fake-cluster", "cluster": {"server": self.url}}],
               "users": [{"name": "fake-user", "user": {}}],
               "contexts": [{"name": context, "context": {"cluster": "fake-cluster", "user": "fake-user",
                                                          "namespace": self.namespace}}]}
        path = Path(path)
        path.write_text(json.dumps(doc, indent=2))
        return path

    # ---------------------------------------------------------------- assertions

    def calls(self, method: str | None = None, path_prefix: str = "") -> list[dict]:
        with self.lock:
            return [r for r in self.requests
                    if (method is None or r["method"] == method) and r["path"].startswith(path_prefix)]

    def mutating_calls(self) -> list[dict]:
        return [r for r in self.calls() if r["method"] not in ("GET",)]

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        with self.lock:
            obj = self.objects.get((resource, namespace or self.namespace, name))
            return copy.deepcopy(obj) if obj else None

    def names(self, resource: str, namespace: str | None = None) -> list[str]:
        with self.lock:
            return sorted(n for r, ns, n in self.objects if r == resource and ns == (namespace or self.namespace))

    # ---------------------------------------------------------------- hooks (what the controllers would do)

    def _touch(self, obj: dict) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self.changed.notify_all()

    def _job(self, name: str, namespace: str | None) -> dict:
        job = self.objects.get(("jobs", namespace or self.namespace, name))
        assert job is not None, f"no job {name}"
        return job

    def set_job_status(self, name: str, namespace: str | None = None, **status) -> dict:
        """Set fields of a Job's status (active, succeeded, failed, ready, conditions, startTime, ...)."""
        with self.lock:
            job = self._job(name, namespace)
            job.setdefault("status", {}).update(copy.deepcopy(status))
            self._touch(job)
            return copy.deepcopy(job)

    def job_finished(self, name: str, namespace: str | None = None) -> dict:
        """The Job controller's view of a Job whose pod succeeded (1.37: SuccessCriteriaMet, then Complete)."""
        conditions = [{"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": _now(),
                       "lastProbeTime": _now()}
                      for t, r, m in (("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of "
                                       "succeeded pods"),
                                      ("Complete", "CompletionsReached", "Reached expected number of succeeded pods"))]
        return self.set_job_status(name, namespace, active=0, ready=0, succeeded=1, conditions=conditions,
                                   completionTime=_now())

    def job_failed(self, name: str, reason: str = "BackoffLimitExceeded",
                   message: str = "Job has reached the specified backoff limit", namespace: str | None = None) -> dict:
        """The Job controller's view of a failed Job (FailureTarget, then Failed, with the reason)."""
        conditions = [{"type": t, "status": "True", "reason": reason, "message": message,
                       "lastTransitionTime": _now(), "lastProbeTime": _now()} for t in ("FailureTarget", "Failed")]
        job = self._job(name, namespace)
        failed = len(self._pods_of(job)) or 1
        return self.set_job_status(name, namespace, active=0, ready=0, failed=failed, conditions=conditions)

    def _pods_of(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        ns = job["metadata"]["namespace"]
        return [o for (r, n, _), o in sorted(self.objects.items())
                if r == "pods" and n == ns and (o["metadata"].get("labels") or {}).get("controller-uid") == uid]

    def add_pod(self, job: str, phase: str = "Running", container_state: dict | None = None, restarts: int = 0,
                name: str | None = None, conditions: list | None = None, reason: str | None = None,
                message: str | None = None, namespace: str | None = None, log: str | None = None) -> str:
        """A pod of a Job, as the Job controller and the kubelet would make it. `container_state` is the
        container's state ({"running": {...}} / {"waiting": {...}} / {"terminated": {...}}); by default it
        follows `phase`. The Job's `active` count follows (1 while the pod is Pending or Running)."""
        with self.lock:
            owner = self._job(job, namespace)
            ns = owner["metadata"]["namespace"]
            template = owner["spec"]["template"]
            pod_name = name or f"{job}-{uuid.uuid4().hex[:5]}"
            state = container_state or ({"running": {"startedAt": _now()}} if phase == "Running" else
                                        {"waiting": {"reason": "ContainerCreating"}} if phase == "Pending" else
                                        {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1,
                                                        "reason": "Completed" if phase == "Succeeded" else "Error"}})
            containers = template["spec"]["containers"]
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod_name, "namespace": ns, "uid": str(uuid.uuid4()),
                                "creationTimestamp": _now(),
                                "labels": dict(template["metadata"].get("labels") or {}),
                                "annotations": dict(template["metadata"].get("annotations") or {}),
                                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                                     "uid": owner["metadata"]["uid"], "controller": True,
                                                     "blockOwnerDeletion": True}]},
                   "spec": copy.deepcopy(template["spec"]),
                   "status": {"phase": phase, "conditions": list(conditions or []),
                              "containerStatuses": [{"name": c["name"], "image": c.get("image"),
                                                     "ready": phase == "Running", "restartCount": restarts,
                                                     "started": phase == "Running", "state": copy.deepcopy(state)}
                                                    for c in containers]}}
            if reason:
                pod["status"]["reason"] = reason
            if message:
                pod["status"]["message"] = message
            self.objects[("pods", ns, pod_name)] = pod
            self._touch(pod)
            if log is not None:
                self.logs[(ns, pod_name)] = log
            self._count_active(owner)
            return pod_name

    def set_pod(self, pod: str, namespace: str | None = None, phase: str | None = None,
                container_state: dict | None = None, restarts: int | None = None, conditions: list | None = None,
                reason: str | None = None, message: str | None = None) -> dict:
        """Change a pod's status (what the kubelet reports)."""
        with self.lock:
            obj = self.objects[("pods", namespace or self.namespace, pod)]
            status = obj["status"]
            if phase is not None:
                status["phase"] = phase
            for cs in status.get("containerStatuses") or []:
                if container_state is not None:
                    cs["state"] = copy.deepcopy(container_state)
                    cs["ready"] = cs["started"] = "running" in container_state
                if restarts is not None:
                    cs["restartCount"] = restarts
            if conditions is not None:
                status["conditions"] = list(conditions)
            if reason is not None:
                status["reason"] = reason
            if message is not None:
                status["message"] = message
            self._touch(obj)
            owner = self._owner(obj)
            if owner:
                self._count_active(owner)
            return copy.deepcopy(obj)

    def evict(self, pod: str, namespace: str | None = None,
              message: str = "Eviction API: evicting") -> dict:
        """An eviction (preemption, node drain): the DisruptionTarget condition, then the pod Failed (137)."""
        condition = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                     "message": message, "lastTransitionTime": _now(), "lastProbeTime": None}
        with self.lock:
            obj = self.objects[("pods", namespace or self.namespace, pod)]
            conditions = [c for c in obj["status"].get("conditions") or [] if c.get("type") != "DisruptionTarget"]
            if self.kubelet is not None:  # the condition first, then the containers stopped with the pod's grace
                obj["status"].update(conditions=conditions + [condition], reason="Evicted", message=message)
                self._touch(obj)
                grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
        if self.kubelet is not None:
            self.kubelet.stop_pod(namespace or self.namespace, pod, grace)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (self.get("pods", pod, namespace) or {}).get(
                    "status", {}).get("phase") not in ("Failed", "Succeeded"):
                time.sleep(0.05)
            return self.get("pods", pod, namespace)
        return self.set_pod(pod, namespace, phase="Failed", conditions=conditions + [condition],
                            container_state={"terminated": {"exitCode": 137, "reason": "Error",
                                                            "finishedAt": _now()}})

    def set_log(self, pod: str, text: str, namespace: str | None = None) -> None:
        with self.lock:
            self.logs[(namespace or self.namespace, pod)] = text

    def _owner(self, pod: dict) -> dict | None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job":
                return self.objects.get(("jobs", pod["metadata"]["namespace"], ref["name"]))
        return None

    def _count_active(self, job: dict) -> None:
        pods = self._pods_of(job)
        status = job.setdefault("status", {})
        if any(c.get("type") in ("Complete", "Failed") for c in status.get("conditions") or []):
            return
        status["active"] = sum(1 for p in pods if p["status"].get("phase") in ("Pending", "Running"))
        status["ready"] = sum(1 for p in pods if p["status"].get("phase") == "Running")
        status["startTime"] = status.get("startTime") or _now()
        self._touch(job)

    # ---------------------------------------------------------------- the podman kubelet and the Job controller

    def stop(self) -> None:
        super().stop()
        if self.kubelet is not None:
            self.kubelet.stop()

    def secret_value(self, name: str, key: str, namespace: str | None = None) -> str | None:
        """A Secret's value for a pod's env: `secret_values[name][key]`, else the Secret object's data."""
        if key in self.secret_values.get(name, {}):
            return self.secret_values[name][key]
        secret = self.get("secrets", name, namespace)
        data = (secret or {}).get("data") or {}
        return base64.b64decode(data[key]).decode() if key in data else None

    def _created(self, resource: str, obj: dict) -> None:
        """What the controllers do with a new object when the podman kubelet is on: run a pod, give a Job its
        pod (the lock is held)."""
        if self.kubelet is None:
            return
        meta = obj["metadata"]
        if resource == "pods":
            self.kubelet.start_pod(meta["namespace"], meta["name"])
        elif resource == "jobs" and not (obj.get("spec") or {}).get("suspend"):
            self._job_pod(obj)

    def _job_pod(self, job: dict) -> str:
        """The Job controller's next pod: <job>-<5 chars>, the template's labels, owned by the Job, run."""
        meta = job["metadata"]
        name = f"{meta['name']}-{''.join(random.choices('bcdfghjklmnpqrstvwxz2456789', k=5))}"
        template = job["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": meta["namespace"], "uid": str(uuid.uuid4()),
                            "creationTimestamp": _now(), "generateName": meta["name"] + "-",
                            "labels": dict(template.get("metadata", {}).get("labels") or {}),
                            "annotations": dict(template.get("metadata", {}).get("annotations") or {}),
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                 "uid": meta["uid"], "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": copy.deepcopy(template["spec"])}
        pod["status"] = pending_status(pod)
        self.objects[("pods", meta["namespace"], name)] = pod
        self._touch(pod)
        self._count_active(job)
        self.kubelet.start_pod(meta["namespace"], name)
        return name

    def pod_changed(self, pod: dict) -> None:
        """A pod's status changed (the kubelet): the Job controller follows (the lock is held). A Job pod that
        ended is counted once: Complete on success; on failure a new pod until backoffLimit, then Failed."""
        self._touch(pod)
        job = self._owner(pod)
        if job is None:
            return
        self._count_active(job)
        phase = pod["status"].get("phase")
        if self.kubelet is None or phase not in ("Succeeded", "Failed") or pod["metadata"]["uid"] in self._counted \
                or job["metadata"].get("deletionTimestamp"):
            return
        self._counted.add(pod["metadata"]["uid"])
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        if phase == "Succeeded":
            self.job_finished(name, namespace)
            return
        failed = sum(1 for p in self._pods_of(job) if p["status"].get("phase") == "Failed")
        if failed > int(job["spec"].get("backoffLimit", 6)):
            self.job_failed(name, namespace=namespace)
            self.set_job_status(name, namespace, failed=failed)
        else:
            self._job_pod(job)

    def _terminate(self, resource: str, obj: dict, grace: int | None) -> None:
        """A graceful delete (the lock is held): deletionTimestamp now; the pod's containers stopped with its
        terminationGracePeriodSeconds and removed, then the pod goes; a Job goes after its pods (foreground)."""
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return
        meta["deletionTimestamp"] = _now()
        namespace = meta["namespace"]
        if resource == "jobs":
            meta["finalizers"] = ["foregroundDeletion"]
            self._touch(obj)
            pods = self._pods_of(obj)
            if not pods:
                self._delete("jobs", namespace, meta["name"])
            for pod in pods:
                self._terminate("pods", pod, grace)
            return
        seconds = grace if grace is not None else int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        meta["deletionGracePeriodSeconds"] = seconds
        self._touch(obj)

        def gone():
            with self.lock:
                self.objects.pop(("pods", namespace, meta["name"]), None)
                self._rv += 1
                self.changed.notify_all()
                job = self._owner(obj)
                if job is not None and job["metadata"].get("deletionTimestamp") and not self._pods_of(job):
                    self._delete("jobs", namespace, job["metadata"]["name"])
        self.kubelet.delete_pod(namespace, meta["name"], seconds, gone)

    def _kubelet_log(self, handler: BaseHTTPRequestHandler, path: str, query: dict) -> int:
        """`pods/<name>/log` from `podman logs` (`follow` streams until the container ends); a pod the kubelet
        does not run (`add_pod`) answers its `set_log` text."""
        parts = path.strip("/").split("/")
        pod = self.get("pods", parts[5], parts[3]) if len(parts) == 7 else None
        problem, argv = None, None
        follow, tail = query.get("follow") == "true", int(query["tailLines"]) if "tailLines" in query else None
        if pod is None:
            problem = status_doc(404, "NotFound", f'pods "{parts[5] if len(parts) > 5 else ""}" not found')
        else:
            try:
                argv = self.kubelet.logs_argv(pod, query.get("container"))
            except LookupError:
                if (parts[3], parts[5]) in self.logs:
                    with self.lock:
                        status, doc, _extra = self.route("GET", path, query, None, "")
                    return _send(handler, status, doc.encode(), "text/plain")
                problem = status_doc(400, "BadRequest", f'container in pod "{parts[5]}" is waiting to start: '
                                     "ContainerCreating")
        if problem is not None:
            return _send(handler, problem["code"], json.dumps(problem).encode(), "application/json")
        # the lines are cut here, not by podman's --tail, which counts partial-line records (`print` writes "done"
        # and "\n" apart); a follow polls the log, which only grows, rather than `podman logs -f`, which can miss
        # the end of a container that exits as it starts and then waits forever
        running = follow and self.kubelet.running(argv[-1])
        text = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.kubelet.env,
                              check=False).stdout
        lines = text.splitlines(keepends=True)
        first = text if tail is None else b"".join(lines[-tail:]) if tail else b""
        if not running:
            return _send(handler, 200, first, "text/plain")
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        sent = len(text)
        try:
            chunk = first
            while True:
                if chunk:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    handler.wfile.flush()
                if not running:
                    break
                time.sleep(0.2)
                running = self.kubelet.running(argv[-1])
                text = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      env=self.kubelet.env, check=False).stdout
                chunk, sent = text[sent:], len(text)
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        handler.close_connection = True
        return 200

    # ---------------------------------------------------------------- the API: objects

    def _defaults(self, resource: str, namespace: str, obj: dict) -> dict:
        """What the API server adds on create: uid, resourceVersion, timestamps, a Job's selector and labels."""
        obj = copy.deepcopy(obj)
        prefix, api_version, kind = RESOURCES[resource]
        obj["apiVersion"], obj["kind"] = api_version, kind
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        if resource == "jobs":
            uid, name = meta["uid"], meta["name"]
            spec = obj.setdefault("spec", {})
            spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", 1)
            labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
            labels.update({"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                           "controller-uid": uid, "job-name": name})
            obj["status"] = {}
        elif resource == "secrets":
            obj = _secret_data(obj)
        elif resource == "persistentvolumeclaims":
            obj["status"] = {"phase": "Pending"}
        elif resource == "pods" and self.kubelet is not None:  # the podman kubelet runs it (_created)
            obj["status"] = pending_status(obj)
        elif resource == "pods":  # created directly (a helper pod), no kubelet: Running and Ready at once
            obj["status"] = {"phase": "Running", "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": _now()}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "started": True,
                                       "state": {"running": {"startedAt": _now()}}}
                                      for c in (obj.get("spec") or {}).get("containers") or []]}
        return obj

    def _list(self, resource: str, namespace: str, query: dict) -> list[dict]:
        labels = parse_selector(query.get("labelSelector"))
        fields = parse_selector(query.get("fieldSelector"))
        return [copy.deepcopy(o) for (r, ns, _), o in sorted(self.objects.items())
                if r == resource and ns == namespace and _matches(o["metadata"].get("labels") or {}, labels)
                and _matches(_field_values(o), fields)]

    def _list_doc(self, resource: str, items: list[dict]) -> dict:
        _prefix, api_version, kind = RESOURCES[resource]
        return {"kind": kind + "List", "apiVersion": api_version, "metadata": {"resourceVersion": str(self._rv)},
                "items": items}

    def _delete(self, resource: str, namespace: str, name: str) -> None:
        obj = self.objects.pop((resource, namespace, name))
        if resource == "jobs":  # the garbage collector: the Job's pods go with it
            for pod in self._pods_of(obj):
                self.objects.pop(("pods", namespace, pod["metadata"]["name"]), None)
        self._rv += 1
        self.changed.notify_all()

    def route(self, method: str, path: str, query: dict, body, content_type: str) -> Reply:
        """One API call (the lock is held)."""
        if method == "GET" and path == "/version":
            return 200, VERSION, {}
        if method == "GET" and path in DISCOVERY:
            return 200, DISCOVERY[path], {}
        if method == "GET" and path == "/openapi/v3":
            return 200, {"paths": {p.lstrip("/"): {"serverRelativeURL": f"/openapi/v3{p}?hash=fake"}
                                   for p in ("/api/v1", "/apis/batch/v1")}}, {}
        if method == "GET" and path.startswith("/openapi/v3/"):
            return 200, _openapi_v3(path[len("/openapi/v3"):]), {}
        for resource, (prefix, _v, _k) in RESOURCES.items():
            parts = path[len(prefix):].strip("/").split("/") if path.startswith(prefix + "/namespaces/") else []
            if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] == resource:
                return self._object_route(method, resource, parts[1], parts[3:], query, body, content_type)
        return 404, status_doc(404, "NotFound", "the server could not find the requested resource"), {}

    def _object_route(self, method, resource, namespace, rest, query, body, content_type) -> Reply:
        key_name = rest[0] if rest else None
        group = RESOURCES[resource][1].split("/")[0] if "/" in RESOURCES[resource][1] else ""
        what = f"{resource}.{group}" if group else resource
        if key_name is None:
            if method == "GET":
                return 200, self._list_doc(resource, self._list(resource, namespace, query)), {}
            if method == "POST":
                name = ((body or {}).get("metadata") or {}).get("name")
                if (resource, namespace, name) in self.objects:
                    return 409, status_doc(409, "AlreadyExists", f'{what} "{name}" already exists', name=name,
                                           group=group, kind=resource), {}
                obj = self._defaults(resource, namespace, body)
                self.objects[(resource, namespace, name)] = obj
                self._touch(obj)
                self._created(resource, obj)
                return 201, copy.deepcopy(obj), {}
            return 405, status_doc(405, "MethodNotAllowed", f"{method} not allowed"), {}
        key = (resource, namespace, key_name)
        obj = self.objects.get(key)
        not_found = status_doc(404, "NotFound", f'{what} "{key_name}" not found', name=key_name, group=group,
                               kind=resource)
        if len(rest) == 2 and rest[1] == "log" and resource == "pods" and method == "GET":
            if obj is None:
                return 404, not_found, {}
            text = self.logs.get((namespace, key_name), "")
            tail = query.get("tailLines")
            if tail is not None:
                lines = text.splitlines(keepends=True)
                text = "".join(lines[-int(tail):]) if int(tail) else ""
            return 200, text, {"Content-Type": "text/plain"}
        if len(rest) != 1:
            return 404, status_doc(404, "NotFound", "the server could not find the requested resource"), {}
        if method == "GET":
            return (200, copy.deepcopy(obj), {}) if obj else (404, not_found, {})
        if method == "DELETE":
            if obj is None:
                return 404, not_found, {}
            if self.kubelet is not None and resource in ("pods", "jobs"):
                grace = (body or {}).get("gracePeriodSeconds") if isinstance(body, dict) else None
                self._terminate(resource, obj, None if grace is None else int(grace))
                return 200, copy.deepcopy(obj), {}
            gone = copy.deepcopy(obj)
            self._delete(resource, namespace, key_name)
            return 200, gone, {}
        if method == "PATCH" and content_type.startswith("application/apply-patch"):
            if obj is None:
                obj = self._defaults(resource, namespace, body)
                self.objects[key] = obj
                self._touch(obj)
                self._created(resource, obj)
                return 201, copy.deepcopy(obj), {}
            merged = _merge(obj, {k: v for k, v in body.items() if k not in ("status",) + PAYLOAD_FIELDS})
            for field in PAYLOAD_FIELDS:  # one manager applies the whole payload: keys it dropped go
                if field in body:
                    merged[field] = copy.deepcopy(body[field])
            merged = _secret_data(merged) if resource == "secrets" else merged
            if merged != obj:
                merged["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
                self.objects[key] = merged
                self._touch(merged)
            return 200, copy.deepcopy(self.objects[key]), {}
        return 415 if method == "PATCH" else 405, status_doc(415 if method == "PATCH" else 405, "BadRequest",
                                                             f"{method} {content_type} is not served by the fake"), {}

    # ---------------------------------------------------------------- plumbing

    def _dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        record = {"method": handler.command, "path": parts.path, "query": query, "body": body,
                  "headers": {k: ("<redacted>" if k.lower() == "authorization" else v)
                              for k, v in handler.headers.items()}}
        with self.lock:
            self.requests.append(record)
        if self.kubelet is not None and parts.path.endswith("/exec") and \
                handler.headers.get("Upgrade", "").lower() == "websocket":
            record["query"] = {k: v if len(v) > 1 else v[0] for k, v in parse_qs(parts.query).items()}
            record["status"] = self._exec(handler, parts.path, parse_qs(parts.query))
            return
        if self.kubelet is not None and handler.command == "GET" and parts.path.endswith("/log"):
            record["status"] = self._kubelet_log(handler, parts.path, query)
            return
        if query.get("watch") in ("true", "1"):
            record["status"] = 200
            self._watch(handler, parts.path, query)
            return
        with self.lock:
            if raw and not isinstance(body, (dict, list)):  # protobuf (`kubectl create configmap`): not spoken
                status, doc, extra = 415, status_doc(415, "UnsupportedMediaType", "the fake takes JSON "
                                                     "bodies only (use kubectl apply)"), {}
            else:
                status, doc, extra = self.route(handler.command, parts.path, query, body,
                                                handler.headers.get("Content-Type", ""))
        record["status"] = status
        if isinstance(doc, str):
            payload = doc.encode()
        else:
            payload = b"" if doc is None else json.dumps(doc).encode()
            if doc is not None:
                extra = {"Content-Type": "application/json", **extra}
        try:
            handler.send_response(status)
            for key, value in extra.items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _watch(self, handler: BaseHTTPRequestHandler, path: str, query: dict) -> None:
        """A watch on a LIST: ADDED for what matches now, then DELETED / MODIFIED as it changes, until the
        client's timeoutSeconds (at most 30 s) or the client goes."""
        resource = namespace = None
        for res, (prefix, _v, _k) in RESOURCES.items():
            parts = path[len(prefix):].strip("/").split("/")
            if path.startswith(prefix + "/namespaces/") and len(parts) == 3 and parts[2] == res:
                resource, namespace = res, parts[1]
        handler.send_response(200 if resource else 404)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(kind: str, obj: dict) -> None:
            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            handler.wfile.flush()

        deadline = time.monotonic() + min(float(query.get("timeoutSeconds") or 30), 30)
        try:
            if resource:
                with self.lock:
                    seen = {o["metadata"]["name"]: o for o in self._list(resource, namespace, query)}
                for obj in seen.values():
                    send("ADDED", obj)
                if query.get("sendInitialEvents") == "true":  # a watch-list (kubectl >= 1.35): say where they end
                    _p, api_version, kind = RESOURCES[resource]
                    send("BOOKMARK", {"kind": kind, "apiVersion": api_version, "metadata": {
                        "resourceVersion": str(self._rv), "annotations": {"k8s.io/initial-events-end": "true"}}})
                while time.monotonic() < deadline:
                    with self.lock:
                        self.changed.wait(timeout=0.2)
                        now = {o["metadata"]["name"]: o for o in self._list(resource, namespace, query)}
                    for name in sorted(set(seen) - set(now)):
                        send("DELETED", seen[name])
                    for name in sorted(now):
                        if name not in seen:
                            send("ADDED", now[name])
                        elif now[name]["metadata"].get("resourceVersion") != \
                                seen[name]["metadata"].get("resourceVersion"):
                            send("MODIFIED", now[name])
                    seen = now
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        handler.close_connection = True

    # ---------------------------------------------------------------- exec: the remotecommand WebSocket protocol

    def _exec(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]]) -> int:
        """`pods/<name>/exec` over WebSocket (what kubectl >= 1.30 tries first): the handshake, then the command
        run by the kubelet with stdin / stdout / stderr as channel 0 / 1 / 2 binary messages and its end as the
        Status on channel 3; closing channel 0 (v5: message [255, 0]) closes the command's stdin."""
        parts = path.strip("/").split("/")  # api v1 namespaces NS pods NAME exec
        namespace, pod_name = parts[3], parts[5]
        with self.lock:
            pod = copy.deepcopy(self.objects.get(("pods", namespace, pod_name)))
        offered = [p.strip() for p in handler.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        protocol = next((p for p in WS_PROTOCOLS if p in offered), None)
        problem = None
        if pod is None:
            problem = status_doc(404, "NotFound", f'pods "{pod_name}" not found', name=pod_name, kind="pods")
        elif protocol is None:
            problem = status_doc(400, "BadRequest", f"no subprotocol of {WS_PROTOCOLS} offered ({offered})")
        else:
            command = query.get("command") or []
            container = (query.get("container") or [None])[0]
            try:
                argv = self.kubelet.exec_argv(pod, container, command, stdin=_flag(query, "stdin"),
                                              tty=_flag(query, "tty"))
            except LookupError as exc:
                problem = status_doc(400, "BadRequest", str(exc))
        if problem is not None:
            return _send(handler, problem["code"], json.dumps(problem).encode(), "application/json")
        key = handler.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        handler.send_response(101, "Switching Protocols")
        handler.send_header("Upgrade", "websocket")
        handler.send_header("Connection", "Upgrade")
        handler.send_header("Sec-WebSocket-Accept", accept)
        handler.send_header("Sec-WebSocket-Protocol", protocol)
        handler.end_headers()
        handler.wfile.flush()
        handler.close_connection = True
        WebSocketExec(handler.connection, handler.rfile, argv, self.kubelet.env, stdin=_flag(query, "stdin"),
                      stdout=_flag(query, "stdout", True), stderr=_flag(query, "stderr", True)).run()
        return 101

    # ---------------------------------------------------------------- the claims' bytes

    def pvc_dir(self, claim: str, directory: str | os.PathLike) -> None:
        """Back the claim `claim` with a local directory: what a pod mounting it sees under its mountPath."""
        with self.lock:
            self.pvc_dirs[claim] = Path(directory)

    def local_path(self, pod: str, path: str, namespace: str | None = None) -> Path:
        """Where `path` inside pod `pod` is on this machine, through the pod's PVC mounts (a stand-in for exec
        when the fake runs without the kubelet)."""
        with self.lock:
            obj = self.objects[("pods", namespace or self.namespace, pod)]
            volumes = {v["name"]: (v.get("persistentVolumeClaim") or {}).get("claimName")
                       for v in obj["spec"].get("volumes") or []}
            mounts = sorted(((m["mountPath"].rstrip("/") or "/", volumes.get(m["name"]))
                             for c in obj["spec"].get("containers") or [] for m in c.get("volumeMounts") or []),
                            key=lambda m: -len(m[0]))
            for mount_path, claim in mounts:
                if claim in self.pvc_dirs and (path == mount_path or path.startswith(mount_path + "/")):
                    return self.pvc_dirs[claim] / path[len(mount_path):].lstrip("/")
        raise KeyError(f"{path} is on no claim mounted in pod {pod}")


# ---------------------------------------------------------------- the remotecommand WebSocket protocol

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# the channel protocols this server speaks, best first (kubectl offers v5 and v4; only v5 can close stdin)
WS_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CHUNK = 32 * 1024


def _send(handler: BaseHTTPRequestHandler, status: int, payload: bytes, content_type: str) -> int:
    """A whole reply with a Content-Length; the status, for the request record."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)
    return status


def _flag(query: dict[str, list[str]], name: str, default: bool = False) -> bool:
    values = query.get(name)
    return default if not values else values[0].lower() in ("1", "true")


def exit_status(rc: int) -> dict:
    """The channel-3 Status of a command that ended with `rc`, as the kubelet words it."""
    if rc == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit code {rc}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]}}


class WebSocketExec:
    """One exec session on an upgraded connection: frames in (masked, from kubectl) and out (unmasked, one binary
    message per chunk, its first byte the channel), the command as a subprocess."""

    def __init__(self, sock: socket.socket, rfile, argv: list[str], env: dict, stdin: bool, stdout: bool,
                 stderr: bool):
        self.sock, self.rfile, self.argv, self.env = sock, rfile, argv, env
        self.want = {STDIN: stdin, STDOUT: stdout, STDERR: stderr}
        self.send_lock = threading.Lock()
        self.closed = threading.Event()  # the client sent a close frame or went away

    def send(self, opcode: int, payload: bytes) -> None:
        head = bytes([0x80 | opcode])
        n = len(payload)
        head += bytes([n]) if n < 126 else struct.pack("!BH", 126, n) if n < 65536 else struct.pack("!BQ", 127, n)
        with self.send_lock:
            self.sock.sendall(head + payload)

    def recv(self) -> tuple[int, bytes] | None:
        """One whole message (fragments joined, control frames in between answered): (opcode, payload)."""
        opcode, data = None, b""
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return None
            fin, op, masked, n = head[0] & 0x80, head[0] & 0x0F, head[1] & 0x80, head[1] & 0x7F
            if n == 126:
                n = struct.unpack("!H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if masked else b"\0\0\0\0"
            raw = self.rfile.read(n)
            if len(raw) < n:
                return None
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(raw)) if masked else raw
            if op >= OP_CLOSE:  # control frames come whole, even inside a fragmented message
                if op == OP_PING:
                    self.send(OP_PONG, payload)
                elif op == OP_CLOSE:
                    return OP_CLOSE, payload
                continue
            opcode = op if op != OP_CONT else opcode
            data += payload
            if fin:
                return opcode, data

    def run(self) -> None:
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE if self.want[STDIN] else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)
        except OSError as exc:
            self._finish({"metadata": {}, "status": "Failure", "reason": "InternalError", "message": str(exc)})
            return
        pumps = [threading.Thread(target=self._pump, args=(proc.stdout, STDOUT), daemon=True),
                 threading.Thread(target=self._pump, args=(proc.stderr, STDERR), daemon=True)]
        for pump in pumps:
            pump.start()
        threading.Thread(target=self._read_client, args=(proc,), daemon=True).start()
        for pump in pumps:
            pump.join()
        proc.stdout.close()
        proc.stderr.close()
        rc = proc.wait()
        self._finish(exit_status(rc))

    def _pump(self, pipe, channel: int) -> None:
        """The command's stdout or stderr, one message per read, to the client (dropped if it did not ask)."""
        try:
            while chunk := pipe.read1(CHUNK):
                if self.want[channel] and not self.closed.is_set():
                    self.send(OP_BINARY, bytes([channel]) + chunk)
        except OSError:
            self.closed.set()

    def _read_client(self, proc: subprocess.Popen) -> None:
        """kubectl's messages: stdin bytes, the close of stdin (v5), resize (ignored), ping, close."""
        stdin = proc.stdin
        try:
            while (message := self.recv()) is not None:
                opcode, data = message
                if opcode == OP_CLOSE:
                    break
                if not data:
                    continue
                if data[0] == STDIN and stdin is not None:
                    try:
                        stdin.write(data[1:])
                        stdin.flush()
                    except BrokenPipeError:
                        pass
                elif data[0] == CLOSE and data[1:2] == bytes([STDIN]) and stdin is not None:
                    stdin.close()
                    stdin = None
        except (OSError, ValueError, struct.error):
            pass
        self.closed.set()
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()

    def _finish(self, status: dict) -> None:
        """The Status on channel 3, then the close handshake (the client's close frame, or a short wait)."""
        try:
            if not self.closed.is_set():
                self.send(OP_BINARY, bytes([ERROR]) + json.dumps(status).encode())
                self.send(OP_CLOSE, struct.pack("!H", 1000))
            self.closed.wait(timeout=5)
        except OSError:
            pass
