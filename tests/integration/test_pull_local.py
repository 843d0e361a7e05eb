"""`rgt-run pull` end to end on this machine (connection local, a temp durable root): what is sealed is exactly what
the run wrote, its logs included (every attempt's lines, a log over its cap capped and said so), a re-pull repairs
local corruption, and no PULL_VERIFIED marker outlives a failure.

The box side (rgt_closeout), the transfer (rsync, local) and the controller side (rgt_pull_verify) are the real
role; only SSH is absent (tests/integration/test_collect_stubs.py covers it on a stub host)."""

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.fakes.capsule import make_pull

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "pull-run"
# job.log as the wrapper leaves it for a run preempted in attempt 1 and resumed as attempt 2
JOB_LOG = (b"== rgt attempt 1 started 2026-01-01T00:00:00Z resume_from=none\nstep=10 loss=1.5\npreempted: checkpoint\n"
           b"== rgt attempt 1 ended 2026-01-01T00:04:00Z reason=preempted rc=143\n"
           b"== rgt attempt 2 started 2026-01-01T00:05:00Z resume_from=ckpt/step_00000010.ckpt\n"
           b"resumed from step 10\nstep=20 loss=0.5\n"
           b"== rgt attempt 2 ended 2026-01-01T00:10:00Z reason=finished rc=0\n")
ATTEMPTS = [{"attempt": 1, "started_at": "2026-01-01T00:00:00Z"},
            {"attempt": 1, "ended_at": "2026-01-01T00:04:00Z", "rc": 143, "reason": "preempted"},
            {"attempt": 2, "started_at": "2026-01-01T00:05:00Z"},
            {"attempt": 2, "ended_at": "2026-01-01T00:10:00Z", "rc": 0, "reason": "finished"}]

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                reason="needs .venv with ansible-core")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Box:
    """One finished run under a temp durable root, an inventory pointing at it, and the local runs dir."""

    def __init__(self, tmp: Path, rgt, runs: Path | None = None, instance_id: str = "inst-1"):
        self.tmp = tmp
        self.rgt = rgt
        self.durable = tmp / "durable"
        self.run_dir = self.durable / "proj" / "active" / RUN_ID
        self.export = self.durable / "proj" / "export"
        self.quarantine = self.durable / "proj" / "quarantine"
        self.runs = runs or tmp / "runs"
        self.dest = self.runs / RUN_ID / "box"
        self.marker = self.runs / RUN_ID / "box.PULL_VERIFIED.json"
        self.job = {"name": RUN_ID, "outputs": []}
        self.instance_id = instance_id
        for sub in (".rgt", "out", "ckpt", "logs"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.run_dir / ".rgt" / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in ATTEMPTS))
        (self.run_dir / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 2, "rc": 0, "signal": None,
                                                                      "reason": "finished"}))
        (self.run_dir / "logs" / "job.log").write_bytes(JOB_LOG)

    def write(self, rel: str, data: bytes) -> Path:
        path = self.run_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def inventory(self, host: str = "box") -> Path:
        (self.run_dir / ".rgt" / "job.json").write_text(json.dumps({
            "schema": 1, "run_id": RUN_ID, "project": "proj", "run_dir": str(self.run_dir),
            "outputs": self.job.get("outputs") or [], "log_patterns": {}, "heartbeat_interval_s": 5}))
        inv = self.tmp / "inv"
        inv.mkdir(exist_ok=True)
        (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {host: {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
            "rgt_instance_id": self.instance_id, "rgt_durable_root": str(self.durable), "rgt_project": "proj",
            "rgt_job": self.job}}}}))
        return inv

    def pull(self, *extra: str):
        res = self.rgt("pull", "-i", self.inventory(), "--runs-dir", self.runs, "--json", *extra, timeout=300)
        res.host = res.doc["hosts"]["box"]
        res.out = res.stdout + res.stderr
        return res

    def sealed(self) -> dict:
        return json.loads((self.export / f"{RUN_ID}.manifest.json").read_text())


def test_a_symlinked_directory_in_an_output_path_is_never_sealed(tmp_path, rgt):
    box = Box(tmp_path, rgt)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_text("someone else's file\n")
    box.write("out/metrics.json", b'{"loss": 0.5}\n')
    os.symlink(outside, box.run_dir / "out" / "sub")
    box.job["outputs"] = ["metrics.json", "sub/secret.txt"]

    res = box.pull()
    assert res.rc == 1, res.out
    assert f"out/sub is a symlink -> {outside}" in res.host["error"], res.out
    assert "out/sub is a symlink" in res.stderr  # the human line names the link
    assert not (box.export / RUN_ID).exists() and not (box.export / f"{RUN_ID}.manifest.json").exists()
    reason = (box.quarantine / f"{RUN_ID}--2" / "REASON.txt").read_text()
    assert f"required output out/sub/secret.txt refused: out/sub is a symlink -> {outside}" in reason
    assert not list(box.quarantine.rglob("secret.txt")), "the outside file is never copied"
    assert not box.marker.exists() and not box.dest.exists()


def test_hf_output_dir_and_globs_are_sealed_whole_and_a_local_corruption_is_repaired(tmp_path, rgt):
    box = Box(tmp_path, rgt)
    written = {}
    for step in (500, 1000):
        for name, data in (("model.safetensors", os.urandom(300_000)), ("trainer_state.json", b'{"step": %d}' % step),
                           ("optimizer.pt", os.urandom(1000))):
            rel = f"out/hf/checkpoint-{step}/{name}"
            written[rel] = box.write(rel, data)
    for rel in ("out/hf/config.json", "out/eval_a.json", "out/eval_b.json"):
        written[rel] = box.write(rel, b"{}\n")
    box.write("out/notes.txt", b"not declared\n")
    box.write("ckpt/rolling.pt", b"resume state\n")
    # the wrapper's own output under nohup, 3 MB of it: over a 1 MiB cap
    chatter = b"".join(b"rgt wrapper: tick %07d\n" % i for i in range(130_000))
    box.write("logs/wrapper.log", chatter)
    box.job["outputs"] = ["hf/", "eval_*.json", "hf/checkpoint-*/model.safetensors"]

    status = rgt("status", "-i", box.inventory(), "--json", timeout=300)
    host = status.doc["hosts"]["box"]
    assert host["state"] == "finished" and host["outputs_missing"] == [], status.stdout + status.stderr
    assert status.rc == 0, status.stdout + status.stderr

    first = box.pull("-e", json.dumps({"collect_log_max_mb": 1}))
    assert first.rc == 0, first.out
    manifest = box.sealed()
    logs = ["logs/attempts.jsonl", "logs/job.log", "logs/wrapper.log"]
    assert [f["path"] for f in manifest["files"]] == sorted([*written, *logs, "run.json"])
    for rel, src in written.items():
        assert sha(box.dest / rel) == sha(src) == next(f["sha256"] for f in manifest["files"] if f["path"] == rel)
    assert f"verified: {len(written) + 4} files" in first.stderr
    # the logs beside the outputs: both attempts' lines and the attempt records, as the box has them
    assert (box.dest / "logs" / "job.log").read_bytes() == JOB_LOG
    assert (box.dest / "logs" / "attempts.jsonl").read_bytes() == (box.run_dir / ".rgt" / "attempts.jsonl").read_bytes()
    # the log over its cap: its first and last lines around the line that says what is left out, and said so
    (capped,) = [r for r in manifest["logs"]["files"] if r["path"] == "logs/wrapper.log"]
    kept = (box.dest / "logs" / "wrapper.log").read_bytes()
    start, end = capped["omitted"]
    assert capped["capped"] and kept.startswith(chatter[:start]) and kept.endswith(chatter[end:])
    assert f"the whole log stays on the box at {box.run_dir / 'logs' / 'wrapper.log'} until teardown" in kept.decode()
    assert f"log {box.run_dir / 'logs' / 'wrapper.log'}: capped: bytes {start} to {end}" in first.stderr
    assert "it is capped at 1.0 MiB (collect_log_max_mb)" in first.stderr
    assert first.host["logs"] == manifest["logs"]
    provenance = (box.runs / RUN_ID / "box.PROVENANCE.md").read_text()
    assert "`out/notes.txt`: not a declared output" in provenance and "`ckpt/rolling.pt`" in provenance
    assert f"`logs/wrapper.log`: capped: bytes {start} to {end}" in provenance
    # the report beside the pull links the pulled logs (relative to the page, so the links work where it is opened)
    page = Path(first.host["report"]).read_text()
    assert first.host["report"] == str(box.runs / RUN_ID / "report.html"), first.out
    for rel in ("box/logs/job.log", "box/logs/attempts.jsonl"):
        assert f'href="{rel}"' in page and (box.runs / RUN_ID / rel).is_file()

    # the local copy is damaged with its size and mtime kept: rsync's quick check alone would skip it forever
    victim = box.dest / "out" / "hf" / "checkpoint-1000" / "model.safetensors"
    before = victim.stat()
    data = bytearray(victim.read_bytes())
    data[1234] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert victim.stat().st_size == before.st_size and victim.stat().st_mtime_ns == before.st_mtime_ns
    untouched = box.dest / "out" / "hf" / "checkpoint-500" / "model.safetensors"
    untouched_ino = untouched.stat().st_ino
    # and a byte of the pulled log: the log is verified like every other file
    log = box.dest / "logs" / "job.log"
    log.write_bytes(JOB_LOG.replace(b"loss=0.5", b"loss=0.4"))

    checked = box.pull("--verify-only")
    assert checked.rc == 1 and not box.marker.exists(), checked.out
    assert checked.host["sha_mismatch"] == ["logs/job.log", "out/hf/checkpoint-1000/model.safetensors"]
    assert "whose content differs from the box's (SHA-256): logs/job.log" in checked.stderr

    second = box.pull()
    assert second.rc == 0, second.out
    assert sha(victim) == sha(written["out/hf/checkpoint-1000/model.safetensors"])
    assert log.read_bytes() == JOB_LOG
    assert second.host["repaired"] == ["logs/job.log", "out/hf/checkpoint-1000/model.safetensors"]
    assert "re-sent 2 file(s) changed locally: logs/job.log, out/hf/checkpoint-1000/model.safetensors" in \
        second.stderr
    assert untouched.stat().st_ino == untouched_ino, "only the changed files are re-sent"
    assert box.marker.exists()


def test_a_glob_with_no_match_is_not_finished_and_is_named(tmp_path, rgt):
    box = Box(tmp_path, rgt)
    box.write("out/hf/checkpoint-500/pytorch_model.bin", b"weights")
    box.job["outputs"] = ["hf/checkpoint-*/model.safetensors"]

    res = box.pull()
    assert res.rc == 1, res.out
    assert "required output out/hf/checkpoint-*/model.safetensors matches nothing" in res.stderr, res.out
    assert not (box.export / RUN_ID).exists() and not box.marker.exists()
    assert "matches nothing" in (box.quarantine / f"{RUN_ID}--2" / "REASON.txt").read_text()


def sealed_pull(box: Box, instance_id: str = "inst-1") -> bytes:
    """A sealed export on the box and a verified local pull of it, with a marker (tests/fakes/capsule.py)."""
    raw, files = make_pull(box.runs, RUN_ID, "box", instance_id)
    for rel, data in files.items():
        (box.export / RUN_ID / rel).parent.mkdir(parents=True, exist_ok=True)
        (box.export / RUN_ID / rel).write_bytes(data)
    (box.export / f"{RUN_ID}.manifest.json").write_bytes(raw)
    assert box.marker.exists()
    return raw


@pytest.mark.parametrize("who", ["instance", "host"])
def test_a_manifest_sealed_on_another_host_or_instance_is_refused(tmp_path, rgt, who):
    box = Box(tmp_path, rgt)
    if who == "instance":  # the inventory now names a new instance; the box's export is the old one's
        sealed_pull(box, "inst-old")
        expect = "sealed on host box, instance inst-old, but this pull is for host box, instance inst-1"
    else:  # a manifest that says another host sealed it
        raw = sealed_pull(box, "inst-1")
        doc = json.loads(raw)
        doc["host"] = "other-box"
        (box.export / f"{RUN_ID}.manifest.json").write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
        expect = "sealed on host other-box, instance inst-1, but this pull is for host box, instance inst-1"
    res = box.pull()
    assert res.rc == 1, res.out
    assert "the box's manifest was refused" in res.stderr and expect in res.stderr, res.out
    assert not box.marker.exists(), "a stale marker for this host is removed"
    local = json.loads((box.runs / RUN_ID / "box.manifest.json").read_text())
    assert local["host"] == "box", "the refused manifest is not promoted"


@pytest.fixture
def small_disk(tmp_path, tmpfs):
    """A 4 MiB tmpfs as the local runs dir (unmounted afterwards); skipped where mounting is not allowed."""
    return tmpfs(tmp_path / "runs", "size=4m")


def test_a_full_local_disk_while_writing_the_marker_leaves_no_marker(tmp_path, rgt, small_disk):
    box = Box(tmp_path, rgt, runs=small_disk)
    sealed_pull(box)
    # every file matches; then the local disk fills up (another writer) before the note and the marker are written
    box.job["verify_command"] = "cat /dev/zero > ../filler 2>/dev/null; exit 0"
    res = box.pull()
    assert res.rc == 1, res.out
    assert not box.marker.exists(), "no PULL_VERIFIED.json outlives a failed write"
    assert "the local disk is full" in res.stderr and "No space left on device" in res.stderr, res.out
    assert not list((box.runs / RUN_ID).glob(".box.*.tmp")), "no temp file is left behind"
