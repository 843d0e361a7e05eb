"""rgt stage of a Kubernetes run: the Job's init container, run at every start of its pod.

Usage: <python> /rgt-stage/rgt_k8s_stage.py <run_dir>

The run's ConfigMap (plugins/module_utils/rgt_k8s.py, built by runner/rgt/k8s.py) is mounted read-only next to this
file, and the durable claim at the durable root. This script makes <run_dir> what the launch module makes on a box
(docs/internals.md "Run spine") before the wrapper starts in the main container:

- the layout dirs (.rgt, ckpt, out, logs);
- code.tar.gz, when the ConfigMap holds one, extracted into <run_dir>/code-<hash8>/ when that dir does not exist
  yet: into a temp sibling (one a killed pod left is removed first), then one rename. hash8 is the code tree's
  hash (rgt_tree: SHA-256 of the sorted "<path>\\0<sha256>\\n" lines of the files, first 8 hex), computed here
  from the tarball, so it names the same code the upload would; job.json's code_dir must be that dir. Only plain
  files and dirs with safe relative names are accepted: an absolute name, '..', a symlink, a hard link or a
  device refuses the whole tarball;
- .rgt/wrapper.py (0755), .rgt/rgt_runlayout.py and .rgt/rgt_states.py (0644) and, last, .rgt/job.json (0600),
  each written atomically (tmp + fsync + rename) and only when its bytes differ. Without code.tar.gz the code is
  in the image: job.json's code_dir (rgt_job.k8s.workdir) must be a directory there.

Idempotent: the Job controller may start a new pod after an eviction, and a second run changes nothing. Exit 0
when staged, 1 with one line on stderr when not (the pod then fails before the wrapper starts).

Stdlib only, Python 3.6+. Imports rgt_runlayout from its own directory (the ConfigMap holds it, and the rgt_states
it imports).
"""

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import rgt_runlayout as rl
finally:
    del sys.path[0]

STAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CODE_TARBALL = "code.tar.gz"
RECORD_PREFIX = "k8s."  # k8s.<file>: a manifest the run was applied from, kept as <run_dir>/.rgt/k8s/<file>
# (file in the ConfigMap, path under <run_dir>/.rgt, mode); job.json last: it names the code dir staged before it
INSTALLS = (("wrapper.py", "wrapper.py", 0o755), ("rgt_runlayout.py", "rgt_runlayout.py", 0o644),
            ("rgt_states.py", "rgt_states.py", 0o644), ("job.json", "job.json", 0o600))


class StageError(Exception):
    pass


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def tar_members(tar):
    """The tarball's members after the safety rules (StageError naming the first bad one): plain files and dirs
    only, each name a safe relative path (rgt_runlayout.check_relpath: not absolute, no '..', '.' or empty
    component), no name twice."""
    members, seen = [], set()
    for member in tar.getmembers():
        name = member.name
        if member.issym() or member.islnk():
            raise StageError("%s is a %s link to %r: refused (the code is shipped as plain files only)"
                             % (name, "symbolic" if member.issym() else "hard", member.linkname))
        if not (member.isfile() or member.isdir()):
            raise StageError("%s is not a plain file or directory (a device, fifo or other special file): refused"
                             % name)
        problem = rl.check_relpath(name.rstrip("/") if member.isdir() else name)
        if problem:
            raise StageError("%r is not a safe relative name (%s): refused" % (name, problem))
        if name in seen:
            raise StageError("%s appears twice in the tarball: refused" % name)
        seen.add(name)
        members.append(member)
    return members


def tree_hash8(tar, members):
    """hash8 of the tarball's files, rgt_tree's rule: SHA-256 of the sorted "<path>\\0<sha256>\\n" lines."""
    lines = []
    for member in members:
        if member.isfile():
            digest = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
            lines.append(member.name.encode("utf-8") + b"\0" + digest.encode("ascii") + b"\n")
    return hashlib.sha256(b"".join(sorted(lines))).hexdigest()[:8]


def extract(tar, members, target):
    """Every member under `target` (a fresh dir): files created exclusively (never through an existing name),
    0755 when the tarball marks them executable, else 0644; each fsynced."""
    for member in members:
        path = os.path.join(target, member.name)
        if member.isdir():
            if not os.path.isdir(path):
                os.makedirs(path)
            continue
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.makedirs(parent)
        mode = 0o755 if member.mode & 0o111 else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
        with os.fdopen(fd, "wb") as handle:
            shutil.copyfileobj(tar.extractfile(member), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(path, mode)


def stage_code(paths, tarball):
    """<run_dir>/code-<hash8> from the tarball (extracted once: a temp sibling, then one rename): (dir, extracted)."""
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            members = tar_members(tar)
            target = paths.code_dir(tree_hash8(tar, members))
            if os.path.isdir(target):
                return target, False
            prefix = ".%s." % os.path.basename(target)
            for name in os.listdir(paths.run_dir):  # left by a pod killed mid-extraction
                if name.startswith(prefix) and name.endswith(".tmp"):
                    shutil.rmtree(os.path.join(paths.run_dir, name), ignore_errors=True)
            tmp = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=paths.run_dir)
            try:
                extract(tar, members, tmp)
                os.chmod(tmp, 0o755)
                try:
                    os.rename(tmp, target)
                except OSError:
                    if not os.path.isdir(target):  # else another pod staged the same code first: same bytes
                        raise
            finally:
                if os.path.isdir(tmp):
                    shutil.rmtree(tmp, ignore_errors=True)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise StageError("%s is not a readable gzip tarball: %s" % (tarball, exc)) from exc
    rl.fsync_dir(paths.run_dir)
    return target, True


def stage(run_dir, stage_dir=STAGE_DIR):
    """Stage <run_dir> from the files in `stage_dir`; the lines to print. StageError when it cannot."""
    run_dir = run_dir.rstrip("/")
    active, run_id = os.path.split(run_dir)
    project_dir, active_name = os.path.split(active)
    if not os.path.isabs(run_dir) or active_name != "active":
        raise StageError("%s is not an absolute <durable_root>/<project>/active/<run_id>" % run_dir)
    try:
        paths = rl.RunPaths(os.path.dirname(project_dir), os.path.basename(project_dir), run_id)
    except ValueError as exc:
        raise StageError(str(exc)) from exc
    for directory in (paths.meta, paths.ckpt, paths.out, paths.logs):
        if not os.path.isdir(directory):
            os.makedirs(directory)
    try:
        job = json.loads(read_bytes(os.path.join(stage_dir, "job.json")).decode("utf-8"))
    except (IOError, OSError, ValueError) as exc:
        raise StageError("no usable job.json in %s: %s" % (stage_dir, exc)) from exc
    lines = []
    tarball = os.path.join(stage_dir, CODE_TARBALL)
    if os.path.exists(tarball):
        code_dir, extracted = stage_code(paths, tarball)
        if job.get("code_dir") != code_dir:
            raise StageError("job.json names code_dir %s, and the staged code is %s: the ConfigMap is not one run's"
                             % (job.get("code_dir"), code_dir))
        lines.append("%s %s" % ("extracted" if extracted else "kept", code_dir))
    elif not job.get("code_dir") or not os.path.isdir(job["code_dir"]):
        raise StageError("the code is in the image, and its dir %r (rgt_job.k8s.workdir) is not a directory there"
                         % job.get("code_dir"))
    for name, target, mode in INSTALLS:
        try:
            data = read_bytes(os.path.join(stage_dir, name))
        except (IOError, OSError) as exc:
            raise StageError("the stage has no %s: %s" % (name, exc)) from exc
        changed = rl.install(os.path.join(paths.meta, target), data, mode)
        lines.append("%s .rgt/%s" % ("installed" if changed else "kept", target))
    records = sorted(n for n in os.listdir(stage_dir) if n.startswith(RECORD_PREFIX) and len(n) > len(RECORD_PREFIX))
    if records and not os.path.isdir(os.path.join(paths.meta, "k8s")):
        os.makedirs(os.path.join(paths.meta, "k8s"))
    for name in records:
        target = "k8s/" + name[len(RECORD_PREFIX):]
        changed = rl.install(os.path.join(paths.meta, target), read_bytes(os.path.join(stage_dir, name)), 0o644)
        lines.append("%s .rgt/%s" % ("installed" if changed else "kept", target))
    return lines


def main(argv):
    if len(argv) != 2:
        print("usage: rgt_k8s_stage.py <run_dir>", file=sys.stderr)
        return 2
    try:
        lines = stage(argv[1])
    except (StageError, OSError) as exc:
        print("rgt stage of %s failed: %s" % (argv[1], exc), file=sys.stderr)
        return 1
    print("rgt stage of %s: %s" % (argv[1], ", ".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
