"""`rgt-run train -C` on a host of the kubernetes profile shows the run's Kubernetes manifests (a PVC for the
durable root, the ConfigMap that stages the run dir, and the Job), validated offline, with where they would be
written (<run_dir>/.rgt/k8s/), and contacts no cluster: no kubeconfig, no kubectl, nothing written. The ConfigMap's
scripts and code tarball are shown as placeholders. A broken field, a code dir too big for a ConfigMap and code in
the image without rgt_job.k8s.workdir are refused at input (exit 2, the job-spec field named), and a real train
through k8s-job stays refused (exit 2). Runs on the controller only (seconds)."""

import json
import os

import yaml
from clihelp import REPO, write_inventory

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_tree

SECRET_VALUE = "s3cr3t-value-never-printed"
DIGEST = "registry.example/train@sha256:" + "b" * 64


def cluster(tmp_path):
    # rgt talks to a cluster from the controller: the host has no SSH, so no pinned key is asked for
    return write_inventory(tmp_path / "inv", {"cluster": {
        "ansible_host": "gke.example", "rgt_profile": "kubernetes", "rgt_instance_id": "gke-ml",
        "rgt_project": "proj"}})


def job(**k8s_fields):
    spec = {"image": DIGEST, "namespace": "ml", "secret_name": "train-secrets", "pvc": {"storage": "200Gi"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    spec.update(k8s_fields)
    return {"rgt_job": {"name": "run.1", "command": "python train.py", "python": "/usr/bin/python3",
                        "code_dir": str(REPO / "examples" / "tiny_train"), "gpu": {"count": 1},
                        "secrets": ["WANDB_API_KEY"], "k8s": spec}}


def spy_kubectl(tmp_path, secret: bool = True):
    """An environment whose first kubectl on PATH records that it was called (and fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spy = bin_dir / "kubectl"
    spy.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'kubectl-called'}\nexit 1\n")
    spy.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "KUBECONFIG": str(tmp_path / "kubeconfig-never-read"),
           "COLUMNS": "200"}
    return {**env, "WANDB_API_KEY": SECRET_VALUE} if secret else env


def nothing_touched(rgt, tmp_path):
    assert not (rgt.ledger / "events").exists() and not (rgt.ledger / "runs").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "inv"], list(tmp_path.iterdir())


def test_check_on_train_shows_the_validated_manifests_and_contacts_no_cluster(rgt, tmp_path):
    result = rgt("train", "-i", cluster(tmp_path), "-e", json.dumps(job()), "-C", "--json",
                 env=spy_kubectl(tmp_path), cwd=tmp_path, timeout=120)
    assert result.rc == 0, result.stdout + result.stderr
    plan = result.doc["hosts"]["cluster"]
    run_dir = "/checkpoints/proj/active/run.1"
    assert plan["run_dir"] == run_dir
    manifests = plan["k8s"]
    assert manifests["dir"] == f"{run_dir}/.rgt/k8s" and manifests["kubernetes_version"] == "1.37"
    assert manifests["validator"] == "kubernetes-validate 1.37.0 --strict"
    assert [(f["file"], f["kind"]) for f in manifests["files"]] == [("pvc.yaml", "PersistentVolumeClaim"),
                                                                     ("stage.yaml", "ConfigMap"), ("job.yaml", "Job")]
    assert "documents" not in manifests  # the full manifests (base64 code) are the engine's, not the plan's
    claim, stage, kjob = (yaml.safe_load(f["yaml"]) for f in manifests["files"])
    pod = kjob["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert pod["volumes"][1]["configMap"]["name"] == stage["metadata"]["name"]
    assert pod["containers"][0]["command"] == ["/usr/bin/python3", f"{run_dir}/.rgt/wrapper.py", run_dir]
    assert pod["initContainers"][0]["command"] == ["/usr/bin/python3", "/rgt-stage/rgt_k8s_stage.py", run_dir]
    # the stage: job.json in full (naming the code dir the upload's rule names), the rest as placeholders
    hash8 = rgt_tree.build_manifest(str(REPO / "examples" / "tiny_train"))["hash8"]
    assert plan["hash8"] == hash8 and plan["code_dir"] == f"{run_dir}/code-{hash8}"
    assert json.loads(stage["data"]["job.json"])["code_dir"] == plan["code_dir"]
    assert stage["binaryData"]["code.tar.gz"].startswith("<code.tar.gz: ")
    assert manifests["stage"]["code"]["sha256"] in stage["binaryData"]["code.tar.gz"]
    assert stage["data"]["wrapper.py"].startswith("<wrapper.py: ") and "--- stage.yaml (ConfigMap" in result.stderr
    assert f"staged from the ConfigMap {stage['metadata']['name']}" in result.stderr
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod["terminationGracePeriodSeconds"] == 40 and pod["restartPolicy"] == "Never"
    # the console: where they would be written, the YAML itself, and that a real train is refused
    assert f"kubernetes manifests for {run_dir}/.rgt/k8s/" in result.stderr
    assert "no cluster contacted" in result.stderr
    assert ("a real train is refused" in result.stderr) is not manifests["built"]  # k8s-job's registry entry
    assert f"--- job.yaml (Job {kjob['metadata']['name']})" in result.stderr
    assert "WANDB_API_KEY (keys of the Kubernetes Secret train-secrets, by reference)" in result.stderr
    assert "secretKeyRef:" in result.stderr and "nvidia.com/gpu: '1'" in result.stderr
    assert SECRET_VALUE not in result.stdout + result.stderr
    nothing_touched(rgt, tmp_path)


def test_check_refuses_a_field_the_kubernetes_schema_refuses_naming_the_job_spec_field(rgt, tmp_path):
    broken = job(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "tolerationSeconds": "soon"}])
    result = rgt("train", "-i", cluster(tmp_path), "-e", json.dumps(broken), "-C", "--json",
                 env=spy_kubectl(tmp_path), cwd=tmp_path, timeout=120)
    assert result.rc == 2, result.stdout + result.stderr
    doc = result.doc
    assert doc["field"] == "rgt_job.k8s.tolerations[0].tolerationSeconds", doc
    assert "kubernetes-validate --strict" in doc["error"] and "'soon' is not of type 'integer'" in doc["error"]
    assert "apiVersion" not in result.stderr  # no manifest is shown for a spec that does not validate
    nothing_touched(rgt, tmp_path)


def test_a_real_train_goes_to_the_cluster_through_kubectl_and_a_kubectl_failure_is_reported(rgt, tmp_path):
    # k8s-job is built: a real train applies through kubectl (tests/integration/test_k8s_cli.py against the fake
    # API server); here the spy kubectl fails, and the run is not remembered as launched
    result = rgt("train", "-i", cluster(tmp_path), "-e", json.dumps(job()), "--json",
                 env=spy_kubectl(tmp_path), cwd=tmp_path, timeout=120)
    assert result.rc == 1, result.stdout + result.stderr
    assert result.doc["hosts"]["cluster"]["failed"] is True
    called = (tmp_path / "kubectl-called").read_text().splitlines()
    assert called and " get " in f" {called[0]} "
    assert not (rgt.ledger / "runs").exists()


def test_the_jobs_secrets_come_from_the_secret_not_from_this_shell(rgt, tmp_path, monkeypatch):
    # the Job reads WANDB_API_KEY from the Secret by reference: the plan needs no value of it here
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    result = rgt("train", "-i", cluster(tmp_path), "-e", json.dumps(job()), "-C", "--json",
                 env=spy_kubectl(tmp_path, secret=False), cwd=tmp_path, timeout=120)
    assert result.rc == 0, result.stdout + result.stderr
    assert "secretKeyRef:" in result.stderr


def test_check_refuses_a_code_dir_too_big_for_the_configmap_naming_code_dir(rgt, tmp_path, tmp_path_factory):
    big = tmp_path_factory.mktemp("big-code")
    (big / "train.py").write_text("print('hi')\n")
    (big / "weights.bin").write_bytes(os.urandom(950 * 1024))  # incompressible
    spec = job()
    spec["rgt_job"]["code_dir"] = str(big)
    result = rgt("train", "-i", cluster(tmp_path), "-e", json.dumps(spec), "-C", "--json",
                 env=spy_kubectl(tmp_path), cwd=tmp_path, timeout=120)
    assert result.rc == 2, result.stdout + result.stderr
    assert result.doc["field"] == "rgt_job.code_dir" and "ConfigMap" in result.doc["error"]
    assert result.doc["fix"] == "bake the code into rgt_job.k8s.image and set rgt_job.k8s.workdir"
    nothing_touched(rgt, tmp_path)


def test_check_of_code_in_the_image_needs_workdir(rgt, tmp_path):
    spec = job()
    del spec["rgt_job"]["code_dir"]
    inventory, env = cluster(tmp_path), spy_kubectl(tmp_path)
    result = rgt("train", "-i", inventory, "-e", json.dumps(spec), "-C", "--json", env=env, cwd=tmp_path,
                 timeout=120)
    assert result.rc == 2, result.stdout + result.stderr
    assert result.doc["field"] == "rgt_job.k8s.workdir", result.doc
    spec["rgt_job"]["k8s"]["workdir"] = "/app"
    result = rgt("train", "-i", inventory, "-e", json.dumps(spec), "-C", "--json", env=env, cwd=tmp_path,
                 timeout=120)
    assert result.rc == 0, result.stdout + result.stderr
    plan = result.doc["hosts"]["cluster"]
    assert plan["hash8"] is None and plan["code_dir"] == "/app" and plan["k8s"]["stage"]["code"] is None
    stage = yaml.safe_load(plan["k8s"]["files"][1]["yaml"])
    assert "binaryData" not in stage and json.loads(stage["data"]["job.json"])["code_dir"] == "/app"
    assert "in the image at /app (rgt_job.k8s.workdir; nothing shipped)" in result.stderr
    nothing_touched(rgt, tmp_path)
