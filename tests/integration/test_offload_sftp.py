"""Offload to sftp on a second stub box (docs/offload.md, issue 19): a short run on rp offloads its last checkpoint
and its sealed export over sftp to adl (its sshd, the fleet's key delivered as a secret by env-var name), each copy
verified by the MD5 adl's own `md5sum` computes (rclone's sftp backend runs it there), the export too; the
bytes on adl are the box's; the key is in no argv, log, ledger or --json."""

import hashlib
import json

import pytest
from clihelp import wait_for
from conftest import stub_inventory
from test_run_spine import RUNS, box, job, train

pytestmark = [pytest.mark.stubs, pytest.mark.slow]

TARGET = "/root/offtarget"  # on adl, in the sftp user's home


@pytest.fixture
def boxes(stub_fleet):
    rp, adl = stub_fleet["stubs"]["rp"], stub_fleet["stubs"]["adl"]
    yield rp, adl
    rp.exec(["bash", "-c", "pkill -f '[r]gt/active/' || true; tmux kill-server 2>/dev/null || true"])
    adl.exec(["bash", "-c", f"rm -rf {TARGET}"])


def test_a_run_offloads_over_sftp_to_a_second_box_verified_by_that_boxs_md5(rgt, stub_fleet, boxes):
    rp, adl = boxes
    address = box(adl, "hostname -I").split()[0]  # adl on the podman bridge, as rp reaches it
    key = (stub_fleet["inv"].parent / "keys" / "id_ed25519").read_text()
    env = {"RCLONE_CONFIG_SFT_TYPE": "sftp", "RCLONE_CONFIG_SFT_HOST": address, "RCLONE_CONFIG_SFT_USER": "root",
           "RCLONE_CONFIG_SFT_KEY_PEM": key.strip().replace("\n", "\\n")}
    spec = job("offs", steps=30, sleep=0.05, offload={"to": f"sft:{TARGET}", "every": 600, "keep": 2,
                                                      "credentials": sorted(env)})
    inv = stub_inventory(stub_fleet, ["rp"])
    launched = train(rgt, inv, spec, **env)
    assert launched.rc == 0, launched.stderr

    proof = wait_for(lambda: box(rp, f"cat {RUNS}/offs/OFFLOAD_VERIFIED.json 2>/dev/null || true").strip(),
                     timeout=90, what="OFFLOAD_VERIFIED.json", interval=1.0)
    proof = json.loads(proof)
    assert proof["target"] == f"sft:{TARGET}/rgt/offs/export" and proof["verify"] == "md5 by the target"
    records = [json.loads(line) for line in box(rp, f"cat {RUNS}/offs/offload.jsonl").splitlines() if line.strip()]
    ckpt = [r for r in records if r.get("kind") == "checkpoint"]
    assert ckpt and ckpt[-1]["step"] == 30 and ckpt[-1]["verified"], records
    assert ckpt[-1]["verify"] == "md5 by the target", ckpt[-1]  # adl's md5sum, over rclone's sftp session

    # the bytes on adl are the box's: the checkpoint and every file of the sealed export
    name = ckpt[-1]["name"]
    on_adl = box(adl, f"sha256sum {TARGET}/rgt/offs/checkpoints/{name}/{name}").split()[0]
    assert on_adl == box(rp, f"sha256sum {RUNS}/offs/ckpt/{name}").split()[0]
    sealed = json.loads(box(rp, f"cat {RUNS.rsplit('/', 1)[0]}/export/offs.manifest.json"))
    for entry in sealed["files"]:
        got = box(adl, f"sha256sum {TARGET}/rgt/offs/export/offs/{entry['path']}").split()[0]
        assert got == entry["sha256"], entry["path"]
    assert hashlib.sha256(box(adl, f"cat {TARGET}/rgt/offs/export/offs.manifest.json").encode()).hexdigest() == \
        proof["manifest_sha256"]

    # the key in no argv, log, ledger or --json
    secret = key.strip().splitlines()[1]
    texts = [launched.stdout, launched.stderr, box(rp, "ps -eo args"),
             box(rp, f"cat {RUNS}/offs/offload.jsonl {RUNS}/offs/logs/* {RUNS}/offs/.rgt/job.json")]
    texts += [p.read_text(errors="replace") for p in rgt.ledger.rglob("*") if p.is_file()]
    assert not any(secret in text for text in texts)
