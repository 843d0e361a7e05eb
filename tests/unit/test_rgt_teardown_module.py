"""plugins/modules/rgt_teardown.py and the teardown_record filter document themselves: their doc blocks parse (as
ansible-doc reads them) and every option the module takes is documented, and nothing else."""

import ast
from pathlib import Path

import yaml

from ansible_collections.rgt.remote_gpu.plugins.filter import teardown_record
from ansible_collections.rgt.remote_gpu.plugins.modules import rgt_teardown

MODULE = Path(rgt_teardown.__file__)


def argument_spec_keys() -> set[str]:
    """The keys of `argument_spec=dict(...)` in the module's main()."""
    for node in ast.walk(ast.parse(MODULE.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "argument_spec" and isinstance(node.value, ast.Call):
            return {kw.arg for kw in node.value.keywords}
    raise AssertionError("no argument_spec in main()")


def test_the_module_documents_exactly_the_options_it_takes():
    doc = yaml.safe_load(rgt_teardown.DOCUMENTATION)
    yaml.safe_load(rgt_teardown.RETURN)
    yaml.safe_load(rgt_teardown.EXAMPLES)
    assert set(doc["options"]) == argument_spec_keys()


def test_the_filter_documents_itself_and_reads_a_record_it_cannot_parse_as_none():
    doc = yaml.safe_load(teardown_record.DOCUMENTATION)
    assert doc["name"] == "teardown_record"
    assert teardown_record.teardown_record("{not json", "pod-1") == {"state": "none", "record": None}
    assert teardown_record.teardown_record("", "pod-1")["state"] == "none"
    gone = teardown_record.teardown_record('{"instance_id": "pod-1", "final_state": "gone"}', "pod-1")
    assert gone["state"] == "gone" and gone["record"]["final_state"] == "gone"


def test_the_rclone_ship_filter_documents_itself():
    from ansible_collections.rgt.remote_gpu.plugins.filter import offload

    doc = yaml.safe_load(offload.DOCUMENTATION)
    yaml.safe_load(offload.RETURN)
    assert doc["name"] == "rclone_ship" and set(doc["options"]) == {"_input", "look", "binary"}
    assert offload.FilterModule().filters() == {"rclone_ship": offload.rclone_ship}
    assert offload.rclone_ship({}) == {"action": "none"}
