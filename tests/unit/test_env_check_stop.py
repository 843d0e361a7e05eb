"""Whether env_check stops the play is decided by the module (plugins/modules/rgt_env_check.py stop_decision over
rgt_envcheck.fails_on), not by the role's Jinja: the verdict, the fail_on policy and the message naming the findings."""

import pytest

from ansible_collections.rgt.remote_gpu.plugins.modules.rgt_env_check import stop_decision

FINDINGS = [{"id": "a", "severity": "critical", "message": "torch cannot see the GPU"},
            {"id": "b", "severity": "warning", "message": "CRLF in run.sh"},
            {"id": "c", "severity": "info", "message": "conda env base"}]


@pytest.mark.parametrize("verdict,fail_on,msg", [
    ("fail", "critical", "env_check verdict is fail: torch cannot see the GPU"),
    ("fail", "warning", "env_check verdict is fail: torch cannot see the GPU | CRLF in run.sh"),
    ("warn", "warning", "env_check verdict is warn: CRLF in run.sh"),
    ("warn", "critical", None),
    ("fail", "never", None),
    ("ok", "warning", None),
])
def test_the_verdict_stops_the_play_only_at_the_policy_and_names_the_findings(verdict, fail_on, msg):
    findings = FINDINGS if verdict == "fail" else FINDINGS[1:] if verdict == "warn" else FINDINGS[2:]
    decision = stop_decision({"verdict": verdict, "findings": findings}, fail_on)
    assert decision == {"stop": msg is not None, "stop_msg": msg}
