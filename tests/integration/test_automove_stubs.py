"""watch moves a run by itself (docs/move.md "Moved by watch"): a run whose job keeps a spare (`offload.spares`)
offloads checkpoints to a real S3 server on the controller (`rclone serve s3`, tests/fakes/s3.py); its stub box is
destroyed mid-run and the fake RunPod API (tests/fakes/control_planes.py) says the pod is gone; `rgt-run watch`,
given nothing but the inventory, moves the run to the spare from its newest verified copy, says so, notifies
`moved` (a rule with the default `on`), and follows it there until it finishes with the weights of an uninterrupted
run. Spares that are no host of the inventory, or the run's own host, are refused at train (exit 2, the field)."""

import json

import pytest
from clihelp import wait_for, write_inventory
from conftest import STUB_LAYOUTS
from test_move import NEW_RUNS
from test_offload import _gateway, _records
from test_run_spine import RUNS, box, job, reference_weights

from tests.fakes.control_planes import RunPodV2
from tests.fakes.s3 import S3Server, rclone_binary
from tests.harness import stubhost as sh

pytestmark = [pytest.mark.stubs, pytest.mark.slow]
STEPS = 200
TOKEN = "rp-automove-token"


@pytest.fixture
def doomed(stub_fleet):
    """A runpod-like stub of this test's own (the fleet's stay up for the other tests), destroyed by the test."""
    inv = stub_fleet["inv"]
    stub = sh.start_stub("doomed", keydir=inv.parent / "keys", known_hosts=inv / "known_hosts", tag=stub_fleet["tag"],
                         instance_id="pod-doomed1", mounts=STUB_LAYOUTS["rp"]["mounts"])
    adl = stub_fleet["stubs"]["adl"]
    sh.podman("cp", rclone_binary(), f"{adl.container}:/usr/local/bin/rclone")  # the run offloads there too
    yield stub
    stub.destroy()
    adl.exec(["bash", "-c", "pkill -f '[r]gt/active/' ; tmux kill-server 2>/dev/null ; rm -f /usr/local/bin/rclone ; "
              "true"])


def _inventory(stub_fleet, doomed):
    hosts = {}
    for name, stub, profile in (("doomed", doomed, "runpod"), ("adl", stub_fleet["stubs"]["adl"], "autodl")):
        hv = {k: v for k, v in stub.inventory_vars().items() if k != "ansible_ssh_common_args"}
        hosts[name] = {**hv, "rgt_profile": profile, "ansible_python_interpreter": "/usr/bin/python3"}
    return write_inventory(stub_fleet["inv"], hosts)


def test_watch_moves_a_run_whose_box_is_destroyed_to_its_spare_by_itself_and_follows_it_to_the_end(
        rgt, stub_fleet, doomed, tmp_path):
    sh.podman("cp", rclone_binary(), f"{doomed.container}:/usr/local/bin/rclone")
    notes = tmp_path / "notes.jsonl"
    with S3Server(tmp_path / "s3", bind=_gateway(doomed)) as s3, RunPodV2(token=TOKEN) as plane:
        plane.add_pod("pod-doomed1")
        env = {**s3.env("s3a"), "RUNPOD_API_KEY": TOKEN, "RUNPOD_API_URL": plane.url}
        offload = {"to": "s3a:rgt/off", "every": 5, "keep": 2, "credentials": sorted(s3.env("s3a")),
                   "spares": ["adl"], "move_after_s": 3600}
        spec = job("am", steps=STEPS, sleep=0.1, offload=offload,
                   notify=[{"command": f"cat >> {notes}; echo >> {notes}"}])
        inv = _inventory(stub_fleet, doomed)

        # spares that are no host of the inventory, or the run's own host: refused at train, nothing launched
        for spares, words in ((["nowhere"], "names nowhere, no host of the inventory"),
                              (["doomed"], "names the run's own host")):
            bad = rgt("playbooks/train.yml", "-i", inv, "-l", "doomed", "-e", json.dumps(
                {"rgt_job": {**spec, "offload": {**offload, "spares": spares}}, "rgt_skip_smoke": True}), "--json",
                env=env)
            assert bad.rc == 2 and json.loads(bad.stdout)["field"] == "rgt_job.offload.spares", bad.stdout
            assert words in bad.stderr, bad.stderr
        assert box(doomed, f"ls {RUNS} 2>/dev/null || true").strip() == ""

        launched = rgt("playbooks/train.yml", "-i", inv, "-l", "doomed", "-e",
                       json.dumps({"rgt_job": spec, "rgt_skip_smoke": True}), "--json", env=env)
        assert launched.rc == 0, launched.stderr
        wait_for(lambda: [r for r in _records(doomed, "am") if r.get("kind") == "checkpoint" and r.get("verified")
                          and r["step"] >= 30], timeout=90, what="a verified offload past step 30", interval=1.0)

        doomed.destroy()  # the box is gone, with its disk; the platform says so
        plane.mark_gone("pod-doomed1")

        watched = rgt("watch", "-i", inv, "--interval", "2", "--max-ticks", "60", "--json", env=env, timeout=600)
        assert "doomed: am: its box is gone (the platform's API says it is gone): moving it to the spare adl" in \
            watched.stderr, watched.stderr
        assert "every run is settled" in watched.stderr, watched.stderr
        assert watched.rc == 0, watched.stderr

        # the run resumed on adl from its offloaded checkpoint and finished with an uninterrupted run's weights
        adl = stub_fleet["stubs"]["adl"]
        moves = [json.loads(line) for line in (rgt.ledger / "moves.jsonl").read_text().splitlines()]
        assert [(m["run_id"], m["from"], m["to"], m["attempt"]) for m in moves] == [("am", "doomed", "adl", 2)]
        first = json.loads(box(adl, f"head -1 {NEW_RUNS}/am/.rgt/attempts.jsonl"))
        assert first["resume_from"] == f"{NEW_RUNS}/am/ckpt/{moves[0]['checkpoint']['name']}", first
        assert json.loads(box(adl, f"cat {NEW_RUNS}/am/.rgt/exit.json"))["reason"] == "finished"
        assert box(adl, f"sha256sum {NEW_RUNS}/am/out/weights.bin").split()[0] == reference_weights(tmp_path, STEPS)
        assert "spares" not in json.loads(box(adl, f"cat {NEW_RUNS}/am/.rgt/job.json")).get("offload", {})
        seeded = json.loads(box(adl, f"head -1 {NEW_RUNS}/am/offload.jsonl"))  # on the target, verified: not behind
        assert (seeded["name"], seeded["verified"], seeded["moved_from"]) == (moves[0]["checkpoint"]["name"], True,
                                                                              "doomed")

        # the ledger keeps the automatic move (a restarted watcher never repeats it); the event and the message
        state = json.loads((rgt.ledger / "automove" / "doomed.json").read_text())
        assert state["runs"]["am"]["state"] == "moved" and state["runs"]["am"]["to"] == "adl"
        events = [json.loads(line) for p in (rgt.ledger / "events").glob("*watch*.jsonl")
                  for line in p.read_text().splitlines()]
        assert [(e["run_id"], e["to"]) for e in events if e.get("event") == "moved"] == [("am", "adl")]
        messages = [json.loads(line) for line in notes.read_text().splitlines() if line.strip()]
        assert [m["kind"] for m in messages if m["kind"] == "moved"] == ["moved"], messages
        again = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", env=env, timeout=300)
        assert "moving it to the spare" not in again.stderr, again.stderr
        assert s3.secret_key not in watched.stdout + watched.stderr
