# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The shipped code tree: ignore rules, manifest, hash8, the CRLF rule (docs/internals.md "Run spine").

Pure stdlib, Python 3.6+: the manifest side runs on the controller (rgt_tree_manifest), the hashing side also on
the box (rgt_tree_verify).

- Ignore rules: ``.rgtignore`` in the tree's root when present, else ``.gitignore`` (root file only; nested
  ignore files are not read). gitignore syntax: ``#`` comments, blank lines, ``!`` negation (last match wins),
  trailing ``/`` = directories only, a ``/`` at the start or in the middle anchors the pattern to the root,
  ``*``/``?``/``[...]`` never cross ``/``, ``**/`` = any number of directories, a trailing ``/**`` = everything
  inside; ``[...]`` as git's wildmatch reads it (``!``/``^`` negates, ``]`` first is literal, ``\\`` escapes,
  ranges, ``[:digit:]`` and the other named classes); a pattern git cannot read (an unclosed ``[``, an unknown
  class, a trailing lone ``\\``) matches nothing. As in git, a file inside an ignored directory cannot be
  re-included (the directory is not entered). Held to git itself by tests/unit/test_rgt_tree.py (a table run
  through ``git ls-files --others --exclude-standard``). Not pathspec: its GitIgnoreSpec (1.1.1) answers the
  directory question of a walk differently from git (``out/**`` + ``!out/keep``, the ``*`` / ``!*/`` whitelist)
  and has no named classes; and this file also runs on the box, stdlib only.
- Always ignored, whatever the rules say: ``.git`` (dir or file), ``__pycache__/``, ``.rgt/``.
- Symlinks are never followed and never shipped; they are listed (``symlinks``) so the caller can warn.
  Other non-regular files (fifos, sockets, devices) are listed as ``special``; names that fail the one
  relative-path rule (rgt_runlayout.check_relpath: a backslash, a leading ``C:``) as ``unsafe``, never shipped.
- Manifest: ``[{"path", "bytes", "sha256"}]`` sorted by path (code point order = UTF-8 byte order), SHA-256 read
  in 1 MiB chunks. ``tree_hash`` = SHA-256 of the concatenated ``"<path>\\0<sha256>\\n"`` lines; hash8 = its first
  8 hex digits (same tree => same ``code-<hash8>`` dir).
- CRLF: ``crlf_scripts`` lists the scripts (``is_script``: a shell suffix or a shebang) with a line ending in CR;
  upload_resume refuses to ship them unless the user allows it, env_check applies the same rule on the box.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import re
import stat
from shlex import quote

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import check_relpath, read_blocks

ALWAYS_IGNORED_DIRS = ("__pycache__", ".rgt")
ALWAYS_IGNORED_ANY = (".git",)
IGNORE_FILES = (".rgtignore", ".gitignore")
# What counts as a script for the CRLF rule, the one rule for upload_resume and env_check: a file a
# shell or the kernel reads line by line, where a CR before the LF becomes part of the last word of the line (an
# argument arrives as `ok\r`, `$'\r': command not found`, `/usr/bin/env: 'python\r'`). That is a shell script by
# its suffix, or any file that starts with a shebang (`#!`, run as `./file`). Python without a shebang is read with
# universal newlines, and data (.csv, .json, .yaml, .txt) does not care: CRLF there is fine.
SCRIPT_SUFFIXES = (".sh", ".bash", ".zsh", ".ksh", ".command")
SHEBANG = b"#!"
CRLF_LIST_MAX = 10


NEVER = re.compile("(?!)")  # the regex of a pattern git cannot read: it matches nothing


class TreeError(Exception):
    pass


# ---------------------------------------------------------------------------------------------------- rules


# git's named classes ([[:digit:]]) over ASCII, as git's wildmatch reads them; as regex class bodies
POSIX_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9",
    "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": " \\t\\n\\r\\x0b\\x0c",
    "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}


def _translate_class(pat, i):
    """A bracket expression at pat[i] == '[' the way git's wildmatch reads it -> (regex, next index), or (None, i)
    when git gives up on the whole pattern (the expression is never closed, names an unknown [:class:], or ends in a
    lone backslash): such a pattern matches nothing. A ']' first is literal, '\\' escapes, 'a-z' is a range (a
    reversed one adds nothing), '[:name:]' a named class, '!' or '^' first negates; it never matches '/'."""
    j = i + 1
    negated = pat[j:j + 1] in ("!", "^")
    if negated:
        j += 1
    items = []
    prev = None  # the character before, where a range may start
    first = True
    while True:
        if j >= len(pat):
            return None, i
        c = pat[j]
        if c == "]" and not first:
            break
        first = False
        if c == "\\":
            j += 1
            if j >= len(pat):
                return None, i
            prev = pat[j]
            items.append(re.escape(prev))
        elif c == "-" and prev is not None and j + 1 < len(pat) and pat[j + 1] != "]":
            j += 1
            end = pat[j]
            if end == "\\":
                j += 1
                if j >= len(pat):
                    return None, i
                end = pat[j]
            if prev <= end:
                items.append(re.escape(prev) + "-" + re.escape(end))
            prev = None
        elif c == "[" and pat[j + 1:j + 2] == ":":
            close = pat.find("]", j + 2)
            if close < 0:
                return None, i
            name = pat[j + 2:close]
            if name.endswith(":"):
                body = POSIX_CLASSES.get(name[:-1])
                if body is None:
                    return None, i
                items.append(body)
                prev = None
                j = close
            else:  # not a [:name:]: a plain '['
                prev = c
                items.append(re.escape(c))
        else:
            prev = c
            items.append(re.escape(c))
        j += 1
    body = "".join(items)
    return ("[^/" + body + "]" if negated else "(?!/)[" + body + "]"), j + 1


def glob_to_regex(pat):
    """gitignore glob (no leading/trailing '/') -> regex body, '/'-aware; None for a pattern git cannot read (an
    unclosed or unknown bracket expression, a trailing lone backslash), which matches nothing."""
    out = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "*":
            if pat[i:i + 2] == "**":
                at_start = i == 0 or pat[i - 1] == "/"
                at_end = i + 2 == n or pat[i + 2] == "/"
                if at_start and at_end:
                    if i + 2 == n:
                        out.append(".*")
                        i += 2
                    else:
                        out.append("(?:.*/)?")
                        i += 3
                    continue
                out.append("[^/]*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            regex, nxt = _translate_class(pat, i)
            if regex is None:
                return None
            out.append(regex)
            i = nxt
            continue
        elif c == "\\":
            if i + 1 == n:
                return None
            out.append(re.escape(pat[i + 1]))
            i += 2
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


class Rule(object):
    __slots__ = ("pattern", "negate", "dir_only", "regex")

    def __init__(self, pattern, negate, dir_only, regex):
        self.pattern = pattern
        self.negate = negate
        self.dir_only = dir_only
        self.regex = regex

    def matches(self, relpath, is_dir):
        if self.dir_only and not is_dir:
            return False
        return self.regex.match(relpath) is not None


def parse_rule(line):
    """One ignore-file line -> Rule, or None for blanks and comments."""
    line = line.rstrip("\n").rstrip("\r")
    # trailing spaces are ignored unless escaped with a backslash
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negate = False
    if line.startswith("!"):
        negate = True
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = False
    while line.endswith("/") and not line.endswith("\\/"):
        dir_only = True
        line = line[:-1]
    if not line:
        return None
    anchored = "/" in line
    body = line[1:] if line.startswith("/") else line
    if not body:
        return None
    regex = glob_to_regex(body)
    if regex is None:  # git cannot read it: the line stays a rule that matches nothing
        return Rule(line, negate, dir_only, NEVER)
    if not anchored:
        regex = "(?:.*/)?" + regex
    return Rule(line, negate, dir_only, re.compile("^" + regex + "$", re.DOTALL))


class IgnoreRules(object):
    def __init__(self, lines=(), source=None):
        self.source = source
        self.rules = [r for r in (parse_rule(ln) for ln in lines) if r is not None]

    @classmethod
    def from_file(cls, path):
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
        return cls(text.splitlines(), source=path)

    def ignored(self, relpath, is_dir):
        """gitignore verdict for a '/'-separated path relative to the root (last matching rule wins)."""
        verdict = False
        for rule in self.rules:
            if rule.matches(relpath, is_dir):
                verdict = not rule.negate
        return verdict


def always_ignored(name, is_dir):
    return name in ALWAYS_IGNORED_ANY or (is_dir and name in ALWAYS_IGNORED_DIRS)


def load_rules(root, ignore_file=None):
    """The rules for root: ignore_file (absolute or relative to root; must exist) or .rgtignore else .gitignore."""
    if ignore_file:
        path = ignore_file if os.path.isabs(ignore_file) else os.path.join(root, ignore_file)
        if not os.path.isfile(path):
            raise TreeError("ignore file %s does not exist" % path)
        return IgnoreRules.from_file(path)
    for name in IGNORE_FILES:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            return IgnoreRules.from_file(path)
    return IgnoreRules()


# ---------------------------------------------------------------------------------------------------- walk


class Walk(object):
    def __init__(self):
        self.files = []  # relpaths of regular files to ship
        self.symlinks = []  # relpaths of symlinks (never followed, never shipped)
        self.special = []  # fifos, sockets, devices
        self.undecodable = []  # names that are not valid UTF-8 (repr)
        self.unsafe = []  # names the relative-path rule refuses (a backslash, a drive prefix)
        self.ignored_count = 0  # ignored entries; an ignored directory counts once


def walk_tree(root, rules):
    """Walk root (never following symlinks), applying rules; returns a Walk with sorted lists."""
    if not os.path.isdir(root):
        raise TreeError("%s is not a directory" % root)
    result = Walk()
    stack = [""]
    while stack:
        reldir = stack.pop()
        absdir = os.path.join(root, reldir) if reldir else root
        try:
            entries = list(os.scandir(absdir))
        except OSError as exc:
            raise TreeError("cannot list %s: %s" % (absdir, exc)) from exc
        for entry in entries:
            name = entry.name
            rel = reldir + "/" + name if reldir else name
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                result.undecodable.append(repr(rel))
                continue
            is_link = entry.is_symlink()
            is_dir = (not is_link) and entry.is_dir(follow_symlinks=False)
            if always_ignored(name, is_dir) or rules.ignored(rel, is_dir):
                result.ignored_count += 1
                continue
            if check_relpath(rel) is not None:
                result.unsafe.append(rel)
                continue
            if is_link:
                result.symlinks.append(rel)
            elif is_dir:
                stack.append(rel)
            elif entry.is_file(follow_symlinks=False):
                result.files.append(rel)
            else:
                result.special.append(rel)
    for lst in (result.files, result.symlinks, result.special, result.undecodable, result.unsafe):
        lst.sort()
    return result


# ---------------------------------------------------------------------------------------------------- hashing


def file_digest(path, detect_crlf=False):
    """(sha256 hex, bytes, has_crlf) of a file, read in 1 MiB chunks; has_crlf (a line ending in CR: CRLF, or a
    CR as the last byte, as crlf_lines counts them) only when detect_crlf."""
    h = hashlib.sha256()
    size = 0
    crlf = False
    prev = b""
    for block in read_blocks(path):
        h.update(block)
        size += len(block)
        if detect_crlf and not crlf:
            crlf = b"\r\n" in prev + block
        prev = block[-1:]
    if detect_crlf and prev == b"\r":
        crlf = True
    return h.hexdigest(), size, crlf


# ---------------------------------------------------------------------------------------------------- CRLF


def crlf_lines(data):
    """1-based numbers of the lines that end in a carriage return (CRLF, or a stray CR at the end of the data). A
    CR inside a line (`a\rb`) is not a line end."""
    lines = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if line.endswith(b"\r"):
            lines.append(number)
    return lines


def is_script(relpath, head):
    """True when a file is a script for the CRLF rule: a shell suffix (SCRIPT_SUFFIXES) or a shebang. `head` is
    the file's first bytes (at least 2)."""
    name = relpath.rsplit("/", 1)[-1].lower()
    return name.endswith(SCRIPT_SUFFIXES) or (head or b"").startswith(SHEBANG)


def read_head(path, size=2):
    with open(path, "rb") as handle:
        return handle.read(size)


def crlf_fix(paths, limit=CRLF_LIST_MAX):
    """The fix for CRLF scripts (paths as the user can type them), one line."""
    shown = [quote(p) for p in paths[:limit]]
    more = " (and %d more)" % (len(paths) - limit) if len(paths) > limit else ""
    return ("convert the line ends to LF: sed -i 's/\\r$//' %s%s (or dos2unix on each), and add '*.sh text eol=lf' "
            "to .gitattributes (with `git add --renormalize .`) so a Windows checkout does not bring them back"
            % (" ".join(shown), more))


def crlf_refusal(src, crlf_scripts, limit=CRLF_LIST_MAX):
    """The message that refuses to ship a tree with CRLF scripts: each file (first `limit` + a count), why, the
    fix, and how to ship them anyway."""
    named = ", ".join(crlf_scripts[:limit])
    if len(crlf_scripts) > limit:
        named += " and %d more" % (len(crlf_scripts) - limit)
    return ("refused: %d script(s) in %s have CRLF (Windows) line ends: %s. bash and the kernel keep the CR as part "
            "of each line (an argument arrives as 'ok\\r', \"$'\\r': command not found\"), so the job would run "
            "wrong; nothing was shipped or launched. Fix: %s. To ship them as they are, set rgt_job.crlf: allow "
            "(or -e upload_resume_crlf=allow)."
            % (len(crlf_scripts), src, named, crlf_fix([os.path.join(src, p) for p in crlf_scripts], limit)))


def tree_hash(manifest):
    """SHA-256 hex of the sorted "relpath\\0sha256\\n" list (docs/internals.md); hash8 = first 8 digits."""
    h = hashlib.sha256()
    for item in sorted(manifest, key=lambda entry: entry["path"]):
        h.update(item["path"].encode("utf-8") + b"\0" + item["sha256"].encode("ascii") + b"\n")
    return h.hexdigest()


def hash8(manifest):
    return tree_hash(manifest)[:8]


def build_manifest(root, ignore_file=None):
    """Everything rgt_tree_manifest returns, as a dict."""
    root = os.path.abspath(os.path.expanduser(root))
    rules = load_rules(root, ignore_file)
    walk = walk_tree(root, rules)
    manifest = []
    crlf = []
    for rel in walk.files:
        path = os.path.join(root, rel)
        try:
            digest, size, has_crlf = file_digest(path, detect_crlf=True)
            if has_crlf and is_script(rel, read_head(path)):
                crlf.append(rel)
        except (IOError, OSError) as exc:
            raise TreeError("cannot read %s: %s" % (path, exc)) from exc
        manifest.append({"path": rel, "bytes": size, "sha256": digest})
    full = tree_hash(manifest)
    return {
        "src": root,
        "ignore_file": rules.source,
        "manifest": manifest,
        "tree_sha256": full,
        "hash8": full[:8],
        "files": len(manifest),
        "bytes": sum(item["bytes"] for item in manifest),
        "crlf_scripts": crlf,
        "ignored_count": walk.ignored_count,
        "symlinks": walk.symlinks,
        "special": walk.special,
        "undecodable": walk.undecodable,
        "unsafe": walk.unsafe,
        "skipped": skipped(walk),
    }


def skipped(walk):
    """Everything a walk found and will not ship, as [{"path", "kind"}] sorted by path; kind is symlink, special
    (fifo, socket, device), undecodable (a name that is not valid UTF-8, shown as its repr) or unsafe (a name the
    relative-path rule refuses: a backslash, a drive prefix)."""
    items = [{"path": rel, "kind": "symlink"} for rel in walk.symlinks]
    items += [{"path": rel, "kind": "special"} for rel in walk.special]
    items += [{"path": rel, "kind": "undecodable"} for rel in walk.undecodable]
    items += [{"path": rel, "kind": "unsafe"} for rel in walk.unsafe]
    return sorted(items, key=lambda item: item["path"])


def files_from_bytes(manifest):
    """NUL-separated path list for `rsync --from0 --files-from=FILE`."""
    return b"".join(item["path"].encode("utf-8") + b"\0" for item in manifest)


# ---------------------------------------------------------------------------------------------------- verify


def verify_tree(root, manifest, list_limit=200):
    """Compare root with a manifest: {exists, ok, mismatches, missing, extra, extra_count, files, bytes}.

    A mismatch is a file whose size or SHA-256 differs, or a path that is not a regular file (a symlink
    or a directory where a file should be). Extra files do not make ok false: a running job may write
    __pycache__ into its code dir."""
    doc = {"dir": root, "exists": os.path.isdir(root), "ok": False, "mismatches": [], "missing": [],
           "missing_count": 0, "mismatch_count": 0, "extra": [], "extra_count": 0, "files": len(manifest),
           "bytes": sum(int(item["bytes"]) for item in manifest)}
    wanted = set()
    for item in manifest:
        reason = check_relpath(item["path"])
        if reason:
            raise TreeError("unsafe manifest path %r: %s" % (item["path"], reason))
        wanted.add(item["path"])
    if not doc["exists"]:
        doc["missing_count"] = len(manifest)
        return doc
    for item in sorted(manifest, key=lambda entry: entry["path"]):
        path = os.path.join(root, item["path"])
        try:
            st = os.lstat(path)
        except OSError:
            doc["missing"].append(item["path"])
            continue
        expected_bytes = int(item["bytes"])
        if not stat.S_ISREG(st.st_mode):
            doc["mismatches"].append({"path": item["path"], "expected": item["sha256"], "actual": None,
                                      "expected_bytes": expected_bytes, "actual_bytes": None,
                                      "reason": "not a regular file"})
            continue
        digest, size, _ = file_digest(path) if st.st_size == expected_bytes else (None, st.st_size, False)
        if size != expected_bytes or digest != item["sha256"]:
            doc["mismatches"].append({"path": item["path"], "expected": item["sha256"], "actual": digest,
                                      "expected_bytes": expected_bytes, "actual_bytes": size,
                                      "reason": "size differs" if size != expected_bytes else "content differs"})
    extra = []
    for dirpath, dirnames, filenames in os.walk(root):
        reldir = os.path.relpath(dirpath, root)
        reldir = "" if reldir == "." else reldir.replace(os.sep, "/")
        names = list(filenames)
        for d in list(dirnames):  # os.walk lists symlinks to dirs as dirs and does not follow them
            if os.path.islink(os.path.join(dirpath, d)):
                names.append(d)
        for name in names:
            rel = reldir + "/" + name if reldir else name
            if rel not in wanted:
                extra.append(rel)
    extra.sort()
    doc["missing_count"] = len(doc["missing"])
    doc["mismatch_count"] = len(doc["mismatches"])
    doc["extra_count"] = len(extra)
    doc["extra_all"] = extra
    doc["extra"] = extra[:list_limit]
    doc["missing"] = doc["missing"][:list_limit]
    doc["mismatches"] = doc["mismatches"][:list_limit]
    doc["ok"] = not doc["mismatches"] and doc["missing_count"] == 0
    return doc


def remove_extra(root, extra, keep):
    """Delete extra files (and directories left empty that hold no kept file) under root; returns the count."""
    removed = 0
    for rel in extra:
        if check_relpath(rel) is not None:  # never delete outside root
            continue
        path = os.path.join(root, rel)
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            continue
    keep_dirs = set()
    for rel in keep:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            keep_dirs.add("/".join(parts[:i]))
    for dirpath, _dirnames, _files in sorted(os.walk(root, topdown=False), key=lambda t: -len(t[0])):
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        if rel == "." or rel in keep_dirs:
            continue
        try:
            os.rmdir(dirpath)
        except OSError:
            pass
    return removed


def manifest_step(src, ignore_file=None, files_from=None, crlf="allow"):
    """rgt_tree_manifest's whole step (the action plugin runs it in Ansible's worker on the controller, the module
    file in a process of its own): (doc, warnings, failure message or None). Writes the NUL-separated list to
    files_from (its directory made 0700, the file 0600) unless it fails."""
    try:
        doc = build_manifest(src, ignore_file)
    except TreeError as exc:
        return None, [], "cannot manifest %s: %s" % (src, exc)
    warnings = ["skipping symlink %s (rgt never follows or ships symlinks; copy the target into the tree)" % rel
                for rel in doc["symlinks"]]
    warnings += ["skipping non-regular file %s" % rel for rel in doc["special"]]
    warnings += ["skipping %s: the name is not valid UTF-8" % rel for rel in doc["undecodable"]]
    warnings += ["skipping %s: a backslash or a drive prefix in a name means another path on another machine"
                 % rel for rel in doc["unsafe"]]
    doc["files_from"] = None
    if doc["crlf_scripts"] and crlf == "refuse":
        return doc, warnings, crlf_refusal(doc["src"], doc["crlf_scripts"])
    if files_from:
        directory = os.path.dirname(files_from) or "."
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o700)
        fd = os.open(files_from, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(files_from_bytes(doc["manifest"]))
        doc["files_from"] = files_from
    return doc, warnings, None
