"""`rgt-run move` on two stub boxes (docs/move.md): a run offloads checkpoints to a real S3 server on the controller
(`rclone serve s3`, tests/fakes/s3.py); its box freezes mid-run (`podman pause`: gone for the controller, its
attempt still in memory); `move` to a second stub resumes it there from the newest verified copy, and it completes
with weights byte-identical to an uninterrupted run; the old box comes back with its attempt alive: watch stops that
stale attempt (only it) and says so; moved back there, the checkpoints that stale attempt left are set aside and
the run resumes from the verified copy; the credentials in no argv, log, ledger or --json. One run, several
assertions."""

import json

import pytest
from clihelp import wait_for
from conftest import stub_inventory
from test_offload import _gateway, _records
from test_run_spine import RUNS, box, job, reference_weights, wrappers

from tests.fakes.s3 import S3Server, rclone_binary
from tests.harness import stubhost as sh

pytestmark = [pytest.mark.stubs, pytest.mark.slow]
NEW_RUNS = "/root/autodl-tmp/rgt/active"  # the autodl stub's durable root
STEPS = 600  # the old attempt must outlive the time from its return to the fence (a minute on a loaded machine)


@pytest.fixture
def boxes(stub_fleet):
    rp, adl = stub_fleet["stubs"]["rp"], stub_fleet["stubs"]["adl"]
    yield rp, adl
    sh.podman("unpause", rp.container, check=False)
    for stub in (rp, adl):
        stub.exec(["bash", "-c", "pkill -f '[r]gt/active/' || true; tmux kill-server 2>/dev/null || true"])
    adl.exec(["rm", "-f", "/usr/local/bin/rclone"])


def test_a_run_moves_to_another_box_resumes_from_its_verified_offload_and_the_stale_attempt_is_fenced(
        rgt, stub_fleet, boxes, tmp_path):
    rp, adl = boxes
    for stub in (rp, adl):  # adl offloads its generation too: the run moves back from there
        sh.podman("cp", rclone_binary(), f"{stub.container}:/usr/local/bin/rclone")
    with S3Server(tmp_path / "s3", bind=_gateway(rp)) as s3:
        env = s3.env("s3m")
        spec = job("mv", steps=STEPS, sleep=0.1, offload={"to": "s3m:rgt/off", "every": 5, "keep": 2,
                                                          "credentials": sorted(env)})
        inv = stub_inventory(stub_fleet, ["rp", "adl"])
        launched = rgt("playbooks/train.yml", "-i", inv, "-l", "rp", "-e",
                       json.dumps({"rgt_job": spec, "rgt_skip_smoke": True}), "--json", env=env)
        assert launched.rc == 0, launched.stderr

        # bad input: exit 2 naming the field, before the box is touched
        for argv, field in ((["nope", "--to", "adl"], "RUN"), (["mv", "--to", "elsewhere"], "--to"),
                            (["mv", "--to", "rp"], "--to")):
            bad = rgt("move", "-i", inv, *argv, "--json", env=env)
            assert bad.rc == 2, bad.stderr
            assert json.loads(bad.stdout)["field"] == field, bad.stdout

        wait_for(lambda: [r for r in _records(rp, "mv") if r.get("kind") == "checkpoint" and r.get("verified")
                          and r["step"] >= 30], timeout=90, what="a verified offload past step 30", interval=1.0)
        seen = rgt("status", "-i", inv, "-l", "rp", "--json", timeout=240)
        last_seen = json.loads(seen.stdout)["hosts"]["rp"]["step"]
        sh.podman("pause", rp.container)  # the box is gone for the controller; its attempt is frozen, not dead

        moved = rgt("move", "-i", inv, "mv", "--to", "adl", "--json", env=env, timeout=600)
        assert moved.rc == 0, moved.stderr + moved.stdout
        doc = json.loads(moved.stdout)
        ckpt = doc["checkpoint"]
        assert doc["from"] == "rp" and doc["to"] == "adl" and doc["generation"] == 2 and ckpt["step"] >= 30
        assert doc["old_last_step"] == last_seen and doc["work_lost_steps"] == max(0, last_seen - ckpt["step"])
        assert f"work lost: {doc['work_lost_steps']} steps" in moved.stderr

        # the new box resumed from that checkpoint, generation 2, and finished with the uninterrupted run's weights
        attempts = [json.loads(line) for line in box(adl, f"cat {NEW_RUNS}/mv/.rgt/attempts.jsonl").splitlines()]
        assert attempts[0]["resume_from"] == f"{NEW_RUNS}/mv/ckpt/{ckpt['name']}", attempts
        assert json.loads(box(adl, f"cat {NEW_RUNS}/mv/.rgt/job.json"))["env"]["RGT_GENERATION"] == "2"
        wait_for(lambda: box(adl, f"cat {NEW_RUNS}/mv/.rgt/exit.json 2>/dev/null || true").strip() or None, timeout=300,
                 what="the moved run to finish", interval=1.0)
        assert json.loads(box(adl, f"cat {NEW_RUNS}/mv/.rgt/exit.json"))["reason"] == "finished"
        weights = box(adl, f"sha256sum {NEW_RUNS}/mv/out/weights.bin").split()[0]
        assert weights == reference_weights(tmp_path, STEPS)

        # status follows the run to adl and says where it went
        looked = rgt("status", "-i", inv, "--json", timeout=240)
        assert looked.rc in (0, 5), looked.stderr  # 5: an attention on adl
        assert list(json.loads(looked.stdout)["hosts"]) == ["adl"], looked.stdout
        assert f"rp: mv moved to adl (generation 2, work lost {doc['work_lost_steps']} steps)" in looked.stderr

        # the ledger: the run lives on adl now; the move and the work lost recorded
        old = json.loads((rgt.ledger / "runs" / "rp.json").read_text())["runs"]["rgt/mv"]
        new = json.loads((rgt.ledger / "runs" / "adl.json").read_text())["runs"]["rgt/mv"]
        assert old["moved_to"] == "adl" and old["generation"] == 1
        assert new["moved_from"] == "rp" and new["generation"] == 2
        moves = [json.loads(line) for line in (rgt.ledger / "moves.jsonl").read_text().splitlines()]
        assert [(m["run_id"], m["from"], m["to"], m["work_lost_steps"]) for m in moves] == [
            ("mv", "rp", "adl", doc["work_lost_steps"])]

        # the old box comes back, its attempt alive: watch stops that attempt (only it) and says so
        sh.podman("unpause", rp.container)
        assert wrappers(rp, "mv") == 1
        finished = box(adl, f"cat {NEW_RUNS}/mv/.rgt/exit.json")
        watched = rgt("watch", "-i", inv, "--max-ticks", "1", "--interval", "1", "--json", timeout=300)
        assert "rp: mv moved to adl (generation 2): its stale attempt here was stopped" in watched.stderr, \
            watched.stderr
        # rp holds no run any more: looked at for the fence only, no row of the watch, no part of its exit code
        assert "rp: its runs moved away and are fenced here; not looked at again" in watched.stderr, watched.stderr
        assert "rp" not in json.loads(watched.stdout)["hosts"] and watched.rc == 0, watched.stdout
        assert wrappers(rp, "mv") == 0
        assert json.loads(box(rp, f"cat {RUNS}/mv/.rgt/exit.json"))["reason"] == "preempted"
        assert json.loads(box(rp, f"cat {RUNS}/mv/.rgt/moved.json"))["moved_to"] == "adl"
        assert box(adl, f"cat {NEW_RUNS}/mv/.rgt/exit.json") == finished  # the run itself untouched
        fenced = json.loads((rgt.ledger / "runs" / "rp.json").read_text())["runs"]["rgt/mv"]
        assert fenced["fence"]["was_live"] is True and fenced["fenced_at"]

        # moved back to rp: the checkpoints its stale attempt wrote there after the run left (and one planted
        # newest of all) are set aside, never resumed from; the new attempt resumes from adl's verified copy
        box(rp, f"cd {RUNS}/mv/ckpt && cp \"$(ls -t step_* | head -1)\" step_99999990.ckpt")
        back = rgt("move", "-i", inv, "mv", "--to", "rp", "--json", env=env, timeout=600)
        assert back.rc == 0, back.stderr + back.stdout
        home = json.loads(back.stdout)
        aside = home["superseded"]
        assert (home["from"], home["generation"], aside["generation"], aside["moved"]) == ("adl", 3, 1, [
            "ckpt", "offload.jsonl"]), home
        assert aside["set_aside"].startswith(f"{RUNS}/mv/superseded/gen1-"), aside
        assert "step_99999990.ckpt" in box(rp, f"ls {aside['set_aside']}/ckpt").split()
        assert box(rp, f"ls {RUNS}/mv/ckpt").split()[0] == home["checkpoint"]["name"]
        resumed = json.loads(box(rp, f"grep resume_from {RUNS}/mv/.rgt/attempts.jsonl | tail -1"))
        assert resumed["resume_from"] == f"{RUNS}/mv/ckpt/{home['checkpoint']['name']}", resumed
        assert json.loads(box(rp, f"head -1 {RUNS}/mv/offload.jsonl"))["moved_from"] == "adl"
        moves = [json.loads(line) for line in (rgt.ledger / "moves.jsonl").read_text().splitlines()]
        assert moves[-1]["superseded"] == aside

        texts = [launched.stdout, launched.stderr, moved.stdout, moved.stderr, watched.stdout, watched.stderr,
                 back.stdout, back.stderr,
                 box(adl, f"cat {NEW_RUNS}/mv/logs/* {NEW_RUNS}/mv/.rgt/job.json {NEW_RUNS}/mv/.rgt/attempts.jsonl")]
        texts += [p.read_text(errors="replace") for p in rgt.ledger.rglob("*") if p.is_file()]
        assert not any(s3.secret_key in text for text in texts)
