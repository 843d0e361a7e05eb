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


def test_history_carries_the_metrics_on_the_step_axis_and_names_a_declared_metric_the_log_never_shows():
    text = ("== rgt attempt 1 started x\n" + "".join(f"step={s} loss=0.5 lr={s * 1e-5:.1e}\n" for s in range(1, 301))
            + "val_loss=0.42\n" + "".join(f"step={s} loss=0.4\n" for s in range(301, 400)))
    built_in = rgt_history.loss_history(text)["metrics"]
    assert list(built_in) == ["eval_loss", "lr"] and built_in["eval_loss"] == [[1, 300, 0.42]]
    assert len(built_in["lr"]) <= rgt_history.MAX_METRIC_POINTS and built_in["lr"][0] == [1, 1, 1e-05]
    no_eval = rgt_history.loss_history(text.replace("val_loss=0.42\n", ""))["metrics"]
    assert list(no_eval) == ["lr"], "a built-in metric only when the log shows it"
    declared = rgt_history.loss_history(text, metrics={"val": r"val_loss=([0-9.]+)", "tok_s": r"tok/s=(\S+)"})
    assert declared["metrics"] == {"val": [[1, 300, 0.42]], "tok_s": []}, "a line without a step takes the last"
    assert rgt_history.build(text, False, "", False, [], metrics={})["metrics"] == {}


def test_gpu_history_buckets_and_idle_stretches_per_gpu():
    rows = "".join(f"{T0 + k},{0},{3 if 100 <= k < 110 else 95},{k},100,40\n" for k in range(1000))
    gpu = rgt_history.gpu_history("ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c\n" + rows)
    assert len(gpu["series"]["0"]) <= rgt_history.MAX_GPU_POINTS and gpu["samples"] == 1000
    assert gpu["idle"] == [{"index": 0, "start": T0 + 100, "end": T0 + 109, "samples": 10}]
    assert gpu["interval_s"] == 1
    # an idle GPU across a preemption: the wrapper took no samples from 60 s to 300 s, two stretches, not one
    paused = "".join(f"{T0 + t},0,0,0,100,40\n" for t in (*range(0, 60, 10), *range(300, 360, 10)))
    assert [(s["start"] - T0, s["end"] - T0, s["samples"]) for s in rgt_history.gpu_history(paused)["idle"]] == [
        (0, 50, 6), (300, 350, 6)]


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
    assert sorted(k for k, _ in images) == ["steps", "time"]
    for key, data in images:
        assert base64.b64decode(data) == (tmp_path / "runs" / "exp1" / f"report-box-{key}.png").read_bytes()
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page  # no network needed
    assert 'data-k="preemptions">1<' in page and 'data-k="recomputed_steps">30<' in page
    assert rep["glance"].startswith("exp1: 1/1 finished; 1 preemption")
    assert "no GPU samples" not in page and 'data-k="clock_offset_h"' not in page  # one clock: no note


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


BOX_TEXT = "<b>x</b> & 'q' \"dq\""  # text a box sends, which must show as text: escaped once, never markup


def test_box_text_on_the_page_is_shown_as_text_escaped_once(tmp_path):
    import html
    import json

    doc = {**preempted_doc(), "host": "box", "_source": BOX_TEXT}
    facts = runreport.run_facts(doc, now=T0 + 3600)
    facts["log_error"] = {"line": BOX_TEXT}
    facts["verified"] = {"files": 3, "bytes": 9, "manifest_sha256": "ab" * 32, "verified_at": BOX_TEXT,
                         "checkpoints": [{"path": BOX_TEXT, "ok": False}]}
    out = tmp_path / "runs" / "exp1"
    (out / "box" / "logs").mkdir(parents=True)
    (out / "box" / "logs" / "job.log").write_text("x\n")
    (out / "box.manifest.json").write_text(json.dumps({"logs": {"files": [{"path": "logs/job.log",
                                                                          "reason": BOX_TEXT}]}}))
    page = runreport.page(BOX_TEXT, [runreport.host_section(doc, facts, {}, {}, runreport.logs_html(out, "box"))],
                          BOX_TEXT, T0)
    assert "<b>" not in page and "&amp;lt;" not in page and "&amp;amp;" not in page
    # once unescaped, as the browser shows it: the title twice, the glance, the source note, the error line,
    # verified at, the checkpoint, the log's reason
    assert html.unescape(page).count(BOX_TEXT) == 8
    assert html.unescape(re.search(r'<p data-k="glance">([^<]*)</p>', page).group(1)) == BOX_TEXT


# ---------------------------------------------------------------- the plots: one story

def metrics_doc():
    """The preempted run of preempted_doc, its log in HF Trainer's format (tqdm bar, dict lines, evaluation),
    with the wrapper's GPU samples only while an attempt ran, and an idle stretch in attempt 1."""
    lines = []
    for number, first, last, total in ((1, 1, 130, 300), (2, 101, 300, 300)):
        lines.append(f"== rgt attempt {number} started x resume_from=none")
        if number == 2:
            lines.append("  Continuing training from global step 100")
        for s in range(first, last + 1):
            lines.append(f" {100 * s // total}%|#   | {s}/{total} [00:10<00:20, 9.50it/s]")
            lines.append(f"{{'loss': {10.0 / s:.5f}, 'grad_norm': 1.5, 'learning_rate': {1e-4 * (1 - s / 400):.3e}, "
                         f"'epoch': {s / total:.2f}}}")
            if s % 50 == 0:
                lines.extend(f" {k * 10}%|#   | {k}/10 [00:01<00:01, 9.00it/s]" for k in range(1, 11))
                lines.append(f"{{'eval_loss': {12.0 / s:.5f}, 'eval_runtime': 1.2, 'epoch': {s / total:.2f}}}")
    attempts = [{"attempt": 1, "started_at": iso(T0), "resume_from": ""},
                {"attempt": 1, "ended_at": iso(T0 + 1200), "rc": 0, "signal": None, "reason": "preempted"},
                {"attempt": 2, "started_at": iso(T0 + 1300), "resume_from": "/r/ckpt/step_00000100.ckpt"},
                {"attempt": 2, "ended_at": iso(T0 + 3000), "rc": 0, "signal": None, "reason": "finished"}]
    samples = [t for t in range(0, 1200, 30)] + [t for t in range(1300, 3000, 30)]
    gpu = "ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c\n" + "".join(
        f"{T0 + t:.0f},0,{2 if 300 <= t < 420 else 90},{30000 + t},81920,50\n" for t in samples)
    history = rgt_history.build("\n".join(lines) + "\n", False, gpu, False, attempts)
    return {**preempted_doc(), "history": history}


def _legend_texts(fig):
    return {t.get_text() for legend in fig.legends for t in legend.get_texts()}


def _span(patch):
    """(x0, x1) of an axvspan in data coordinates (a Rectangle in matplotlib >= 3.9, a Polygon before)."""
    if hasattr(patch, "get_width"):
        return patch.get_x(), patch.get_x() + patch.get_width()
    xs = [x for x, _y in patch.get_xy()]
    return min(xs), max(xs)


def test_the_steps_figure_puts_loss_and_each_metric_on_one_step_axis_with_every_style_in_its_legend():
    pytest.importorskip("matplotlib")
    doc = metrics_doc()
    assert set(doc["history"]["metrics"]) == {"eval_loss", "lr"}
    fig = runreport.steps_figure(doc, runreport.run_facts(doc, now=T0 + 3600))
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == ["loss", "eval_loss", "lr"]
    assert all(axes[0].get_shared_x_axes().joined(axes[0], ax) for ax in axes[1:]), "one shared step axis"
    legend = _legend_texts(fig)
    for ax in axes:
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
        curves = {ln.get_label(): ln for ln in lines if ln.get_linestyle() == "-"}
        assert set(curves) == {"attempt 1", "attempt 2"}, ax.get_ylabel()
        # an attempt's curve ends where the attempt ended: attempt 1 at 130, attempt 2 from its resume point on
        assert max(curves["attempt 1"].get_xdata()) <= 130 and min(curves["attempt 2"].get_xdata()) >= 100
        dashed = [ln for ln in lines if ln.get_linestyle() == "--"]
        assert [tuple(ln.get_xdata()) for ln in dashed] == [(100, 100)], "the relaunch, in every plot"
        assert [_span(p) for p in ax.patches] == [(100, 130)], "the recomputed steps, in every plot"
        for artist in [*lines, *ax.patches]:
            assert artist.get_label() in legend, f"{artist.get_label()!r} has no legend entry"
    assert {"attempt 1", "attempt 2", "preempted, then resumed from this step",
            "steps computed twice (lost to the relaunch)"} <= legend
    for label in ("attempt 1", "attempt 2"):
        colours = {ln.get_color() for ax in axes for ln in ax.get_lines() if ln.get_label() == label}
        assert len(colours) == 1, f"{label} has one colour in every plot (its one legend entry stands for all)"
    evals = dict((s, v) for _a, s, v in doc["history"]["metrics"]["eval_loss"])
    assert evals[50] == pytest.approx(12.0 / 50), "an evaluation is drawn at the training step, not the eval bar's"


def test_the_time_figure_breaks_lines_between_attempts_and_shades_the_gap_and_the_idle_stretch():
    pytest.importorskip("matplotlib")
    import math

    doc = metrics_doc()
    facts = runreport.run_facts(doc, now=T0 + 3600)
    fig = runreport.time_figure(doc, facts)
    bars, util, mem = fig.axes
    assert all(bars.get_shared_x_axes().joined(bars, ax) for ax in (util, mem)), "one shared time axis"
    gap = (20.0, 1300 / 60)  # attempt 1 ended at 20 min, attempt 2 started at 21.67 min
    for ax in (util, mem):
        (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "GPU 0"]
        xs, ys = list(line.get_xdata()), list(line.get_ydata())
        breaks = [x for x, y in zip(xs, ys, strict=True) if isinstance(y, float) and math.isnan(y)]
        assert len(breaks) == 1 and gap[0] - 0.5 < breaks[0] < gap[1] + 0.5, "a NaN break at the attempt gap"
        points = list(zip(xs, ys, strict=True))
        drawn = [(a, b) for (a, ya), (b, yb) in zip(points, points[1:], strict=False)
                 if not (math.isnan(ya) or math.isnan(yb))]
        assert not [(a, b) for a, b in drawn if a <= gap[0] and b >= gap[1]], "no segment crosses the gap"
        spans = {p.get_label(): _span(p) for p in ax.patches}
        assert spans["between attempts (no job ran)"] == pytest.approx(gap)
        # idle: samples at 300..390 s (4 samples, 30 s apart) widened by half an interval: 285..405 s
        assert spans["a GPU idle (at or below 5 % for 2+ samples)"] == pytest.approx((285 / 60, 405 / 60))
    assert {p.get_label() for p in bars.patches} == {"between attempts (no job ran)"}
    reasons = {c.get_label() for c in bars.collections}
    assert reasons == {"preempted", "finished", "box billed after the job ended (until this report)"}
    legend = _legend_texts(fig)
    for ax in fig.axes:
        for artist in [*ax.get_lines(), *ax.patches, *ax.collections]:
            assert artist.get_label() in legend, f"{artist.get_label()!r} has no legend entry"
    assert {"GPU 0", "GPU memory total", "preempted", "finished"} <= legend


def test_a_gpu_line_is_also_broken_where_the_wrapper_took_no_samples():
    from rgt.runreport import _breaks, _with_nan_breaks

    times = [0, 30, 60, 90, 600, 630]  # the box was gone from 90 s to 600 s
    cut = _breaks(times, [0], 3 * 30)
    assert cut == [4]
    xs, ys = _with_nan_breaks(times, [1, 2, 3, 4, 5, 6], cut)
    assert xs[4] == 345 and ys[4] != ys[4] and ys[:4] == [1, 2, 3, 4] and ys[5:] == [5, 6]
    assert _breaks([0, 30, 60, 90], [0, 45], None) == [2], "two attempts: no line joins them"


def test_the_page_says_what_the_plots_lack():
    pytest.importorskip("matplotlib")
    doc = preempted_doc()
    doc["history"]["gpu"] = rgt_history.gpu_history("")
    doc["history"]["metrics"] = {"tokens_per_s": []}  # declared, never matched
    section = runreport.host_section(doc, runreport.run_facts(doc, now=T0 + 3600), {}, {})
    assert "no GPU samples" in section
    assert "no value in the log for the metric(s) tokens_per_s (rgt_job.metrics sets the patterns)" in section
    assert "no loss lines in the log" in section and "no attempts recorded yet" in section
    # GPU samples without attempt records, metrics without a loss: each figure still drawn, the page says what lacks
    gpu_only = {**metrics_doc(), "history": {**metrics_doc()["history"], "attempts": [],
                                             "loss": {"points": [], "attempts": [], "truncated": False}}}
    facts = runreport.run_facts(gpu_only, now=T0 + 3600)
    time_fig = runreport.time_figure(gpu_only, facts)
    assert "the first GPU sample" in time_fig.axes[-1].get_xlabel()
    steps_fig = runreport.steps_figure(gpu_only, facts)
    assert [ax.get_ylabel() for ax in steps_fig.axes] == ["eval_loss", "lr"]
    assert "the steps figure shows the metrics only" in runreport.host_section(gpu_only, facts, {}, {})


# ---------------------------------------------------------------- one clock per duration

DAY = 86400.0


def skewed_doc(price=10.0, box_behind=DAY, state="finished"):
    """An 11 s run on a box whose clock is a day behind this machine's: its records are on the box's clock, its
    `collected_at` too (40 s after the start), `seen_at` is this machine's time when the document arrived."""
    box_t0 = T0 - box_behind
    attempts = [{"attempt": 1, "started_at": iso(box_t0), "resume_from": ""}]
    if state == "finished":
        attempts.append({"attempt": 1, "ended_at": iso(box_t0 + 11), "rc": 0, "signal": None, "reason": "finished"})
    history = rgt_history.build(log_text((1, 1, 11, state if state == "finished" else None)), False, "", False,
                                attempts)
    return {"host": "box", "run_id": "r", "state": state, "attempt": 1, "price_per_hour": price,
            "history": history, "collected_at": box_t0 + 40, "seen_at": T0 + 40,
            "cost_so_far": round(price * (11 if state == "finished" else 40) / 3600, 4)}


def test_a_box_clock_a_day_behind_bills_the_minutes_not_the_day():
    doc = skewed_doc()
    facts = runreport.run_facts(doc, now=T0 + 45)
    assert facts["wall_s"] == 11 and facts["attempts_cost"] == pytest.approx(doc["cost_so_far"])
    # ended at 11 s, seen at 40 s on the box's clock, reported 5 s later on this machine's: billed 34 s after the end
    assert facts["idle_after_end_s"] == pytest.approx(34)
    assert facts["cost"] == pytest.approx(10.0 * 45 / 3600, abs=1e-4)
    assert facts["clock_offset_s"] == DAY
    assert runreport.glance({"box": doc}, {"box": facts}).endswith("; $0.12 so far")
    torn = runreport.run_facts(doc, now=T0 + 999, teardown_at=T0 + 100)  # teardown is this machine's record
    assert torn["idle_after_end_s"] == pytest.approx(89) and torn["torn_down"] is True
    table = runreport.figures_table(facts)
    assert 'data-k="clock_offset_h">-24.00 h<' in table and "behind this machine" in table


def test_a_running_attempt_on_a_skewed_box_counts_its_own_time():
    doc = skewed_doc(state="running")
    facts = runreport.run_facts(doc, now=T0 + 100)
    # 40 s on the box's clock when it was seen, then 60 s more on this machine's
    assert facts["attempts"][0]["running"] is True and facts["wall_s"] == pytest.approx(100)
    assert facts["idle_after_end_s"] is None
    ahead = runreport.run_facts(skewed_doc(state="running", box_behind=-DAY), now=T0 + 100)
    assert ahead["wall_s"] == pytest.approx(100) and ahead["clock_offset_s"] == -DAY


def test_a_second_report_redraws_only_the_figure_whose_data_changed(tmp_path):
    """The steps figure reads the document and the attempts: a later report of the same settled run keeps its PNG
    as it is; the time figure shows the time billed until this report, so it is drawn again."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "runs" / "exp1"
    runreport.write_report(tmp_path / "runs", tmp_path / "ledger", "exp1", [preempted_doc()], now=T0 + 3600)
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in out.glob("*.png")}
    rep = runreport.write_report(tmp_path / "runs", tmp_path / "ledger", "exp1", [preempted_doc()], now=T0 + 7200)
    after = {p.name: (p.stat().st_ino, p.read_bytes()) for p in out.glob("*.png")}
    assert sorted(rep["pngs"]) == sorted(str(out / n) for n in before)
    assert after["report-box-steps.png"] == before["report-box-steps.png"]
    assert after["report-box-time.png"][0] != before["report-box-time.png"][0]


def test_a_moved_runs_page_says_where_it_came_from_and_the_work_lost(tmp_path):
    pytest.importorskip("matplotlib")
    from rgt import memory

    ledger = tmp_path / "ledger"
    memory.record_launch(ledger, "box", "i-box", "rgt", {"name": "exp1", "command": "x"}, {"action": "launch"})
    memory.record_move(ledger, "old", "box", "rgt", "exp1", 2, {"from": "old", "generation": 2, "attempt": 2,
                                                              "checkpoint": {"step": 100}, "work_lost_steps": 30})
    runreport.write_report(tmp_path / "runs", ledger, "exp1", [preempted_doc()], now=T0 + 3600)
    page = (tmp_path / "runs" / "exp1" / "report.html").read_text()
    assert ('data-k="moved">moved from old (generation 2, attempt 2, resumed from step 100; work lost 30 steps)<'
            in page), page[:2000]
