"""The box stops its own meter (rgt_job.offload.stop_box with `rgt-run train --down`, docs/unattended.md "The box
stops its own meter").

The box is this machine (connection local, a temp durable root) under a test profile whose meter stop is AutoDL's
(关机 through the fake AutoDL API, an in-box command) with the command a stub script that records its call; the
offload target is a real S3 server (`rclone serve s3`, tests/fakes/s3.py) on 127.0.0.1. What a launch refuses
(exit 2, nothing launched) comes first; then a run whose box cannot prove its own id refuses on the box (a record,
no call), and a second run, its authorisation covering both, stops the box's meter once its export is offloaded
and verified; the watcher polls the platform to a receipt and never calls it.
"""

import json
import stat
import sys
import time
from pathlib import Path

import pytest
import yaml
from clihelp import wait_for

from rgt import unattended
from tests.fakes.control_planes import AutoDL
from tests.fakes.s3 import S3Server

REPO = Path(__file__).resolve().parents[2]
TOKEN = "adl-down-token"
IID = "adl-box-1"
ID_ENV = "AutoDLContainerUUID"
FAST = json.dumps({"teardown_poll_interval_s": 0.3, "teardown_poll_timeout_s": 30})

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                reason="needs .venv with ansible-core")


def profile_dir(tmp_path: Path, base_url: str, command: list[str]) -> Path:
    """$RGT_PROFILES_DIR with a `runpod` profile whose meter stop is AutoDL's: the fake API, the stub command."""
    base = yaml.safe_load((REPO / "profiles" / "runpod.yml").read_text())
    meter = yaml.safe_load((REPO / "profiles" / "autodl.yml").read_text())["meter_stop"]
    meter["api"]["base_url"] = base_url
    meter["in_box"]["command"] = command
    base["meter_stop"] = meter
    base["danger_clocks"] = list(base["danger_clocks"]) + [c for c in meter["starts_clocks"]
                                                             if c not in base["danger_clocks"]]
    base["secrets"]["dir"] = str(tmp_path / "secrets")  # the offload's credentials file, under the test's dir
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "runpod.yml").write_text(yaml.safe_dump(base, allow_unicode=True))
    return pdir


def inventory(tmp_path: Path, profile: str = "runpod") -> Path:
    hv = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": profile,
          "rgt_instance_id": IID, "rgt_durable_root": str(tmp_path / "durable"), "rgt_project": "proj",
          "rgt_scratch_root": str(tmp_path / "scratch")}
    inv = tmp_path / f"hosts-{profile}.yml"
    inv.write_text(json.dumps({"all": {"hosts": {"box": hv}}}))
    return inv


def job(name: str, offload: dict) -> dict:
    code = REPO / "examples" / "tiny_train"
    return {"rgt_job": {"name": name, "command": f"{sys.executable} train.py --steps 20 --ckpt-every 10 --sleep 0.05",
                        "python": sys.executable, "code_dir": str(code), "gpu": {"count": 0},
                        "outputs": ["weights.bin", "metrics.json"],
                        "checkpoint": {"glob": "step_*.ckpt", "every_steps": 10}, "disk_floor_gib": 0.01,
                        "offload": offload}}


def record(tmp_path: Path, run_id: str):
    path = tmp_path / "durable" / "proj" / "active" / run_id / ".rgt" / "inbox_stop.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_the_box_stops_its_own_meter_only_when_its_authorisation_and_every_run_allow_it(rgt, tmp_path):
    (tmp_path / "tmux").mkdir()
    (tmp_path / "secrets").mkdir()
    calls = tmp_path / "shutdown-calls"
    stub = tmp_path / "shutdown"
    stub.write_text(f"#!/bin/sh\necho \"shutdown $* id=${ID_ENV}\" >> {calls}\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    with AutoDL(token=TOKEN) as fake, S3Server(tmp_path / "s3") as s3:
        fake.add_instance(IID)
        creds = s3.env("s3t")
        offload = {"to": "s3t:rgt/off", "every": 600, "credentials": sorted(creds), "stop_box": True}
        pdir = profile_dir(tmp_path, fake.url, [str(stub)])
        env = {"AUTODL_TOKEN": TOKEN, "RGT_PROFILES_DIR": str(pdir), "RGT_RUNS_DIR": str(tmp_path / "runs"),
               "TMUX_TMPDIR": str(tmp_path / "tmux"), **creds}
        inv = inventory(tmp_path)

        def train(name, *extra, spec=None, **more):
            return rgt("train", "-i", inv, "-e", json.dumps(spec or job(name, offload)), *extra, "--json",
                       env={**env, **more}, timeout=300)

        # refused at launch, exit 2 naming the field, nothing launched: no --down; an offload to the controller;
        # a profile where an in-box stop is unsafe (Lambda: in-OS shutdown keeps billing in Alert)
        alone = train("r0")
        assert alone.rc == 2 and alone.doc["field"] == "rgt_job.offload.stop_box", alone.stderr
        assert "needs rgt-run train --down naming this instance (adl-box-1)" in alone.doc["error"]
        home = train("r0", "--down", "--down-confirm", IID,
                     spec=job("r0", {"to": "controller", "stop_box": True}))
        assert home.rc == 2 and "needs an offload to an rclone remote" in home.doc["error"], home.stderr
        lam = rgt("train", "-i", inventory(tmp_path, "lambda"), "-e", json.dumps(job("r0", offload)), "--down",
                  "--down-confirm", IID, "--json", env=env, timeout=120)
        assert lam.rc == 2 and "profile lambda (host box) refuses a meter stop from the box itself" in lam.doc[
            "error"] and "Alert, still billing" in lam.doc["error"], lam.stderr
        assert not (tmp_path / "durable").exists() and not (rgt.ledger / "authorisations").exists()

        # the box cannot prove it is the instance the authorisation names (its id variable says another): the box
        # refuses, says why, calls nothing
        first = train("r1", "--down", "--down-confirm", IID, **{ID_ENV: "adl-someone-else"})
        assert first.rc == 0, first.stderr
        refused = wait_for(lambda: record(tmp_path, "r1"), timeout=120, what="the box's record of r1", interval=0.5)
        assert refused["action"] == "refused", refused
        assert "names instance 'adl-box-1', not this box's 'adl-someone-else'" in refused["reason"]
        assert not calls.exists()
        job_json = json.loads((tmp_path / "durable" / "proj" / "active" / "r1" / ".rgt" / "job.json").read_text())
        auth = json.loads(unattended.auth_path(rgt.ledger, IID).read_text())
        assert job_json["inbox_stop"]["authorisation"] == auth and auth["in_box"] is True
        assert job_json["inbox_stop"]["command"] == [str(stub)] and job_json["inbox_stop"]["self_id_env"] == ID_ENV

        # a second run on the box; the authorisation now covers both, each export offloaded and verified: the box
        # stops its own meter once, after r2's export is verified, and says why
        second = train("r2", "--down", "--down-confirm", IID, **{ID_ENV: IID})
        assert second.rc == 0, second.stderr
        done = wait_for(lambda: (record(tmp_path, "r2") or {}).get("rc") is not None and record(tmp_path, "r2"),
                        timeout=120, what="the box's stop", interval=0.5)
        assert done["action"] == "stop" and done["rc"] == 0, done
        assert "every run on the box (proj/r1, proj/r2) is covered" in done["reason"]
        assert calls.read_text().splitlines() == [f"shutdown  id={IID}"]
        verified = tmp_path / "durable" / "proj" / "active" / "r2" / "OFFLOAD_VERIFIED.json"
        assert verified.stat().st_mtime <= (tmp_path / "durable" / "proj" / "active" / "r2" / ".rgt" /
                                            "inbox_stop.json").stat().st_mtime
        shown = rgt("status", "-i", inv, "-e", json.dumps(job("r2", offload)), env=env, timeout=120)
        assert "box stopped its own meter at " in " ".join(shown.stdout.split()), shown.stdout

        # the platform reports the box off (its shutdown took effect): the watcher polls it to a receipt and never
        # calls the platform's power_off
        fake.instances[IID]["status"] = "shutdown"
        t0 = time.monotonic()
        watch = rgt("watch", "-i", inv, "-e", json.dumps(job("r2", offload)), "-e", FAST, "--interval", "1",
                    "--max-ticks", "4", env=env, timeout=300)
        print(f"watch {time.monotonic() - t0:.1f} s")
        assert "box stopped its own meter" in watch.stderr, watch.stderr
        assert f"meter stopped: {IID} stopped (by the box itself" in " ".join(watch.stderr.split()), watch.stderr
        assert fake.mutating_calls() == []
    receipt = json.loads(unattended.receipt_path(rgt.ledger, IID).read_text())
    assert receipt["by"] == "the box itself" and receipt["status"] == "done", receipt
    assert receipt["box_record"]["reason"] == done["reason"]
    assert len(calls.read_text().splitlines()) == 1  # the box called its command once, the watcher never
