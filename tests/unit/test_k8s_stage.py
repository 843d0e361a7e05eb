"""The stage of a Kubernetes run (plugins/module_utils/rgt_k8s_stage.py): the Job's init container, run here
with python3 on a tmp dir standing in for the claim, from the very ConfigMap runner/rgt/k8s.py generates (its files
written out as the kubelet mounts them). It installs the wrapper, rgt_runlayout and job.json, extracts the code into
code-<hash8> (the upload's hash rule) once, changes nothing on a second run (a new pod after an eviction), and
refuses a hostile tarball (absolute name, '..', symlink, hard link, device) with one line and nothing extracted.
The staged run dir is what the wrapper needs: it runs the job from it. Seconds, no cluster."""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_bundle, rgt_runlayout, rgt_tree
from rgt import k8s
from rgt.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny_train"
PROFILE = load_profile("kubernetes")


def job_spec(**fields) -> dict:
    job = {"name": "run.1", "command": "test -f train.py && echo staged-ok > \"$RGT_OUT_DIR/ok\"",
           "python": sys.executable, "code_dir": str(TINY), "gpu": {"count": 0},
           "k8s": {"image": "registry.example/train@sha256:" + "c" * 64, "pvc": {"storage": "1Gi"}}}
    job.update(fields)
    return job


def mount(config_map: dict, stage_dir: Path) -> Path:
    """The ConfigMap's files as the kubelet puts them in the volume: data as text, binaryData decoded."""
    stage_dir.mkdir()
    for name, text in config_map["data"].items():
        (stage_dir / name).write_text(text, encoding="utf-8")
    for name, blob in (config_map.get("binaryData") or {}).items():
        (stage_dir / name).write_bytes(base64.b64decode(blob))
    return stage_dir


@pytest.fixture
def staged(tmp_path):
    """(run paths on the tmp claim, the mounted stage dir, the ConfigMap) for the default job."""
    return prepare(tmp_path, job_spec())


def prepare(tmp_path, job):
    paths = rgt_runlayout.RunPaths(str(tmp_path / "claim"), "proj", "run.1")
    plan = k8s.manifests_for("cluster", PROFILE, job, paths)
    (config_map,) = [d for d in plan["documents"] if d["kind"] == "ConfigMap"]
    return paths, mount(config_map, tmp_path / "rgt-stage"), config_map


def run_stage(stage_dir: Path, run_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", str(stage_dir / "rgt_k8s_stage.py"), run_dir], capture_output=True, text=True,
                          timeout=60)


def snapshot(root: str) -> dict:
    """Every path under root with its inode, mode and mtime (ns): what a run that changes nothing keeps."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_ino, st.st_mode, st.st_mtime_ns)
    return out


def test_the_stage_installs_what_the_wrapper_needs_and_the_code_under_its_hash(staged):
    paths, stage_dir, config_map = staged
    proc = run_stage(stage_dir, paths.run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for directory in (paths.meta, paths.ckpt, paths.out, paths.logs):
        assert os.path.isdir(directory)
    wrapper = Path(paths.wrapper)
    shipped = rgt_bundle.build("wrapper").files  # as the launch ships them
    assert wrapper.read_bytes() == shipped["wrapper.py"].encode()
    assert wrapper.stat().st_mode & 0o7777 == 0o755
    layout = Path(paths.meta) / "rgt_runlayout.py"
    assert layout.read_bytes() == shipped["rgt_runlayout.py"].encode()
    states = Path(paths.meta) / "rgt_states.py"  # what rgt_runlayout imports from its own directory
    assert states.read_bytes() == shipped["rgt_states.py"].encode()
    assert shipped["rgt_states.py"] == (REPO / "plugins" / "module_utils" / "rgt_states.py").read_text()
    job_json = Path(paths.job)
    assert job_json.read_text() == config_map["data"]["job.json"] and job_json.stat().st_mode & 0o7777 == 0o600
    # the code: code-<hash8> by the upload's rule, the same files, and job.json names it
    hash8 = rgt_tree.build_manifest(str(TINY))["hash8"]
    code_dir = paths.code_dir(hash8)
    assert json.loads(job_json.read_text())["code_dir"] == code_dir
    assert rgt_tree.build_manifest(code_dir)["hash8"] == hash8
    assert (Path(code_dir) / "train.py").read_bytes() == (TINY / "train.py").read_bytes()
    assert sorted(os.listdir(paths.run_dir)) == sorted([".rgt", "ckpt", "out", "logs", f"code-{hash8}"])
    assert f"extracted {code_dir}" in proc.stdout and "installed .rgt/job.json" in proc.stdout


def test_a_half_extracted_code_dir_of_a_killed_pod_is_removed_and_extracted_again(staged):
    paths, stage_dir, _config_map = staged
    hash8 = rgt_tree.build_manifest(str(TINY))["hash8"]
    stale = Path(paths.run_dir) / f".code-{hash8}.k1ll3d.tmp"
    stale.mkdir(parents=True)
    (stale / "train.py").write_text("half")
    proc = run_stage(stage_dir, paths.run_dir)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and (Path(paths.code_dir(hash8)) / "train.py").read_bytes() == \
        (TINY / "train.py").read_bytes()


def test_a_second_run_changes_nothing_and_extracts_the_code_once(staged):
    """A new pod (eviction, node loss) runs the stage again: same bytes, so no file is rewritten."""
    paths, stage_dir, _config_map = staged
    assert run_stage(stage_dir, paths.run_dir).returncode == 0
    before = snapshot(paths.run_dir)
    again = run_stage(stage_dir, paths.run_dir)
    assert again.returncode == 0, again.stderr
    assert snapshot(paths.run_dir) == before
    assert "kept " in again.stdout and "installed" not in again.stdout and "extracted" not in again.stdout


def test_a_changed_job_json_is_replaced_and_the_rest_is_kept(staged):
    paths, stage_dir, _config_map = staged
    assert run_stage(stage_dir, paths.run_dir).returncode == 0
    before = snapshot(paths.run_dir)
    doc = json.loads((stage_dir / "job.json").read_text())
    doc["stall_after_s"] = 1200
    (stage_dir / "job.json").write_text(json.dumps(doc))
    proc = run_stage(stage_dir, paths.run_dir)
    assert proc.returncode == 0, proc.stderr
    after = snapshot(paths.run_dir)
    assert after[".rgt/job.json"][0] != before[".rgt/job.json"][0]  # a new inode: written beside, renamed over
    assert json.loads(Path(paths.job).read_text())["stall_after_s"] == 1200
    changed = (".rgt", ".rgt/job.json")  # the file, and its dir's mtime (the rename)
    assert {k: v for k, v in after.items() if k not in changed} == {k: v for k, v in before.items()
                                                                   if k not in changed}


def hostile(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ok = tarfile.TarInfo("train.py")
        ok.size = 3
        tar.addfile(ok, io.BytesIO(b"ok\n"))
        info = tarfile.TarInfo({"dotdot": "../escaped", "nested": "pkg/../../escaped", "absolute": "/tmp/escaped",
                                "symlink": "link", "hardlink": "hard", "device": "dev"}[kind])
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "train.py"
        elif kind == "device":
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
        else:
            info.size = 4
        tar.addfile(info, io.BytesIO(b"bad\n") if info.isfile() else None)
    return buf.getvalue()


@pytest.mark.parametrize("kind, words", [
    ("dotdot", "not a safe relative name"),
    ("nested", "not a safe relative name"),
    ("absolute", "not a safe relative name (absolute path)"),
    ("symlink", "symbolic link to '/etc/passwd'"),
    ("hardlink", "hard link to 'train.py'"),
    ("device", "not a plain file or directory"),
])
def test_a_hostile_tarball_is_refused_with_one_line_and_nothing_extracted(staged, tmp_path, kind, words):
    paths, stage_dir, _config_map = staged
    (stage_dir / "code.tar.gz").write_bytes(hostile(kind))
    proc = run_stage(stage_dir, paths.run_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"rgt stage of {paths.run_dir} failed: ")
    assert sorted(os.listdir(paths.run_dir)) == [".rgt", "ckpt", "logs", "out"]  # no code dir, no temp dir
    assert not os.path.exists(paths.job) and not os.path.exists(paths.wrapper)  # the wrapper cannot start
    assert not (tmp_path / "claim" / "proj" / "escaped").exists() and not (tmp_path / "escaped").exists()


def test_a_job_json_for_other_code_is_refused(staged):
    paths, stage_dir, _config_map = staged
    doc = json.loads((stage_dir / "job.json").read_text())
    doc["code_dir"] = paths.code_dir("00000000")
    (stage_dir / "job.json").write_text(json.dumps(doc))
    proc = run_stage(stage_dir, paths.run_dir)
    assert proc.returncode == 1 and "names code_dir" in proc.stderr and not os.path.exists(paths.job)


def test_code_in_the_image_is_not_extracted_and_its_workdir_must_exist(tmp_path):
    workdir = tmp_path / "image-app"
    job = job_spec(k8s={**job_spec()["k8s"], "workdir": str(workdir)})
    del job["code_dir"]
    paths, stage_dir, config_map = prepare(tmp_path, job)
    assert not (stage_dir / "code.tar.gz").exists()
    proc = run_stage(stage_dir, paths.run_dir)
    assert proc.returncode == 1 and "rgt_job.k8s.workdir" in proc.stderr
    workdir.mkdir()
    proc = run_stage(stage_dir, paths.run_dir)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(Path(paths.job).read_text())["code_dir"] == str(workdir)
    assert not [n for n in os.listdir(paths.run_dir) if n.startswith(("code-", ".code-"))]


def test_the_wrapper_runs_the_job_from_the_staged_run_dir(staged):
    """The chain the pod runs: the init container stages, then the main container's command (the Job's) starts
    the wrapper, which reads job.json and runs the command in code-<hash8>."""
    paths, stage_dir, _config_map = staged
    assert run_stage(stage_dir, paths.run_dir).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("RGT_")}
    proc = subprocess.run([sys.executable, paths.wrapper, paths.run_dir], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exit_doc = rgt_runlayout.read_json(paths.exit)
    assert exit_doc["rc"] == 0 and exit_doc["reason"] == "finished", exit_doc
    assert Path(paths.out, "ok").read_text() == "staged-ok\n"


def test_the_stage_refuses_a_run_dir_that_is_not_a_run_dir(staged, tmp_path):
    _paths, stage_dir, _config_map = staged
    for bad in ("relative/proj/active/run.1", str(tmp_path / "claim" / "proj" / "runs" / "run.1")):
        proc = run_stage(stage_dir, bad)
        assert proc.returncode == 1 and "<durable_root>/<project>/active/<run_id>" in proc.stderr


def test_the_stage_script_is_stdlib_and_python36_syntax():
    """It runs in the user's image with its python (3.6+), next to nothing but rgt_runlayout (the script as the
    ConfigMap carries it: the bundle k8s_stage, its imports made flat)."""
    source = rgt_bundle.build("k8s_stage").files["rgt_k8s_stage.py"]
    tree = ast.parse(source, feature_version=(3, 6))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - set(sys.stdlib_module_names) == {"rgt_runlayout"}
