# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The one bundler of box-side code that is not an Ansible module (docs/internals.md "Box-side code"): given an
entry point (a module_util or a script), it follows the entry's imports of this collection's module_utils, and
theirs, and gives one artefact with a content hash. Runs on the controller only (the runner, through
runner/rgt/bundle.py, and the lookup plugin rgt.remote_gpu.rgt_bundle); it is never shipped itself.

One import style everywhere: box-side code (modules, module_utils, the scripts) imports a module_util as
``from ansible_collections.rgt.remote_gpu.plugins.module_utils import x`` (or ``...module_utils.x import name``),
never flat, never through sys.path, never in a try/except fallback. That is the only style AnsiballZ follows
(Ansible ships a module_util inside a module's zip only when it is imported by that path), so it works for modules
too. A bundle then lays the files out for its carrier:

- ``package``: the module_utils under ``ansible_collections/rgt/remote_gpu/plugins/module_utils/`` (with the
  package ``__init__`` files) and the entry as ``__main__.py``: the status round's zipapp (runner/rgt/sshround.py),
  unpacked on the box and run as ``python3 <dir>/__main__.py``.
- ``flat``: the entry and its module_utils side by side in one directory, each module_util by its own name
  (``rgt_runlayout.py``), every collection import rewritten to the flat form (``import rgt_runlayout as rl``,
  ``from rgt_runlayout import name``; the line numbers stay the same). Python puts a script's own directory first
  on sys.path, so the entry finds its module_utils there with no sys.path manipulation. The carriers that hold one
  directory of named files: the run's ``.rgt/`` (the wrapper, rgt_launch ``wrapper_bundle``), the sweep's
  ``.rgt/`` (the queue, ``queue_bundle``), the Kubernetes stage and seal ConfigMaps (a ConfigMap key cannot hold a
  ``/``) and the checkpoint loader (rgt_closeout ``loader_bundle``).

No list of which module_utils a script needs is kept anywhere: the closure is read from the imports. A bundled
file may import only the stdlib and this collection's module_utils (box-side code runs without Ansible); anything
else in the closure is a BundleError naming the file and the line.

- ``build(name, root=None, utils_dir=None) -> Bundle``: one of BUNDLES, read from the collection at ``root``.
- ``closure(source, utils_dir)``: the module_util names a source reaches, in a stable order.
- ``flat_source(source, where)``: a source with its collection imports in the flat form.
- ``zipapp(bundle) -> (digest, bytes)``: a package bundle as a reproducible zip, named by its SHA-256.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ast
import collections
import hashlib
import io
import os
import re
import zipfile

PACKAGE = "ansible_collections.rgt.remote_gpu.plugins.module_utils"
PACKAGE_DIR = PACKAGE.replace(".", "/")
UTILS_REL = "plugins/module_utils"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the collection root
DIGEST_LEN = 20
ZIP_DATE = (2020, 1, 1, 0, 0, 0)  # every member's date: the same code gives the same bytes
FLAT, PACKAGED = "flat", "package"

# What each bundle carries: its layout, its entry point (relative to the collection root) and the entry's name in
# the bundle; the module_utils come from the entry's imports.
Spec = collections.namedtuple("Spec", "layout source entry about")
BUNDLES = collections.OrderedDict([
    ("status", Spec(PACKAGED, UTILS_REL + "/rgt_statusround.py", "__main__.py",
                    "the status round's zipapp: status documents, log reads, sweep rosters (runner/rgt/sshround.py)")),
    ("wrapper", Spec(FLAT, "roles/launch_detached/files/rgt_wrapper.py", "wrapper.py",
                     "the job wrapper, installed in <run_dir>/.rgt/ by rgt_launch and the Kubernetes stage")),
    ("queue", Spec(FLAT, "roles/launch_detached/files/rgt_queue.py", "queue.py",
                   "a sweep's queue, installed in <sweep_dir>/.rgt/ by rgt_launch")),
    ("k8s_stage", Spec(FLAT, UTILS_REL + "/rgt_k8s_stage.py", "rgt_k8s_stage.py",
                       "the Kubernetes Job's init container that stages the run dir (runner/rgt/k8s.py)")),
    ("k8s_seal", Spec(FLAT, UTILS_REL + "/rgt_k8s_seal.py", "rgt_k8s_seal.py",
                      "the Kubernetes seal pod's closeout (runner/rgt/k8s_engine.py)")),
    ("ckpt_loader", Spec(FLAT, UTILS_REL + "/rgt_manifest.py", "rgt_manifest.py",
                         "the checkpoint load check run by the job's python (rgt_closeout loader_bundle)")),
    ("seal", Spec(PACKAGED, UTILS_REL + "/rgt_sealround.py", "__main__.py",
                  "the pull round's zipapp: every run of a box sealed in one call (runner/rgt/pullround.py)")),
])


class BundleError(Exception):
    """A box-side source the bundler cannot ship: it names the file, the line and the fix."""


class Bundle(collections.namedtuple("Bundle", "name layout entry files sources digest")):
    """One artefact: `files` {name in the bundle: text}, in a stable order (the entry first); `sources` {name:
    where it was read, relative to the collection root}; `digest` the first DIGEST_LEN hex of the SHA-256 of the
    names and contents."""

    def as_dict(self):
        """What a module receives (rgt_launch wrapper_bundle/queue_bundle, rgt_closeout loader_bundle)."""
        return {"name": self.name, "entry": self.entry, "digest": self.digest, "files": dict(self.files)}


def digest_of(files):
    """The content hash of a set of files {name: text or bytes}: names and contents, in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        h.update(name.encode("utf-8") + b"\0" + (data if isinstance(data, bytes) else data.encode("utf-8")) + b"\0")
    return h.hexdigest()[:DIGEST_LEN]


# ---------------------------------------------------------------- reading imports

def _parse(source, where):
    try:
        return ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise BundleError("%s:%s does not parse: %s" % (where, exc.lineno, exc.msg)) from None


def _collection_imports(tree, where, utils_dir):
    """[(node, [module_util names])] for every import of this collection in `tree`; BundleError for an import a
    bundle cannot carry (another style, Ansible, another collection)."""
    found = []

    def flat_util(name):
        return "." not in name and name.startswith("rgt_") and os.path.isfile(os.path.join(utils_dir, name + ".py"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in ("ansible_collections", "ansible") or flat_util(alias.name):
                    raise BundleError("%s:%d: `import %s`: import a module_util as `from %s import <name>`; box-side "
                                      "code runs without Ansible" % (where, node.lineno, alias.name, PACKAGE))
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level or flat_util(module):
            raise BundleError("%s:%d: `from %s%s import ...`: import a module_util as `from %s import <name>`"
                              % (where, node.lineno, "." * node.level, module, PACKAGE))
        if module == PACKAGE:
            names = [alias.name for alias in node.names]
        elif module.startswith(PACKAGE + ".") and "." not in module[len(PACKAGE) + 1:]:
            names = [module[len(PACKAGE) + 1:]]
        elif module.split(".")[0] in ("ansible_collections", "ansible"):
            raise BundleError("%s:%d: `from %s import ...`: box-side code runs without Ansible and imports only the "
                              "stdlib and %s" % (where, node.lineno, module, PACKAGE))
        else:
            continue
        for name in names:
            if name == "*" or not os.path.isfile(os.path.join(utils_dir, name + ".py")):
                raise BundleError("%s:%d: %s is not a module_util of this collection (%s)"
                                  % (where, node.lineno, name, UTILS_REL))
        found.append((node, names))
    return found


def closure(source, utils_dir, where="<source>"):
    """The module_util names `source` reaches through its imports and theirs, in the order first met (depth first,
    each file's imports in source order)."""
    order, seen = [], set()

    def visit(text, at):
        tree = _parse(text, at)
        for _node, names in sorted(_collection_imports(tree, at, utils_dir), key=lambda item: item[0].lineno):
            for name in names:
                if name not in seen:
                    seen.add(name)
                    order.append(name)
                    path = os.path.join(utils_dir, name + ".py")
                    visit(_read(path), "%s/%s.py" % (UTILS_REL, name))

    visit(source, where)
    return order


# ---------------------------------------------------------------- the flat form

def _offsets(data):
    """The byte offset where each line starts (1-based line numbers, as ast counts them)."""
    starts = [0, 0]
    index = data.find(b"\n")
    while index >= 0:
        starts.append(index + 1)
        index = data.find(b"\n", index + 1)
    return starts


def _flat_statement(node):
    """`from PKG import a as b, c` as `import a as b, c` (one line)."""
    return "import " + ", ".join(a.name + (" as " + a.asname if a.asname else "") for a in node.names)


def flat_source(source, utils_dir, where="<source>"):
    """`source` with every import of this collection's module_utils in the flat form, each statement in place
    (a statement over several lines keeps its line count: the lines after it keep their numbers)."""
    data = source.encode("utf-8")
    starts = _offsets(data)
    edits = []
    for node, _names in _collection_imports(_parse(source, where), where, utils_dir):
        begin = starts[node.lineno] + node.col_offset
        end = starts[node.end_lineno] + node.end_col_offset
        old = data[begin:end].decode("utf-8")
        if node.module == PACKAGE:
            new = _flat_statement(node) + "\n" * old.count("\n")
        else:
            new = re.sub(r"^from\s+" + re.escape(PACKAGE) + r"\.", "from ", old)
        edits.append((begin, end, new.encode("utf-8")))
    for begin, end, new in sorted(edits, reverse=True):
        data = data[:begin] + new + data[end:]
    return data.decode("utf-8")


# ---------------------------------------------------------------- bundles

def _read(path):
    with io.open(path, encoding="utf-8") as handle:
        return handle.read()


def build(name, root=None, utils_dir=None):
    """The bundle `name` (a key of BUNDLES) of the collection at `root` (default: this one), its module_utils read
    from `utils_dir` (default: root/plugins/module_utils). BundleError for an unknown name or a source it cannot
    carry."""
    if name not in BUNDLES:
        raise BundleError("no bundle %r (known: %s)" % (name, ", ".join(BUNDLES)))
    spec = BUNDLES[name]
    root = root or ROOT
    utils_dir = utils_dir or os.path.join(root, UTILS_REL)
    if spec.source.startswith(UTILS_REL + "/"):
        entry_path = os.path.join(utils_dir, spec.source[len(UTILS_REL) + 1:])
    else:
        entry_path = os.path.join(root, spec.source)
    entry_text = _read(entry_path)
    entry_util = os.path.splitext(os.path.basename(spec.source))[0] if spec.source.startswith(UTILS_REL + "/") \
        else None
    utils = [u for u in closure(entry_text, utils_dir, spec.source) if u != entry_util]
    files, sources = collections.OrderedDict(), collections.OrderedDict()

    def add(bundle_name, text, source):
        files[bundle_name] = text
        sources[bundle_name] = source

    if spec.layout == FLAT:
        add(spec.entry, flat_source(entry_text, utils_dir, spec.source), spec.source)
        for util in utils:
            rel = "%s/%s.py" % (UTILS_REL, util)
            add(util + ".py", flat_source(_read(os.path.join(utils_dir, util + ".py")), utils_dir, rel), rel)
    else:
        add(spec.entry, entry_text, spec.source)
        parts = PACKAGE_DIR.split("/")
        for depth in range(1, len(parts) + 1):
            add("/".join(parts[:depth]) + "/__init__.py", "", None)
        for util in utils:
            rel = "%s/%s.py" % (UTILS_REL, util)
            add("%s/%s.py" % (PACKAGE_DIR, util), _read(os.path.join(utils_dir, util + ".py")), rel)
    return Bundle(name, spec.layout, spec.entry, files, sources, digest_of(files))


def zipapp(bundle):
    """(hash, bytes) of a package bundle as a zip: sorted names, fixed dates and modes, so the same code gives the
    same bytes; the hash is the first DIGEST_LEN hex of the SHA-256 of those bytes (the name of its copy on a box)."""
    if bundle.layout != PACKAGED:
        raise BundleError("bundle %s is %s; only a package bundle is a zipapp" % (bundle.name, bundle.layout))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(bundle.files):
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, bundle.files[name].encode("utf-8"))
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest()[:DIGEST_LEN], data
