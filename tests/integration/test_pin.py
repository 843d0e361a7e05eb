"""`rgt-run pin` against a box it cannot reach says so: exit 4 (unreachable), not 1, and nothing is pinned."""

import socket

from clihelp import write_inventory


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_pin_to_a_closed_ssh_port_exits_4_saying_the_box_is_unreachable(rgt, tmp_path):
    port = closed_port()
    inv = write_inventory(tmp_path / "inv", {"box": {"ansible_host": "127.0.0.1", "ansible_port": port,
                                                     "rgt_profile": "generic_ssh", "rgt_instance_id": "box-closed"}})
    result = rgt("pin", "-i", inv, "--json")
    assert result.rc == 4, result.stderr
    assert "box: UNREACHABLE" in result.stderr and f"127.0.0.1:{port}" in result.stderr
    assert "refused" in result.stderr.lower()
    assert result.doc["exit_code"] == 4
    assert result.doc["hosts"] == [{"host": "box", "instance_id": "box-closed", "action": "unreachable",
                                    "error": result.doc["hosts"][0]["error"]}]
    assert not (inv / "known_hosts").exists()  # nothing was pinned
