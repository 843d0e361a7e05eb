"""The Kubernetes manifests of a run (plugins/module_utils/rgt_k8s.py, runner/rgt/k8s.py), checked offline only: the
generated Job, its staging ConfigMap and PersistentVolumeClaim pass `kubernetes-validate --strict` (the kept
validator package, the Kubernetes OpenAPI schema of the stated version) and rgt's own rules; each rule refuses its
bad case; a broken field that only the schema knows about is caught by the validator and named as a job-spec field
(exit 2); a secret is only ever a reference; names and labels are valid Kubernetes names derived from rgt names; the
stage (wrapper, job.json, code tarball) is deterministic, shown as placeholders and refused when it cannot fit a
ConfigMap. No API server is involved (none exists on our machines: docs/kubernetes.md). The stage script itself is
tests/unit/test_k8s_stage.py."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_bundle, rgt_k8s, rgt_runlayout, rgt_tree
from rgt import k8s
from rgt.errors import InputError
from rgt.inventory import validate_job
from rgt.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
DIGEST = "registry.example/train@sha256:" + "a" * 64
PROFILE = load_profile("kubernetes")
SECRET_VALUE = "s3cr3t-value-never-in-a-manifest"


def full_job(**k8s_fields) -> dict:
    spec = {"image": DIGEST, "namespace": "ml", "service_account": "trainer", "secret_name": "train-secrets",
            "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "restart_policy": "OnFailure", "backoff_limit": 2, "active_deadline_s": 86400,
            "pvc": {"storage": "200Gi", "storage_class": "premium-rwo", "access_mode": "ReadWriteOnce"}}
    spec.update(k8s_fields)
    return {"name": "run.1", "command": "python train.py", "python": "/usr/bin/python3",
            "code_dir": str(REPO / "examples" / "tiny_train"), "gpu": {"count": 2},
            "env": {"SEED": 3, "FP16": True}, "secrets": ["WANDB_API_KEY", "HF_TOKEN"], "k8s": spec}


def run_paths(run_id="run.1", project="proj"):
    return rgt_runlayout.RunPaths("/checkpoints", project, run_id)


# what the runner stages (rgt_k8s is pure: the contents come in); the real ones are runner/rgt/k8s.stage_for's
STAGE = {"rgt_k8s_stage.py": "# stage\n", "wrapper.py": "# wrapper\n", "rgt_runlayout.py": "# layout\n",
         "rgt_states.py": "# states\n", "job.json": "{}\n", "code.tar.gz": b"\x1f\x8b tarball"}


def build(job=None, profile=None, paths=None, stage=STAGE):
    return rgt_k8s.build(job or full_job(), profile or PROFILE, paths or run_paths(), {"HF_HOME": "/checkpoints/hf"},
                         stage)


def pod_of(manifests) -> dict:
    return dict(manifests)["job.yaml"]["spec"]["template"]["spec"]


# --- what is generated ------------------------------------------------------------------------------------


def test_the_generated_job_and_claim_pass_kubernetes_validate_strict_for_the_stated_versions(tmp_path):
    """The validator's own command line, as CI and a user would run it, on the YAML rgt shows: both manifests pass
    --strict for the default version (1.37) and for the oldest bundled one (1.25)."""
    files = []
    plan = k8s.manifests_for("cluster", PROFILE, full_job(), run_paths())  # the real stage: scripts, code tar.gz
    for entry, doc in zip(plan["files"], plan["documents"], strict=True):
        (tmp_path / entry["file"]).write_text(k8s.to_yaml(doc), encoding="utf-8")
        files.append(str(tmp_path / entry["file"]))
    assert [f["file"] for f in plan["files"]] == ["pvc.yaml", "stage.yaml", "job.yaml"]
    existing = rgt_k8s.build(full_job(pvc={"claim_name": "shared-ckpt"}), PROFILE, run_paths())
    assert [name for name, _doc in existing] == ["job.yaml"]  # an existing claim: referenced, not generated
    (tmp_path / "existing-job.yaml").write_text(k8s.to_yaml(existing[0][1]), encoding="utf-8")
    files.append(str(tmp_path / "existing-job.yaml"))
    proc = subprocess.run([str(VALIDATE), "--strict", "-k", "1.37.0", "-k", "1.25.0", *files],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("passed") == 8, proc.stdout
    assert "job/rgt-proj-run-1-" in proc.stdout and "persistentvolumeclaim/rgt-durable-proj-" in proc.stdout
    assert "configmap/rgt-proj-run-1-" in proc.stdout


def test_the_job_carries_every_field_of_the_spec_and_the_wrapper_as_entrypoint():
    manifests = build()
    assert [name for name, _doc in manifests] == ["pvc.yaml", "stage.yaml", "job.yaml"]  # apply order
    job = dict(manifests)["job.yaml"]
    assert job["spec"]["backoffLimit"] == 2 and job["spec"]["activeDeadlineSeconds"] == 86400
    pod = pod_of(manifests)
    assert pod["restartPolicy"] == "OnFailure"
    assert pod["terminationGracePeriodSeconds"] == 40  # the kubernetes profile's spot.grace_s + 10 s end records
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}
    assert pod["tolerations"] == full_job()["k8s"]["tolerations"] and pod["serviceAccountName"] == "trainer"
    (container,) = pod["containers"]
    assert container["image"] == DIGEST
    assert container["command"] == ["/usr/bin/python3", "/checkpoints/proj/active/run.1/.rgt/wrapper.py",
                                    "/checkpoints/proj/active/run.1"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert container["volumeMounts"] == [{"name": "durable", "mountPath": "/checkpoints"}]
    claim = dict(manifests)["pvc.yaml"]
    stage = dict(manifests)["stage.yaml"]
    assert stage["metadata"]["name"] == job["metadata"]["name"] + "-stage"
    assert pod["volumes"] == [{"name": "durable", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}},
                              {"name": "rgt-stage", "configMap": {"name": stage["metadata"]["name"]}}]
    # the stage: an init container in the user's image installs wrapper, job.json and code from the ConfigMap
    assert pod["initContainers"] == [{
        "name": "stage", "image": DIGEST,
        "command": ["/usr/bin/python3", "/rgt-stage/rgt_k8s_stage.py", "/checkpoints/proj/active/run.1"],
        "volumeMounts": [{"name": "durable", "mountPath": "/checkpoints"},
                         {"name": "rgt-stage", "mountPath": "/rgt-stage", "readOnly": True}]}]
    # the scripts, job.json, and the manifests the run is applied from (kept as <run_dir>/.rgt/k8s/<file>)
    assert stage["data"] == {**{k: v for k, v in STAGE.items() if k != "code.tar.gz"},
                             "k8s.pvc.yaml": rgt_k8s.dumps(claim), "k8s.job.yaml": rgt_k8s.dumps(job)}
    assert stage["binaryData"] == {"code.tar.gz": base64.b64encode(STAGE["code.tar.gz"]).decode("ascii")}
    assert stage["metadata"]["labels"] == job["metadata"]["labels"]
    assert stage["metadata"]["annotations"] == job["metadata"]["annotations"]
    assert stage["metadata"]["namespace"] == "ml"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "200Gi"}},
                             "storageClassName": "premium-rwo"}
    env = {e["name"]: e for e in container["env"]}
    # the values the wrapper itself would export (str() of the job spec's value), plus the profile's network env
    assert env["SEED"] == {"name": "SEED", "value": "3"} and env["FP16"]["value"] == "True"
    assert env["HF_HOME"]["value"] == "/checkpoints/hf"
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "train-secrets",
                                                                                 "key": "HF_TOKEN"}}}
    assert [e["name"] for e in container["env"]] == sorted(env)
    for doc in (job, claim, stage, job["spec"]["template"]):
        assert doc["metadata"]["labels"]["rgt/project"] == "proj"
    assert job["metadata"]["labels"]["rgt/run-id"] == "run.1" and job["metadata"]["namespace"] == "ml"
    assert job["metadata"]["annotations"]["rgt/run-dir"] == "/checkpoints/proj/active/run.1"


def test_defaults_follow_rgt_never_relaunching_a_failed_run_and_the_launch_grace_rule():
    job = full_job()
    for key in ("restart_policy", "backoff_limit", "active_deadline_s", "node_selector", "tolerations",
                "service_account", "namespace"):
        del job["k8s"][key]
    job["gpu"] = {"count": 0}
    manifests = build(job)
    spec = dict(manifests)["job.yaml"]["spec"]
    assert spec["backoffLimit"] == 0 and "activeDeadlineSeconds" not in spec
    pod = pod_of(manifests)
    assert pod["restartPolicy"] == "Never" and "resources" not in pod["containers"][0]
    assert not {"nodeSelector", "tolerations", "serviceAccountName"} & set(pod)
    assert "namespace" not in dict(manifests)["job.yaml"]["metadata"]
    # terminationGracePeriodSeconds = the job's grace as launch computes it (spot.grace_s, 30 when null, >= 5) + 10 s
    for grace, expected in ((120, 130), (None, 40), (2, 15)):
        profile = copy.deepcopy(PROFILE)
        profile["spot"]["grace_s"] = grace
        assert pod_of(build(job, profile))["terminationGracePeriodSeconds"] == expected


def test_the_output_is_deterministic_and_independent_of_the_order_of_the_spec():
    job = full_job()
    shuffled = json.loads(json.dumps(job))
    shuffled["env"] = dict(reversed(list(job["env"].items())))
    shuffled["secrets"] = list(reversed(job["secrets"]))
    first = [k8s.to_yaml(doc) for _name, doc in build(job)]
    again = [k8s.to_yaml(doc) for _name, doc in build(shuffled)]
    assert first == again == [k8s.to_yaml(doc) for _name, doc in build(job)]
    assert "&id" not in "".join(first)  # no YAML anchors: every manifest reads on its own


def test_names_and_labels_are_valid_kubernetes_names_derived_from_the_name_rule():
    long_id = "A" + "b." * 63 + "z"  # 128 characters: the longest run id the name rule allows
    assert rgt_runlayout.check_name(long_id) is None
    for run_id in ("run.1", long_id, "ends-with-dash-", "x_"):
        manifests = build(paths=run_paths(run_id))
        job = dict(manifests)["job.yaml"]
        name, label = job["metadata"]["name"], job["metadata"]["labels"]["rgt/run-id"]
        assert len(name) <= 63 and rgt_k8s._DNS_LABEL.fullmatch(name), name
        assert len(label) <= 63 and rgt_k8s._LABEL_VALUE.fullmatch(label), label
        assert job["metadata"]["annotations"]["rgt/run-id"] == run_id  # the exact name rides along
    assert rgt_k8s.label_value("run.1") == "run.1"
    # names that a cut or lowercasing would merge stay apart
    assert rgt_k8s.object_name("rgt", "p", "Run.A") != rgt_k8s.object_name("rgt", "p", "run-a")
    assert rgt_k8s.label_value(long_id) != rgt_k8s.label_value(long_id[:-1] + "y")
    assert rgt_k8s.label_value("x_") != rgt_k8s.label_value("x-")


# --- secrets: only by reference ---------------------------------------------------------------------------


def test_a_secret_is_a_reference_to_the_named_secret_and_its_value_appears_nowhere(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", SECRET_VALUE)
    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE)
    plan = k8s.manifests_for("cluster", PROFILE, full_job(), run_paths())
    text = json.dumps(plan)
    assert SECRET_VALUE not in text
    docs = [yaml.safe_load(f["yaml"]) for f in plan["files"]]
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "ConfigMap", "Job"]  # never a Secret object
    staged = json.loads(docs[1]["data"]["job.json"])  # job.json names the secrets nowhere: the Job's env has them
    assert staged["secrets_file"] is None and not {"WANDB_API_KEY", "HF_TOKEN"} & set(staged["env"])
    env = {e["name"]: e for e in docs[2]["spec"]["template"]["spec"]["containers"][0]["env"]}
    for name in ("WANDB_API_KEY", "HF_TOKEN"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"] == {"secretKeyRef": {"name": "train-secrets", "key": name}}


# --- rgt's rules, beyond the schema: each refuses its bad case --------------------------------------------


def _restart_always(m):
    pod_of(m)["restartPolicy"] = "Always"


def _no_gpu_limit(m):
    del pod_of(m)["containers"][0]["resources"]


def _gpu_request_differs(m):
    pod_of(m)["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "1"}


def _other_claim(m):
    pod_of(m)["volumes"][0]["persistentVolumeClaim"]["claimName"] = "someone-elses"


def _claim_renamed(m):
    dict(m)["pvc.yaml"]["metadata"]["name"] = "renamed"


def _mounted_elsewhere(m):
    pod_of(m)["containers"][0]["volumeMounts"][0]["mountPath"] = "/data"


def _literal_secret(m):
    env = pod_of(m)["containers"][0]["env"]
    entry = next(e for e in env if e["name"] == "WANDB_API_KEY")
    entry.pop("valueFrom")
    entry["value"] = SECRET_VALUE


def _secret_object(m):
    m.append(("secret.yaml", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "train-secrets"},
                              "stringData": {"WANDB_API_KEY": SECRET_VALUE}}))


def _other_secret(m):
    pod_of(m)["containers"][0]["envFrom"] = [{"secretRef": {"name": "cluster-admin-token"}}]


def _grace_changed(m):
    pod_of(m)["terminationGracePeriodSeconds"] = 1


def _stage_mounts_claim_elsewhere(m):
    pod_of(m)["initContainers"][0]["volumeMounts"][0]["mountPath"] = "/mnt"


def _stage_without_its_volume(m):
    pod_of(m)["initContainers"][0]["volumeMounts"].pop(1)


def _stage_mounts_a_missing_volume(m):
    pod_of(m)["initContainers"][0]["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})


def _other_config_map(m):
    pod_of(m)["volumes"][1]["configMap"]["name"] = "someone-elses-stage"


def _config_map_missing(m):
    m.remove(next(item for item in m if item[0] == "stage.yaml"))


def _stage_container_missing(m):
    del pod_of(m)["initContainers"]


@pytest.mark.parametrize("break_it, field, words", [
    (_restart_always, "rgt_job.k8s.restart_policy", "'Always'"),
    (_no_gpu_limit, "rgt_job.gpu.count", "asks for 2 GPU(s)"),
    (_gpu_request_differs, "rgt_job.gpu.count", "must be equal"),
    (_other_claim, "rgt_job.k8s.pvc.claim_name", "'someone-elses'"),
    (_claim_renamed, "rgt_job.k8s.pvc", "'renamed'"),
    (_mounted_elsewhere, "rgt_durable_root", "durable root /checkpoints"),
    (_literal_secret, "rgt_job.secrets", "literal value"),
    (_secret_object, "rgt_job.secrets", "Secret object"),
    (_other_secret, "rgt_job.k8s.secret_name", "'cluster-admin-token'"),
    (_grace_changed, "spot.grace_s", "not the job's grace 30 s"),
    (_stage_mounts_claim_elsewhere, "rgt_durable_root", "initContainers[0] does not mount the claim"),
    (_stage_without_its_volume, "rgt_job.k8s", "stage volume 'rgt-stage' at /rgt-stage"),
    (_stage_mounts_a_missing_volume, "rgt_job.k8s.pvc", "volume 'scratch'"),
    (_other_config_map, "rgt_job.k8s", "'someone-elses-stage'"),
    (_config_map_missing, "rgt_job.k8s", "no ConfigMap among the manifests"),
    (_stage_container_missing, "rgt_job.k8s", "no init container 'stage'"),
])
def test_each_rule_refuses_its_bad_case_naming_the_field(break_it, field, words):
    manifests = build()
    assert rgt_k8s.check(manifests, full_job(), PROFILE, run_paths()) == []
    break_it(manifests)
    problems = rgt_k8s.check(manifests, full_job(), PROFILE, run_paths())
    assert [p[0] for p in problems] == [field], problems
    assert words in problems[0][1] and problems[0][2]
    with pytest.raises(InputError) as caught:  # the runner: one message, the field, the fix, exit 2
        k8s.check(manifests, full_job(), PROFILE, run_paths(), "cluster")
    assert caught.value.exit_code == 2 and caught.value.field == field and caught.value.fix
    assert SECRET_VALUE not in str(caught.value.as_dict())


def test_the_validator_alone_does_not_refuse_restart_always_which_is_why_rgt_checks_it():
    """kubernetes-validate (the schema) lets a Job with restartPolicy Always through; rgt's rule does not."""
    manifests = build()
    _restart_always(manifests)
    assert k8s.validate(manifests, "1.37", "cluster") == "1.37"
    assert rgt_k8s.check(manifests, full_job(), PROFILE, run_paths())[0][0] == "rgt_job.k8s.restart_policy"


# --- the validator catches what only the schema knows -----------------------------------------------------


@pytest.mark.parametrize("toleration, path, words", [
    ({"key": "gpu", "operator": "Exists", "tolerationSeconds": "soon"},
     "rgt_job.k8s.tolerations[0].tolerationSeconds", "'soon' is not of type 'integer'"),
    ({"key": "gpu", "operator": "Exists", "tolerationSecs": 30},
     "rgt_job.k8s.tolerations[0]", "'tolerationSecs' was unexpected"),  # an unknown field: --strict only
])
def test_a_broken_field_is_caught_by_the_validator_and_named_as_a_job_spec_field(toleration, path, words):
    job = full_job(tolerations=[toleration])
    validate_job(job)  # the job spec's own schema passes it through: tolerations are the API's own objects
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", PROFILE, job, run_paths())
    err = caught.value
    assert err.exit_code == 2 and err.field == path, err.as_dict()
    assert "job.yaml does not validate against Kubernetes 1.37 (kubernetes-validate --strict)" in err.message
    assert words in err.message and path in err.fix


def test_a_version_the_validator_has_no_schema_for_is_refused_and_the_stated_one_is_used():
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", PROFILE, full_job(kubernetes_version="1.20"), run_paths())
    assert caught.value.field == "rgt_job.k8s.kubernetes_version" and "1.25" in caught.value.fix
    plan = k8s.manifests_for("cluster", PROFILE, full_job(kubernetes_version="1.29.4"), run_paths())
    assert plan["kubernetes_version"] == "1.29" and plan["validator"] == "kubernetes-validate 1.37.0 --strict"
    assert plan["dir"] == "/checkpoints/proj/active/run.1/.rgt/k8s"


# --- bad input: one message, the field, the fix -----------------------------------------------------------


def _without(job, *keys):
    target = job
    for key in keys[:-1]:
        target = target[key]
    del target[keys[-1]]
    return job


@pytest.mark.parametrize("job, field", [
    (_without(full_job(), "k8s", "image"), "rgt_job.k8s.image"),
    (_without(full_job(), "python"), "rgt_job.python"),
    (_without(full_job(), "k8s", "secret_name"), "rgt_job.k8s.secret_name"),
    (full_job(pvc={}), "rgt_job.k8s.pvc"),
    (full_job(pvc={"claim_name": "mine", "storage": "10Gi"}), "rgt_job.k8s.pvc"),
    (full_job(pvc={"storage": "lots"}), "rgt_job.k8s.pvc.storage"),
    ({**full_job(), "env": {"HF_TOKEN": "x"}}, "rgt_job.env.HF_TOKEN"),
])
def test_bad_k8s_input_is_refused_naming_the_field(job, field):
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", PROFILE, job, run_paths())
    assert caught.value.exit_code == 2 and caught.value.field == field and caught.value.fix


@pytest.mark.parametrize("k8s_block, field", [
    ({"image": DIGEST, "restart_policy": "Always"}, "rgt_job.k8s.restart_policy"),
    ({"image": DIGEST, "backoff_limit": "three"}, "rgt_job.k8s.backoff_limit"),
    ({"image": DIGEST, "imagee": "typo"}, "rgt_job.k8s.imagee"),
    ({"image": DIGEST, "pvc": {"storage": "10 Gi"}}, "rgt_job.k8s.pvc.storage"),
    ({"image": DIGEST, "workdir": "app"}, "rgt_job.k8s.workdir"),
])
def test_the_job_schema_refuses_a_bad_k8s_block_at_input(k8s_block, field):
    job = {"name": "r", "command": "true", "code_dir": str(REPO / "examples" / "tiny_train"), "k8s": k8s_block}
    with pytest.raises(InputError) as caught:
        validate_job(job)
    assert caught.value.field == field, caught.value.as_dict()


def test_the_validator_is_in_both_extras_at_the_version_ci_installs():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    name, _, version = k8s.VALIDATOR_PIN.partition("==")
    assert all(any(d.startswith(name) for d in extras[group]) for group in ("k8s", "test"))
    assert f"{k8s.VALIDATOR_PIN}\n" in (REPO / "constraints.txt").read_text(encoding="utf-8"), \
        "the fix the runner prints installs the version constraints.txt pins"
    assert os.access(VALIDATE, os.X_OK)


# --- the stage: what the init container installs, from the ConfigMap ------------------------------------------


def config_map(plan) -> dict:
    (doc,) = [d for d in plan["documents"] if d["kind"] == "ConfigMap"]
    return doc


def test_the_stage_carries_the_repo_scripts_job_json_and_the_code_and_the_plan_shows_placeholders():
    plan = k8s.manifests_for("cluster", PROFILE, full_job(), run_paths())
    doc = config_map(plan)
    for name in ("k8s_stage", "wrapper"):  # the repo's scripts and their module_utils, as the bundler ships them
        for file, text in rgt_bundle.build(name).files.items():
            assert doc["data"][file] == text
    code = rgt_tree.build_manifest(str(REPO / "examples" / "tiny_train"))
    staged = json.loads(doc["data"]["job.json"])
    run_dir = "/checkpoints/proj/active/run.1"
    assert staged["code_dir"] == f"{run_dir}/code-{code['hash8']}"  # the upload's code-<hash8> rule
    assert staged["run_dir"] == run_dir and staged["python"] == "/usr/bin/python3" and staged["grace_s"] == 30
    assert staged["secrets_file"] is None and staged["proxy_hook"] is None and staged["omp_num_threads"] is None
    assert staged["env"] == {"HF_HOME": "/checkpoints/.cache/huggingface", "SEED": "3", "FP16": "True"}
    assert staged["launched_at"] == k8s.STAGED_LAUNCHED_AT and staged["command"] == "python train.py"
    blob = base64.b64decode(doc["binaryData"]["code.tar.gz"])
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [f["path"] for f in code["manifest"]]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.type) for m in members} == {(0, 0, 0, "", "",
                                                                                        tarfile.REGTYPE)}
        assert tar.extractfile("train.py").read() == (REPO / "examples" / "tiny_train" / "train.py").read_bytes()
    assert blob[4:8] == b"\0\0\0\0"  # the gzip header's mtime
    assert plan["stage"] == {"name": doc["metadata"]["name"], "bytes": plan["stage"]["bytes"],
                             "limit": 900 * 1024, "code_dir": staged["code_dir"],
                             "code": {"hash8": code["hash8"], "files": code["files"], "bytes": code["bytes"],
                                      "tar_bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}}
    # the plan shows the ConfigMap with placeholders: job.json in full, no script text, no base64 blob
    (entry,) = [f for f in plan["files"] if f["kind"] == "ConfigMap"]
    shown = yaml.safe_load(entry["yaml"])
    assert shown["data"]["job.json"] == doc["data"]["job.json"]
    digest = hashlib.sha256(blob).hexdigest()
    assert shown["binaryData"]["code.tar.gz"] == (f"<code.tar.gz: {len(blob)} bytes, sha256 {digest}; base64 in "
                                                  "the applied manifest>")
    wrapper = shown["data"]["wrapper.py"]
    assert wrapper.startswith("<wrapper.py: ") and wrapper.endswith("from roles/launch_detached/files/rgt_wrapper.py>")
    assert doc["binaryData"]["code.tar.gz"] not in entry["yaml"] and "def main" not in entry["yaml"]
    assert len(entry["yaml"]) < 5000  # a placeholder line per staged file, never a file's content


def test_the_stage_is_byte_identical_for_the_same_spec_and_code(tmp_path):
    trees = []
    for i, mtime in enumerate((1_000_000, 1_700_000_000)):
        tree = tmp_path / f"code{i}"
        (tree / "pkg").mkdir(parents=True)
        (tree / "train.py").write_text("print('hi')\n")
        (tree / "pkg" / "run.sh").write_text("#!/bin/sh\necho ok\n")
        (tree / "pkg" / "run.sh").chmod(0o755)
        for path in (tree / "train.py", tree / "pkg" / "run.sh"):
            os.utime(path, (mtime, mtime))
        trees.append(tree)
    job = full_job(code_dir="./code")
    first, second = (k8s.manifests_for("cluster", PROFILE, job, run_paths(), code_src=str(t)) for t in trees)
    assert [k8s.to_yaml(d) for d in first["documents"]] == [k8s.to_yaml(d) for d in second["documents"]]
    assert first["files"] == second["files"]
    blob = base64.b64decode(config_map(first)["binaryData"]["code.tar.gz"])
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        assert {m.name: m.mode for m in tar.getmembers()} == {"pkg/run.sh": 0o755, "train.py": 0o644}


def test_omp_num_threads_in_job_json_comes_only_from_the_jobs_env():
    job = full_job()
    job["env"]["OMP_NUM_THREADS"] = 4
    staged = json.loads(config_map(k8s.manifests_for("cluster", PROFILE, job, run_paths()))["data"]["job.json"])
    assert staged["omp_num_threads"] == 4 and staged["env"]["OMP_NUM_THREADS"] == "4"


def test_a_code_dir_too_big_for_a_config_map_is_refused_naming_code_dir(tmp_path):
    (tmp_path / "weights.bin").write_bytes(os.urandom(900 * 1024))  # incompressible: over the limit as tar.gz
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", PROFILE, full_job(code_dir=str(tmp_path)), run_paths(), code_src=str(tmp_path))
    err = caught.value
    assert err.exit_code == 2 and err.field == "rgt_job.code_dir", err.as_dict()
    assert "ConfigMap" in err.message and err.fix == "bake the code into rgt_job.k8s.image and set rgt_job.k8s.workdir"


def test_a_symlink_in_the_code_dir_is_refused_naming_it(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "latest").symlink_to("train.py")
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", PROFILE, full_job(), run_paths(), code_src=str(tmp_path))
    assert caught.value.field == "rgt_job.code_dir" and "latest" in caught.value.message


def test_a_crlf_script_in_the_code_dir_is_refused_as_the_upload_refuses_it_unless_allowed(tmp_path):
    (tmp_path / "run.sh").write_bytes(b"#!/bin/bash\r\necho ok\r\n")
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", PROFILE, full_job(), run_paths(), code_src=str(tmp_path))
    assert caught.value.exit_code == 2 and caught.value.field == "rgt_job.crlf" and "run.sh" in caught.value.message
    job = {**full_job(), "crlf": "allow"}
    allowed = k8s.manifests_for("cluster", PROFILE, job, run_paths(), code_src=str(tmp_path))
    assert allowed["stage"]["code"]["files"] == 1


def test_code_in_the_image_needs_workdir_and_is_not_shipped():
    job = full_job()
    del job["code_dir"]
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", PROFILE, job, run_paths())
    assert caught.value.exit_code == 2 and caught.value.field == "rgt_job.k8s.workdir" and caught.value.fix
    job["k8s"]["workdir"] = "/app"
    validate_job(job)
    plan = k8s.manifests_for("cluster", PROFILE, job, run_paths())
    doc = config_map(plan)
    assert "binaryData" not in doc and json.loads(doc["data"]["job.json"])["code_dir"] == "/app"
    assert plan["stage"]["code"] is None and plan["stage"]["code_dir"] == "/app"


@pytest.mark.parametrize("change, words", [
    ({"workdir": "app"}, "not an absolute path"),
    ({"workdir": "/app", "code_dir": "./src"}, "keep one"),
])
def test_a_bad_workdir_is_refused_by_rgt_k8s(change, words):
    job = full_job(workdir=change["workdir"])
    if "code_dir" not in change:
        del job["code_dir"]
    with pytest.raises(rgt_k8s.K8sError) as caught:
        rgt_k8s.settings(job)
    assert caught.value.field == "rgt_job.k8s.workdir" and words in caught.value.message + caught.value.fix


def test_a_proxy_hook_is_never_staged_in_a_config_map():
    profile = copy.deepcopy(PROFILE)
    profile["network"]["proxy_hook"] = "export HTTPS_PROXY=http://user:pass@proxy:3128"
    with pytest.raises(InputError) as caught:
        k8s.manifests_for("cluster", profile, full_job(), run_paths())
    assert caught.value.field == "network.proxy_hook" and "user:pass" not in str(caught.value.as_dict())
