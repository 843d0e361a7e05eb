"""The fake Kubernetes API with its podman kubelet (tests/fakes/k8s_api.py, tests/fakes/k8s_kubelet.py), driven by
the REAL kubectl: ConfigMaps, `kubectl exec` over the remotecommand WebSocket protocol (stdout, stderr, stdin,
exit codes, binary bytes), `kubectl cp` both ways, claims and configMaps mounted as the pod says, and Jobs whose
pods really run in podman (Complete, Failed, logs, deletion with grace, eviction). One fake and one kubelet per
module; every podman container it made is removed at the end."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import tarfile
import time

import pytest

from rgt import k8s_engine
from tests.fakes import k8s_kubelet
from tests.fakes.k8s_api import FakeKubernetes
from tests.harness.stubhost import IMAGE, image_present, podman_available

NS = "ml"
CLAIM = "durable-claim"
KUBECTL = shutil.which("kubectl")
KUBECTLS = [k for k in dict.fromkeys([KUBECTL, "/usr/bin/kubectl"]) if k and os.access(k, os.X_OK)]
SECRET_VALUE = "tok-s3cr3t"

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH")
needs_podman = pytest.mark.skipif(not podman_available() or not image_present(IMAGE),
                                  reason=f"needs podman and the image {IMAGE} (tests/harness/stubhost.py)")
pytestmark = needs_kubectl


class Cluster:
    def __init__(self, fake: FakeKubernetes, kubeconfig, claim_dir):
        self.fake, self.kubeconfig, self.claim_dir = fake, kubeconfig, claim_dir

    def kubectl(self, *words: str, input: bytes | str | None = None, binary: str | None = None,  # noqa: A002
                check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run([binary or KUBECTL, f"--kubeconfig={self.kubeconfig}", *words], input=data,
                              capture_output=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(words)} -> {proc.returncode}: {proc.stderr.decode()}")
        return proc

    def apply(self, doc: dict) -> None:
        self.kubectl("apply", "--server-side", "--field-manager=rgt", "-f", "-", input=json.dumps(doc))

    def pod_of(self, job: str) -> str:
        names = [n for n in self.fake.names("pods") if n.startswith(job + "-")]
        assert len(names) == 1, names
        return names[0]

    def wait_for(self, what, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = what()
            if got:
                return got
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")


def claim_mount(read_only: bool = False) -> dict:
    return {"name": "durable", "mountPath": "/durable", "readOnly": read_only}


def helper(name: str, read_only: bool) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"rgt.helper": "test"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "helper", "image": "busybox:1.36", "command": ["sleep", "3600"],
                                     "volumeMounts": [claim_mount(read_only),
                                                      {"name": "stage", "mountPath": "/stage"}]}],
                     "volumes": [{"name": "durable", "persistentVolumeClaim": {"claimName": CLAIM}},
                                 {"name": "stage", "configMap": {"name": "stage", "defaultMode": 0o755}}]}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not podman_available() or not image_present(IMAGE):
        pytest.skip(f"needs podman and the image {IMAGE}")
    tmp = tmp_path_factory.mktemp("k8s-exec")
    cache = os.environ.get("KUBECACHEDIR")
    os.environ["KUBECACHEDIR"] = str(tmp / "kube-cache")  # kubectl's discovery cache: not in $HOME
    claim_dir = tmp / "claim"
    claim_dir.mkdir()
    (claim_dir / "x").write_text("hello from the claim\n")
    fake = FakeKubernetes(NS, kubelet="podman").start()
    session = fake.kubelet.session
    try:
        fake.pvc_dir(CLAIM, claim_dir)
        c = Cluster(fake, fake.kubeconfig(tmp / "kubeconfig"), claim_dir)
        c.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stage"},
                 "data": {"run.sh": "#!/bin/sh\necho staged\n"}, "binaryData": {"blob": "AAEC/w=="}})
        c.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "train-secrets"},
                 "stringData": {"TOKEN": SECRET_VALUE}})
        c.apply(helper("rw", read_only=False))
        c.apply(helper("ro", read_only=True))
        c.kubectl("wait", "--for=condition=Ready", "pod/rw", "pod/ro", "--timeout=30s")
        yield c
    finally:
        fake.stop()
        k8s_kubelet.remove_all(session)
        if cache is None:
            os.environ.pop("KUBECACHEDIR", None)
        else:
            os.environ["KUBECACHEDIR"] = cache
    left = k8s_kubelet.podman("ps", "-a", "-q", "--filter", f"label={k8s_kubelet.SESSION_LABEL}={session}").stdout
    assert not left.split(), "the kubelet left containers behind"


# ---------------------------------------------------------------- ConfigMaps (no podman needed)

def test_configmaps_are_applied_listed_watched_and_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
    with FakeKubernetes(NS) as fake:
        c = Cluster(fake, fake.kubeconfig(tmp_path / "kubeconfig"), None)
        doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": {"app": "x"}},
               "data": {"a": "1", "b": "2"}, "binaryData": {"bin": "AAE="}}
        c.apply(doc)
        c.apply(dict(doc, data={"a": "9"}))  # one manager re-applies: the key it dropped goes
        got = json.loads(c.kubectl("get", "configmap", "cm", "-o", "json").stdout)
        assert got["data"] == {"a": "9"} and got["binaryData"] == {"bin": "AAE="} and got["kind"] == "ConfigMap"
        assert c.kubectl("get", "cm", "-l", "app=x", "-o", "name").stdout.decode().split() == ["configmap/cm"]
        assert c.kubectl("get", "cm", "-l", "app=y", "-o", "name").stdout.decode().split() == []
        c.kubectl("delete", "configmap", "cm", "--wait=true", "--timeout=10s")
        assert fake.names("configmaps") == []
        assert c.kubectl("get", "cm", "cm", check=False).returncode == 1


# ---------------------------------------------------------------- exec

@needs_podman
@pytest.mark.parametrize("binary", KUBECTLS)
def test_exec_runs_in_the_pod_with_the_claim_mounted(cluster, binary):
    out = cluster.kubectl("exec", "ro", "--", "cat", "/durable/x", binary=binary)
    assert out.stdout == b"hello from the claim\n"
    got = cluster.kubectl("exec", "-i", "rw", "--", "sh", "-c", "cat > /durable/from-stdin; echo done >&2",
                          input=b"line 1\nline 2\n", binary=binary)
    assert got.stderr == b"done\n" and (cluster.claim_dir / "from-stdin").read_bytes() == b"line 1\nline 2\n"


@needs_podman
@pytest.mark.parametrize("binary", KUBECTLS)
def test_exec_reports_the_commands_exit_code(cluster, binary):
    got = cluster.kubectl("exec", "rw", "--", "sh", "-c", "echo out; echo err >&2; exit 3", check=False,
                          binary=binary)
    assert got.returncode == 3 and got.stdout == b"out\n"
    assert b"err\n" in got.stderr and b"command terminated with exit code 3" in got.stderr
    assert cluster.kubectl("exec", "rw", "-c", "nope", "--", "true", check=False).returncode != 0
    assert cluster.kubectl("exec", "gone", "--", "true", check=False).returncode != 0


@needs_podman
def test_exec_tar_is_binary_safe_and_collect_works_end_to_end(cluster, tmp_path):
    export = cluster.claim_dir / "proj" / "export" / "run.1"
    (export / "ckpt").mkdir(parents=True)
    blob = os.urandom(700_000)
    (export / "ckpt" / "model.bin").write_bytes(blob)
    (export / "metrics.json").write_text('{"loss": 1.2}\n')
    raw = cluster.kubectl("exec", "ro", "--", "tar", "cf", "-", "-C", "/durable/proj/export/run.1", ".").stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        assert archive.extractfile("./ckpt/model.bin").read() == blob
    kc = k8s_engine.Kubectl(str(cluster.kubeconfig), None, NS)
    got = k8s_engine.collect(kc, CLAIM, "proj/export/run.1", tmp_path / "pulled", image="busybox:1.36",
                             ready_timeout_s=30)
    assert got["files"] == ["ckpt/model.bin", "metrics.json"] and got["bytes"] == len(blob) + 14
    assert (tmp_path / "pulled" / "ckpt" / "model.bin").read_bytes() == blob
    cluster.wait_for(lambda: not [n for n in cluster.fake.names("pods") if n.startswith("rgt-collect")])


@needs_podman
@pytest.mark.parametrize("binary", KUBECTLS)
def test_kubectl_cp_both_ways_and_the_read_only_claim(cluster, tmp_path, binary):
    src = tmp_path / "up"
    src.mkdir()
    (src / "a.bin").write_bytes(bytes(range(256)) * 100)
    cluster.kubectl("cp", str(src), f"rw:/durable/{tmp_path.name}", binary=binary)
    assert (cluster.claim_dir / tmp_path.name / "a.bin").read_bytes() == bytes(range(256)) * 100
    cluster.kubectl("cp", f"ro:/durable/{tmp_path.name}/a.bin", str(tmp_path / "down.bin"), binary=binary)
    assert (tmp_path / "down.bin").read_bytes() == bytes(range(256)) * 100
    denied = cluster.kubectl("exec", "ro", "--", "sh", "-c", "echo no > /durable/ro-write", check=False)
    assert denied.returncode != 0 and b"Read-only file system" in denied.stderr
    assert not (cluster.claim_dir / "ro-write").exists()


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """A client frame: FIN, masked (as RFC 6455 wants from a client)."""
    mask = os.urandom(4)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | len(payload)]) if len(payload) < 126 else
                                     struct.pack("!BH", 0x80 | 126, len(payload)))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_read(sock_file) -> tuple[int, bytes]:
    head = sock_file.read(2)
    n = head[1] & 0x7F
    n = struct.unpack("!H", sock_file.read(2))[0] if n == 126 else struct.unpack("!Q", sock_file.read(8))[0] \
        if n == 127 else n
    return head[0] & 0x0F, sock_file.read(n)


@needs_podman
def test_the_websocket_exec_protocol_on_the_wire_v4_ping_and_close(cluster):
    """A hand-made client that offers only v4: the 101 names it, a ping is answered, stdout and the Failure
    Status with the exit code come as channel messages, then the server's close frame."""
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", cluster.fake.port), timeout=10) as sock:
        sock.sendall((f"GET /api/v1/namespaces/{NS}/pods/rw/exec?command=sh&command=-c&command=sleep+0.5%3B"
                      "echo+hi%3Bexit+5&stdout=true&stderr=true HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      "Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n").encode())
        reader = sock.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += reader.read(1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        assert lines[0].startswith("HTTP/1.1 101") and headers["sec-websocket-accept"] == accept.decode()
        assert headers["sec-websocket-protocol"] == "v4.channel.k8s.io" and headers["upgrade"] == "websocket"
        sock.sendall(ws_frame(0x9, b"are you there"))
        messages = []
        while not messages or messages[-1][0] != 0x8:
            messages.append(ws_read(reader))
        sock.sendall(ws_frame(0x8, struct.pack("!H", 1000)))
    assert messages[0] == (0xA, b"are you there")
    assert (0x2, b"\x01hi\n") in messages
    status = json.loads(next(data[1:] for op, data in messages if op == 0x2 and data[:1] == b"\x03"))
    assert status["status"] == "Failure" and status["details"]["causes"] == [{"reason": "ExitCode", "message": "5"}]


@needs_podman
def test_a_config_map_volume_is_its_files_read_only(cluster):
    assert cluster.kubectl("exec", "rw", "--", "/stage/run.sh").stdout == b"staged\n"  # defaultMode 0755
    assert cluster.kubectl("exec", "rw", "--", "cat", "/stage/blob").stdout == b"\x00\x01\x02\xff"
    assert cluster.kubectl("exec", "rw", "--", "touch", "/stage/new", check=False).returncode != 0


# ---------------------------------------------------------------- Jobs

def job(name: str, code: str, grace: int = 2, init: str | None = None, memory: str | None = None) -> dict:
    container = {"name": "job", "image": "registry.example/train@sha256:" + "b" * 64,
                 "command": ["python3", "-u", "-c", code], "args": ["arg1"], "workingDir": "/durable",
                 "env": [{"name": "PLAIN", "value": "plain-value"},
                         {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "train-secrets", "key": "TOKEN"}}}],
                 "volumeMounts": [claim_mount()]}
    if memory:
        container["resources"] = {"limits": {"memory": memory}}
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace, "containers": [container],
            "volumes": [{"name": "durable", "persistentVolumeClaim": {"claimName": CLAIM}}]}
    if init:
        spec["initContainers"] = [{"name": "stage", "image": "busybox:1.36", "command": ["sh", "-c", init],
                                   "volumeMounts": [claim_mount()]}]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "rgt"}}, "spec": spec}}}


def phase(cluster, pod: str) -> str | None:
    return ((cluster.fake.get("pods", pod) or {}).get("status") or {}).get("phase")


@needs_podman
def test_a_job_runs_init_then_its_container_to_complete_and_its_logs_come_through(cluster):
    code = ("import os, sys, time; print('start', sys.argv[1:], os.getcwd(), flush=True); time.sleep(1.5); "
            "open('out.txt', 'w').write(open('staged').read() + os.environ['PLAIN'] + ' ' + os.environ['TOKEN']); "
            "print('done')")
    cluster.apply(job("train", code, init="echo staged > /durable/staged"))
    pod = cluster.wait_for(lambda: [n for n in cluster.fake.names("pods") if n.startswith("train-")])[0]
    labels = cluster.fake.get("pods", pod)["metadata"]["labels"]
    assert len(pod) == len("train-") + 5 and labels["job-name"] == "train" and labels["app"] == "rgt"
    kc = k8s_engine.Kubectl(str(cluster.kubeconfig), None, NS)
    cluster.wait_for(lambda: phase(cluster, pod) == "Running")
    running = k8s_engine.observe(kc, "train")
    assert running["state"] == "running" and cluster.fake.get("jobs", "train")["status"]["active"] == 1
    assert cluster.fake.get("pods", pod)["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    followed = subprocess.run(k8s_engine.logs_argv(kc, "train", follow=True), capture_output=True, timeout=30,
                              check=True)  # rgt's `logs -f`: until the container ends
    assert followed.stdout == b"start ['arg1'] /durable\ndone\n"
    cluster.kubectl("wait", "--for=condition=Complete", "job/train", "--timeout=30s")
    assert k8s_engine.observe(kc, "train")["state"] == "finished"
    status = cluster.fake.get("pods", pod)["status"]
    assert status["phase"] == "Succeeded" and status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert cluster.fake.get("jobs", "train")["status"]["succeeded"] == 1
    assert (cluster.claim_dir / "out.txt").read_text() == f"staged\nplain-value {SECRET_VALUE}"
    assert k8s_engine.logs(kc, "train") == "start ['arg1'] /durable\ndone\n"
    assert k8s_engine.logs(kc, "train", tail=1) == "done\n"
    assert not any(SECRET_VALUE in json.dumps(r) for r in cluster.fake.requests if r["method"] != "PATCH")


@needs_podman
def test_a_failing_job_is_failed_with_its_exit_code(cluster):
    cluster.apply(job("crash", "import sys; print('boom'); sys.exit(7)"))
    cluster.kubectl("wait", "--for=condition=Failed", "job/crash", "--timeout=30s")
    pod = cluster.pod_of("crash")
    terminated = cluster.fake.get("pods", pod)["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 7 and terminated["reason"] == "Error" and phase(cluster, pod) == "Failed"
    assert cluster.fake.get("jobs", "crash")["status"]["failed"] == 1
    kc = k8s_engine.Kubectl(str(cluster.kubeconfig), None, NS)
    state = k8s_engine.observe(kc, "crash")
    assert state["state"] == "failed" and state["k8s"]["exit_code"] == 7
    assert cluster.pod_of("crash") == pod  # backoffLimit 0: no second pod


@needs_podman
def test_a_job_over_its_memory_limit_is_oomkilled(cluster):
    cluster.apply(job("hog", "x = bytearray(256 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])", memory="64Mi"))
    cluster.kubectl("wait", "--for=condition=Failed", "job/hog", "--timeout=30s")
    terminated = cluster.fake.get("pods", cluster.pod_of("hog"))["status"]["containerStatuses"][0]["state"]
    assert terminated["terminated"]["reason"] == "OOMKilled" and terminated["terminated"]["exitCode"] == 137
    kc = k8s_engine.Kubectl(str(cluster.kubeconfig), None, NS)
    assert k8s_engine.observe(kc, "hog")["state"] == "oom"


@needs_podman
def test_deleting_a_job_stops_its_container_with_grace_and_removes_it(cluster):
    code = ("import signal, sys, time\n"
            "def bye(*_):\n    open('/durable/term.txt', 'w').write('sigterm'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye); print('ready'); time.sleep(600)")
    cluster.apply(job("graceful", code))
    pod = cluster.wait_for(lambda: [n for n in cluster.fake.names("pods") if n.startswith("graceful-")])[0]
    kc = k8s_engine.Kubectl(str(cluster.kubeconfig), None, NS)
    cluster.wait_for(lambda: phase(cluster, pod) == "Running" and "ready" in k8s_engine.logs(kc, "graceful"))
    assert k8s_engine.delete(kc, "graceful", timeout=60)["outcome"] == "deleted"
    assert (cluster.claim_dir / "term.txt").read_text() == "sigterm"
    assert "graceful" not in cluster.fake.names("jobs") and pod not in cluster.fake.names("pods")
    left = k8s_kubelet.podman("ps", "-a", "-q", "--filter", f"label={k8s_kubelet.POD_LABEL}={NS}/{pod}").stdout
    assert left.split() == []


@needs_podman
def test_an_evicted_pod_is_killed_after_its_grace_and_the_job_is_preempted(cluster):
    cluster.apply(job("evictee", "import time; print('up'); time.sleep(600)", grace=1))
    pod = cluster.wait_for(lambda: [n for n in cluster.fake.names("pods") if n.startswith("evictee-")])[0]
    cluster.wait_for(lambda: phase(cluster, pod) == "Running")
    started = time.monotonic()
    got = cluster.fake.evict(pod)
    assert time.monotonic() - started >= 0.9  # python as PID 1 ignores SIGTERM: SIGKILL after the grace
    assert got["status"]["phase"] == "Failed" and got["status"]["reason"] == "Evicted"
    assert got["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert any(c["type"] == "DisruptionTarget" for c in got["status"]["conditions"])
    cluster.kubectl("wait", "--for=condition=Failed", "job/evictee", "--timeout=30s")
    kc = k8s_engine.Kubectl(str(cluster.kubeconfig), None, NS)
    assert k8s_engine.observe(kc, "evictee")["state"] == "preempted"
