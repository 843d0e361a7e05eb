"""Liveness reconciliation (module_utils rgt_reconcile): each state, the evidence, and every attention id."""

import json

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_reconcile as rc

NOW = 1_800_000_000.0
INC = "boot-a:111"


def job(**over):
    base = {"schema": 1, "run_id": "exp1", "outputs": ["weights.bin"], "expected_duration_s": 3600,
            "price_per_hour": 2.0, "stall_after_s": 600, "heartbeat_interval_s": 5,
            "attempt_policy": {"auto_resume": True}}
    base.update(over)
    return base


def start(attempt=1, at=NOW - 1800, inc=INC, **extra):
    rec = {"attempt": attempt, "started_at": at, "code_dir": "/r/code-abcd1234", "resume_from": "",
           "incarnation": inc, "detach": "tmux"}
    rec.update(extra)
    return rec


def end(attempt=1, at=NOW - 10, reason="finished", rc_=0):
    return {"attempt": attempt, "ended_at": at, "rc": rc_, "signal": None, "reason": reason}


def log(n=50, loss=lambda i: 1.0 / (i + 1) + 0.5):
    return "".join("step=%d loss=%.6f\n" % (i, loss(i)) for i in range(1, n + 1))


def facts(**over):
    base = {"host": "box", "run_id": "exp1", "job": job(), "now": NOW, "incarnation": INC,
            "pid": {"wrapper_pid": 10, "job_pid": 11, "pgid": 11, "attempt": 1, "incarnation": INC},
            "attempts": [start()], "exit": None, "wrapper_alive": True, "job_alive": True, "session_alive": True,
            "heartbeat_age_s": 2.0, "log_tail": log(), "log_age_s": 3.0, "ckpt_age_s": 100.0,
            "outputs_present": {"weights.bin": False},
            "mounts": [{"path": "/data", "bytes_pct": 40, "inodes_pct": 3}, {"path": "/", "bytes_pct": 50,
                                                                               "inodes_pct": 10}],
            "cgroup": {"mem_limit_bytes": 8 << 30, "mem_usage_bytes": 1 << 30, "oom_kill": 0},
            "gpu_samples": [{"index": 0, "util_pct": 90, "mem_used_mib": 1000, "mem_total_mib": 80000}]}
    base.update(over)
    return base


def ids(doc):
    return [a["id"] for a in doc["attention"]]


def finished_facts(**over):
    base = dict(exit={"attempt": 1, "rc": 0, "signal": None, "reason": "finished", "ended_at": NOW - 10,
                      "stop_signal": None},
                attempts=[start(at=NOW - 3600), end(at=NOW - 10)], wrapper_alive=False, job_alive=False,
                session_alive=False, outputs_present={"weights.bin": True})
    base.update(over)
    return facts(**base)


# ---------------------------------------------------------------- states

def test_not_started_without_job_json():
    doc = rc.reconcile(facts(job=None, pid=None, attempts=[]))
    assert doc["state"] == "not_started"
    assert doc["attempt"] is None and doc["attention"] == []


def test_running_when_the_wrapper_pid_is_alive_under_the_same_incarnation():
    doc = rc.reconcile(facts())
    assert doc["state"] == "running"
    assert doc["attempt"] == 1
    assert doc["step"] == 50 and doc["loss"] == pytest.approx(1 / 51 + 0.5)
    assert doc["evidence"]["wrapper_pid_alive"] and doc["evidence"]["incarnation_changed"] is False
    assert doc["attention"] == []
    assert doc["gpu"] == [{"index": 0, "util_pct": 90, "mem_used_mib": 1000, "mem_total_mib": 80000}]
    assert doc["auto_resume"] is True
    json.dumps(doc, allow_nan=False)  # strict JSON


def test_finished_needs_the_exit_record_and_every_output():
    doc = rc.reconcile(finished_facts())
    assert doc["state"] == "finished"
    assert doc["evidence"]["exit"]["reason"] == "finished"
    assert doc["attention"] == [] and doc["outputs_missing"] == []


def test_finished_but_outputs_missing_is_failed_with_attention():
    doc = rc.reconcile(finished_facts(outputs_present={"weights.bin": False}))
    assert doc["state"] == "failed"
    assert doc["outputs_missing"] == ["weights.bin"]
    assert ids(doc) == ["outputs_missing"]


@pytest.mark.parametrize("reason", ["failed", "killed"])
def test_failed_and_killed_exit_reasons_are_failed(reason):
    doc = rc.reconcile(finished_facts(exit={"attempt": 1, "rc": 3, "reason": reason, "ended_at": NOW - 5}))
    assert doc["state"] == "failed"


def test_preempted_exit_reason():
    doc = rc.reconcile(finished_facts(exit={"attempt": 1, "rc": 0, "reason": "preempted", "ended_at": NOW - 5}))
    assert doc["state"] == "preempted"


def test_budget_stopped_exit_reason():
    doc = rc.reconcile(finished_facts(exit={"attempt": 1, "rc": 0, "reason": "budget_stopped", "ended_at": NOW - 5}))
    assert doc["state"] == "budget_stopped" and not doc["warnings"]


def test_incarnation_change_without_exit_record_is_preempted():
    # the pid doc belongs to the old incarnation: the module reports its pids as not alive
    doc = rc.reconcile(facts(incarnation="boot-b:999", wrapper_alive=False, job_alive=False, session_alive=False))
    assert doc["state"] == "preempted"
    assert doc["evidence"]["incarnation_changed"] is True


def test_live_pid_from_another_incarnation_never_counts():
    # a pid number reused after a restart: alive flags passed in by mistake still lose to the incarnation
    doc = rc.reconcile(facts(incarnation="boot-b:999", wrapper_alive=True, job_alive=True))
    assert doc["state"] == "preempted"


def test_dead_wrapper_same_incarnation_no_exit_is_dead():
    doc = rc.reconcile(facts(wrapper_alive=False, job_alive=False, session_alive=False))
    assert doc["state"] == "dead"


def test_exit_record_of_an_older_attempt_is_ignored():
    doc = rc.reconcile(facts(attempts=[start(1), end(1, reason="preempted"), start(2)],
                             pid={"wrapper_pid": 10, "job_pid": 11, "attempt": 2, "incarnation": INC},
                             exit={"attempt": 1, "reason": "preempted", "ended_at": NOW - 900}))
    assert doc["state"] == "running" and doc["attempt"] == 2
    assert doc["evidence"]["exit"] is None


# ---------------------------------------------------------------- a wrapper that could not write exit.json

def gone(**over):
    """The wrapper and the job are gone, same incarnation."""
    base = dict(wrapper_alive=False, job_alive=False, session_alive=False)
    base.update(over)
    return facts(**base)


def test_end_line_without_exit_json_is_the_runs_end_failed_rc_1():
    """A full disk: the wrapper wrote the attempt's end line but not exit.json. The run failed rc 1, not dead.
    Without the end line (and without exit.json) the wrapper really vanished: dead. A `dead` line (written by a
    later wrapper for an attempt that vanished) is no exit record either."""
    doc = rc.reconcile(gone(attempts=[start(1), end(1, reason="failed", rc_=1)], exit=None))
    assert doc["state"] == "failed"
    assert doc["evidence"]["exit"]["rc"] == 1 and doc["evidence"]["exit"]["reason"] == "failed"
    assert doc["evidence"]["exit"]["source"] == "attempts.jsonl"
    assert any("exit.json of attempt 1 is missing" in w for w in doc["warnings"])
    assert rc.reconcile(gone(attempts=[start(1)]))["state"] == "dead"
    noted = {"attempt": 1, "ended_at": None, "rc": None, "signal": None, "reason": "dead", "noted_at": "x"}
    vanished = rc.reconcile(gone(attempts=[start(1), noted]))
    assert vanished["state"] == "dead" and vanished["evidence"]["exit"] is None


def test_end_line_decides_when_exit_json_is_from_an_older_attempt():
    """Only the current attempt's end line counts: an older attempt's line never ends a running one."""
    doc = rc.reconcile(gone(attempts=[start(1), end(1, reason="preempted"), start(2), end(2, reason="failed", rc_=1)],
                            pid={"wrapper_pid": 10, "job_pid": 11, "attempt": 2, "incarnation": INC},
                            exit={"attempt": 1, "rc": 0, "reason": "preempted", "ended_at": NOW - 900}))
    assert doc["state"] == "failed" and doc["attempt"] == 2 and doc["evidence"]["exit"]["attempt"] == 2
    running = rc.reconcile(facts(attempts=[start(1), end(1, reason="failed", rc_=1), start(2)],
                                 pid={"wrapper_pid": 10, "job_pid": 11, "attempt": 2, "incarnation": INC}))
    assert running["state"] == "running" and running["evidence"]["exit"] is None


def test_end_line_finished_still_needs_the_outputs():
    ok = rc.reconcile(gone(attempts=[start(1), end(1)], outputs_present={"weights.bin": True}))
    assert ok["state"] == "finished"
    missing = rc.reconcile(gone(attempts=[start(1), end(1)]))
    assert missing["state"] == "failed" and ids(missing) == ["outputs_missing"]


def test_job_json_but_no_wrapper_record_and_no_session_is_dead():
    doc = rc.reconcile(facts(pid=None, attempts=[], wrapper_alive=False, job_alive=False, session_alive=False))
    assert doc["state"] == "dead"
    assert any("no wrapper ever recorded" in w for w in doc["warnings"])


# ---------------------------------------------------------------- stall

def test_stalled_when_alive_but_log_and_ckpt_old_and_gpu_idle():
    doc = rc.reconcile(facts(log_age_s=700.0, ckpt_age_s=900.0,
                             gpu_samples=[{"index": 0, "util_pct": 0}, {"index": 0, "util_pct": 1}]))
    assert doc["state"] == "stalled"
    assert ids(doc) == ["stalled"]


def test_not_stalled_while_a_gpu_is_busy():
    doc = rc.reconcile(facts(log_age_s=700.0, ckpt_age_s=900.0))
    assert doc["state"] == "running"
    assert any("GPU is busy" in w for w in doc["warnings"])


def test_not_stalled_while_checkpoints_advance():
    doc = rc.reconcile(facts(log_age_s=700.0, ckpt_age_s=30.0, gpu_samples=[]))
    assert doc["state"] == "running"


def test_stalled_without_gpus():
    doc = rc.reconcile(facts(log_age_s=700.0, ckpt_age_s=None, gpu_samples=[]))
    assert doc["state"] == "stalled"


# ---------------------------------------------------------------- loss

def test_nonfinite_loss_reports_its_step_and_value():
    tail = log(10) + "step=11 loss=nan\n"
    doc = rc.reconcile(facts(log_tail=tail))
    assert doc["nonfinite_loss"] == {"step": 11, "value": "nan"}
    assert "nonfinite_loss" in ids(doc)
    assert doc["loss"] == "nan"
    json.dumps(doc, allow_nan=False)


def test_nan_is_not_hidden_by_later_finite_lines():
    tail = log(10) + "step=11 loss=nan\n" + "".join("step=%d loss=0.4\n" % i for i in range(12, 400))
    doc = rc.reconcile(facts(log_tail=tail))
    assert doc["nonfinite_loss"] == {"step": 11, "value": "nan"}
    assert doc["step"] == 399 and doc["loss"] == pytest.approx(0.4)


def test_inf_and_custom_patterns():
    tail = "it 1 | train_loss: 0.5\nit 2 | train_loss: -inf\n"
    doc = rc.reconcile(facts(log_tail=tail, job=job(log_patterns={"step": r"it (\d+)", "loss": r"train_loss: (\S+)"})))
    assert doc["nonfinite_loss"] == {"step": 2, "value": "-inf"}


def test_partial_first_line_of_a_tail_is_dropped():
    scan = rc.scan_log("=nan\nstep=5 loss=0.3\n", partial_first_line=True)
    assert scan["nonfinite"] is None and scan["step"] == 5


def test_loss_spike_over_ten_times_the_median_of_the_previous_twenty():
    tail = "".join("step=%d loss=1.0\n" % i for i in range(1, 31)) + "step=31 loss=11.5\nstep=32 loss=1.0\n"
    doc = rc.reconcile(facts(log_tail=tail))
    assert doc["loss_spike"]["step"] == 31 and doc["loss_spike"]["value"] == 11.5
    assert "loss_spike" in ids(doc)


def test_no_spike_below_ten_times_or_before_twenty_losses():
    tail = "".join("step=%d loss=1.0\n" % i for i in range(1, 25)) + "step=25 loss=9.9\n"
    assert rc.reconcile(facts(log_tail=tail))["loss_spike"] is None
    early = "step=1 loss=1.0\nstep=2 loss=50.0\n"
    assert rc.reconcile(facts(log_tail=early))["loss_spike"] is None


# ---------------------------------------------------------------- finish, disk, oom, cost

def test_fast_finish_under_half_the_expected_duration():
    doc = rc.reconcile(finished_facts(attempts=[start(at=NOW - 600), end(at=NOW - 10)],
                                      exit={"attempt": 1, "reason": "finished", "ended_at": NOW - 10}))
    assert doc["state"] == "finished"
    assert ids(doc) == ["fast_finish"]
    assert doc["elapsed_s"] == pytest.approx(590)


def test_fast_finish_sums_all_attempts():
    attempts = [start(1, at=NOW - 4000), end(1, at=NOW - 3000, reason="preempted"),
                start(2, at=NOW - 2000), end(2, at=NOW - 10)]
    doc = rc.reconcile(finished_facts(attempts=attempts, pid={"attempt": 2, "incarnation": INC},
                                      exit={"attempt": 2, "reason": "finished", "ended_at": NOW - 10}))
    assert doc["attempt"] == 2 and doc["elapsed_s"] == pytest.approx(2990)
    assert "fast_finish" not in ids(doc)


@pytest.mark.parametrize("mount", [{"path": "/data", "bytes_pct": 95, "inodes_pct": 3},
                                   {"path": "/data", "bytes_pct": 20, "inodes_pct": 97}])
def test_disk_full_on_bytes_or_inodes(mount):
    doc = rc.reconcile(facts(mounts=[mount, {"path": "/", "bytes_pct": 10, "inodes_pct": None}]))
    assert ids(doc) == ["disk_full"]
    assert "/data" in doc["attention"][0]["message"]


def test_disk_94_is_fine():
    assert rc.reconcile(facts(mounts=[{"path": "/data", "bytes_pct": 94, "inodes_pct": 94}]))["attention"] == []


def test_oom_kill_counter_increase_since_the_attempt_start():
    same = rc.reconcile(facts(attempts=[start(oom_kill=2)], cgroup={"oom_kill": 2}))
    assert same["attention"] == []
    more = rc.reconcile(facts(attempts=[start(oom_kill=2)], cgroup={"oom_kill": 3}))
    assert ids(more) == ["oom_kill"]
    no_baseline = rc.reconcile(facts(cgroup={"oom_kill": 1}))
    assert ids(no_baseline) == ["oom_kill"]


def test_cost_of_a_running_attempt_counts_up_to_now():
    doc = rc.reconcile(facts(attempts=[start(at=NOW - 1800)]))
    assert doc["cost_so_far"] == pytest.approx(1.0)
    assert doc["elapsed_s"] == pytest.approx(1800)


def test_cost_sums_ended_attempts_and_is_none_without_price():
    attempts = [start(1, at=NOW - 7200), end(1, at=NOW - 3600, reason="preempted"), start(2, at=NOW - 1800)]
    doc = rc.reconcile(facts(attempts=attempts, pid={"wrapper_pid": 1, "attempt": 2, "incarnation": INC}))
    assert doc["cost_so_far"] == pytest.approx(3.0)
    assert rc.reconcile(facts(job=job(price_per_hour=None)))["cost_so_far"] is None


def test_dead_attempt_cost_stops_at_the_last_heartbeat():
    doc = rc.reconcile(facts(wrapper_alive=False, job_alive=False, heartbeat_age_s=600.0))
    assert doc["state"] == "dead"
    assert doc["elapsed_s"] == pytest.approx(1200)


def test_iso_timestamps():
    assert rc.to_epoch("2027-01-15T08:00:00Z") == rc.to_epoch("2027-01-15T09:00:00+01:00")
    assert rc.to_epoch("2027-01-15T08:00:00.5") == pytest.approx(rc.to_epoch("2027-01-15T08:00:00Z") + 0.5)
    assert rc.to_epoch("garbage") is None and rc.to_epoch(12) == 12.0


def test_log_scan_covers_the_current_attempt_only():
    tail = ("== rgt attempt 1 started 2027-01-01T00:00:00Z resume_from=none\n" + "step=1 loss=nan\n"
            "== rgt attempt 1 ended 2027-01-01T00:01:00Z reason=failed rc=3\n"
            "== rgt attempt 2 started 2027-01-01T00:02:00Z resume_from=/r/ckpt/a\n" + "step=41 loss=0.3\n")
    doc = rc.reconcile(facts(log_tail=tail, attempts=[start(1), end(1, reason="failed"), start(2)],
                             pid={"wrapper_pid": 1, "job_pid": 2, "attempt": 2, "incarnation": INC}))
    assert doc["attempt"] == 2 and doc["nonfinite_loss"] is None and doc["step"] == 41
    same = rc.reconcile(facts(log_tail=tail.replace("step=41 loss=0.3", "step=41 loss=inf\nstep=42 loss=0.3"),
                              attempts=[start(1), end(1, reason="failed"), start(2)],
                              pid={"wrapper_pid": 1, "job_pid": 2, "attempt": 2, "incarnation": INC}))
    assert same["nonfinite_loss"] == {"step": 41, "value": "inf"}


def test_wrapper_style_records_iso_times_and_noted_dead_attempts():
    attempts = [start(1, at="2027-01-15T08:00:00Z"),
                {"attempt": 1, "ended_at": None, "rc": None, "signal": None, "reason": "dead", "noted_at": "x"},
                start(2, at="2027-01-15T09:00:00Z")]
    now = rc.to_epoch("2027-01-15T09:30:00Z")
    doc = rc.reconcile(facts(now=now, attempts=attempts, pid={"wrapper_pid": 1, "attempt": 2, "incarnation": INC}))
    assert doc["state"] == "running" and doc["elapsed_s"] == pytest.approx(1800)


# ---------------------------------------------------------------- the common trainers' log formats
# Lines in the formats the trainers write (HF Trainer's ProgressCallback: a tqdm bar redrawn with \r and the
# logs dict written above it; PyTorch Lightning's TQDMProgressBar; plain key=value, key: value and JSON lines).

HF_TRAINER = (
    "***** Running training *****\n  Num examples = 2,000\n  Num Epochs = 1\n"
    "  Total optimization steps = 500\n  Number of trainable parameters = 124,439,808\n"
    "  0%|          | 0/500 [00:00<?, ?it/s]\r  1%|          | 5/500 [00:01<02:10,  3.80it/s]"
    "\r  2%|▏         | 10/500 [00:02<02:08,  3.81it/s]\r                                        \r"
    "{'loss': 2.3456, 'grad_norm': 3.1415, 'learning_rate': 4.9e-05, 'epoch': 0.02}\n"
    "\r  2%|▏         | 10/500 [00:02<02:08,  3.81it/s]\r  4%|▍         | 20/500 [00:05<02:05,  3.82it/s]"
    "\r                                        \r{'loss': 1.9876, 'grad_norm': 2.5, 'learning_rate': 4.8e-05, "
    "'epoch': 0.04}\n"
    "\r  0%|          | 0/25 [00:00<?, ?it/s]\r 40%|████      | 10/25 [00:00<00:00, 40.1it/s]"
    "\r100%|██████████| 25/25 [00:00<00:00, 41.0it/s]\r                                        \r"
    "{'eval_loss': 1.7654, 'eval_runtime': 0.61, 'eval_samples_per_second': 327.9, 'epoch': 0.04}\n"
    "\r  4%|▍         | 20/500 [00:06<02:05,  3.82it/s]\r  5%|▌         | 25/500 [00:07<02:04,  3.82it/s]\n"
)
HF_SUMMARY = ("{'train_runtime': 130.2, 'train_samples_per_second': 15.36, 'train_steps_per_second': 3.84, "
              "'train_loss': 0.7321, 'epoch': 1.0}\n")
HF_RESUMED = (
    "  Continuing training from checkpoint, will skip to saved global_step\n"
    "  Continuing training from epoch 0\n  Continuing training from global step 135\n"
    "  Will skip the first 0 epochs then the first 135 batches in the first epoch.\n"
)
LIGHTNING = (
    "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 20.1it/s]\n"
    "Epoch 0:  50%|█████     | 50/100 [00:05<00:05,  9.87it/s, v_num=0, train_loss=0.512]\r"
    "Epoch 0: 100%|██████████| 100/100 [00:10<00:00,  9.90it/s, v_num=0, train_loss=0.401]\r"
    "Validation DataLoader 0:  40%|████      | 4/10 [00:00<00:00, 20.00it/s]\n"
    "Epoch 1:  30%|███       | 30/100 [00:03<00:07,  9.91it/s, v_num=0, train_loss_step=0.333, val_loss=0.420, "
    "train_loss_epoch=0.455]\n"
)
PLAIN = [
    ("step=10 loss=0.5000", 10, 0.5),
    ("Step 100 | loss: 0.2500 | lr: 1e-04", 100, 0.25),
    ("iter 300 loss 0.2", 300, 0.2),
    ("Iteration 400: loss=tensor(0.1500, device='cuda:0')", 400, 0.15),
    ('{"step": 10, "loss": 0.5, "lr": 0.001}', 10, 0.5),
    ("{'loss': 1.23, 'step': 100}", 100, 1.23),
    ("[global_step=7] train/loss: 3.5", 7, 3.5),
    ("step: 12 loss: NaN", 12, float("nan")),
]
RESUME_LINES = [
    "Resuming from global_step=135",
    "loaded checkpoint /ckpt/model.pt at step 135",
    "Restoring states from the checkpoint path at /ckpt/epoch=0-step=135.ckpt",
    "resumed from /r/ckpt/step_00000020.ckpt at step=20",
    "Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.52s/it]",
]


def read_all(text, patterns=None, metrics=None):
    reader = rc.LogReader(patterns, metrics)
    return [(line, *reader.read(line), reader.step) for line in text.splitlines()], reader


def test_hf_trainer_steps_come_from_its_training_bar_and_its_losses_from_the_dict_lines():
    scan = rc.scan_log(HF_TRAINER)
    assert scan["step"] == 25 and scan["loss"] == pytest.approx(1.9876) and scan["lines_with_loss"] == 2
    rows, _reader = read_all(HF_TRAINER)
    losses = [(step, loss) for _line, _s, loss, _m, step in rows if loss is not None]
    assert losses == [(10, pytest.approx(2.3456)), (20, pytest.approx(1.9876))]
    evals = [(step, dict(values)) for _line, _s, _loss, values, step in rows
             if any(n == "eval_loss" for n, _ in values)]
    assert evals == [(20, {"eval_loss": pytest.approx(1.7654)})], "the evaluation bar's 25/25 is no training step"
    lrs = [dict(values)["lr"] for _line, _s, _loss, values, _step in rows if any(n == "lr" for n, _ in values)]
    assert lrs == [pytest.approx(4.9e-05), pytest.approx(4.8e-05)]
    assert rc.scan_log(HF_TRAINER + HF_SUMMARY)["loss"] == pytest.approx(1.9876), "the run's mean is no loss"


def test_lightning_bars_count_steps_across_epochs_and_skip_validation_and_sanity_bars():
    rows, _reader = read_all(LIGHTNING)
    seen = [(step, loss, dict(values)) for _line, step, loss, values, _latest in rows if step is not None]
    assert seen == [(50, pytest.approx(0.512), {}), (100, pytest.approx(0.401), {}),
                    (130, pytest.approx(0.333), {"eval_loss": pytest.approx(0.42)})]
    assert rc.scan_log(LIGHTNING)["step"] == 130


@pytest.mark.parametrize("line,step,loss", PLAIN)
def test_key_value_and_json_styles(line, step, loss):
    (row,), _reader = read_all(line)
    assert row[1] == step
    assert row[2] == pytest.approx(loss, nan_ok=True)


@pytest.mark.parametrize("line", RESUME_LINES + HF_RESUMED.splitlines())
def test_a_resume_or_load_message_is_not_progress(line):
    (row,), _reader = read_all(line)
    assert row[1:4] == (None, None, []), line


def test_config_lines_and_other_keys_are_not_taken_for_step_or_loss():
    text = ("max_steps=500 warmup_steps=10 logging_steps=5\n  Total optimization steps = 500\n"
            "loss_scale: 65536\neval_loss=0.3 val/loss: 0.2\nMap: 100%|██████████| 1000/1000 [00:00<00:00, "
            "9000.00 examples/s]\n"
            "== rgt attempt 2 started 2027-01-01T00:00:00Z resume_from=/r/ckpt/step_00000100.ckpt\n")
    scan = rc.scan_log(text)
    assert scan["step"] is None and scan["loss"] is None


def test_the_resume_step_is_not_the_status_step_after_a_relaunch():
    tail = ("== rgt attempt 2 started 2027-01-01T00:02:00Z resume_from=/r/ckpt/step_135.ckpt\n"
            "Resuming from global_step=135\n")
    doc = rc.reconcile(facts(log_tail=tail, attempts=[start(1), end(1, reason="preempted"), start(2)],
                             pid={"wrapper_pid": 1, "job_pid": 2, "attempt": 2, "incarnation": INC}))
    assert doc["step"] is None
    assert rc.reconcile(facts(log_tail=tail + "step=136 loss=0.3\n", attempts=[start(1), end(1), start(2)],
                              pid={"wrapper_pid": 1, "attempt": 2, "incarnation": INC}))["step"] == 136


def test_the_jobs_own_patterns_replace_the_built_in_rules_and_old_job_json_defaults_do_not():
    own = {"step": r"it (\d+)", "loss": r"train_loss: (\S+)"}
    assert rc.scan_log("step=5 loss=0.1\nit 7 | train_loss: 0.3\n", own)["step"] == 7
    assert rc.scan_log("step=5 loss=0.1\n", own)["loss"] is None
    # job.json written before the built-in rules spelled the old defaults out: they mean "the built-in rules"
    assert rc.scan_log(HF_TRAINER, dict(rc.LEGACY_PATTERNS))["step"] == 25
    assert rc.scan_log("Resuming from step=135\n", {"step": r"step=(\d+)"})["step"] is None


def test_metrics_are_the_jobs_declared_ones_else_eval_loss_and_lr():
    assert [name for name, _rule in rc.metric_rules()] == ["eval_loss", "lr"]
    assert rc.metric_rules({}) == []
    declared = rc.metric_rules({"tok_s": r"tokens/s[=:] *([0-9.]+)"})
    assert [name for name, _rule in declared] == ["tok_s"]
    (row,), _reader = read_all("step=3 tokens/s=1234.5 lr=0.1", metrics={"tok_s": r"tokens/s[=:] *([0-9.]+)"})
    assert row[3] == [("tok_s", 1234.5)]


# ---------------------------------------------------------------- a log the rules do not read

def test_a_running_job_whose_log_shows_no_step_or_loss_after_five_minutes_gets_one_warning():
    tail = "".join("epoch 1 batch %d: 0.5 (%.1f samples/s)\n" % (i, 100.0 + i) for i in range(200))
    early = rc.reconcile(facts(log_tail=tail, attempts=[start(at=NOW - 120)]))
    assert not [w for w in early["warnings"] if "no step" in w]
    doc = rc.reconcile(facts(log_tail=tail, attempts=[start(at=NOW - 360)]))
    assert doc["state"] == "running" and doc["attention"] == [], "a warning, not attention"
    (warning,) = [w for w in doc["warnings"] if "seen in logs/job.log" in w]
    assert warning.startswith("no step/loss seen in logs/job.log after 6 min: set rgt_job.log_patterns")
    only_loss = rc.reconcile(facts(log_tail="step=%d\n" * 3 % (1, 2, 3), attempts=[start(at=NOW - 400)]))
    (warning,) = [w for w in only_loss["warnings"] if "seen in logs/job.log" in w]
    assert warning.startswith("no loss seen in logs/job.log after 6 min (steps were seen, the latest 3): set "
                              "rgt_job.log_patterns.loss to a regex")
    own = rc.reconcile(facts(log_tail="step=1 loss=0.4\n", attempts=[start(at=NOW - 400)],
                             job=job(log_patterns={"loss": r"train_loss=(\S+)"})))
    assert any("rgt_job.log_patterns.loss matches no line" in w for w in own["warnings"])


def test_no_warning_for_a_job_that_shows_progress_an_empty_log_or_a_run_that_ended():
    assert not [w for w in rc.reconcile(facts(attempts=[start(at=NOW - 900)]))["warnings"] if "seen in logs" in w]
    empty = rc.reconcile(facts(log_tail="", attempts=[start(at=NOW - 900)]))
    assert not [w for w in empty["warnings"] if "seen in logs" in w], "a quiet log is the stall check's"
    ended = rc.reconcile(finished_facts(log_tail="hello\n" * 50))
    assert not [w for w in ended["warnings"] if "seen in logs" in w]


# ---------------------------------------------------------------- one clock

def test_under_slurm_the_running_attempts_time_is_the_wrappers_own_not_the_login_nodes():
    """The status is read on the login node; the wrapper runs on a compute node whose clock is a day behind."""
    compute_start = NOW - 86400 - 600
    slurm = {"job_id": "7", "known": True, "error": None, "state": "RUNNING", "reason": None, "exit_rc": 0,
             "exit_signal": 0, "restarts": 0, "time_limit": "01:00:00", "run_time": "00:10:00", "nodes": "c1"}
    doc = rc.reconcile(facts(attempts=[start(at=compute_start, detach="sbatch")], wrapper_alive=False,
                             job_alive=False, slurm=slurm, heartbeat_age_s=3.0,
                             heartbeat={"ts": compute_start + 597, "attempt": 1, "job_alive": True}))
    assert doc["state"] == "running"
    assert doc["elapsed_s"] == pytest.approx(597) and doc["cost_so_far"] == pytest.approx(2.0 * 597 / 3600, abs=1e-4)


def test_the_box_side_status_document_of_a_job_whose_log_the_rules_do_not_read_warns_once(tmp_path):
    """rgt_statusdoc on a real run layout: job.json as the launch writes it (rgt_runlayout.job_document, no
    log_patterns in the spec: the built-in rules), a live process as the wrapper, an attempt 6 minutes old and a
    log in a format no rule reads."""
    import os
    import subprocess
    import time

    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_statusdoc

    paths = rl.RunPaths(str(tmp_path), "rgt", "quiet")
    for directory in (paths.meta, paths.logs, paths.ckpt, paths.out):
        os.makedirs(directory)
    spec = {"name": "quiet", "command": "python train.py", "price_per_hour": 2.0}
    doc = rl.job_document(paths, spec, paths.code_dir("abcd1234"), None, "/usr/bin/python3", None, {}, None, 30)
    assert doc["log_patterns"] == {} and doc["metrics"] is None, "job.json names the job's own patterns only"
    rl.atomic_write_json(paths.job, doc)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        inc = rl.incarnation()
        rl.atomic_write_json(paths.pid, {"wrapper_pid": sleeper.pid, "job_pid": sleeper.pid, "pgid": sleeper.pid,
                                         "attempt": 1, "incarnation": inc})
        rl.atomic_write_json(paths.heartbeat, {"ts": time.time(), "attempt": 1, "job_alive": True})
        rl.append_jsonl(paths.attempts, {"attempt": 1, "started_at": time.time() - 360, "resume_from": "",
                                         "incarnation": inc, "detach": "nohup"})
        with open(paths.log, "w") as handle:
            handle.write("== rgt attempt 1 started x resume_from=none\n" + "".join(
                "epoch 1 batch %d: 0.5 (%.1f samples/s) lr=%g\n" % (i, 100.0 + i, 1e-3) for i in range(100)))
        status = rgt_statusdoc.status_document({"durable_root": str(tmp_path), "project": "rgt", "run_id": "quiet"})
    finally:
        sleeper.kill()
        sleeper.wait()
    assert status["state"] == "running" and status["attention"] == []
    assert [w for w in status["warnings"] if "seen in logs/job.log" in w] == [
        "no step/loss seen in logs/job.log after 6 min: set rgt_job.log_patterns (a regex with one group each for "
        "the step and the loss your job prints; docs/job-spec.md)"]
    assert status["cost_so_far"] == pytest.approx(2.0 * 360 / 3600, abs=2e-3)
    assert status["history"]["metrics"] == {}, "a value without any step to put it at is no point"
