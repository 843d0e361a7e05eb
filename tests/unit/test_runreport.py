"""The report's figures and the watch's one-glance line, from status documents as the box sends them
(module_utils/rgt_history builds the `history` key from a job.log, a gpu.csv and attempts.jsonl)."""

import base64
import re

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_history
from rgt import runreport

T0 = 1_700_000_000.0


def iso(t):
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def log_text(*attempts):
    """attempts: (number, first_step, last_step, reason or None)."""
    out = []
    for number, first, last, reason in attempts:
        out.append(f"== rgt attempt {number} started x resume_from=none")
        out.extend(f"step={s} loss={10.0 / s:.5f}" for s in range(first, last + 1))
        if reason:
            out.append(f"== rgt attempt {number} ended x reason={reason} rc=0")
    return "\n".join(out) + "\n"


def preempted_doc(price=2.0):
    """Attempt 1 ran 1200 s to step 130 and was preempted; attempt 2 resumed from the step-100 checkpoint and
    finished step 300 after 1700 s."""
    attempts = [{"attempt": 1, "started_at": iso(T0), "resume_from": ""},
                {"attempt": 1, "ended_at": iso(T0 + 1200), "rc": 0, "signal": None, "reason": "preempted"},
                {"attempt": 2, "started_at": iso(T0 + 1300), "resume_from": "/r/ckpt/step_00000100.ckpt"},
                {"attempt": 2, "ended_at": iso(T0 + 3000), "rc": 0, "signal": None, "reason": "finished"}]
    gpu = "ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c\n" + "".join(
        f"{T0 + 30 * k:.0f},{i},{0 if 10 <= k < 14 else 90},{2000 + k},81920,50\n" for k in range(60) for i in (0, 1))
    history = rgt_history.build(log_text((1, 1, 130, "preempted"), (2, 101, 300, "finished")), False, gpu, False,
                                attempts)
    return {"host": "box", "run_id": "exp1", "state": "finished", "attempt": 2, "step": 300, "loss": 0.0333,
            "price_per_hour": price, "cost_so_far": round(price * 2900 / 3600, 4), "history": history,
            "evidence": {"exit": {"rc": 0, "reason": "finished"}}}


def test_attempts_resume_point_recomputed_steps_and_lost_compute():
    facts = runreport.run_facts(preempted_doc(), now=T0 + 3600)
    a1, a2 = facts["attempts"]
    assert (a1["reason"], a1["last_step"], a1["wall_s"]) == ("preempted", 130, 1200)
    assert (a2["reason"], a2["resumed_from_step"], a2["last_step"], a2["wall_s"]) == ("finished", 100, 300, 1700)
    assert a1["recomputed_steps"] == 30 == facts["recomputed_steps"]
    assert a1["lost_s"] == pytest.approx(30 / (130 / 1200))  # 30 steps at attempt 1's own pace
    assert facts["preemptions"] == 1 and facts["attempt_count"] == 2 and facts["final_step"] == 300


def test_cost_is_price_times_wall_per_attempt_plus_the_billed_time_after_the_end():
    doc = preempted_doc(price=2.0)
    facts = runreport.run_facts(doc, now=T0 + 3600)
    assert [a["cost"] for a in facts["attempts"]] == [pytest.approx(2.0 * 1200 / 3600, abs=1e-4),
                                                     pytest.approx(2.0 * 1700 / 3600, abs=1e-4)]
    assert facts["attempts_cost"] == pytest.approx(doc["cost_so_far"])  # the status document's own figure
    assert facts["idle_after_end_s"] == 600 and facts["idle_cost"] == pytest.approx(2.0 * 600 / 3600, abs=1e-4)
    torn = runreport.run_facts(doc, now=T0 + 9999, teardown_at=T0 + 3300)
    assert torn["idle_after_end_s"] == 300 and torn["torn_down"] is True
    assert torn["cost"] == pytest.approx(2.0 * 3200 / 3600, abs=1e-3)
    assert facts["gpus"] == 2 and facts["gpu_hours"] == pytest.approx(2 * 2900 / 3600, abs=1e-3)


def test_a_running_attempt_counts_up_to_now_and_nothing_bills_after_it():
    doc = preempted_doc()
    doc["history"]["attempts"] = doc["history"]["attempts"][:3]
    doc.update(state="running")
    facts = runreport.run_facts(doc, now=T0 + 2000)
    assert facts["attempts"][1]["running"] is True and facts["attempts"][1]["wall_s"] == 700
    assert facts["idle_after_end_s"] is None and facts["idle_cost"] is None


def test_history_splits_attempts_keeps_nonfinite_and_stays_small():
    text = log_text((1, 1, 5000, "preempted")) + "== rgt attempt 2 started\nstep=4001 loss=nan\n" + "".join(
        f"step={s} loss=0.5\n" for s in range(4002, 9000)) + "Traceback (most recent call last):\nValueError: boom\n"
    hist = rgt_history.loss_history(text)
    assert len(hist["points"]) <= rgt_history.MAX_LOSS_POINTS + 60
    assert [4001, "nan"] in [p[1:] for p in hist["points"]], "a non-finite loss survives thinning"
    firsts = {a["attempt"]: (a["first_step"], a["last_step"]) for a in hist["attempts"]}
    assert firsts == {1: (1, 5000), 2: (4001, 8999)}
    assert hist["error_line"] == "ValueError: boom" and hist["traceback"] is True
    assert {p[0] for p in hist["points"]} == {1, 2} and hist["points"][-1] == [2, 8999, 0.5]


def test_gpu_history_buckets_and_idle_stretches_per_gpu():
    rows = "".join(f"{T0 + k},{0},{3 if 100 <= k < 110 else 95},{k},100,40\n" for k in range(1000))
    gpu = rgt_history.gpu_history("ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c\n" + rows)
    assert len(gpu["series"]["0"]) <= rgt_history.MAX_GPU_POINTS and gpu["samples"] == 1000
    assert gpu["idle"] == [{"index": 0, "start": T0 + 100, "end": T0 + 109, "samples": 10}]
    assert gpu["interval_s"] == 1


def test_resume_step_is_the_last_number_of_the_checkpoint_name():
    assert rgt_history.resume_step("/r/ckpt/step_00000100.ckpt") == 100
    assert rgt_history.resume_step("/r/ckpt/checkpoint-1500/") == 1500
    assert rgt_history.resume_step("/r/ckpt/latest.pt") is None


def test_glance_names_the_failed_run_its_exit_and_the_traceback():
    ok = preempted_doc()
    bad = {"host": "b2", "run_id": "r2", "state": "failed", "attempt": 1, "price_per_hour": 1.0,
           "evidence": {"exit": {"rc": 1, "reason": "failed"}},
           "history": rgt_history.build(log_text((1, 1, 3, None)) + "Traceback (most recent call last):\n"
                                        "KeyError: 'lr'\n", False, "", False,
                                        [{"attempt": 1, "started_at": iso(T0), "resume_from": ""},
                                         {"attempt": 1, "ended_at": iso(T0 + 60), "rc": 1, "reason": "failed"}])}
    docs = {"box": ok, "b2": bad, "b3": {"host": "b3", "state": "running"}}
    facts = {h: runreport.run_facts(d, now=T0 + 3600) for h, d in docs.items()}
    line = runreport.glance(docs, facts)
    assert line.startswith("1/3 finished, 1 running, 1 failed (b2: exit 1, Traceback in log: KeyError: 'lr')")
    # 30 steps at 130 steps per 1200 s; attempts 2900 s at $2/h + 600 s billed after the end, and 3600 s at $1/h
    assert line.endswith("; 1 preemption, 4.6 min of compute lost; $2.94 so far"), line


def test_the_page_embeds_every_plot_and_writes_the_pngs_beside_it(tmp_path):
    pytest.importorskip("matplotlib")
    rep = runreport.write_report(tmp_path / "runs", tmp_path / "ledger", "exp1", [preempted_doc()], now=T0 + 3600)
    page = (tmp_path / "runs" / "exp1" / "report.html").read_text()
    images = re.findall(r'data-plot="(\w+)"[^>]*src="data:image/png;base64,([^"]+)"', page)
    assert sorted(k for k, _ in images) == ["attempts", "gpu", "loss"]
    for key, data in images:
        assert base64.b64decode(data) == (tmp_path / "runs" / "exp1" / f"report-box-{key}.png").read_bytes()
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page  # no network needed
    assert 'data-k="preemptions">1<' in page and 'data-k="recomputed_steps">30<' in page
    assert rep["glance"].startswith("exp1: 1/1 finished; 1 preemption")


def test_the_page_links_the_pulled_logs_with_the_seals_word_on_a_capped_one(tmp_path):
    pytest.importorskip("matplotlib")
    import json

    out = tmp_path / "runs" / "exp1"
    assert runreport.logs_html(out, "box") == "", "no pulled logs here: no block"
    (out / "box" / "logs").mkdir(parents=True)
    (out / "box" / "logs" / "job.log").write_text("== rgt attempt 1 started\n")
    (out / "box" / "logs" / "attempts.jsonl").write_text("{}\n")
    reason = "capped: bytes 10 to 20 (...) are not in the export: it is capped at 1.0 MiB (collect_log_max_mb)"
    (out / "box.manifest.json").write_text(json.dumps({"logs": {"max_bytes": 1 << 20, "files": [
        {"path": "logs/job.log", "reason": reason}, {"path": "logs/attempts.jsonl", "reason": None}]}}))
    runreport.write_report(tmp_path / "runs", tmp_path / "ledger", "exp1", [preempted_doc()], now=T0 + 3600)
    page = (out / "report.html").read_text()
    assert '<a data-k="log" href="box/logs/job.log">box/logs/job.log</a>' in page
    assert '<a data-k="log" href="box/logs/attempts.jsonl">box/logs/attempts.jsonl</a></li>' in page
    assert "it is capped at 1.0 MiB (collect_log_max_mb)" in page
