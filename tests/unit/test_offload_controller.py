"""`offload: {to: controller}` (runner/rgt/offload.py, docs/offload.md): the box's pick (module_utils
rgt_statusround `op: offload_pick`, run here as the box would run it), the copy verified on the controller
against the box's manifest, and a checkpoint rewritten while it copies never counting; `keep` honoured; the
records in the box's shape (rgt_offload.newest_verified and health read them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from rgt import offload, paths

off = paths.module_util("rgt_offload")


def _box(tmp_path):
    run = tmp_path / "durable" / "demo" / "active" / "r1"
    (run / "ckpt").mkdir(parents=True)
    (run / ".rgt").mkdir()
    (run / ".rgt" / "job.json").write_text(json.dumps({"ckpt_glob": "step_*"}))
    return run


def _pick(tmp_path, **extra):
    """The box's answer, from the status round's own entry (python3 __main__.py, JSON on stdin)."""
    mod = paths.module_util("rgt_statusround")
    params = {"op": "offload_pick", "durable_root": str(tmp_path / "durable"), "project": "demo", "run_id": "r1",
              "settle_s": 0.05, **extra}
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = %r; import runpy; "
                           "runpy.run_path(%r, run_name='__main__')" % (sys.path, mod.__file__)],
                          input=json.dumps(params) + "\n", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_copy_counts_only_when_it_matches_the_manifest_and_the_entry_did_not_change(tmp_path):
    run = _box(tmp_path)
    (run / "ckpt" / "step_10").write_bytes(b"a" * 1000)
    (run / "ckpt" / "step_20.tmp").write_bytes(b"half")  # being written: never a candidate
    entry = _pick(tmp_path)["entry"]
    assert entry["name"] == "step_10" and entry["bytes"] == 1000 and len(entry["manifest"]) == 1
    folder = tmp_path / "runs" / "r1" / "box.offload"

    def look(name):
        return (_pick(tmp_path, name=name)["entry"] or {}).get("signature")

    def fetch_then_rewrite(dest):  # the old bytes arrive whole, then the job rewrites the file in place
        shutil.copy(entry["path"], dest / entry["name"])
        (run / "ckpt" / "step_10").write_bytes(b"b" * 1000)
        return None

    rec = offload.copy_entry(folder, entry, fetch_then_rewrite, look)
    assert rec["ok"] is False and "changed on the box during the copy" in rec["reason"], rec
    assert not (folder / "checkpoints" / "step_10").exists()

    entry = _pick(tmp_path)["entry"]

    def fetch_half(dest):  # rewritten between the manifest and the copy: the bytes copied are not the manifest's
        (dest / entry["name"]).write_bytes(b"c" * 1000)
        return None

    rec = offload.copy_entry(folder, entry, fetch_half, look)
    assert rec["ok"] is False and rec["reason"].startswith("not verified: step_10 differs here"), rec
    assert off.newest_verified(off.read_records(str(folder))) is None

    for step in (10, 20, 30):  # whole copies: verified, keep 2
        (run / "ckpt" / f"step_{step}").write_bytes(bytes([step]) * 500)
        entry = _pick(tmp_path)["entry"]
        assert entry["name"] == f"step_{step}"
        rec = offload.copy_entry(folder, entry, lambda d, e=entry: shutil.copy(e["path"], d / e["name"]) and None,
                                 look)
        assert rec["ok"] and rec["verified"] and rec["step"] == step, rec
        offload.prune(folder, 2)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_20", "step_30"]
    manifest = (folder / "checkpoints" / "step_30" / off.MANIFEST).read_text()
    assert manifest.split() == [entry["manifest"][0][0], "step_30"]
    assert off.newest_verified_checkpoint(str(folder))["name"] == "step_30"

    docs = {"box": {"run_id": "r1", "state": "running", "attention": [],
                    "offload": {"to": "controller", "every": 5, "keep": 2}}}
    offload.annotate(docs, tmp_path / "runs")
    assert docs["box"]["offload"]["newest"]["step"] == 30 and docs["box"]["attention"] == []


def test_the_copy_rides_the_status_rounds_pinned_ssh_on_the_boxs_port(tmp_path):
    from rgt import sshround
    from rgt.inventory import Host

    (tmp_path / "hosts.yml").write_text("all: {}\n")
    host = Host("gpu1", {"ansible_host": "10.0.0.5", "ansible_port": 2222, "ansible_user": "ubuntu",
                         "rgt_instance_id": "i-123"})
    target = sshround.target_for(str(tmp_path / "hosts.yml"), host)
    conn = offload._connection(target, host)
    argv = paths.module_util("rgt_rsync").Transfer(conn, "/d/ckpt/step_1", str(tmp_path / "x"), push=False).argv()
    rsh = argv[argv.index("-e") + 1]
    assert rsh.startswith("ssh -p 2222 ") and "HostKeyAlias=i-123" in rsh and "StrictHostKeyChecking=yes" in rsh
    assert f"ControlPath={target.control_path}" in rsh and argv[-2] == "10.0.0.5:/d/ckpt/step_1"
