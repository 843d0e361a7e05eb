"""Slurm on the login node (module_utils rgt_slurm): parsing real `scontrol show job` text, the sbatch command line,
and the teardown's cancel decision (look first, cancel once, bounded wait) driven by scripted scontrol answers."""

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_slurm as sl

# pitt-crc/user-manual docs/getting-started/onramp.md (`scontrol -M gpu show job 260056`, Slurm ~21.x): PENDING
PENDING_V100 = """JobId=260056 JobName=gpus-1
   UserId=username(152289) GroupId=groupname(16260) MCS_label=N/A
   Priority=2367 Nice=0 Account=sam QOS=gpu-v100-s
   JobState=PENDING Reason=Priority Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:00 TimeLimit=1-00:00:00 TimeMin=N/A
   SubmitTime=2022-01-26T08:20:43 EligibleTime=2022-01-26T08:20:43
   StartTime=Unknown EndTime=Unknown Deadline=N/A
   Partition=v100 AllocNode:Sid=login1:25474
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=(null)
   NumNodes=1-1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,mem=5364M,node=1,billing=5,gres/gpu=1
   Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=*
   Command=/ihome/groupname/username/mocvnhlysm_1v100.1C/amber.slurm
   StdOut=/ihome/groupname/username/mocvnhlysm_1v100.1C/gpus-1.out
   Power=
   TresPerNode=gpu:1
   MailUser=(null) MailType=NONE
"""

# irush-cs/slurm-scripts t/get_jobs.t (`scontrol show job -dd`, 2025): RUNNING, a per-node detail line, a bare
# `NtasksPerTRES:0` word without '='
RUNNING_DD = """JobId=25687666 JobName=test
   UserId=user6(600) GroupId=group6(606) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0
   RunTime=00:00:29 TimeLimit=02:00:00 TimeMin=N/A
   Partition=interactive AllocNode:Sid=alloc-node-02:407409
   NodeList=node-001
   TRES=cpu=2,mem=1G,node=1,billing=2,gres/gg=1,gres/gg:g0=1,gres/gpu=1,gres/gpu:rtx2080=1,license/interactive=1
   JOB_GRES=gpu:rtx2080:1,gg:g0:1
     Nodes=node-001 CPU_IDs=2-3 Mem=1024 GRES=gpu:rtx2080:1(IDX:1),gg:g0(CNT:1)
   Command=cmd
   TresPerNode=gpu:rtx2080,gg:g0
   NtasksPerTRES:0
"""

# Slurm 22.05.8 (Debian 12, the cluster of tests/slurm/start-slurm.sh), captured 2026-12-01: `scontrol show job -o 1`
# after `scontrol requeue 1` (PENDING, Reason=BeginTime, Restarts=1, empty NodeList=), then after `scancel 1`
REQUEUED = ("JobId=1 JobName=rgt-x UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
            "Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 "
            "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
            "SubmitTime=2026-12-01T08:49:22 EligibleTime=2026-12-01T08:49:33 AccrueTime=2026-12-01T08:49:33 "
            "StartTime=2026-12-01T08:49:33 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
            "LastSchedEval=2026-12-01T08:49:21 Scheduler=Main Partition=debug AllocNode:Sid=localhost:29617 "
            "ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
            "ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1000M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
            "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
            "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/sdev/j.sh WorkDir=/tmp/sdev "
            "Comment=/tmp/d/p/active/r  StdErr=/tmp/sdev/o-1.out StdIn=/dev/null StdOut=/tmp/sdev/o-1.out Power= \n")
ONE_LINE = (REQUEUED.replace("JobState=PENDING", "JobState=CANCELLED").replace("NumTasks=1", "NumTasks=N/A")
            .replace("EndTime=Unknown", "EndTime=2026-12-01T08:49:25"))
UNKNOWN_ERR = "slurm_load_jobs error: Invalid job id specified\n"  # rc 1, on stderr


def test_a_pending_job_gives_state_reason_and_requeue_flag():
    (job,) = sl.parse_jobs(PENDING_V100)
    view = sl.job_view(job)
    assert view["job_id"] == "260056" and view["name"] == "gpus-1"
    assert view["state"] == "PENDING" and view["reason"] == "Priority"
    assert view["requeue"] is True and view["restarts"] == 0
    assert view["nodes"] is None and view["time_limit"] == "1-00:00:00"
    assert job["TRES"] == "cpu=1,mem=5364M,node=1,billing=5,gres/gpu=1"  # '=' inside a value stays in it
    assert job["AllocNode:Sid"] == "login1:25474" and job["Socks/Node"] == "*"


def test_running_dd_keeps_the_jobs_fields_over_the_per_node_detail_and_stops_values_at_the_line_end():
    (job,) = sl.parse_jobs(RUNNING_DD)
    view = sl.job_view(job)
    assert view["state"] == "RUNNING" and view["reason"] is None and view["exit_rc"] == 0
    assert view["nodes"] == "node-001"
    assert job["TresPerNode"] == "gpu:rtx2080,gg:g0"  # not "... NtasksPerTRES:0" from the next line
    assert job["Mem"] == "1024" and job["GRES"] == "gpu:rtx2080:1(IDX:1),gg:g0(CNT:1)"


def test_one_line_output_of_a_requeued_then_cancelled_job():
    (job,) = sl.parse_jobs(REQUEUED)
    view = sl.job_view(job)
    assert view["state"] == "PENDING" and view["reason"] == "BeginTime" and view["restarts"] == 1
    assert view["nodes"] is None and view["time_limit"] == "UNLIMITED"  # `NodeList= NumNodes=1`: empty
    assert view["comment"] == "/tmp/d/p/active/r" and view["stdout"] == "/tmp/sdev/o-1.out"
    assert job["Power"] == "" and job["StdErr"] == "/tmp/sdev/o-1.out"
    view = sl.job_view(sl.parse_jobs(ONE_LINE)[0])
    assert view["state"] == "CANCELLED" and (view["exit_rc"], view["exit_signal"]) == (0, 0)


def test_several_jobs_in_one_output_are_split_at_each_JobId():
    jobs = sl.parse_jobs(PENDING_V100 + "\n" + RUNNING_DD)
    assert [j["JobId"] for j in jobs] == ["260056", "25687666"]
    assert sl.parse_jobs(UNKNOWN_ERR) == []


@pytest.mark.parametrize(("raw", "word"), [("CANCELLED by 0", "CANCELLED"), ("CANCELLED+", "CANCELLED"),
                                           ("timeout", "TIMEOUT"), ("", ""), (None, "")])
def test_base_state_strips_suffixes(raw, word):
    assert sl.base_state(raw) == word


def test_submit_and_squeue_parsers():
    assert sl.parse_submit("42\n") == "42" and sl.parse_submit("42;cluster\n") == "42"
    assert sl.parse_submit("sbatch: error: Batch job submission failed\n") is None
    rows = sl.parse_squeue("12|PENDING|/d/p/active/r\n13|RUNNING|(null)\n\n")
    assert rows == [{"job_id": "12", "state": "PENDING", "comment": "/d/p/active/r"},
                    {"job_id": "13", "state": "RUNNING", "comment": None}]


def test_sbatch_argv_takes_resources_from_the_spec_only_and_exec_s_the_wrapper():
    argv = sl.sbatch_argv("sbatch", "/r/.rgt/sbatch.sh", "rgt-p-r", "/r/logs/slurm-%j.out", "/r", 60, True,
                          {"partition": "gpu", "gres": "gpu:1", "cpus_per_task": 4, "mem": "8G", "time": "1:00:00",
                           "account": None, "extra": ["--begin=now+1hour"]})
    assert argv[:2] == ["sbatch", "--parsable"] and argv[-1] == "/r/.rgt/sbatch.sh"
    for word in ("--job-name=rgt-p-r", "--output=/r/logs/slurm-%j.out", "--open-mode=append", "--comment=/r",
                 "--signal=B:TERM@60", "--requeue", "--partition=gpu", "--gres=gpu:1", "--cpus-per-task=4",
                 "--mem=8G", "--time=1:00:00", "--begin=now+1hour"):
        assert word in argv
    assert not any(w.startswith("--account") or w.startswith("--qos") for w in argv)
    bare = sl.sbatch_argv("sbatch", "/s", "n", "/o", "/r", 30, False, None)
    assert "--no-requeue" in bare and not any(w.startswith("--time") or w.startswith("--partition") for w in bare)
    script = sl.batch_script("/usr/bin/python3", "/r dir/.rgt/wrapper.py", "/r dir", "sbatch")
    assert "export RGT_DETACH=sbatch\n" in script
    assert script.startswith("#!/bin/bash\n")
    assert script.rstrip().splitlines()[-1] == "exec /usr/bin/python3 '/r dir/.rgt/wrapper.py' '/r dir'"


class Scontrol:
    """Scripted answers for `scontrol show job -o ID` and the cancel call, in order; records every argv."""

    def __init__(self, answers, cancel_rc=0):
        self.answers = list(answers)
        self.calls = []
        self.cancel_rc = cancel_rc

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[0] == "scancel":
            return self.cancel_rc, "", ""
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer == "unknown":
            return 1, "", UNKNOWN_ERR
        if answer == "down":
            return 1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
        return 0, ONE_LINE.replace("JobState=CANCELLED", "JobState=" + answer).replace("JobId=1 ", "JobId=7 "), ""


def cancel(fake, timeout_s=5):
    clock = {"t": 0.0}

    def sleep(s):
        clock["t"] += s

    return sl.cancel("7", ["scancel", "7"], timeout_s, 1, look_tries=3, look_delay_s=2, run=fake, sleep=sleep,
                     clock=lambda: clock["t"])


def scancels(fake):
    return [c for c in fake.calls if c[0] == "scancel"]


def test_a_running_job_is_cancelled_once_and_recorded_gone_with_slurms_state():
    fake = Scontrol(["RUNNING", "RUNNING", "COMPLETING", "CANCELLED by 0"])
    out = cancel(fake)
    assert out["ok"] and out["final_state"] == "gone" and out["slurm_state"] == "JobState=CANCELLED"
    assert scancels(fake) == [["scancel", "7"]] and out["calls"] == [{"argv": ["scancel", "7"], "rc": 0}]


def test_an_unknown_or_ended_job_is_already_gone_and_nothing_is_called():
    for answer, state in (("unknown", "unknown"), ("COMPLETED", "JobState=COMPLETED")):
        fake = Scontrol([answer])
        out = cancel(fake)
        assert out["final_state"] == "already gone" and out["slurm_state"] == state, out
        assert scancels(fake) == [] and out["calls"][0]["rc"] is None


def test_slurm_that_cannot_say_is_asked_again_then_nothing_is_cancelled():
    fake = Scontrol(["down"])
    out = cancel(fake)
    assert out["ok"] is False and out["final_state"] is None and "Unable to contact" in out["msg"]
    assert scancels(fake) == [] and len(fake.calls) == 3
    fake = Scontrol(["down", "RUNNING", "CANCELLED"])
    assert cancel(fake)["final_state"] == "gone" and len(scancels(fake)) == 1


def test_a_job_that_never_ends_is_unknown_after_the_bound_and_never_cancelled_twice():
    fake = Scontrol(["RUNNING"])
    out = cancel(fake, timeout_s=5)
    assert out["ok"] is False and out["final_state"] == "unknown — check squeue"
    assert out["slurm_state"] == "JobState=RUNNING" and "not cancelling again" in out["msg"]
    assert len(scancels(fake)) == 1


class PerJob(Scontrol):
    """Scripted scontrol answers per job id (the id is the last word of `scontrol show job -o ID`)."""

    def __init__(self, by_id):
        Scontrol.__init__(self, ["unknown"])
        self.by_id = {k: list(v) for k, v in by_id.items()}

    def __call__(self, argv):
        if argv[0] != "scancel":
            answers = self.by_id[argv[-1]]
            self.answers = [answers.pop(0) if len(answers) > 1 else answers[0]]
        return Scontrol.__call__(self, argv)


def test_the_instance_and_every_runs_queued_job_are_cancelled_once_each_in_one_outcome():
    jobs = [{"job_id": "login-1", "argv": ["scancel", "login-1"]}, {"job_id": "8", "argv": ["scancel", "8"]},
            {"job_id": "9", "argv": ["scancel", "9"]}]
    fake = PerJob({"login-1": ["unknown"], "8": ["PENDING", "CANCELLED"], "9": ["COMPLETED"]})
    out = sl.cancel_jobs(jobs, 5, 1, run=fake, sleep=lambda s: None, clock=lambda: 0.0)
    assert out["ok"] and out["final_state"] == "gone"  # one was cancelled now, the others needed nothing
    assert scancels(fake) == [["scancel", "8"]]
    assert [j["final_state"] for j in out["jobs"]] == ["already gone", "gone", "already gone"]
    assert out["slurm_state"] == "login-1: unknown; 8: JobState=CANCELLED; 9: JobState=COMPLETED"
    # one job alone keeps the one-job record
    single = sl.cancel_jobs(jobs[2:], 5, 1, run=PerJob({"9": ["COMPLETED"]}), sleep=lambda s: None)
    assert single["final_state"] == "already gone" and single["slurm_state"] == "JobState=COMPLETED"
    # Slurm that cannot say for one job: that one is not cancelled, and the outcome says nothing was decided
    down = PerJob({"login-1": ["unknown"], "8": ["down"], "9": ["RUNNING", "CANCELLED"]})
    out = sl.cancel_jobs(jobs, 5, 1, look_tries=2, look_delay_s=0, run=down, sleep=lambda s: None)
    assert out["final_state"] is None and out["ok"] is False and scancels(down) == [["scancel", "9"]]


def test_the_teardown_cancels_the_instance_and_each_job_runs_on_the_box_submitted():
    slurm_jobs = sl.teardown_jobs
    listing = {"runs": [{"run_id": "a", "slurm_job_id": "8"}, {"run_id": "b", "slurm_job_id": None},
                        {"run_id": "c", "slurm_job_id": "8"}, {"run_id": "d", "slurm_job_id": "12"}]}
    assert slurm_jobs("login-1", [listing, listing]) == [
        {"job_id": "login-1", "argv": ["scancel", "login-1"]}, {"job_id": "8", "argv": ["scancel", "8"]},
        {"job_id": "12", "argv": ["scancel", "12"]}]
    assert slurm_jobs("5", []) == [{"job_id": "5", "argv": ["scancel", "5"]}]


# ---------------------------------------------------------------- status: Slurm's view + the wrapper's records

def test_durations_in_slurms_formats():
    assert sl.duration_s("00:01:00") == 60 and sl.duration_s("1-00:00:00") == 86400
    assert sl.duration_s("05:30") == 330 and sl.duration_s("90") == 5400
    assert sl.duration_s("UNLIMITED") is None and sl.duration_s(None) is None


def slurm_facts(state, reason=None, restarts=0, run_time="00:00:20", time_limit="00:10:00", exit_rc=0, known=True):
    return {"job_id": "7", "known": known, "error": None if known is not None else "Unable to contact slurm "
            "controller", "state": state, "reason": reason, "exit_rc": exit_rc, "exit_signal": 0,
            "restarts": restarts, "time_limit": time_limit, "run_time": run_time, "nodes": "vm"}


def status(slurm, exit_reason=None, other_boot=False):
    """reconcile() as rgt_status calls it for a run on the login node: the wrapper's records plus Slurm's view."""
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_reconcile as rc

    now = 1_800_000_000.0
    start = {"attempt": 1, "started_at": now - 100, "incarnation": "compute-boot:1" if other_boot else "login:1",
             "detach": "sbatch", "slurm_job_id": "7"}
    attempts = [start]
    exit_doc = None
    if exit_reason:
        exit_doc = {"attempt": 1, "rc": 0, "signal": None, "reason": exit_reason, "ended_at": now - 5}
        attempts.append(dict(exit_doc))
    facts = {"now": now, "job": {"run_id": "r", "run_dir": "/nonexistent/r", "outputs": [], "grace_s": 30},
             "pid": {"wrapper_pid": 999999, "job_pid": 999999, "attempt": 1, "incarnation": start["incarnation"]},
             "attempts": attempts, "exit": exit_doc, "incarnation": "login:1", "wrapper_alive": False,
             "job_alive": False, "heartbeat_age_s": 3, "slurm": slurm}
    return rc.reconcile(facts)


def test_pending_is_queued_with_slurms_reason_and_a_requeue_is_named():
    doc = status(slurm_facts("PENDING", "BeginTime", restarts=1), exit_reason="preempted")
    assert doc["state"] == "queued" and doc["queue_reason"] == "BeginTime" and not doc["attention"]
    assert any("requeued job 7 (1 restart)" in w for w in doc["warnings"])
    assert status(slurm_facts("PENDING", "Priority"))["state"] == "queued"


@pytest.mark.parametrize("state", ["PREEMPTED", "NODE_FAIL", "REQUEUED", "REQUEUE_HOLD"])
def test_preemption_states_are_preempted(state):
    assert status(slurm_facts(state))["state"] == "preempted"


def test_running_on_a_compute_node_is_running_whatever_the_login_nodes_pids_and_boot_id_say():
    doc = status(slurm_facts("RUNNING"), other_boot=True)
    assert doc["state"] == "running" and doc["slurm"]["state"] == "RUNNING"
    assert not any("box restarted" in w for w in doc["warnings"]), doc["warnings"]
    # between two attempts of a requeue: attempt 1 ended preempted, Slurm runs the job again
    assert status(slurm_facts("RUNNING", restarts=1), exit_reason="preempted")["state"] == "running"


def test_timeout_is_its_own_state_with_the_advice_to_checkpoint_before_the_limit():
    doc = status(slurm_facts("TIMEOUT", run_time="00:10:29"))
    assert doc["state"] == "timeout"
    (item,) = doc["attention"]
    assert item["id"] == "timeout" and "checkpoint before the limit" in item["message"]
    # the wrapper stopped on Slurm's B:TERM warning near the limit: the job ended COMPLETED, still a timeout
    near = status(slurm_facts("COMPLETED", run_time="00:09:10"), exit_reason="preempted")
    assert near["state"] == "timeout"
    # far from the limit a stop signal is a preemption, not a timeout
    assert status(slurm_facts("COMPLETED", run_time="00:02:00"), exit_reason="preempted")["state"] == "preempted"


def test_out_of_memory_is_oom_with_attention():
    doc = status(slurm_facts("OUT_OF_MEMORY", exit_rc=0))
    assert doc["state"] == "oom" and [a["id"] for a in doc["attention"]] == ["oom"]


def test_an_ended_job_keeps_the_wrappers_exit_record_and_without_one_is_failed_or_dead():
    assert status(slurm_facts("COMPLETED"), exit_reason="finished")["state"] == "finished"
    assert status(slurm_facts("FAILED", exit_rc=2))["state"] == "failed"
    assert status(slurm_facts("CANCELLED"))["state"] == "dead"


def test_slurm_that_cannot_say_leaves_the_wrappers_view_with_a_warning():
    doc = status(slurm_facts(None, known=None), exit_reason="finished")
    assert doc["state"] == "finished" and any("Slurm could not say" in w for w in doc["warnings"])


def test_a_run_not_submitted_through_slurm_is_untouched():
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_reconcile as rc

    doc = {"state": "running", "warnings": [], "attention": []}
    assert rc.with_slurm(doc, None) is doc and "slurm" not in doc


def test_the_wrappers_start_record_names_sbatch_the_job_id_and_the_restart_count():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "roles" / "launch_detached" / "files" / "rgt_wrapper.py"
    spec = importlib.util.spec_from_file_location("rgt_wrapper_slurm", path)
    wrapper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wrapper)
    job = {"code_dir": "/c", "session": "rgt-p/r"}
    rec = wrapper.start_record(job, 2, "t", "/r/ckpt/step_1.ckpt", "i", 0,
                               {"RGT_DETACH": "sbatch", "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"})
    assert rec["detach"] == "sbatch" and rec["slurm_job_id"] == "7" and rec["slurm_restart_count"] == 1
    assert rec["session"] is None and rec["resume_from"] == "/r/ckpt/step_1.ckpt"
    # tmux and nohup records are as before (no slurm keys)
    assert wrapper.start_record(job, 1, "t", None, "i", 0, {"TMUX": "/tmp/x"}) == {
        "attempt": 1, "started_at": "t", "code_dir": "/c", "resume_from": None, "incarnation": "i", "oom_kill": 0,
        "detach": "tmux", "session": "rgt-p/r"}
    assert wrapper.start_record(job, 1, "t", None, "i", 0, {})["detach"] == "nohup"


# ---------------------------------------------------------------- rgt_job.slurm.extra never overrides rgt's options

def test_the_reserved_options_are_the_ones_rgt_passes():
    argv = sl.sbatch_argv("sbatch", "/s", "n", "/o", "/r", 30, True, {"partition": "p", "gres": "g",
                                                                     "cpus_per_task": 1, "mem": "1G", "time": "1",
                                                                     "account": "a", "qos": "q"})
    passed = {w.split("=", 1)[0] for w in argv[1:-1]} | {"--no-requeue"}
    assert set(sl.reserved_options()) == passed | {"--array", "--wrap"}
    assert sl.array_option(3, 2) == "--array=0-2%2" and sl.array_option(1) == "--array=0-0"


@pytest.mark.parametrize("extra, index, says", [
    (["--job-name=x"], 0, "sets --job-name"),
    (["--constraint=a100", "-Jx"], 1, "sets --job-name (-J)"),
    (["-o", "/tmp/out"], 0, "sets --output (-o)"),
    (["-a", "0-3"], 0, "sets --array (-a)"),
    (["--sig=B:USR1@9"], 0, "abbreviates --signal"),
    (["--requeue"], 0, "sets --requeue"),
    (["--wrap=hostname"], 0, "replaces the batch script"),
    (["--par=x"], 0, "abbreviates --parsable or --partition"),
    (["--cpus-per-task=8"], 0, "sets --cpus-per-task"),
])
def test_an_extra_word_that_sets_an_option_rgt_passes_is_refused(extra, index, says):
    found, message, fix = sl.extra_problem(extra)
    assert found == index and says in message and "rgt_job.slurm.extra[%d]" % index in message and fix


@pytest.mark.parametrize("extra", [["--constraint=a100"], ["--begin=now+1hour", "--mem-per-cpu=4G"], ["--gpus=2"],
                                   ["--time-min=10", "--exclusive", "-e", "err.log"], [], None])
def test_options_rgt_does_not_pass_go_through(extra):
    assert sl.extra_problem(extra) is None
