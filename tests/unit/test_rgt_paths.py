"""The one expansion of `~`/`{user}` and the one relative-path rule, both in rgt_runlayout (docs/internals.md
"Paths on the box"), and the callers that use them: probe evaluation, profiles, code-tree manifests."""

import os

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_probe_eval as ev
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_profiles, rgt_tree
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl


@pytest.mark.parametrize("raw, expanded", [
    ("~", "/home/ann"),
    ("~/rgt-runs", "/home/ann/rgt-runs"),
    ("/scratch/{user}/rgt-runs", "/scratch/ann/rgt-runs"),
    ("~/{user}/x", "/home/ann/ann/x"),
    ("~bob/x", "~bob/x"),            # another user's home is not ours to guess
    ("a~b", "a~b"),
    ("", ""),
    (None, None),
])
def test_expand_user_resolves_tilde_and_user_only(raw, expanded):
    assert rl.expand_user(raw, user="ann", home="/home/ann/") == expanded


def test_expand_root_also_normalises_the_path_and_defaults_to_this_login():
    assert rl.expand_root("~//rgt-runs/", user="ann", home="/home/ann") == "/home/ann/rgt-runs"
    assert rl.expand_root("/scratch/{user}", home="/h") == "/scratch/" + rl.login_user()
    assert rl.expand_root("~") == os.path.expanduser("~")
    assert rl.expand_user("https://mirror//x/{user}", user="ann") == "https://mirror//x/ann"  # values: no normpath


def test_profiles_expand_the_same_way():
    for raw in ("~/rgt-runs", "/scratch/{user}/rgt-runs", "~bob/x", "~"):
        assert rgt_profiles.expand_path(raw, "/home/ann/", "ann") == rl.expand_root(raw, "ann", "/home/ann/")


@pytest.mark.parametrize("path, reason", [
    ("weights.bin", None), ("ckpt-1/model.safetensors", None), ("a.b/c-d_e", None),
    ("/etc/passwd", "absolute"), ("C:/x", "absolute"), ("\\\\srv\\x", "absolute"),
    ("a\\b", "backslash"), ("a\x00b", "NUL"),
    ("../x", "'..'"), ("a/../b", "'..'"), ("a//b", "empty"), ("./a", "'.'"), ("a/", "empty"),
    ("", "empty"), (None, "non-string"),
])
def test_check_relpath_is_the_one_rule(path, reason):
    got = rl.check_relpath(path)
    assert (got is None) if reason is None else (reason in got), got


def test_a_code_tree_manifest_entry_with_a_backslash_is_refused_on_the_box(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").write_text("x")
    with pytest.raises(rgt_tree.TreeError, match="backslash"):
        rgt_tree.verify_tree(str(tmp_path), [{"path": "a\\b", "bytes": 1, "sha256": "0" * 64}])


def test_a_code_tree_never_ships_a_name_the_rule_refuses(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "src\\model.py").write_text("x = 1\n")  # what a Windows zip unpacks to on Linux
    doc = rgt_tree.build_manifest(str(tmp_path))
    assert [item["path"] for item in doc["manifest"]] == ["train.py"]
    assert {"path": "src\\model.py", "kind": "unsafe"} in doc["skipped"]


def test_probe_matches_a_profile_mount_written_with_user_to_the_durable_root():
    # slurm-like: the durable root is on /scratch/{user}, which survives the meter stop; / does not
    profile = {"meter_stop": {"verb": "scancel"},
               "mounts": [{"path": "/", "survives": []},
                          {"path": "/scratch/{user}", "survives": ["stop", "terminate"]}]}
    report = {"host": {"home": "/home/ann", "user": "ann"},
              "layout": {"durable_root": "/scratch/ann/rgt", "durable_root_exists": True,
                         "durable_root_writable": True, "same_filesystem": True}}
    assert [f["id"] for f in ev.layout_findings(report, profile)] == []
    report["layout"]["durable_root"] = "/home/ann/rgt"
    (f,) = ev.layout_findings(report, profile)
    assert f["id"] == "durable_root_not_surviving" and "/scratch/{user}" in f["fix"]
