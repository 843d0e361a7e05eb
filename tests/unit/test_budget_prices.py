"""The platform's own price for budgets (rgt.prices, rgt_cloud.Client.price_per_hour) against the fake control
planes (tests/fakes): RunPod's pod `cost` and vast.ai's `dph_total` replace the configured price_per_hour, cached
atomically in <ledger>/prices.json and asked again only when due; the budget says its source (platform |
inventory) in status --json and in the notification; a failing API (no key, 401, a hung call, a stopped pod)
falls back to the configured price and is said once."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console

from rgt import budget, prices

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token"


def profile(name):
    return yaml.safe_load((REPO / "profiles" / f"{name}.yml").read_text())


def setup(tmp_path, fake, platform="runpod", instance="pod-1", env=None, **kw):
    clock = [1_000_000.0]
    out = io.StringIO()
    host = SimpleNamespace(name="box", vars={"rgt_instance_id": instance}, profile=profile(platform))
    key, url = {"runpod": ("RUNPOD_API_KEY", "RUNPOD_API_URL"), "vastai": ("VAST_API_KEY", "VAST_URL")}[platform]
    p = prices.Prices(tmp_path, [host], Console(file=out, width=300),
                      env={key: TOKEN, url: fake.url} if env is None else env, clock=lambda: clock[0], **kw)
    return p, clock, out, host


def run(**extra):
    # the configured price is $360/h; 100 s of attempts: $10 at the inventory's price
    return {"host": "box", "run_id": "r1", "state": "running", "attempt": 1, "elapsed_s": 100.0,
            "price_per_hour": 360.0, "budget_usd": 20.0, **extra}


def test_runpod_pod_cost_is_the_price_cached_atomically_and_asked_again_only_when_due(tmp_path, plane):
    fake = plane("runpod")
    fake.add_pod("pod-1", cost=36.0)
    p, clock, out, _host = setup(tmp_path, fake)
    p.refresh()
    assert p.of("box") == 36.0
    cached = json.loads((tmp_path / "prices.json").read_text())
    assert cached["schema"] == prices.SCHEMA
    assert cached["hosts"]["box"] == {"instance_id": "pod-1", "platform": "RunPod", "at": clock[0],
                                      "price_per_hour": 36.0}
    assert not list(tmp_path.glob("*.tmp*")) and out.getvalue() == ""
    p.refresh()
    clock[0] += prices.ASK_EVERY_S - 1
    p.refresh()
    assert len(fake.calls("GET", "/v2/pods/pod-1")) == 1
    clock[0] += 2
    p.refresh()
    assert len(fake.calls("GET", "/v2/pods/pod-1")) == 2
    assert fake.mutating_calls() == []  # a price is a read


def test_vast_dph_total_is_the_price(tmp_path, plane):
    fake = plane("vast")
    fake.add_instance("4242")
    p, _clock, _out, _host = setup(tmp_path, fake, platform="vastai", instance="4242")
    p.refresh()
    assert p.of("box") == 0.42
    assert fake.calls("GET")[0]["path"] == "/api/v0/instances/4242/" and fake.calls("GET")[0]["query"] == {
        "owner": "me"}


def test_the_budget_counts_at_the_platform_price_and_says_its_source(tmp_path, plane):
    fake = plane("runpod")
    fake.add_pod("pod-1", cost=36.0)
    p, _clock, _out, _host = setup(tmp_path, fake)
    runs = [run()]
    budget.annotate(runs, prices=budget.platform_prices(runs, p))
    assert runs[0]["budget"] == {"budget_usd": 20.0, "spent_usd": 1.0, "pct": 5.0, "scope": "run",
                                 "source": "platform"}  # $36/h x 100 s, not $360/h
    plain = [run()]
    budget.annotate(plain)
    assert plain[0]["budget"]["spent_usd"] == 10.0 and plain[0]["budget"]["source"] == "inventory"


def test_watch_notifies_with_the_platform_price_source(tmp_path, plane):
    fake = plane("runpod")
    fake.add_pod("pod-1", cost=360.0 * 1.2)  # above the configured price: 60% spent where the inventory says 50%
    p, clock, out, host = setup(tmp_path, fake)
    sent = []

    class Notes:
        def queue(self, host, kind, event_id, view, detail, summary=""):
            sent.append(detail)

    w = budget.Watcher(SimpleNamespace(inventory="inv", runs_dir=None), p.console, tmp_path, [host], {}, Notes(),
                       clock=lambda: clock[0], prices=p)
    w.tick({"box": run()})
    assert sent == ["run box:r1: $12.00 of its $20.00 budget (60%, threshold 50%; platform price)"]


@pytest.mark.parametrize("how", ["no_key", "401", "stopped_pod", "no_pod"])
def test_a_failing_api_falls_back_to_the_configured_price_and_says_so_once(tmp_path, plane, how):
    fake = plane("runpod")
    fake.add_pod("pod-1", status="EXITED" if how == "stopped_pod" else "RUNNING",
                 cost=0.0 if how == "stopped_pod" else 36.0)
    env = {"RUNPOD_API_URL": fake.url, **({} if how == "no_key" else {"RUNPOD_API_KEY": "wrong" if how == "401"
                                                                      else TOKEN})}
    p, clock, out, _host = setup(tmp_path, fake, env=env, instance="pod-9" if how == "no_pod" else "pod-1")
    for _ in range(3):
        runs = [run()]
        budget.annotate(runs, prices=budget.platform_prices(runs, p))
        assert runs[0]["budget"]["source"] == "inventory" and runs[0]["budget"]["spent_usd"] == 10.0
        clock[0] += prices.ASK_EVERY_S + 1
    said = [line for line in out.getvalue().splitlines() if line.startswith("price: ")]
    assert len(said) == 1 and "using the configured rgt_job.price_per_hour" in said[0], out.getvalue()
    assert TOKEN not in out.getvalue() and "wrong" not in out.getvalue()
    assert "error" in json.loads((tmp_path / "prices.json").read_text())["hosts"]["box"]


def test_a_hung_call_is_bounded_and_falls_back(tmp_path, plane):
    fake = plane("runpod", hang={"GET /v2/pods/pod-1": 3})
    fake.add_pod("pod-1", cost=36.0)
    p, _clock, out, _host = setup(tmp_path, fake, http_timeout=0.5)
    p.refresh()
    assert p.of("box") is None and "did not say the price of pod-1" in out.getvalue()


def test_a_working_call_after_a_failure_clears_it_and_a_new_failure_is_said_again(tmp_path, plane):
    fake = plane("runpod")
    fake.add_pod("pod-1", cost=36.0)
    p, clock, out, _host = setup(tmp_path, fake)
    fake.token = "other"
    p.refresh()
    fake.token = TOKEN
    clock[0] += prices.ASK_EVERY_S + 1
    p.refresh()
    assert p.of("box") == 36.0
    fake.token = "other"
    clock[0] += prices.ASK_EVERY_S + 1
    p.refresh()
    assert out.getvalue().count("did not say the price") == 2 and p.of("box") is None


def test_a_profile_without_a_priced_api_or_a_host_of_another_instance_asks_nothing(tmp_path, plane):
    fake = plane("runpod")
    p, _clock, _out, host = setup(tmp_path, fake)
    host.profile = profile("lambda")  # its client says no price
    p.refresh()
    assert fake.calls() == [] and not (tmp_path / "prices.json").exists()
    assert prices.api_of(SimpleNamespace(profile=profile("generic_ssh"))) is None
    (tmp_path / "prices.json").write_text(json.dumps({"schema": prices.SCHEMA, "hosts": {"box": {
        "instance_id": "pod-old", "price_per_hour": 9.0, "at": 0}}}))
    assert p.of("box") is None  # the cache names another instance
