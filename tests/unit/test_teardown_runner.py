"""runner/teardown.py: the plan shown at the prompt, and who gets confirmed (no playbook, no network)."""

import io

from rich.console import Console

from rgt import teardown as td
from rgt.inventory import Host
from rgt.profiles import load_profile


def host(name, profile, instance_id):
    return Host(name=name, vars={"rgt_profile": profile, "rgt_instance_id": instance_id},
                profile=load_profile(profile))


class Typed(Console):
    def __init__(self, answers):
        super().__init__(file=io.StringIO(), width=120, highlight=False)
        self.answers = list(answers)

    def input(self, prompt="", **kw):
        self.print(prompt)
        return self.answers.pop(0)


def test_plan_tells_irreversible_terminate_what_it_deletes_and_what_keeps_billing():
    item = td.plan(host("rp", "runpod", "pod-1"))
    assert item["verb"] == "terminate" and item["reversible"] is False
    assert "/" in item["deletes"] and "/workspace" not in item["deletes"]
    assert any("Network Volume" in line for line in item["keeps_billing"])
    console = Typed([])
    td.render_plan(console, item)
    text = console.file.getvalue()
    assert "IRREVERSIBLE" in text and "keeps billing" in text


def test_plan_tells_reversible_power_off_apart():
    item = td.plan(host("adl", "autodl", "adl-1"))
    assert item["reversible"] is True and item["verb"] == "power_off"
    assert "/root/autodl-fs" not in item["deletes"]
    console = Typed([])
    td.render_plan(console, item)
    assert "reversible" in console.file.getvalue() and "IRREVERSIBLE" not in console.file.getvalue()


def test_non_interactive_without_confirm_is_refused():
    ok, refused = td.confirmations(Typed([]), [host("rp", "runpod", "pod-1")], [], interactive=False)
    assert ok == {} and "--confirm pod-1" in refused["rp"]


def test_confirm_flags_match_hosts_by_instance_id():
    hosts = [host("a", "runpod", "pod-a"), host("b", "vastai", "4242")]
    ok, refused = td.confirmations(Typed([]), hosts, ["pod-a"], interactive=True)
    assert ok == {"a": "pod-a"} and "does not name" in refused["b"]


def test_interactive_typed_id_confirms_and_a_typo_refuses():
    hosts = [host("a", "runpod", "pod-a"), host("b", "runpod", "pod-b")]
    console = Typed(["pod-a", "pod-bb"])
    ok, refused = td.confirmations(console, hosts, [], interactive=True)
    assert ok == {"a": "pod-a"} and "pod-bb" in refused["b"]
    assert "Type the instance id" in console.file.getvalue()
