"""The sweep report: one page per sweep (runs/<sweep>/report.html) with a row per cell of the roster, every cell's
loss in one plot and the sweep's one-glance line, from status documents as the box sends them (module_utils/
rgt_history builds the `history` key) and the ledger's roster."""

import base64
import html
import json
import re
import shutil
import subprocess

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_history
from rgt import runreport
from rgt.inventory import Host

T0 = 1_700_000_000.0
NAME = "abl"
A, B, C = "abl--lr=0.1--seed=0", "abl--lr=0.01--seed=0", "abl--lr=0.01--seed=1"


def iso(t):
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def roster():
    cells = [(A, "a", {"lr": 0.1, "seed": 0}), (B, "b", {"lr": 0.01, "seed": 0}), (C, "b", {"lr": 0.01, "seed": 1})]
    return {"schema": "rgt/roster/v1", "sweep": NAME, "project": "proj", "created_at": "2026-01-01T00:00:00+00:00",
            "cells": [{"id": i, "host": h, "params": p, "args": [], "env": {}, "command": "x"} for i, h, p in cells],
            "hosts": {"a": [A], "b": [B, C]}}


def finished_doc(host, run_id, scale, steps=50, wall=600, price=1.2):
    """A cell that ran one attempt of `wall` seconds to `steps` steps, its loss scale / step."""
    log = "== rgt attempt 1 started x resume_from=none\n" + "".join(
        f"step={s} loss={scale / s:.5f}\n" for s in range(1, steps + 1)) + "== rgt attempt 1 ended x reason=finished\n"
    attempts = [{"attempt": 1, "started_at": iso(T0), "resume_from": ""},
                {"attempt": 1, "ended_at": iso(T0 + wall), "rc": 0, "signal": None, "reason": "finished"}]
    return {"host": host, "run_id": run_id, "state": "finished", "attempt": 1, "step": steps,
            "loss": round(scale / steps, 5), "price_per_hour": price, "evidence": {"exit": {"rc": 0}},
            "history": rgt_history.build(log, False, "", False, attempts)}


def preempted_doc(host, run_id, price=1.2):
    """Attempt 1 ran to step 30 and was preempted (600 s); attempt 2 resumed from step 20 and finished step 60
    after 900 s."""
    log = ("== rgt attempt 1 started x resume_from=none\n"
           + "".join(f"step={s} loss={9.0 / s:.5f}\n" for s in range(1, 31))
           + "== rgt attempt 1 ended x reason=preempted\n== rgt attempt 2 started x\n"
           + "".join(f"step={s} loss={8.0 / s:.5f}\n" for s in range(21, 61)) + "== rgt attempt 2 ended x\n")
    attempts = [{"attempt": 1, "started_at": iso(T0), "resume_from": ""},
                {"attempt": 1, "ended_at": iso(T0 + 600), "rc": 0, "signal": None, "reason": "preempted"},
                {"attempt": 2, "started_at": iso(T0 + 700), "resume_from": "/r/ckpt/step_00000020.ckpt"},
                {"attempt": 2, "ended_at": iso(T0 + 1600), "rc": 0, "signal": None, "reason": "finished"}]
    return {"host": host, "run_id": run_id, "state": "finished", "attempt": 2, "step": 60, "loss": 0.13333,
            "price_per_hour": price, "history": rgt_history.build(log, False, "", False, attempts)}


MARKER = {"schema": "rgt/pull-verified/v1", "run_id": A, "host": "a", "files": 3, "bytes": 1234,
          "manifest_sha256": "ab" * 32, "verified_at": "2026-01-01T00:10:00Z"}


def test_a_row_per_cell_of_the_roster_with_its_figures_and_a_cell_without_data_shown_missing():
    docs = [finished_doc("a", A, 5.0), preempted_doc("b", B)]
    s = runreport.sweep_facts(roster(), docs, now=T0 + 1600, verified={A: MARKER})
    rows = {r["cell"]: r for r in s["rows"]}
    assert [r["cell"] for r in s["rows"]] == [A, B, C], "roster order, every cell"
    a, b, c = rows[A], rows[B], rows[C]
    assert (a["host"], a["label"], a["state"], a["attempts"], a["final_loss"]) == ("a", "lr=0.1, seed=0",
                                                                                  "finished", 1, 0.1)
    assert a["wall_s"] == 600 and a["verified"] == MARKER
    # one attempt of 600 s at $1.2/h, and the box billed 1000 s more after the job ended, until this report
    assert a["cost"] == pytest.approx(1.2 * 1600 / 3600, abs=1e-4)
    assert (b["state"], b["attempts"], b["final_loss"], b["wall_s"]) == ("finished", 2, 0.13333, 1500)
    assert b["cost"] == pytest.approx(1.2 * 1500 / 3600, abs=1e-4) and b["verified"] is None
    assert c["missing"] is True and c["state"] == "missing" and c["host"] == "b"
    assert (c["attempts"], c["final_loss"], c["wall_s"], c["cost"]) == (None, None, None, None)
    # the sweep's tally, then the compute lost (10 steps at attempt 1's 30 steps per 600 s) and the cost
    assert s["glance"] == (f"sweep abl: 2/3 finished, 1 missing ({C}); 1 preemption, 3.3 min of compute lost; "
                           "$1.03 so far"), s["glance"]


def test_a_cell_whose_box_did_not_answer_is_unreachable_not_missing():
    s = runreport.sweep_facts(roster(), [finished_doc("a", A, 5.0)], now=T0 + 600, down={"b"})
    assert [r["state"] for r in s["rows"]] == ["finished", "unreachable", "unreachable"]
    assert s["glance"].startswith("sweep abl: 1/3 finished, 2 unreachable;")


def test_every_cell_is_one_line_of_the_overlaid_loss_plot_labelled_by_its_params():
    pytest.importorskip("matplotlib")
    docs = {A: finished_doc("a", A, 5.0), B: preempted_doc("b", B), C: finished_doc("b", C, 7.0, steps=40)}
    s = runreport.sweep_facts(roster(), list(docs.values()), now=T0 + 1600)
    fig = runreport.sweep_loss_figure(s["rows"], docs, "t")
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines] == ["lr=0.1, seed=0", "lr=0.01, seed=0", "lr=0.01, seed=1"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [ln.get_label() for ln in lines]
    # the preempted cell is one curve: attempt 1 up to the step attempt 2 resumed from, then attempt 2
    steps, losses = (list(v) for v in lines[1].get_data())
    assert steps == list(range(1, 61))
    assert losses[19] == pytest.approx(9.0 / 20, abs=1e-4) and losses[20] == pytest.approx(8.0 / 21, abs=1e-4)
    assert len(ax.get_lines()) == 3
    runreport._pyplot().close(fig)
    # a cell with no document draws no line
    fig = runreport.sweep_loss_figure(s["rows"], {A: docs[A]}, "t")
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["lr=0.1, seed=0"]
    runreport._pyplot().close(fig)


def write(tmp_path, docs, **kw):
    (tmp_path / "runs" / A).mkdir(parents=True)
    (tmp_path / "runs" / A / "a.PULL_VERIFIED.json").write_text(json.dumps(MARKER))
    return runreport.write_sweep_report(tmp_path / "runs", tmp_path / "ledger", roster(), docs, now=T0 + 1600, **kw)


def shown(page, key):
    return [html.unescape(v) for v in re.findall(rf'data-k="{key}"[^>]*>([^<]*)<', page)]


def test_the_sweep_page_is_one_self_contained_file_with_its_table_plot_and_line(tmp_path):
    pytest.importorskip("matplotlib")
    rep = write(tmp_path, [finished_doc("a", A, 5.0), preempted_doc("b", B)])
    out = tmp_path / "runs" / NAME
    page = (out / "report.html").read_text()
    assert rep["html"] == str(out / "report.html") and rep["pngs"] == [str(out / "report-loss.png")]
    assert sorted(rep["hosts"]) == ["a", "b"] and sorted(rep["hosts"]["b"]) == [B]
    (image,) = re.findall(r'data-plot="sweep-loss"[^>]*src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(image) == (out / "report-loss.png").read_bytes()
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page
    assert re.findall(r'<tr data-cell="([^"]+)"', page) == [A, B, C]
    assert shown(page, "glance") == [rep["glance"]] and rep["glance"].startswith("sweep abl: 2/3 finished, 1 missing")
    assert shown(page, "host") == ["a", "b", "b"]
    assert shown(page, "params") == ["lr=0.1, seed=0", "lr=0.01, seed=0", "lr=0.01, seed=1"]
    assert shown(page, "state") == ["finished", "finished", "missing"]
    assert shown(page, "attempts") == ["1", "2", "-"] and shown(page, "final_loss") == ["0.1", "0.13333", "-"]
    assert shown(page, "wall_min") == ["10.00", "25.00", "-"]
    assert shown(page, "cost") == ["0.5333", "0.5000", "-"]
    assert shown(page, "verified") == ["verified (3 files)", "not verified", "not verified"]
    # the data behind each cell's row, where a later report of a box that is gone reads it back
    saved = json.loads((tmp_path / "runs" / B / "b.report.json").read_text())
    assert saved["run_id"] == B and saved["doc"]["run_id"] == B and saved["facts"]["attempt_count"] == 2
    assert not (tmp_path / "runs" / C).exists()


def test_box_text_on_the_sweep_page_is_shown_as_text_escaped_once():
    box_text = "<b>x</b> & 'q' \"dq\""  # a cell's source note and no-loss name, as a box could make them
    s = runreport.sweep_facts(roster(), [finished_doc("a", A, 5.0)], now=T0 + 600)
    s["rows"][0]["source"] = box_text
    page = runreport.sweep_page(s, None, "report-loss.png", T0, [box_text])
    assert "<b>" not in page and "&amp;lt;" not in page and "&amp;amp;" not in page
    assert html.unescape(page).count(box_text) == 2
    assert shown(page, "no_loss") == [f"no loss lines in the log of: {box_text} (rgt_job.log_patterns sets the "
                                      "patterns)"]
    assert shown(page, "cell") == [A, B, C]


def test_the_sweep_page_opens_in_a_real_browser_with_its_plot_loaded(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed; the browser check did not run")
    pytest.importorskip("matplotlib")
    rep = write(tmp_path, [finished_doc("a", A, 5.0), preempted_doc("b", B)])
    probe = tmp_path / "probe.html"
    probe.write_text(open(rep["html"]).read().replace("</body>", (
        "<script>window.addEventListener('load',function(){var i=document.images,n=0;for(var k=0;k<i.length;k++)"
        "{if(i[k].complete&&i[k].naturalWidth>0)n++;}document.title='images '+n+'/'+i.length;});</script></body>")))
    dom = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--dump-dom", f"file://{probe}"],
                         capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"<title>images 1/1</title>", dom), dom[:300]
    assert shown(dom, "state") == ["finished", "finished", "missing"]
    assert shown(dom, "verified")[0] == "verified (3 files)"


def sweep_host(name, cells):
    host = Host(name=name, vars={"rgt_project": "proj", "rgt_job": {"run_id": cells[0]}})
    host.recalled = {"job": {"run_id": cells[0]}, "cells": [{"run_id": c} for c in cells]}
    host.other_runs, host.sweep = cells[1:], NAME
    return host


def test_the_status_round_documents_are_grouped_by_the_roster_and_a_cell_with_no_data_is_skipped(tmp_path):
    """A sweep host's status document carries its first cell as the run and the others in `other_runs`
    (rgt.sweeps.expand); box b answered with B only, so C is shown missing and reported as b:C."""
    pytest.importorskip("matplotlib")
    ledger, root = tmp_path / "ledger", tmp_path / "runs"
    (ledger / "sweeps" / "proj").mkdir(parents=True)
    (ledger / "sweeps" / "proj" / f"{NAME}.json").write_text(json.dumps(roster()))
    fresh = {"a": finished_doc("a", A, 5.0),
             "b": {**preempted_doc("b", B), "other_runs": [{"host": "b", "run_id": C, "state": "not_started"}]}}
    skipped = {}
    (rep,) = runreport.sweep_reports(ledger, root, [sweep_host("a", [A]), sweep_host("b", [B, C])], fresh, {},
                                     skipped)
    assert [(c["cell"], c["state"]) for c in rep["cells"]] == [(A, "finished"), (B, "finished"), (C, "missing")]
    assert skipped == {f"b:{C}": "not_started: no history from the box"}
    assert (root / NAME / "report.html").is_file() and not (root / A / "report.html").exists()
    # box b is gone now: its cell is shown from the data the last report saved, and says so
    skipped = {}
    down = {"a": fresh["a"], "b": {"host": "b", "state": "unreachable", "error": "ssh: timed out"}}
    (rep,) = runreport.sweep_reports(ledger, root, [sweep_host("a", [A]), sweep_host("b", [B, C])], down, {},
                                     skipped)
    assert [(c["cell"], c["state"]) for c in rep["cells"]] == [(A, "finished"), (B, "finished"), (C, "unreachable")]
    assert rep["cells"][1]["source"].startswith("b is unreachable now: data as of the last report")
    assert skipped == {f"b:{C}": "unreachable: ssh: timed out"}
    # --run names the sweep or one of its cells; another name leaves the sweep out
    assert runreport.sweep_reports(ledger, root, [sweep_host("a", [A])], fresh, {}, {}, only_run="other") == []
    (rep,) = runreport.sweep_reports(ledger, root, [sweep_host("a", [A])], fresh, {}, {}, only_run=C)
    # b is outside this play: nothing in the ledger's status of b, but the last report saved B
    assert [(c["cell"], c["state"]) for c in rep["cells"]] == [(A, "finished"), (B, "finished"), (C, "missing")]
    assert rep["cells"][1]["source"].startswith("b is outside this play now: data as of the last report")


def test_a_report_of_unchanged_data_keeps_its_figure_and_draws_nothing_and_new_data_redraws_it(tmp_path,
                                                                                               monkeypatch):
    """A re-pull (or a second report) of a settled sweep: the PNG carries the hash of what it was drawn from, so
    the same data keeps the file on disk as it is and draws nothing; a changed loss draws it again."""
    pytest.importorskip("matplotlib")
    docs = [finished_doc("a", A, 5.0), preempted_doc("b", B)]
    png = tmp_path / "runs" / NAME / "report-loss.png"
    write(tmp_path, docs)
    first, inode = png.read_bytes(), png.stat().st_ino
    assert runreport.png_key(first)
    real = runreport.sweep_loss_figure
    monkeypatch.setattr(runreport, "sweep_loss_figure", lambda *a: pytest.fail("drew an unchanged figure"))
    rep = runreport.write_sweep_report(tmp_path / "runs", tmp_path / "ledger", roster(), docs, now=T0 + 9999)
    assert rep["pngs"] == [str(png)] and png.stat().st_ino == inode and png.read_bytes() == first
    (image,) = re.findall(r'data-plot="sweep-loss"[^>]*src="data:image/png;base64,([^"]+)"',
                          (png.parent / "report.html").read_text())
    assert base64.b64decode(image) == first
    monkeypatch.setattr(runreport, "sweep_loss_figure", real)
    runreport.write_sweep_report(tmp_path / "runs", tmp_path / "ledger", roster(),
                                 [finished_doc("a", A, 7.0), preempted_doc("b", B)], now=T0 + 9999)
    assert png.read_bytes() != first and runreport.png_key(png.read_bytes()) != runreport.png_key(first)


def test_a_sweep_host_whose_cells_are_remembered_by_name_is_seen_settled():
    """The ledger remembers a cell's job by `name` or `run_id` (one rule for a run's id): either way the report
    after a pull reuses a settled status instead of polling the box again."""
    host = sweep_host("b", [B, C])
    host.recalled = {"job": {"name": B}, "cells": [{"name": B}, {"name": C, "outputs": []}]}
    doc = {**preempted_doc("b", B), "other_runs": [finished_doc("b", C, 3.0)]}
    assert runreport._host_settled(host, doc, {})
    assert not runreport._host_settled(host, {**doc, "other_runs": []}, {})


def test_a_cell_moved_to_another_host_says_so_on_the_sweep_page(tmp_path):
    pytest.importorskip("matplotlib")
    from rgt import memory

    ledger = tmp_path / "ledger"
    memory.record_launch(ledger, "b", "i-b", "proj", {"name": C, "command": "x"}, {"action": "launch", "attempt": 2})
    memory.record_move(ledger, "a", "b", "proj", C, 2, {"from": "a", "generation": 2, "attempt": 2,
                                                        "checkpoint": {"step": 20}, "work_lost_steps": 7})
    write(tmp_path, [finished_doc("a", A, 5.0), preempted_doc("b", B), finished_doc("b", C, 3.0)])
    page = (tmp_path / "runs" / NAME / "report.html").read_text()
    assert shown(page, "moved") == [f"{C}: moved from a (generation 2, attempt 2, resumed from step 20; work lost 7 "
                                    "steps)"]
