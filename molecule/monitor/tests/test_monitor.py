"""Verify the monitor scenario: the role is read-only (every file of the hand-made finished run has the path,
mtime, size and SHA-256 that converge snapshotted before the role first ran, and no file was added), and a fresh
rgt_status call (the role's one module) reports the run finished at step 10. Runs under testinfra with
molecule's inventory."""

import pytest

RUN_DIRS = {"adl": "/root/autodl-tmp/mol/active/mol-mon", "rp": "/workspace/mol/active/mol-mon"}
DURABLE = {"adl": "/root/autodl-tmp", "rp": "/workspace"}
SNAPSHOT = "/tmp/mol-layout-snapshot.txt"
# the same listing as converge.yml's mol_snapshot_cmd: "<path> <mtime> <size> <sha256>  ./<path>", sorted
LISTING = "cd {run_dir} && find . -type f -printf '%P %T@ %s ' -exec sha256sum {{}} \\; | LC_ALL=C sort"


def _name(host):
    return host.backend.get_hostname()


def _listing(host):
    return host.check_output("bash -c %s", "set -o pipefail && " + LISTING.format(run_dir=RUN_DIRS[_name(host)]))


def test_layout_was_snapshotted(host):
    snap = host.file(SNAPSHOT)
    assert snap.is_file
    names = [line.split(" ", 1)[0] for line in snap.content_string.splitlines()]
    for expected in (
        ".rgt/job.json",
        ".rgt/exit.json",
        ".rgt/attempts.jsonl",
        ".rgt/heartbeat",
        "logs/job.log",
        "out/weights.bin",
        "out/metrics.json",
    ):
        assert expected in names


def test_role_changed_nothing_in_the_run(host):
    """path, mtime, size and SHA-256 of every file equal the snapshot taken before the role's first run."""
    assert _listing(host).strip() == host.file(SNAPSHOT).content_string.strip()


def test_role_wrote_nothing_beside_the_run(host):
    project = DURABLE[_name(host)] + "/mol"
    out = host.check_output(f"find {project} -mindepth 1 -maxdepth 2 -printf '%P\\n' | LC_ALL=C sort")
    assert out.split() == ["active", "active/mol-mon"]


@pytest.fixture
def status(host):
    res = host.ansible(
        "rgt.remote_gpu.rgt_status",
        f"durable_root={DURABLE[_name(host)]} project=mol run_id=mol-mon",
        check=False,
    )
    assert not res.get("failed"), res
    return res["status"]


def test_fresh_status_says_finished(host, status):
    assert status["state"] == "finished"
    assert status["run_id"] == "mol-mon" and status["attempt"] == 1
    assert status["step"] == 10 and status["loss"] == pytest.approx(0.5)
    assert status["evidence"]["exit"]["reason"] == "finished"
    assert status["outputs_missing"] == [] and status["attention"] == []
