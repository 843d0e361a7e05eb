"""A sealed export and its verified local pull, made by hand for teardown tests (no collect run needed).

`make_pull(runs_dir, run_id, host, instance_id, files)` writes, on the controller:
  runs/<run_id>/<host>/...                    the capsule's files
  runs/<run_id>/<host>.manifest.json          the manifest bytes (rgt_manifest.dumps)
  runs/<run_id>/<host>.PULL_VERIFIED.json     {schema rgt/pull-verified/v1, manifest_sha256, ...}
and returns (manifest bytes, files) for the test to put on the box as export/<run_id>/ + export/<run_id>.manifest.json.

CLI (molecule prepare): `python -m tests.fakes.capsule RUNS_DIR RUN_ID HOST INSTANCE_ID` prints the manifest JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

DEFAULT_FILES = {"out/metrics.json": b'{"loss": 0.1234}\n', "out/model.bin": bytes(range(256)) * 64,
                 "run.json": b'{"schema": "rgt/run/v1"}\n'}


def _manifest_module():
    collections = str(Path(__file__).resolve().parents[2] / ".collections")
    if collections not in sys.path:
        sys.path.insert(0, collections)
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest

    return rgt_manifest


def make_pull(runs_dir: Path, run_id: str, host: str, instance_id: str,
              files: dict[str, bytes] | None = None) -> tuple[bytes, dict[str, bytes]]:
    m = _manifest_module()
    files = dict(DEFAULT_FILES if files is None else files)
    pulled = Path(runs_dir) / run_id / host
    for rel, data in files.items():
        path = pulled / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    doc = m.build_manifest(str(pulled), run_id, host=host, instance_id=instance_id,
                           created_at="2026-11-30T00:00:00+00:00")
    raw = m.dumps(doc)
    (pulled.parent / f"{host}.manifest.json").write_bytes(raw)
    marker = {"schema": "rgt/pull-verified/v1", "run_id": run_id, "host": host, "instance_id": instance_id,
              "manifest_sha256": hashlib.sha256(raw).hexdigest(), "files": doc["totals"]["files"],
              "bytes": doc["totals"]["bytes"], "checkpoints": [], "verified_at": "2026-11-30T00:00:01+00:00"}
    (pulled.parent / f"{host}.PULL_VERIFIED.json").write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return raw, files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("runs_dir")
    p.add_argument("run_id")
    p.add_argument("host")
    p.add_argument("instance_id")
    args = p.parse_args(argv)
    raw, files = make_pull(Path(args.runs_dir), args.run_id, args.host, args.instance_id)
    sys.stdout.write(json.dumps({"manifest": raw.decode(),
                                 "files": {k: v.hex() for k, v in files.items()}}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
