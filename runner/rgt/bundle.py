"""The runner's bundles of box-side code: module_utils/rgt_bundle (the one bundler, shared with the launch role's
lookup rgt.remote_gpu.rgt_bundle) applied to this checkout or installation (rgt.paths.REPO_ROOT).

- `flat(name)`: a flat bundle (the wrapper, the Kubernetes stage and seal, the checkpoint loader), built once per
  process.
- `status_zipapp()`: (hash, bytes) of the status round's zipapp (runner/rgt/sshround.py ships it once per box by
  that hash). Once per process, by the first thread that asks (the others wait for it instead of building it
  again under the GIL), and read from the controller's cache while no module_util changed: building it parses
  them all, a fifth of a second every `rgt-run status` would pay again.
- `seal_zipapp()`: the same for the pull round's zipapp (runner/rgt/pullround.py).
"""

from __future__ import annotations

import hashlib
import threading
from functools import cache
from pathlib import Path

from rgt import paths
from rgt.ledger import cache_path, cache_put

ZIPAPP_KEEP = 8  # built zipapps kept on the controller, newest first
STATUS = "status"
SEAL = "seal"


def lib():
    """The module_util rgt_bundle."""
    return paths.module_util("rgt_bundle")


@cache
def flat(name: str):
    """The flat bundle `name` of this collection (rgt_bundle.Bundle: entry, files, sources, digest)."""
    return lib().build(name, str(paths.REPO_ROOT), str(paths.MODULE_UTILS_DIR))


def build_zipapp(utils_dir: Path | None = None, name: str = STATUS) -> tuple[str, bytes]:
    """(hash, bytes): the package bundle `name` (default the status bundle) of the module_utils at `utils_dir`
    (default: this collection's) as a zip."""
    bundler = lib()
    return bundler.zipapp(bundler.build(name, str(paths.REPO_ROOT), str(utils_dir or paths.MODULE_UTILS_DIR)))


def zipapp_cache(utils_dir: Path, name: str = STATUS) -> Path:
    """Where this controller keeps the built zipapp: named by every module_util's name, mtime and size (the entry is
    a module_util too) and by the bundle's spec."""
    stamp = "\0".join(f"{p.name}:{p.stat().st_mtime_ns}:{p.stat().st_size}" for p in sorted(utils_dir.glob("*.py")))
    key = hashlib.sha256(f"{utils_dir}\0{stamp}\0{lib().BUNDLES[name]}".encode()).hexdigest()[:24]
    return cache_path("zipapp", f"{key}.pyz")


def load_zipapp(utils_dir: Path, name: str = STATUS) -> tuple[str, bytes]:
    """The zipapp `name` of `utils_dir`: from the controller's cache, else built and kept there."""
    cache = zipapp_cache(utils_dir, name)
    try:
        data = cache.read_bytes()
        return hashlib.sha256(data).hexdigest()[:lib().DIGEST_LEN], data  # the name on the box is its own hash
    except OSError:
        pass
    digest, data = build_zipapp(utils_dir, name)
    cache_put(cache, data, ZIPAPP_KEEP)
    return digest, data


_ZIPAPP: tuple[str, bytes] | None = None
_ZIPAPP_LOCK = threading.Lock()


def status_zipapp() -> tuple[str, bytes]:
    """The status zipapp of this checkout/installation, once per process."""
    global _ZIPAPP
    with _ZIPAPP_LOCK:
        if _ZIPAPP is None:
            _ZIPAPP = load_zipapp(paths.MODULE_UTILS_DIR)
    return _ZIPAPP


_SEAL: tuple[str, bytes] | None = None


def seal_zipapp() -> tuple[str, bytes]:
    """The pull round's zipapp (bundle `seal`: module_utils/rgt_sealround.py) of this checkout/installation, once
    per process."""
    global _SEAL
    with _ZIPAPP_LOCK:
        if _SEAL is None:
            _SEAL = load_zipapp(paths.MODULE_UTILS_DIR, SEAL)
    return _SEAL
