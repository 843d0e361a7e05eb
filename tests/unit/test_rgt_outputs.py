"""rgt_outputs: declared outputs/checkpoints as files, directories and globs, never through a symlink."""

import os

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_outputs as outs


@pytest.fixture
def run(tmp_path):
    """A run dir with an HF-style output dir, loose files, and an outside directory to link to."""
    run_dir = tmp_path / "run"
    out = run_dir / "out"
    for step in (500, 1000):
        ck = out / "hf" / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        (ck / "model.safetensors").write_bytes(b"m%d" % step)
        (ck / "trainer_state.json").write_text("{}")
    (out / "hf" / "config.json").write_text("{}")
    (out / "metrics.json").write_text('{"loss": 1}')
    (out / "eval.json").write_text("{}")
    (out / ".hidden.json").write_text("{}")
    (run_dir / "ckpt").mkdir()
    (run_dir / "ckpt" / "step_10.pt").write_bytes(b"c")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours")
    return run_dir, outside


def resolve(run_dir, entries, sub="out"):
    fd = outs.open_run_subdir(str(run_dir), sub)
    try:
        return outs.resolve(fd, entries, sub + "/")
    finally:
        if fd is not None:
            os.close(fd)


def test_files_directories_and_globs_resolve_to_regular_files(run):
    run_dir, _ = run
    res = resolve(run_dir, ["metrics.json", "hf/", "*.json", "hf/checkpoint-*/model.safetensors"])
    assert res["missing"] == [] and res["problems"] == []
    assert res["files"] == ["eval.json", "hf/checkpoint-1000/model.safetensors",
                            "hf/checkpoint-1000/trainer_state.json", "hf/checkpoint-500/model.safetensors",
                            "hf/checkpoint-500/trainer_state.json", "hf/config.json", "metrics.json"]
    glob = resolve(run_dir, ["hf/checkpoint-*/model.safetensors"])
    assert glob["files"] == ["hf/checkpoint-1000/model.safetensors", "hf/checkpoint-500/model.safetensors"]
    assert resolve(run_dir, [".*.json"])["files"] == [".hidden.json"]  # a leading dot is matched only explicitly
    assert resolve(run_dir, ["checkpoint-[0-9]*"], "out")["missing"] == ["checkpoint-[0-9]*"]


def test_missing_entries_and_unmatched_globs_are_named(run):
    run_dir, _ = run
    res = resolve(run_dir, ["model.pt", "hf/checkpoint-*/pytorch_model.bin", "metrics.json/", "metrics.json/x"])
    assert res["missing"] == ["model.pt", "hf/checkpoint-*/pytorch_model.bin", "metrics.json/", "metrics.json/x"]
    assert outs.missing_words("hf/checkpoint-*/pytorch_model.bin", "out/") == \
        "required output out/hf/checkpoint-*/pytorch_model.bin matches nothing"
    assert outs.missing_words("model.pt", "out/") == "required output out/model.pt is missing"
    assert resolve(run_dir, ["x"], "nope")["missing"] == ["x"]  # the base dir itself is absent


@pytest.mark.parametrize("entry", ["../x", "/etc/passwd", "a/../../b", "", "a//b", "./a"])
def test_escaping_entries_are_refused(run, entry):
    run_dir, _ = run
    res = resolve(run_dir, [entry])
    assert res["files"] == [] and res["missing"] == [] and "is refused" in res["problems"][0]
    with pytest.raises(ValueError):
        outs.split_entry(entry)


def test_a_symlinked_component_is_refused_never_followed(run):
    run_dir, outside = run
    out = run_dir / "out"
    os.symlink(str(outside), out / "sub")
    for entry in ("sub/secret.txt", "sub", "s*/secret.txt", "*"):
        res = resolve(run_dir, [entry])
        assert any(p.startswith("out/sub is a symlink -> %s" % outside) for p in res["problems"]), (entry, res)
        assert not any("secret" in f for f in res["files"])
    os.unlink(out / "sub")
    os.symlink("metrics.json", out / "hf" / "checkpoint-500" / "alias.json")  # a link inside an output dir
    res = resolve(run_dir, ["hf"])
    assert res["problems"] == ["out/hf/checkpoint-500/alias.json is a symlink -> metrics.json (nothing is followed)"]


def test_out_itself_as_a_symlink_is_refused(run, tmp_path):
    run_dir, outside = run
    os.rename(run_dir / "ckpt", tmp_path / "real-ckpt")
    os.symlink(str(tmp_path / "real-ckpt"), run_dir / "ckpt")
    with pytest.raises(outs.Refused, match="ckpt/ is a symlink"):
        outs.open_run_subdir(str(run_dir), "ckpt")
    assert outs.present(str(run_dir), "ckpt", ["step_10.pt"]) == {"step_10.pt": False}
    assert outs.open_run_subdir(str(run_dir), "absent") is None


def test_present_for_the_status_poll(run):
    run_dir, outside = run
    os.symlink(str(outside), run_dir / "out" / "sub")
    got = outs.present(str(run_dir), "out", ["hf/", "hf/checkpoint-*/model.safetensors", "*.bin", "sub/secret.txt",
                                             "metrics.json", "../escape"])
    assert got == {"hf/": True, "hf/checkpoint-*/model.safetensors": True, "*.bin": False, "sub/secret.txt": False,
                   "metrics.json": True, "../escape": False}
    assert outs.present(str(run_dir / "gone"), "out", ["metrics.json"]) == {"metrics.json": False}


def test_copy_reads_the_opened_file_and_refuses_a_link(run, tmp_path):
    run_dir, outside = run
    fd = outs.open_run_subdir(str(run_dir), "out")
    try:
        src = run_dir / "out" / "hf" / "checkpoint-500" / "model.safetensors"
        os.utime(src, ns=(1_000_000_000, 1_500_000_000))
        dst = tmp_path / "copy" / "hf" / "model.safetensors"
        outs.copy_file(fd, "hf/checkpoint-500/model.safetensors", str(dst), "out/")
        assert dst.read_bytes() == b"m500" and dst.stat().st_mtime_ns == 1_500_000_000
        os.rename(run_dir / "out" / "hf", tmp_path / "hf-real")  # a link swapped in after the resolution
        os.symlink(str(tmp_path / "hf-real"), run_dir / "out" / "hf")
        with pytest.raises(outs.Refused, match="out/hf is a symlink"):
            outs.copy_file(fd, "hf/checkpoint-500/model.safetensors", str(tmp_path / "copy2"), "out/")
        os.symlink(str(outside / "secret.txt"), run_dir / "out" / "leak.txt")
        with pytest.raises(outs.Refused, match="out/leak.txt is a symlink"):
            outs.copy_file(fd, "leak.txt", str(tmp_path / "copy3"), "out/")
        assert not (tmp_path / "copy2").exists() and not (tmp_path / "copy3").exists()
    finally:
        os.close(fd)


def test_special_files_are_refused(run):
    run_dir, _ = run
    os.mkfifo(run_dir / "out" / "pipe.json")
    res = resolve(run_dir, ["*.json"])
    assert res["problems"] == ["out/pipe.json is not a regular file or directory"]
    assert "eval.json" in res["files"]


def test_match_listed_covers_files_directories_and_globs():
    listed = ["ckpt/a/x.pt", "ckpt/a/y.pt", "ckpt/ab.pt", "ckpt/step-1/w.safetensors", "ckpt/step-2/w.safetensors",
              "out/step-1/w.safetensors", "run.json"]
    assert outs.match_listed(listed, "a", "ckpt") == ["ckpt/a/x.pt", "ckpt/a/y.pt"]
    assert outs.match_listed(listed, "ab.pt", "ckpt") == ["ckpt/ab.pt"]
    assert outs.match_listed(listed, "ab.pt/", "ckpt") == []
    assert outs.match_listed(listed, "step-*/", "ckpt") == ["ckpt/step-1/w.safetensors", "ckpt/step-2/w.safetensors"]
    assert outs.match_listed(listed, "*/y.pt", "ckpt") == ["ckpt/a/y.pt"]
    assert outs.match_listed(listed, "../out", "ckpt") == []
