"""Test harness: GPU-less stub hosts (podman containers with sshd and a fake nvidia-smi).

See stubhost.py for the API and `python -m tests.harness --help` for the CLI.
"""

from .stubhost import (  # noqa: F401
    CONTAINERS_CONF,
    IMAGE,
    Mount,
    StubError,
    StubHost,
    down,
    ensure_image,
    ensure_keypair,
    host_cleanup,
    image_present,
    list_stubs,
    load,
    podman,
    podman_available,
    podman_env,
    session_tag,
    start_stub,
    write_known_host,
)
