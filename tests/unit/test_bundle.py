"""The one bundler of box-side code (plugins/module_utils/rgt_bundle.py, rgt.bundle, the lookup
rgt.remote_gpu.rgt_bundle): each bundle carries exactly the import closure of its entry point (checked by Python's
own modulefinder on the bundle as it lands, not by the bundler's reading), a flat bundle differs from the repo's
files only in its import lines, every box-side file imports a module_util one way, a role's files/ holds only what
the role ships, the status zipapp is reproducible and kept on the controller until a module_util changes."""

from __future__ import annotations

import ast
import io
import modulefinder
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_bundle, rgt_runlayout
from rgt import bundle, paths

REPO = Path(__file__).resolve().parents[2]
UTILS = REPO / "plugins" / "module_utils"
PKG = rgt_bundle.PACKAGE
OPTIONAL = {"numpy", "torch", "safetensors"}  # the checkpoint loaders, imported only when present
BOX_SIDE = sorted([*(REPO / "plugins" / "modules").glob("*.py"), *UTILS.glob("*.py"), *REPO.glob("roles/*/files/*.py")])


def lay_out(built, where: Path) -> Path:
    """The bundle's files as they land: a flat directory, or the zipapp unpacked (what sshround's SHIP does)."""
    where.mkdir()
    if built.layout == rgt_bundle.PACKAGED:
        _digest, data = rgt_bundle.zipapp(built)
        zipfile.ZipFile(io.BytesIO(data)).extractall(where)
    else:
        for name, text in built.files.items():
            (where / name).write_text(text)
    return where


# ---------------------------------------------------------------- what each bundle carries

@pytest.mark.parametrize("name", list(rgt_bundle.BUNDLES))
def test_each_bundle_carries_exactly_the_import_closure_of_its_entry(name, tmp_path):
    built = rgt_bundle.build(name)
    where = lay_out(built, tmp_path / name)
    finder = modulefinder.ModuleFinder(path=[str(where)])  # only the bundle: what it lacks stays unfound
    finder.run_script(str(where / built.entry))
    found = {os.path.relpath(m.__file__, where) for m in finder.modules.values()
             if m.__file__ and m.__file__.startswith(str(where))}
    assert found == set(built.files), name
    missing = {n.split(".")[0] for n in finder.badmodules}
    assert missing - set(sys.stdlib_module_names) - OPTIONAL == set(), f"{name} imports what it does not carry"
    assert built.files[built.entry] is not None and list(built.files)[0] == built.entry


def test_the_bundles_are_the_ones_their_carriers_need():
    flat = {name: list(rgt_bundle.build(name).files) for name in rgt_bundle.BUNDLES
            if name not in ("status", "seal")}
    layout = ["rgt_runlayout.py", "rgt_states.py"]  # rgt_runlayout imports the run-state vocabulary
    seal = ["rgt_seal.py", "rgt_manifest.py", "rgt_outputs.py", "rgt_slurm.py"]  # the seal at a job's end (offload)
    # the box's own meter stop (rgt_inbox) reads the box's listing (rgt_boxlist: its sweeps and Slurm records too)
    inbox = ["rgt_inbox.py", "rgt_boxlist.py"]
    assert flat == {"wrapper": ["wrapper.py"] + inbox + ["rgt_offload.py"] + layout + ["rgt_slurm.py", "rgt_sweep.py",
                                                                                   "rgt_seal.py", "rgt_manifest.py",
                                                                                   "rgt_outputs.py"],
                    "queue": ["queue.py"] + layout,
                    "k8s_stage": ["rgt_k8s_stage.py"] + layout,
                    "k8s_seal": ["rgt_k8s_seal.py", "rgt_manifest.py"] + layout + ["rgt_seal.py", "rgt_outputs.py",
                                                                                   "rgt_slurm.py"],
                    "ckpt_loader": ["rgt_manifest.py"] + layout}
    status = rgt_bundle.build("status").files
    utils = "ansible_collections/rgt/remote_gpu/plugins/module_utils/"
    for util in ("rgt_statusdoc", "rgt_logread", "rgt_sweep", "rgt_runlayout", "rgt_reconcile", "rgt_history"):
        assert utils + util + ".py" in status
    assert utils + "rgt_cloud.py" not in status and utils + "rgt_statusround.py" not in status  # it is __main__
    assert status["__main__.py"] == (UTILS / "rgt_statusround.py").read_text()
    seal = rgt_bundle.build("seal").files  # the pull round's: the closeout's own code, and none of the status's
    assert seal["__main__.py"] == (UTILS / "rgt_sealround.py").read_text()
    assert utils + "rgt_seal.py" in seal and utils + "rgt_statusdoc.py" not in seal


@pytest.mark.parametrize("name", [n for n, s in rgt_bundle.BUNDLES.items() if s.layout == rgt_bundle.FLAT])
def test_a_flat_bundle_differs_from_the_repo_only_in_its_collection_import_lines(name):
    built = rgt_bundle.build(name)
    for file, text in built.files.items():
        original = (REPO / built.sources[file]).read_text()
        tree = ast.parse(original)
        import_lines = {line for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and (node.module or "").startswith(PKG) for line in range(node.lineno, node.end_lineno + 1)}
        old, new = original.splitlines(), text.splitlines()
        assert len(old) == len(new), f"{file}: the line numbers of a traceback stay the repo's"
        changed = {i + 1 for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b}
        assert changed <= import_lines and (changed or not import_lines), file
        assert "ansible_collections" not in {n.module.split(".")[0] for n in ast.walk(ast.parse(text))
                                             if isinstance(n, ast.ImportFrom) and n.module}, file
        if not import_lines:
            assert text == original, f"{file} imports no module_util: shipped byte for byte"


def test_a_flat_bundle_runs_with_only_its_own_directory(tmp_path):
    """The checkpoint loader under a plain python3 -S -E (no site-packages, no PYTHONPATH): its module_util is found
    beside it, with no sys.path line in any file."""
    if not Path("/usr/bin/python3").exists():
        pytest.skip("needs /usr/bin/python3")
    where = lay_out(rgt_bundle.build("ckpt_loader"), tmp_path / "loader")
    ckpt = tmp_path / "w.safetensors"
    ckpt.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    proc = subprocess.run(["/usr/bin/python3", "-S", "-E", str(where / "rgt_manifest.py"), str(ckpt), "ckpt/w"],
                          capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith('"detail": "0 tensors"}') and '"ok": true' in proc.stdout


def test_the_digest_names_the_contents():
    built = rgt_bundle.build("wrapper")
    assert built.digest == rgt_bundle.digest_of(built.files) == rgt_bundle.build("wrapper").digest
    assert rgt_bundle.digest_of(dict(built.files, **{"wrapper.py": built.files["wrapper.py"] + "#"})) != built.digest
    assert built.as_dict() == {"name": "wrapper", "entry": "wrapper.py", "digest": built.digest,
                               "files": dict(built.files)}


def test_the_lookup_gives_the_bundle_and_names_an_unknown_one():
    from ansible.errors import AnsibleError  # imported here: Ansible reads its settings ($HOME) at import

    from ansible_collections.rgt.remote_gpu.plugins.lookup.rgt_bundle import LookupModule

    assert LookupModule().run(["wrapper", "queue"]) == [rgt_bundle.build("wrapper").as_dict(),
                                                        rgt_bundle.build("queue").as_dict()]
    with pytest.raises(AnsibleError, match="no bundle 'wrap' .known: status, wrapper, queue"):
        LookupModule().run(["wrap"])


@pytest.mark.parametrize("line, words", [
    ("import rgt_b", "`import rgt_b`: import a module_util as `from %s import <name>`" % PKG),
    ("from rgt_b import x", "`from rgt_b import ...`"),
    ("from . import rgt_b", "`from . import ...`"),
    ("from ansible.module_utils.basic import AnsibleModule", "box-side code runs without Ansible"),
    ("from %s import rgt_nothing" % PKG, "rgt_nothing is not a module_util of this collection"),
])
def test_the_bundler_refuses_a_source_it_cannot_ship_naming_file_and_line(tmp_path, line, words):
    utils = tmp_path / "plugins" / "module_utils"
    utils.mkdir(parents=True)
    (utils / "rgt_b.py").write_text("x = 1\n")
    (utils / "rgt_manifest.py").write_text("import os\n\n%s\n" % line)
    with pytest.raises(rgt_bundle.BundleError) as err:
        rgt_bundle.build("ckpt_loader", str(tmp_path))
    assert str(err.value).startswith("plugins/module_utils/rgt_manifest.py:3: ") and words in str(err.value)


def test_a_multiline_import_keeps_its_line_count_and_the_rest_of_the_file(tmp_path):
    utils = tmp_path / "plugins" / "module_utils"
    utils.mkdir(parents=True)
    (utils / "rgt_b.py").write_text("x = 1\n")
    (utils / "rgt_c.py").write_text("y = 2\n")
    source = ("import os\n"
              "from %s import (  # the two\n    rgt_b,\n    rgt_c as c,\n)  # noqa: E402\n"
              "from %s.rgt_b import (\n    x,\n)\n"
              "print('from %s import rgt_b')\n" % (PKG, PKG, PKG))
    flat = rgt_bundle.flat_source(source, str(utils))
    assert flat == ("import os\nimport rgt_b, rgt_c as c\n\n\n  # noqa: E402\nfrom rgt_b import (\n    x,\n)\n"
                    "print('from %s import rgt_b')\n" % PKG)
    assert rgt_bundle.closure(source, str(utils)) == ["rgt_b", "rgt_c"]


# ---------------------------------------------------------------- one import style

def _violations(path: Path) -> list[str]:
    utils = {p.stem for p in UTILS.glob("*.py")}
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            out.append(f"{where}: sys.path")
        elif isinstance(node, ast.Import):
            out += [f"{where}: import {a.name}" for a in node.names
                    if a.name.split(".")[0] in utils or a.name.startswith("ansible_collections")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module.split(".")[0] in utils or (module.startswith("ansible_collections")
                                                                 and not module.startswith(PKG)):
                out.append(f"{where}: from {'.' * node.level}{module} import")
        elif isinstance(node, ast.Try):
            catches_import_error = any("ImportError" in ast.dump(h.type) for h in node.handlers if h.type)
            guarded = [n for n in ast.walk(ast.Module(body=node.body, type_ignores=[]))
                       if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(PKG)]
            if catches_import_error and guarded:
                out.append(f"{where}: a module_util import with an ImportError fallback")
    return out


def test_every_box_side_file_imports_a_module_util_one_way():
    """`from ansible_collections.rgt.remote_gpu.plugins.module_utils import x` (the one style AnsiballZ follows):
    no flat import, no sys.path, no relative import, no ImportError fallback, in every module, module_util and
    role script."""
    assert len(BOX_SIDE) > 30
    assert [v for path in BOX_SIDE for v in _violations(path)] == []


def test_a_roles_files_hold_only_what_the_role_ships():
    """A script under roles/<role>/files/ is named by a role's tasks, or is the entry of a bundle the role's tasks
    look up; the runner's own box-side scripts (the Kubernetes stage and seal) live with the module_utils."""
    tasks = {role.name: " ".join(p.read_text() for p in role.glob("tasks/*.yml")) for role in REPO.glob("roles/*")}
    everything = " ".join(tasks.values())
    for script in REPO.glob("roles/*/files/*"):
        role = script.parts[-3]
        looked_up = [name for name, spec in rgt_bundle.BUNDLES.items() if REPO / spec.source == script
                     and f"lookup('rgt.remote_gpu.rgt_bundle', '{name}')" in tasks[role]]
        assert script.name in everything or looked_up, f"{script.relative_to(REPO)} is not shipped by a role"
    for name in ("k8s_stage", "k8s_seal", "status"):
        assert rgt_bundle.BUNDLES[name].source.startswith("plugins/module_utils/")


# ---------------------------------------------------------------- installing a flat bundle on a box

def test_a_bundle_is_installed_entry_0755_module_utils_0644_and_only_when_different(tmp_path):
    built = rgt_bundle.build("wrapper")
    names = ["wrapper.py"] + sorted(set(built.files) - {"wrapper.py"})
    assert rgt_runlayout.install_bundle(str(tmp_path), built.files, built.entry) == [(n, True) for n in names]
    assert stat.S_IMODE((tmp_path / "wrapper.py").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "rgt_runlayout.py").stat().st_mode) == 0o644
    inode = (tmp_path / "wrapper.py").stat().st_ino
    assert rgt_runlayout.install_bundle(str(tmp_path), built.files, built.entry) == [(n, False) for n in names]
    assert (tmp_path / "wrapper.py").stat().st_ino == inode
    for bad in ({"../x.py": "", "wrapper.py": ""}, {".hidden": "", "wrapper.py": ""}, {"a.py": ""}):
        with pytest.raises(ValueError):
            rgt_runlayout.install_bundle(str(tmp_path / "new"), bad, "wrapper.py")
    assert not (tmp_path / "new").exists() and not (tmp_path.parent / "x.py").exists()


# ---------------------------------------------------------------- the status zipapp (rgt.bundle)

def test_zipapp_is_reproducible_and_carries_the_imported_module_utils():
    status = rgt_bundle.build("status")
    assert rgt_bundle.zipapp(status) == rgt_bundle.zipapp(rgt_bundle.build("status"))
    with zipfile.ZipFile(io.BytesIO(rgt_bundle.zipapp(status)[1])) as zf:
        assert sorted(zf.namelist()) == sorted(status.files)
        assert {i.date_time for i in zf.infolist()} == {rgt_bundle.ZIP_DATE}
    with pytest.raises(rgt_bundle.BundleError):
        rgt_bundle.zipapp(rgt_bundle.build("wrapper"))


def test_zipapp_hash_changes_with_the_code(tmp_path):
    utils = tmp_path / "module_utils"
    shutil.copytree(paths.MODULE_UTILS_DIR, utils, ignore=shutil.ignore_patterns("__pycache__"))
    before, _ = bundle.build_zipapp(utils)
    with open(utils / "rgt_history.py", "a") as fh:
        fh.write("\n# changed\n")
    after, _ = bundle.build_zipapp(utils)
    assert before != after


def test_the_built_zipapp_is_kept_on_the_controller_until_a_module_util_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    utils = tmp_path / "module_utils"
    shutil.copytree(paths.MODULE_UTILS_DIR, utils, ignore=shutil.ignore_patterns("__pycache__"))
    built = bundle.load_zipapp(utils)
    assert built == bundle.build_zipapp(utils)

    def no_build(_utils=None):
        raise AssertionError("built again although nothing changed")

    monkeypatch.setattr(bundle, "build_zipapp", no_build)
    assert bundle.load_zipapp(utils) == built  # the next process reads it
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with open(utils / "rgt_history.py", "a") as fh:
        fh.write("\n# changed\n")
    changed = bundle.load_zipapp(utils)
    assert changed[0] != built[0] and changed == bundle.build_zipapp(utils)
