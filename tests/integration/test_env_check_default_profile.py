"""env_check defaults its profile the way probe does: an inventory that names no `rgt_profile` gets the
generic_ssh profile instead of an undefined-variable error (roles/env_check/defaults/main.yml)."""

import pytest
from test_env_check_local import ANSIBLE_PLAYBOOK, OMIT, box  # noqa: F401 (box is the fixture)

pytestmark = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs .venv with ansible-core")


def test_env_check_without_rgt_profile_uses_generic_ssh_like_probe(box):  # noqa: F811
    proc, report = box.play(env_check_profile=OMIT, rgt_job={"secrets": []}, env_check_fail_on="never")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rgt_profile" not in proc.stdout + proc.stderr  # no "'rgt_profile' is undefined"
    assert report["verdict"] in ("ok", "warn", "fail")  # the module ran and reported
    assert "interpreter" in report and report["interpreter"]["path"]
