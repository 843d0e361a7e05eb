"""What a fresh `rgt-run` process imports before its first round: nothing it does not use on the way (the cost
itself is measured by bench/status_bench.py --profile, never asserted)."""

from __future__ import annotations

import subprocess
import sys

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud
from rgt import automove


def test_a_status_or_watch_process_imports_no_http_client_until_a_platform_api_is_asked():
    code = "import sys, rgt.cli, rgt.status, rgt.automove; print('ansible.module_utils.urls' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_the_platforms_word_for_gone_is_rgt_clouds():
    assert automove.PLATFORM_GONE[0] == rgt_cloud.GONE
