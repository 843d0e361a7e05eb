"""The status module's mount reading (plugins/modules/rgt_status.py collect_mounts) with the real `df` and with a
`df` on PATH whose inode query fails: an inode failure is a warning in the status document, never a silent gap."""

import os
import shutil
import stat
from pathlib import Path

from ansible_collections.rgt.remote_gpu.plugins.modules import rgt_status

REAL_DF = shutil.which("df")


def failing_inode_df(bin_dir: Path) -> None:
    """A `df` that answers byte queries with the real df and fails `df -i` the way a broken filesystem does."""
    bin_dir.mkdir()
    script = bin_dir / "df"
    script.write_text("#!/bin/sh\n"
                      'for a in "$@"; do [ "$a" = "-i" ] && { echo "df: cannot read inodes: Input/output error" >&2; '
                      "exit 1; }; done\n"
                      f'exec {REAL_DF} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_mounts_report_bytes_and_inodes_without_warnings(tmp_path):
    warnings = []
    mounts = rgt_status.collect_mounts([str(tmp_path)], warnings)
    assert warnings == []
    assert [m["path"] for m in mounts] == [str(tmp_path)]
    assert mounts[0]["bytes_pct"] is not None


def test_a_failed_inode_df_is_a_warning_naming_the_paths(tmp_path, monkeypatch):
    failing_inode_df(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    warnings = []
    mounts = rgt_status.collect_mounts([str(tmp_path)], warnings)
    assert [m["path"] for m in mounts] == [str(tmp_path)]
    assert mounts[0]["bytes_pct"] is not None and mounts[0]["inodes_pct"] is None
    assert len(warnings) == 1
    assert warnings[0].startswith("df -i failed (rc=1): df: cannot read inodes: Input/output error")
    assert str(tmp_path) in warnings[0]
