# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The registries of detach primitives and meter-stop verbs: the one place that says which exist, what each needs
and whether it is built (usable now). To add one, add an entry here, then its class in the table that implements
its kind (below); the unit tests (tests/unit/test_registry.py) hold the registry and the tables together.

- Detach primitives (a profile's ``detach.primitive`` / ``detach.fallback``): how the job wrapper keeps running
  after SSH goes away. rgt_launch starts a built one with its class in ``rgt_detach.DETACHES`` (keyed by the
  class's ``name``, the entry's name); one that runs on the controller (k8s-job) has its class there too, which
  names the runner's function that starts it (``rgt.k8s_run.start_k8s_job``), and rgt_launch refuses it.
- Meter-stop verbs: how teardown stops paying. A profile's verb is ``meter_stop.api.client`` when it has an API
  (``api``: a control-plane client, its class in ``rgt_cloud.CLIENTS`` by the same name), else ``meter_stop.verb``
  (scancel, delete_job, manual, none), and ``manual`` for an action word (terminate, release, ...) that has no API,
  only console steps. rgt_teardown runs a verb with its class in ``rgt_meterstop.STOPS`` (one class for every API
  client, the others by name).
- Meter actions: the words ``meter_stop.verb`` and ``alternatives[].verb`` may also use for what an API call or a
  console step does (power_off, stop, terminate, ...).

A profile naming a primitive or verb that is not registered is refused when it is loaded (``profile_problems``:
the runner's ``rgt.profiles`` and the lookup ``rgt.remote_gpu.profile``); a registered one that is not built is
refused before a launch (``launch_problem``: the runner before any play that launches, and rgt_launch itself),
never run under another primitive instead.

Runs on the box (rgt_launch imports it) and in the runner (``rgt.paths.module_util("rgt_registry")``):
Python 3.6+, stdlib only, no import of another module_util.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

HOME = "plugins/module_utils/rgt_registry.py"


class Entry(object):
    """One registered primitive or verb.

    name: the word a profile uses (and the ``name`` of its class: rgt_detach, rgt_meterstop, rgt_cloud). what: one
    line for people. built: usable now (its class exists). runs_on: where it acts (box, login node, controller).
    binaries: programs it needs there, on PATH. env: environment variables it needs on the controller (a
    ``<field>`` names the profile field that holds the name). profile_fields / job_fields: what it reads from the
    profile / the job spec. instead: what to use while it is not built. api: a meter-stop verb that is a
    control-plane client (its class in rgt_cloud). sweeps: how a detach primitive runs a sweep (rgt_launch):
    "queue" (a queue on the box starts the cells as slots free), "array" (one scheduler job array per launch),
    None (it runs no sweeps)."""

    __slots__ = ("name", "what", "built", "runs_on", "binaries", "env", "profile_fields", "job_fields",
                 "instead", "api", "sweeps")

    def __init__(self, name, what, built, runs_on="box", binaries=(), env=(), profile_fields=(),
                 job_fields=(), instead=None, api=False, sweeps=None):
        self.name = name
        self.what = what
        self.built = built
        self.runs_on = runs_on
        self.binaries = tuple(binaries)
        self.env = tuple(env)
        self.profile_fields = tuple(profile_fields)
        self.job_fields = tuple(job_fields)
        self.instead = instead
        self.api = api
        self.sweeps = sweeps

    def as_dict(self):
        return dict((key, list(v) if isinstance(v, tuple) else v)
                    for key, v in ((k, getattr(self, k)) for k in self.__slots__))

    def needs(self):
        """What it needs, as one line (for tables and messages)."""
        parts = []
        if self.binaries:
            parts.append("%s on the %s" % (", ".join(self.binaries), self.runs_on))
        if self.env:
            parts.append("env " + ", ".join(self.env))
        if self.profile_fields:
            parts.append("profile " + ", ".join(self.profile_fields))
        if self.job_fields:
            parts.append("job spec " + ", ".join(self.job_fields))
        return "; ".join(parts) or "nothing"


_API_FIELDS = ("meter_stop.api.base_url", "meter_stop.api.key_env")
_API_ENV = ("<meter_stop.api.key_env>",)

DETACH_PRIMITIVES = (
    Entry("tmux", "a tmux session on the box, named after the run (rgt-<project>/<run_id>)", True,
          binaries=("tmux",), sweeps="queue"),
    Entry("nohup", "a new session (setsid, stdin /dev/null, output to logs/wrapper.log): no hangup reaches it",
          True, sweeps="queue"),
    Entry("sbatch", "a Slurm batch job submitted from the login node; the wrapper runs inside the allocation",
          True, runs_on="login node", binaries=("sbatch", "squeue", "scontrol"),
          profile_fields=("roots.durable (on the cluster's shared filesystem)",), job_fields=("slurm",),
          sweeps="array"),
    Entry("k8s-job", "a Kubernetes Job from generated manifests, the wrapper as the container's entrypoint, "
          "applied by rgt-run from the controller", True, runs_on="controller",
          binaries=("kubectl",), env=("KUBECONFIG",), profile_fields=("roots.durable (the PVC)",),
          job_fields=("k8s", "python", "gpu.count", "env", "secrets")),
    Entry("vast-onstart", "vast.ai's /root/onstart.sh, run on every container start, relaunches the wrapper", False,
          binaries=("bash",), profile_fields=("detach.primitive",),
          instead="detach tmux with fallback nohup (the vastai profile); `rgt-run watch` relaunches a preempted "
                  "run from the controller"),
)

METER_STOPS = (
    Entry("runpod_rest", "RunPod REST API: DELETE the pod (terminate) or stop it", True, runs_on="controller",
          env=_API_ENV, profile_fields=_API_FIELDS, api=True),
    Entry("vast_rest", "vast.ai REST API: DELETE the instance (destroy)", True, runs_on="controller",
          env=_API_ENV, profile_fields=_API_FIELDS, api=True),
    Entry("lambda_rest", "Lambda Cloud API: terminate the instance", True, runs_on="controller",
          env=_API_ENV, profile_fields=_API_FIELDS, api=True),
    Entry("paperspace_rest", "Paperspace API: delete the machine", True, runs_on="controller",
          env=_API_ENV, profile_fields=_API_FIELDS, api=True),
    Entry("autodl_token", "AutoDL Pro API: power off (关机, reversible); console steps without the token", True,
          runs_on="controller", env=_API_ENV, profile_fields=_API_FIELDS, api=True),
    Entry("scancel", "cancel the Slurm job on the login node and watch it end (scontrol)", True,
          runs_on="login node", binaries=("scancel", "scontrol")),
    Entry("delete_job", "kubectl delete job <name> for each Job rgt launched for the host (rgt-run teardown; the "
          "claim is kept); the teardown role alone calls nothing and says so", True,
          runs_on="controller", binaries=("kubectl",)),
    Entry("manual", "nothing is called: the user follows the profile's console steps", True,
          runs_on="controller", profile_fields=("meter_stop.manual_steps",)),
    Entry("none", "nothing bills: nothing to stop", True, runs_on="controller"),
)

# What an API call or a console step does; allowed in meter_stop.verb (with an API or console steps) and in
# meter_stop.alternatives[].verb, next to the names of the verbs that run without an API.
METER_ACTIONS = ("power_off", "stop", "terminate", "destroy", "delete", "release")

AUTO = "auto"  # rgt_launch's own shorthand for the usual pair below
AUTO_MEANS = ("tmux", "nohup")  # (primitive, fallback)


def runs_sweeps(primitive):
    """Whether a profile's detach primitive (or auto) runs a sweep."""
    entry = detach(AUTO_MEANS[0] if primitive == AUTO else primitive)
    return bool(entry is not None and entry.sweeps)


def _find(entries, name):
    for entry in entries:
        if entry.name == name:
            return entry
    return None


def detach(name):
    """The registered detach primitive `name`, or None."""
    return _find(DETACH_PRIMITIVES, name)


def meter_stop(name):
    """The registered meter-stop verb `name`, or None."""
    return _find(METER_STOPS, name)


def detach_names():
    return [e.name for e in DETACH_PRIMITIVES]


def meter_stop_names():
    return [e.name for e in METER_STOPS]


def api_clients():
    """The meter-stop verbs that are control-plane clients (rgt_cloud classes)."""
    return [e for e in METER_STOPS if e.api]


def verb_words():
    """Every word meter_stop.verb and alternatives[].verb may hold."""
    return list(METER_ACTIONS) + [e.name for e in METER_STOPS if not e.api]


def _listing(entries):
    return ", ".join("%s%s" % (e.name, "" if e.built else " (not built yet)") for e in entries)


def meter_stop_of(meter):
    """The registered verb that stops this profile's meter: the API client, else the verb itself when it is one
    that runs without an API, else manual (an action word with console steps). None when unregistered."""
    meter = meter or {}
    api = meter.get("api") or {}
    if api:
        entry = meter_stop(api.get("client"))
        return entry.name if entry is not None and entry.api else None
    verb = meter.get("verb")
    entry = meter_stop(verb)
    if entry is not None and not entry.api:
        return entry.name
    return "manual" if verb in METER_ACTIONS else None


def profile_problems(profile):
    """(field, message, fix) for every primitive or verb the profile names that is not registered."""
    problems = []
    if not isinstance(profile, dict):
        return problems
    where = "registered in %s" % HOME
    det = profile.get("detach") or {}
    for key in ("primitive", "fallback"):
        name = det.get(key)
        if name is None and key == "fallback":
            continue
        if detach(name) is None:
            problems.append(("detach." + key, "%r is not a registered detach primitive" % (name,),
                             "use one of: %s (%s)%s" % (_listing(DETACH_PRIMITIVES), where,
                                                        "; null for no fallback" if key == "fallback" else "")))
    meter = profile.get("meter_stop") or {}
    words = verb_words()
    if "verb" in meter and meter.get("verb") not in words:
        problems.append(("meter_stop.verb", "%r is not a registered meter-stop verb or action" % (meter.get("verb"),),
                         "use one of: %s (%s)" % (", ".join(words), where)))
    api = meter.get("api")
    if isinstance(api, dict) and "client" in api:
        entry = meter_stop(api.get("client"))
        if entry is None or not entry.api:
            problems.append(("meter_stop.api.client",
                             "%r is not a registered control-plane client" % (api.get("client"),),
                             "use one of: %s (%s), or api: null with manual_steps"
                             % (", ".join(e.name for e in api_clients()), where)))
    for i, alt in enumerate(meter.get("alternatives") or []):
        if isinstance(alt, dict) and alt.get("verb") not in words:
            problems.append(("meter_stop.alternatives[%d].verb" % i,
                             "%r is not a registered meter-stop verb or action" % (alt.get("verb"),),
                             "use one of: %s (%s)" % (", ".join(words), where)))
    return problems


def not_built(entry):
    """(message, fix) refusing a registered primitive that is not built yet."""
    message = ("%r (%s) is registered but not built yet: rgt cannot launch through it, and never runs the job "
               "under another primitive instead; nothing was started" % (entry.name, entry.what))
    return message, "use %s" % (entry.instead or "a built one: " + ", ".join(
        e.name for e in DETACH_PRIMITIVES if e.built))


def launch_problem(primitive, fallback=None, where="controller"):
    """(field, message, fix) when a launch through this detach primitive (and fallback) must be refused: a name
    that is not registered, one not built yet, or (``where="box"``: rgt_launch) one that is started from the
    controller. None when the launch may go ahead. `auto` is tmux + nohup."""
    if primitive == AUTO:
        return None
    for field, name in (("detach.primitive", primitive), ("detach.fallback", fallback)):
        if name is None and field == "detach.fallback":
            continue
        entry = detach(name)
        if entry is None:
            return (field, "%r is not a registered detach primitive: nothing was started" % (name,),
                    "use one of: %s (registered in %s)" % (_listing(DETACH_PRIMITIVES), HOME))
        if not entry.built:
            message, fix = not_built(entry)
            return field, message, fix
        if where != entry.runs_on and entry.runs_on == "controller":
            return (field, "%r is started from the controller by rgt-run (%s), not by the launch role on a box: "
                    "nothing was started" % (name, entry.what),
                    "run `rgt-run train -i INVENTORY -e @job.yml` for this host")
    return None


def table():
    """Both registries as data (for `rgt-run profiles --json` and the docs)."""
    return {"detach_primitives": [e.as_dict() for e in DETACH_PRIMITIVES],
            "meter_stops": [e.as_dict() for e in METER_STOPS],
            "meter_actions": list(METER_ACTIONS)}
