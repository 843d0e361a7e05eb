"""runner/rgt/teardown.py: the plan shown before the prompt, one teardown per instance, and who gets confirmed (no
playbook, no network: the box listing is given as the read-only play would bring it back)."""

import io
from types import SimpleNamespace

from rich.console import Console

from rgt import teardown as td
from rgt.engines.ssh import assess_instance as assess
from rgt.events import HostOutcome
from rgt.inventory import Host
from rgt.profiles import load_profile, verb_plan


def host(name, profile, instance_id):
    return Host(name=name, vars={"rgt_profile": profile, "rgt_instance_id": instance_id},
                profile=load_profile(profile))


def instance(profile, instance_id, *names):
    hosts = [host(n, profile, instance_id) for n in names or ("h",)]
    return td.instances_of(hosts, "unused", None)[0]


class Typed(Console):
    def __init__(self, answers):
        super().__init__(file=io.StringIO(), width=200, highlight=False)
        self.answers = list(answers)

    def input(self, prompt="", **kw):
        self.print(prompt)
        return self.answers.pop(0)


def looked(reports: dict, unreachable=()):
    """What the read-only listing play returns: per host, the teardown_box_report fact (or nothing)."""
    hosts = {}
    for name, report in reports.items():
        out = HostOutcome()
        if report is not None:
            out.results["teardown_box_report"] = report
        hosts[name] = out
    for name in unreachable:
        hosts[name] = HostOutcome(unreachable=True, messages=["ssh: connect to host 10.0.0.1 port 22: timed out"])
    return SimpleNamespace(hosts=hosts)


def empty_box(root="/workspace"):
    return {"durable_root": root, "exists": True, "durable_mount": {"path": "/workspace",
                                                                     "survives": ["stop", "terminate"]},
            "runs": [], "not_runs": []}


def test_plan_tells_irreversible_terminate_what_it_deletes_and_what_keeps_billing():
    item = verb_plan(instance("runpod", "pod-1"))
    assert item["verb"] == "terminate" and item["reversible"] is False
    assert "/" in item["deletes"] and "/workspace" not in item["deletes"]
    assert any("Network Volume" in line for line in item["keeps_billing"])
    item.update(status="ready", gate=None, reasons=[])
    console = Typed([])
    td.render_plan(console, item)
    text = console.file.getvalue()
    assert "IRREVERSIBLE" in text and "keeps billing" in text


def test_plan_of_a_reversible_power_off_names_the_clock_it_starts(monkeypatch):
    monkeypatch.delenv("AUTODL_TOKEN", raising=False)
    item = verb_plan(instance("autodl", "adl-1"))
    assert item["reversible"] is True and item["verb"] == "power_off"
    assert "/root/autodl-fs" not in item["deletes"]
    assert item["console_steps"] is True and any("关机" in step for step in item["manual_steps"])
    assert any("released after 15 days" in clock for clock in item["clocks"])
    item.update(status="ready", gate=None, reasons=[])
    console = Typed([])
    td.render_plan(console, item)
    text = console.file.getvalue()
    assert "reversible" in text and "IRREVERSIBLE" not in text
    assert "AUTODL_TOKEN is not set" in text and "released after 15 days" in text and "容器实例" in text


def test_with_the_token_set_autodl_plans_the_api_call_not_the_console(monkeypatch):
    monkeypatch.setenv("AUTODL_TOKEN", "t")
    item = verb_plan(instance("autodl", "adl-1"))
    assert item["console_steps"] is False and item["manual_steps"] == [] and item["clocks"]


def test_hosts_sharing_an_instance_are_one_instance_in_the_plan():
    hosts = [host("b", "runpod", "pod-1"), host("a", "runpod", "pod-1"), host("c", "vastai", "4242")]
    groups = td.instances_of(hosts, "unused", None)
    assert [(g.instance_id, g.names, g.inventory_hosts) for g in groups] == [
        ("pod-1", ["a", "b"], ["a", "b"]), ("4242", ["c"], ["c"])]


def test_an_empty_box_passes_and_says_so(tmp_path):
    inst = instance("runpod", "pod-1", "a", "b")
    look = looked({"a": {"already_gone": False, "box": empty_box()}, "b": {"already_gone": False, "box": empty_box()}})
    item = assess(inst, look, tmp_path, td.manifest_lib())
    assert item["status"] == "ready" and item["gate"]["runs"] == []
    assert item["gate"]["notes"] == ["no runs on the box (under /workspace): nothing on it waits for a pull"]


def test_a_host_of_the_instance_that_could_not_look_refuses_the_instance(tmp_path):
    inst = instance("runpod", "pod-1", "a", "b")
    item = assess(inst, looked({"a": {"already_gone": False, "box": empty_box()}}, unreachable=["b"]), tmp_path,
                     td.manifest_lib())
    assert item["status"] == "refused"
    assert "host b (instance pod-1) could not list the runs on its box" in item["reasons"][0]
    alone = assess(instance("runpod", "pod-2", "c"), looked({}, unreachable=["c"]), tmp_path, td.manifest_lib())
    assert alone["status"] == "unreachable" and "timed out" in alone["reasons"][0]


def test_an_instance_recorded_gone_is_not_planned_again(tmp_path):
    report = {"already_gone": True, "record": {"final_state": "gone", "instance_id": "pod-1"}}
    item = assess(instance("runpod", "pod-1"), looked({"h": report}), tmp_path, td.manifest_lib())
    assert item["status"] == "already gone" and item["gate"] is None


def ready(*ids):
    return [{"instance_id": i, "verb": "terminate"} for i in ids]


def test_non_interactive_without_confirm_is_refused():
    ok, refused = td.confirmations(Typed([]), ready("pod-1"), [], interactive=False)
    assert ok == {} and "--confirm pod-1" in refused["pod-1"]


def test_confirm_flags_match_instances_by_id():
    ok, refused = td.confirmations(Typed([]), ready("pod-a", "4242"), ["pod-a"], interactive=True)
    assert ok == {"pod-a": True} and "does not name the instance '4242'" in refused["4242"]


def test_interactive_typed_id_confirms_and_a_typo_refuses():
    console = Typed(["pod-a", "pod-bb"])
    ok, refused = td.confirmations(console, ready("pod-a", "pod-b"), [], interactive=True)
    assert ok == {"pod-a": True} and "pod-bb" in refused["pod-b"]
    assert console.file.getvalue().count("Type the instance id") == 2


def test_a_slurm_plan_names_every_job_the_teardown_will_cancel_before_asking(tmp_path):
    """The cluster's meter is its jobs: the plan lists the same jobs the module cancels (the instance id, each run's
    sbatch job, each sweep cell's array task), once each, before any confirmation."""
    box = empty_box("/shared")
    box["runs"] = [{"project": "p", "run_id": run_id, "run_dir": f"/shared/p/active/{run_id}", "state": "failed",
                    "attempt": 1, "export": {}, "slurm_job_id": job_id}
                   for run_id, job_id in (("a", "41"), ("arr--seed=1", "42_0"), ("arr--seed=2", "42_1"),
                                          ("b", "41"))]
    item = assess(instance("slurm", "login-1"), looked({"h": {"already_gone": False, "box": box}}), tmp_path,
                     td.manifest_lib())
    assert item["slurm_jobs"] == ["login-1", "41", "42_0", "42_1"]
    console = Typed([])
    td.render_plan(console, item)
    assert "cancels the Slurm jobs (each that is still queued or running): login-1, 41, 42_0, 42_1" in \
        console.file.getvalue()


def test_a_stop_in_flight_is_planned_as_a_poll_without_the_box_or_a_confirmation(tmp_path):
    """An earlier run was interrupted after it recorded the stop: the plan polls it, whatever the box says (one
    host of the instance could not even be reached: the box may be gone already)."""
    record = {"instance_id": "pod-1", "final_state": "requested — not reported gone yet",
              "requested_at": "2026-12-01T06:43:00+00:00", "calls": [{"method": "DELETE", "path": "/v2/pods/pod-1",
                                                                     "status": 204}]}
    look = looked({"a": {"already_gone": False, "in_flight": True, "record": record}}, unreachable=["b"])
    item = assess(instance("runpod", "pod-1", "a", "b"), look, tmp_path, td.manifest_lib())
    assert item["status"] == "in flight" and item["gate"] is None
    assert item["requested_at"] == "2026-12-01T06:43:00+00:00"
    assert td._look_code([item]) == 0
    console = Typed([])
    td.render_plan(console, item)
    text = console.file.getvalue()
    assert "a stop is in flight" in text and "2026-12-01T06:43:00+00:00" in text and "call again" in text
    assert "gate:" not in text
