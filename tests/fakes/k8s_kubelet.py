"""A podman "kubelet" for the fake Kubernetes API (tests/fakes/k8s_api.py, `FakeKubernetes(kubelet="podman")`):
every pod the fake holds becomes real processes, so `kubectl exec`, `kubectl cp` and `kubectl logs` reach them.

- Each container of a pod is one podman container of `localhost/rgt-stub:latest` (whatever image the pod names),
  run as the pod says: `command` as the entrypoint, `args` after it, `workingDir`, `env` (`value`, and
  `valueFrom.secretKeyRef` from a Secret object in the fake or `FakeKubernetes.secret_values`), and
  `resources.limits.memory` as `--memory` (so a container can be OOMKilled). Env values travel in podman's
  environment (`-e NAME`), never in its argv.
- Volumes: a `persistentVolumeClaim` volume is bind-mounted from the claim's directory (`pvc_dir(claim, dir)`) at
  the mountPath (read-only when the mount or the volume says so); a `configMap` volume is written into a temp
  directory (`data` as text, `binaryData` decoded, `items` and `defaultMode` honoured) and mounted read-only; an
  `emptyDir` is a temp directory shared by the pod's containers. A claim with no directory is refused (the pod
  stays Pending with the reason).
- Lifecycle: initContainers run one after another (the pod is Pending, `Init:i/n`), then the main containers
  together; the status follows podman (Running with startedAt, then terminated with exitCode, reason
  Completed / Error / OOMKilled and the pod Succeeded / Failed). restartPolicy is taken as Never. podman on a
  cgroup v1 host may not flag an OOM kill: an exit 137 of a memory-limited container the kubelet did not stop
  counts as OOMKilled.
- exec: `exec_argv()` is `podman exec -i <container> <command>`; logs: `podman logs` (a follow polls it).
- Deleting a pod stops its containers with its terminationGracePeriodSeconds (`podman stop -t N`: SIGTERM, then
  SIGKILL) and removes them. Every container is labelled `rgt-k8s-fake=1` and `rgt-k8s-fake.session=<id>`;
  `stop()` removes the session's containers and temp directories (`remove_all()` any session's).
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tests.harness.stubhost import IMAGE, podman_available, podman_env

LABEL = "rgt-k8s-fake"
SESSION_LABEL = LABEL + ".session"
POD_LABEL = LABEL + ".pod"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def podman(*args: str, timeout: float = 120, env: dict | None = None, check: bool = False) \
        -> subprocess.CompletedProcess:
    """One podman call with the repo's containers.conf (text output)."""
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          env=env or podman_env(), check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:2])} -> rc {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc


def remove_all(session: str | None = None) -> None:
    """Remove the fake kubelet's containers: one session's, or every session's (a test teardown's safety net)."""
    label = f"{SESSION_LABEL}={session}" if session else LABEL
    names = podman("ps", "-a", "-q", "--filter", f"label={label}").stdout.split()
    if names:
        podman("rm", "-f", "-t", "0", *names)


class PodmanKubelet:
    """Runs the fake's pods in podman (see the module docstring). The API server calls `start_pod`,
    `delete_pod`, `exec_argv`, `logs_argv`; the pod's status is written back into the fake's objects."""

    def __init__(self, api):
        if not podman_available():
            raise RuntimeError("the podman kubelet needs podman on PATH")
        self.api = api
        self.session = uuid.uuid4().hex[:8]
        self.env = podman_env()
        self.root = Path(tempfile.mkdtemp(prefix=f"rgt-k8s-kubelet-{self.session}-"))
        self.containers: dict[tuple[str, str], dict[str, str]] = {}  # (ns, pod) -> container name -> podman name
        self.limited: set[str] = set()  # podman names of containers with a memory limit
        self.stopping: set[str] = set()  # podman names the kubelet stopped (delete, evict): a 137 there is no OOM
        self.lock = threading.Lock()

    # ---------------------------------------------------------------- names

    def podman_name(self, namespace: str, pod: str, container: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"rgtk8s-{self.session}-{namespace}-{pod}-{container}")

    def _labels(self, namespace: str, pod: str) -> list[str]:
        return ["--label", f"{LABEL}=1", "--label", f"{SESSION_LABEL}={self.session}",
                "--label", f"{POD_LABEL}={namespace}/{pod}"]

    # ---------------------------------------------------------------- volumes and env

    def _volume_args(self, pod: dict, container: dict, pod_dir: Path) -> list[str]:
        """-v arguments for a container's volumeMounts; LookupError for a volume the kubelet cannot provide."""
        volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
        args = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise LookupError(f"volumeMount {mount['name']!r} names no volume of the pod")
            read_only = bool(mount.get("readOnly"))
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                read_only = read_only or bool(volume["persistentVolumeClaim"].get("readOnly"))
                with self.api.lock:
                    source = self.api.pvc_dirs.get(claim)
                if source is None:
                    raise LookupError(f"persistentvolumeclaim {claim!r} has no directory (pvc_dir)")
                source = Path(source)
                if mount.get("subPath"):
                    source = source / mount["subPath"]
                    source.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume:
                source = self._config_map(pod, volume, pod_dir)
                read_only = True
            elif "emptyDir" in volume:
                source = pod_dir / "empty" / volume["name"]
                source.mkdir(parents=True, exist_ok=True)
            else:
                raise LookupError(f"volume {volume['name']!r}: the fake kubelet serves persistentVolumeClaim, "
                                  "configMap and emptyDir volumes only")
            args += ["-v", f"{source}:{mount['mountPath']}:{'ro' if read_only else 'rw'}"]
        return args

    def _config_map(self, pod: dict, volume: dict, pod_dir: Path) -> Path:
        """A configMap volume as files in a temp directory (written once per pod)."""
        ref = volume["configMap"]
        target = pod_dir / "configmap" / volume["name"]
        if target.exists():
            return target
        cm = self.api.get("configmaps", ref["name"], pod["metadata"]["namespace"])
        if cm is None:
            if ref.get("optional"):
                target.mkdir(parents=True)
                return target
            raise LookupError(f'configmap "{ref["name"]}" not found')
        content = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        content.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        items = ref.get("items") or [{"key": k, "path": k} for k in sorted(content)]
        target.mkdir(parents=True)
        for item in items:
            if item["key"] not in content:
                raise LookupError(f'configmap "{ref["name"]}" has no key {item["key"]!r}')
            path = target / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content[item["key"]])
            path.chmod(item.get("mode", ref.get("defaultMode", 0o644)))
        return target

    def _env(self, pod: dict, container: dict) -> tuple[list[str], dict]:
        """(argv words `-e NAME`, the values for podman's own environment): values never ride in argv."""
        words, values = [], {}
        namespace = pod["metadata"]["namespace"]
        for entry in container.get("env") or []:
            name = entry["name"]
            if "value" in entry:
                value = str(entry["value"])
            else:
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if ref is None:
                    raise LookupError(f"env {name}: the fake kubelet serves value and valueFrom.secretKeyRef only")
                value = self.api.secret_value(ref["name"], ref["key"], namespace)
                if value is None:
                    if ref.get("optional"):
                        continue
                    raise LookupError(f'secret "{ref["name"]}" has no key {ref["key"]!r} (env {name})')
            words += ["-e", name]
            values[name] = value
        return words, values

    def _run_argv(self, pod: dict, container: dict, pod_dir: Path, name: str) -> tuple[list[str], dict]:
        namespace, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        env_words, env_values = self._env(pod, container)
        argv = ["podman", "run", "--name", name, *self._labels(namespace, pod_name), "--hostname", pod_name[:63],
                *self._volume_args(pod, container, pod_dir), *env_words]
        memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if memory:
            with self.lock:
                self.limited.add(name)
            argv += ["--memory", str(_bytes(str(memory))), "--memory-swap", str(_bytes(str(memory)))]
        if container.get("workingDir"):
            argv += ["--workdir", container["workingDir"]]
        if container.get("command"):
            argv += ["--entrypoint", json.dumps(container["command"])]
        argv += [IMAGE, *(container.get("args") or [])]
        return argv, dict(self.env, **env_values)

    # ---------------------------------------------------------------- lifecycle

    def start_pod(self, namespace: str, pod: str) -> None:
        """Run a pod the fake has just stored (Pending): a thread walks it through init, run and the end."""
        threading.Thread(target=self._run_pod, args=(namespace, pod), name=f"kubelet-{pod}", daemon=True).start()

    def _update(self, namespace: str, pod: str, change) -> bool:
        """Apply `change(status)` to the pod's status in the fake (False when the pod is gone or going)."""
        with self.api.lock:
            obj = self.api.objects.get(("pods", namespace, pod))
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return False
            change(obj["status"])
            self.api.pod_changed(obj)
            return True

    def _inspect(self, name: str) -> dict:
        out = podman("inspect", "--format", "{{json .State}}", name).stdout.strip()
        return json.loads(out) if out else {}

    def _terminated(self, name: str) -> dict:
        state = self._inspect(name)
        rc = int(state.get("ExitCode") or 0)
        with self.lock:  # podman on cgroup v1 may miss the OOM kill: a SIGKILL under a limit nobody sent is one
            oom = state.get("OOMKilled") or (rc == 137 and name in self.limited and name not in self.stopping)
        reason = "OOMKilled" if oom else "Completed" if rc == 0 else "Error"
        return {"exitCode": rc, "reason": reason, "startedAt": _rfc3339(state.get("StartedAt")),
                "finishedAt": _rfc3339(state.get("FinishedAt"))}

    def _run_pod(self, namespace: str, pod_name: str) -> None:
        pod = self.api.get("pods", pod_name, namespace)
        if pod is None:
            return
        spec = pod.get("spec") or {}
        pod_dir = self.root / f"{namespace}-{pod_name}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        inits, mains = spec.get("initContainers") or [], spec.get("containers") or []
        names = {c["name"]: self.podman_name(namespace, pod_name, c["name"]) for c in inits + mains}
        with self.lock:
            self.containers[(namespace, pod_name)] = names
        try:
            for i, container in enumerate(inits):
                self._update(namespace, pod_name, lambda st, i=i: _set_init(st, i, inits))
                argv, env = self._run_argv(pod, container, pod_dir, names[container["name"]])
                if self._deleted(namespace, pod_name):
                    return
                subprocess.run(argv, capture_output=True, env=env, check=False)
                done = self._terminated(names[container["name"]])
                self._update(namespace, pod_name, lambda st, c=container, d=done: _set_container(
                    st, "initContainerStatuses", c["name"], {"terminated": d}))
                if done["exitCode"] != 0:
                    self._update(namespace, pod_name, lambda st: _finish(st, "Failed"))  # mains stay waiting
                    return
            for container in mains:
                argv, env = self._run_argv(pod, container, pod_dir, names[container["name"]])
                if self._deleted(namespace, pod_name):
                    return
                proc = subprocess.run(argv[:2] + ["-d"] + argv[2:], capture_output=True, text=True, env=env,
                                      check=False)
                if proc.returncode != 0:
                    raise LookupError(f"podman run: {proc.stderr.strip()[-300:]}")
                at = _rfc3339(self._inspect(names[container["name"]]).get("StartedAt"))
                self._update(namespace, pod_name, lambda st, c=container, at=at: _set_container(
                    st, "containerStatuses", c["name"], {"running": {"startedAt": at}}, ready=True))
            self._update(namespace, pod_name, lambda st: _running(st))
            ends = {}
            for container in mains:
                podman("wait", names[container["name"]], timeout=24 * 3600)
                ends[container["name"]] = self._terminated(names[container["name"]])
                self._update(namespace, pod_name, lambda st, c=container: _set_container(
                    st, "containerStatuses", c["name"], {"terminated": ends[c["name"]]}))
            phase = "Succeeded" if all(e["exitCode"] == 0 for e in ends.values()) else "Failed"
            self._update(namespace, pod_name, lambda st: _finish(st, phase))
        except (LookupError, OSError, ValueError) as exc:
            message = str(exc)
            self._update(namespace, pod_name, lambda st: _stuck(st, mains, message))

    def _deleted(self, namespace: str, pod: str) -> bool:
        obj = self.api.objects.get(("pods", namespace, pod))
        return obj is None or bool(obj["metadata"].get("deletionTimestamp"))

    def delete_pod(self, namespace: str, pod: str, grace_s: int, then) -> None:
        """Stop the pod's containers (`podman stop -t grace_s`), remove them, then call `then()` (a thread)."""
        def run():
            with self.lock:
                names = list(self.containers.pop((namespace, pod), {}).values())
            present = [n for n in names if podman("container", "exists", n).returncode == 0]
            with self.lock:
                self.stopping.update(present)
            if present:
                podman("stop", "-t", str(int(grace_s)), *present, timeout=grace_s + 60)
                podman("rm", "-f", "-t", "0", *present)
            shutil.rmtree(self.root / f"{namespace}-{pod}", ignore_errors=True)
            then()
        threading.Thread(target=run, name=f"kubelet-delete-{pod}", daemon=True).start()

    def stop_pod(self, namespace: str, pod: str, grace_s: int) -> dict[str, dict]:
        """Stop the pod's running containers with grace (an eviction) and return their terminated states."""
        with self.lock:
            names = dict(self.containers.get((namespace, pod), {}))
        if names:
            with self.lock:
                self.stopping.update(names.values())
            podman("stop", "-t", str(int(grace_s)), *names.values(), timeout=grace_s + 60)
        return {c: self._terminated(n) for c, n in names.items()}

    # ---------------------------------------------------------------- exec and logs

    def container_of(self, pod: dict, container: str | None) -> str:
        """The podman name of a pod's container (the first when None); LookupError when it does not run."""
        spec = pod.get("spec") or {}
        wanted = container or (spec.get("containers") or [{}])[0].get("name")
        with self.lock:
            name = self.containers.get((pod["metadata"]["namespace"], pod["metadata"]["name"]), {}).get(wanted)
        if name is None:
            raise LookupError(f"container {wanted} is not valid for pod {pod['metadata']['name']}")
        return name

    def exec_argv(self, pod: dict, container: str | None, command: list[str], stdin: bool, tty: bool) -> list[str]:
        """`podman exec [-i] NAME COMMAND...`; LookupError when the container is not running."""
        name = self.container_of(pod, container)
        if self._inspect(name).get("Status") != "running":
            raise LookupError(f"container {name} is not running")
        if not command:
            raise LookupError("you must specify at least one command for the container")
        return ["podman", "exec", *(["-i"] if stdin else []), name, *command]

    def logs_argv(self, pod: dict, container: str | None) -> list[str]:
        """`podman logs NAME` (the API server cuts the tail and polls for a follow)."""
        return ["podman", "logs", self.container_of(pod, container)]

    def running(self, name: str) -> bool:
        return self._inspect(name).get("Status") == "running"

    def stop(self) -> None:
        """Remove this session's containers and temp directories."""
        remove_all(self.session)
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------- pod status shapes

UNITS = {"": 1, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4, "Ki": 1024, "Mi": 1024 ** 2,
         "Gi": 1024 ** 3, "Ti": 1024 ** 4}


def _bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (`64Mi`, `1G`, `1000000`) in bytes."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kMGT]i?|)", quantity.strip())
    if match is None:
        raise LookupError(f"memory limit {quantity!r} is not a quantity the fake kubelet reads")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def _rfc3339(stamp: str | None) -> str | None:
    """podman's `2026-12-01 15:46:17.123 +0000 UTC` (or RFC 3339 with nanoseconds) -> 2026-12-01T15:46:17Z."""
    if not stamp or stamp.startswith("0001-"):
        return None
    match = re.match(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)", stamp)
    return f"{match.group(1)}T{match.group(2)}Z" if match else None


def _condition(status: dict, kind: str, value: bool, reason: str | None = None) -> None:
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != kind]
    cond = {"type": kind, "status": "True" if value else "False", "lastTransitionTime": _now()}
    if reason:
        cond["reason"] = reason
    status["conditions"] = conditions + [cond]


def _set_container(status: dict, key: str, name: str, state: dict, ready: bool = False) -> None:
    for cs in status.get(key) or []:
        if cs["name"] == name:
            cs.update(state=copy.deepcopy(state), ready=ready, started="running" in state)


def _set_init(status: dict, index: int, inits: list[dict]) -> None:
    status["phase"] = "Pending"
    _set_container(status, "initContainerStatuses", inits[index]["name"], {"running": {"startedAt": _now()}})
    _condition(status, "Initialized", False, "ContainersNotInitialized")


def _running(status: dict) -> None:
    status["phase"] = "Running"
    status["startTime"] = status.get("startTime") or _now()
    for kind in ("Initialized", "ContainersReady", "Ready"):
        _condition(status, kind, True)


def _finish(status: dict, phase: str) -> None:
    status["phase"] = phase
    for kind in ("ContainersReady", "Ready"):
        _condition(status, kind, False, "PodCompleted" if phase == "Succeeded" else "PodFailed")


def _stuck(status: dict, mains: list[dict], message: str) -> None:
    """A container the kubelet cannot create (a missing claim directory, Secret key, configMap)."""
    for container in mains:
        _set_container(status, "containerStatuses", container["name"],
                       {"waiting": {"reason": "CreateContainerConfigError", "message": message}})


def pending_status(pod: dict) -> dict:
    """A new pod's status, before the kubelet ran anything: scheduled, its containers waiting."""
    spec = pod.get("spec") or {}
    inits = spec.get("initContainers") or []
    waiting = {"waiting": {"reason": "PodInitializing" if inits else "ContainerCreating"}}
    status = {"phase": "Pending", "startTime": _now(),
              "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}],
              "containerStatuses": [{"name": c["name"], "image": c.get("image"), "ready": False, "restartCount": 0,
                                     "started": False, "state": copy.deepcopy(waiting)}
                                    for c in spec.get("containers") or []]}
    if inits:
        status["initContainerStatuses"] = [{"name": c["name"], "image": c.get("image"), "ready": False,
                                            "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
                                           for c in inits]
    return status

