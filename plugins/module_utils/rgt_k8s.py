# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Kubernetes manifests of a run (the ``k8s-job`` detach primitive's input): a batch/v1 Job whose container runs
the rgt wrapper in the user's image, with the run dir on a PersistentVolumeClaim mounted at the durable root, and
the claim itself unless the job spec names an existing one. Pure: dicts in, dicts out; nothing is applied here.

- ``build(job, profile, paths, network_env, stage)``: the manifests as ``[(file name, manifest)]`` in apply order
  (``pvc.yaml`` first when rgt generates the claim, then ``stage.yaml``, then ``job.yaml``). ``job`` is the job
  spec (``rgt_job``; its block ``k8s`` is docs/kubernetes.md), ``profile`` the host's profile (``spot.grace_s``),
  ``paths`` the run's ``rgt_runlayout.RunPaths`` (durable root, project, run id, run dir, wrapper path),
  ``network_env`` the profile's rendered ``network.env``, ``stage`` what the run dir is staged from (below).
  Bad input raises ``K8sError(field, message, fix)``.
- Staging (no ``kubectl exec``): ``stage`` maps the ConfigMap's files to their contents, gathered by the caller
  (runner/rgt/k8s.py): text files (``rgt_k8s_stage.py`` and ``job.json`` at least; the runner adds the flat
  bundles of the stage and of the wrapper, module_utils/rgt_bundle, and the wrapper bundle's listing) and, when the
  code is shipped (``rgt_job.code_dir``), ``code.tar.gz`` (bytes). They become the ConfigMap ``stage.yaml``, and
  the pod gets an init container ``stage`` in the user's image that runs ``rgt_k8s_stage.py <run_dir>`` with the
  claim at the durable root and the ConfigMap read-only at ``/rgt-stage``: it installs the wrapper, job.json and
  ``code-<hash8>/`` on the claim at every pod start (plugins/module_utils/rgt_k8s_stage.py). Without
  ``stage`` the Job expects a run dir staged otherwise. ``code_dir(job, paths, hash8)`` is the code dir job.json
  names: ``code-<hash8>`` of the shipped code, else ``rgt_job.k8s.workdir`` (the code in the image).
- ``check(manifests, job, profile, paths)``: the rules the OpenAPI schema cannot say (kubernetes-validate checks
  types, required fields and unknown fields; the runner runs it): ``restartPolicy`` Never or OnFailure, an
  ``nvidia.com/gpu`` limit equal to the job's GPU count, the claim name of the durable volume matching the claim,
  the volume mounted at the durable root, ``terminationGracePeriodSeconds`` the job's grace + END_RECORDS_S, secrets
  only by reference (no ``value`` for a secret's name, every ``secretKeyRef``/``secretRef`` naming the job's
  Secret, an offload credential's the run's offload Secret, no Secret object), and when the run is staged: the
  stage container mounts the claim at the durable root and the stage volume, and that volume is the ConfigMap
  among the manifests. Returns ``[(field, message, fix)]``, empty when the manifests pass.
- ``label_value(name)`` / ``object_name(*parts)``: Kubernetes-safe forms of rgt names (run id, project), derived
  deterministically; the exact names ride along as annotations.

Secrets: a job secret NAME becomes the key of the same name in the Secret ``rgt_job.k8s.secret_name``
(``valueFrom.secretKeyRef``); rgt never reads, writes or prints a value here. An offload to an rclone remote
(docs/offload.md) gets its ``offload.credentials`` the same way, from the run's own Secret ``offload_secret_name``
(the Job's name + ``-offload``), which the engine creates from the controller's environment
(runner/rgt/k8s_engine.apply_offload_secret; ``offload_secret`` builds it): never among the manifests, never shown.

Python 3.6+, stdlib only, no import of another module_util.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import json
import posixpath
import re

DEFAULT_VERSION = "1.37"  # the Kubernetes minor validated against unless rgt_job.k8s.kubernetes_version says
GPU_RESOURCE = "nvidia.com/gpu"
RESTART_POLICIES = ("Never", "OnFailure")
DEFAULT_RESTART_POLICY = "Never"  # a failed attempt stays failed; rgt decides what is relaunched
DEFAULT_BACKOFF_LIMIT = 0  # Kubernetes' default (6) would rerun a failed job: rgt never relaunches a failed run
END_RECORDS_S = 10  # the pod's grace beyond the job's: the wrapper's heartbeat, end line, log trailer, exit.json
ENTRYPOINT_ENV = "RGT_CONTAINER_ENTRYPOINT"  # tells the wrapper it is PID 1 of a container (rgt_wrapper.py)
DEFAULT_GRACE_S = 30  # the launch's rule (roles/launch_detached/defaults: spot.grace_s or 30, at least 5)
MIN_GRACE_S = 5
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
DEFAULT_ACCESS_MODE = "ReadWriteOnce"
CONTAINER = "job"
VOLUME = "durable"
JOB_FILE = "job.yaml"
RECORD_PREFIX = "k8s."  # a staging ConfigMap's key for a manifest the stage writes to <run_dir>/.rgt/k8s/
PVC_FILE = "pvc.yaml"
STAGE_FILE = "stage.yaml"
STAGE_CONTAINER = "stage"  # the init container that stages the run dir on the claim
STAGE_VOLUME = "rgt-stage"
STAGE_MOUNT = "/rgt-stage"  # where the ConfigMap is mounted read-only in the stage container
STAGE_SCRIPT = "rgt_k8s_stage.py"
STAGE_REQUIRED = (STAGE_SCRIPT, "job.json")  # text files a stage cannot do without (every text file is data)
STAGE_CODE = "code.tar.gz"  # its binaryData, when the code is shipped
LABEL_PROJECT = "rgt/project"
LABEL_RUN_ID = "rgt/run-id"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_PROJECT = "rgt/project"
ANNOTATION_RUN_ID = "rgt/run-id"
ANNOTATION_RUN_DIR = "rgt/run-dir"
OFFLOAD_SECRET_SUFFIX = "-offload"  # the run's Secret of its offload credentials: <job name>-offload
OFFLOAD_CONTROLLER = "controller"  # offload.to: controller pushes nothing from the pod (rgt_offload.CONTROLLER)

_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_LABEL_MAX = 63
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")
_HASH_LEN = 8


class K8sError(ValueError):
    """Bad input for the manifests: the job-spec field, what is wrong, the fix."""

    def __init__(self, field, message, fix):
        super(K8sError, self).__init__("%s: %s" % (field, message))
        self.field = field
        self.message = message
        self.fix = fix


def _digest(*parts):
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:_HASH_LEN]


def label_value(name):
    """A Kubernetes label value for an rgt name (run id, project). A name that already is one (at most 63
    characters, alphanumeric at both ends) is kept as it is; any other (longer, or ending in '.', '_' or '-') is cut
    to fit, trimmed to an alphanumeric end and suffixed with '-' and 8 hex of its SHA-256, so two different names
    never share a value by being cut alike. The exact name is in the annotations."""
    if len(name) <= _LABEL_MAX and _LABEL_VALUE.fullmatch(name):
        return name
    head = re.sub(r"[^A-Za-z0-9]+$", "", name[:_LABEL_MAX - _HASH_LEN - 1])
    return (head + "-" if head else "") + _digest(name)


def object_name(*parts):
    """A DNS-1123 label (lowercase alphanumerics and '-', at most 63) for an object named after rgt names: the parts
    lowercased, every other character turned into '-', cut to fit, then '-' and 8 hex of the SHA-256 of the exact
    parts. Names that differ only in case or punctuation (Run.A, run-a) get different objects."""
    slug = re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")
    slug = slug[:_LABEL_MAX - _HASH_LEN - 1].rstrip("-")
    return (slug + "-" if slug else "") + _digest(*parts)


def grace_s(profile):
    """The job's grace (SIGTERM -> SIGKILL), as the launch computes it: the profile's spot.grace_s, 30 when null
    or 0, at least 5."""
    value = ((profile or {}).get("spot") or {}).get("grace_s")
    return max(int(value or DEFAULT_GRACE_S), MIN_GRACE_S)


def pod_grace_s(profile):
    """The pod's terminationGracePeriodSeconds: the job's grace (the wrapper forwards SIGTERM, waits that long, then
    kills the job) plus END_RECORDS_S for the wrapper's end records before the kubelet's SIGKILL."""
    return grace_s(profile) + END_RECORDS_S


def gpu_count(job):
    return int(((job or {}).get("gpu") or {}).get("count") or 0)


def _env_value(value):
    """The string the wrapper would put in the environment for a job.env value (str(), as rgt_wrapper.build_env)."""
    return "" if value is None else str(value)


def settings(job):
    """The job spec's k8s block with the defaults filled in; K8sError for what the schema cannot refuse alone."""
    k8s = (job or {}).get("k8s")
    if not isinstance(k8s, dict) or not k8s.get("image"):
        raise K8sError("rgt_job.k8s.image", "a kubernetes profile runs the job in a container image, and the job "
                       "spec names none", "set rgt_job.k8s.image to your training image, pinned by digest "
                       "(registry/name@sha256:...)")
    if not (job or {}).get("python"):
        raise K8sError("rgt_job.python", "the interpreter in the image is not given (the wrapper runs with it)",
                       "set rgt_job.python to the absolute path of python in the image, e.g. /usr/bin/python3")
    restart = k8s.get("restart_policy", DEFAULT_RESTART_POLICY)
    if restart not in RESTART_POLICIES:
        raise K8sError("rgt_job.k8s.restart_policy", "%r is not allowed for a Job" % (restart,),
                       "use Never (the default) or OnFailure")
    pvc = k8s.get("pvc") or {}
    claim = pvc.get("claim_name")
    if claim:
        extra = sorted(k for k in ("storage", "storage_class", "access_mode") if k in pvc)
        if extra:
            raise K8sError("rgt_job.k8s.pvc", "claim_name names an existing claim, so %s cannot apply"
                           % ", ".join(extra), "remove %s, or remove claim_name to let rgt create the claim"
                           % ", ".join(extra))
    elif not pvc.get("storage"):
        raise K8sError("rgt_job.k8s.pvc", "the durable root needs a PersistentVolumeClaim, and the job spec names "
                       "neither an existing claim nor a size for a new one",
                       "set rgt_job.k8s.pvc.claim_name to an existing claim, or pvc.storage (e.g. 100Gi)")
    elif not _QUANTITY.fullmatch(str(pvc["storage"])):
        raise K8sError("rgt_job.k8s.pvc.storage", "%r is not a Kubernetes quantity" % (pvc["storage"],),
                       "write a size such as 100Gi or 500G")
    secrets = list(job.get("secrets") or [])
    secret_name = k8s.get("secret_name")
    if secrets and not secret_name:
        raise K8sError("rgt_job.k8s.secret_name", "the job names secrets (%s), and on Kubernetes they come only "
                       "from a Secret, by reference" % ", ".join(secrets),
                       "create a Secret holding one key per name (kubectl create secret generic NAME "
                       "--from-literal=%s=...) and set rgt_job.k8s.secret_name to its name" % secrets[0])
    workdir = k8s.get("workdir")
    if workdir is not None and not (isinstance(workdir, str) and posixpath.isabs(workdir)):
        raise K8sError("rgt_job.k8s.workdir", "%r is not an absolute path" % (workdir,),
                       "set rgt_job.k8s.workdir to the absolute path of the code inside the image, e.g. /app")
    if workdir is not None and job.get("code_dir"):
        raise K8sError("rgt_job.k8s.workdir", "the job ships its code (rgt_job.code_dir) and also names code in the "
                       "image (rgt_job.k8s.workdir)", "keep one: code_dir to ship the code, or workdir for code "
                       "baked into rgt_job.k8s.image")
    for name in sorted(job.get("env") or {}):
        if name in secrets:
            raise K8sError("rgt_job.env.%s" % name, "%s is both a plain env value and a secret" % name,
                           "remove it from rgt_job.env: a secret is only named in rgt_job.secrets")
    credentials = offload_credentials(job)
    for i, name in enumerate(credentials):
        if name in secrets or name in (job.get("env") or {}):
            raise K8sError("rgt_job.offload.credentials[%d]" % i, "%s is both an offload credential and %s"
                           % (name, "a job secret" if name in secrets else "a plain env value"),
                           "name it once: on Kubernetes an offload credential comes from the run's own Secret "
                           "(made from this shell's environment), a job secret from rgt_job.k8s.secret_name")
    return {
        "image": k8s["image"], "namespace": k8s.get("namespace"), "service_account": k8s.get("service_account"),
        "node_selector": dict(k8s.get("node_selector") or {}), "tolerations": list(k8s.get("tolerations") or []),
        "restart_policy": restart, "backoff_limit": k8s.get("backoff_limit", DEFAULT_BACKOFF_LIMIT),
        "active_deadline_s": k8s.get("active_deadline_s"), "claim_name": claim,
        "storage": None if claim else str(pvc["storage"]), "storage_class": pvc.get("storage_class"),
        "access_mode": pvc.get("access_mode", DEFAULT_ACCESS_MODE), "secret_name": secret_name,
        "secrets": secrets, "kubernetes_version": str(k8s.get("kubernetes_version") or DEFAULT_VERSION),
        "workdir": workdir, "offload_credentials": credentials,
    }


def offload_credentials(job):
    """The NAMES of offload.credentials the pod needs: those of an offload to an rclone remote (with `to:
    controller` the pod pushes nothing), else []."""
    offload = (job or {}).get("offload")
    if not isinstance(offload, dict) or not offload.get("to") or offload.get("to") == OFFLOAD_CONTROLLER:
        return []
    return [str(name) for name in offload.get("credentials") or []]


def offload_secret_name(paths):
    """The run's Secret of its offload credentials: the Job's name + '-offload' (a DNS subdomain)."""
    return job_name(paths) + OFFLOAD_SECRET_SUFFIX


def _labels(paths):
    return {LABEL_MANAGED_BY: "rgt", LABEL_PROJECT: label_value(paths.project), LABEL_RUN_ID: label_value(
        paths.run_id)}


def _annotations(paths):
    return {ANNOTATION_PROJECT: paths.project, ANNOTATION_RUN_ID: paths.run_id, ANNOTATION_RUN_DIR: paths.run_dir}


def offload_secret(job, paths, values):
    """The run's offload Secret (v1, Opaque): `values` {NAME: value} as stringData, one key per credential of
    offload_credentials(job). Only the engine holds it, to send it on kubectl's stdin: it is never written, shown
    or put among the manifests. ValueError naming a credential without a value."""
    names = offload_credentials(job)
    missing = [n for n in names if values.get(n) is None]
    if missing:
        raise ValueError("no value for %s" % ", ".join(missing))
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(offload_secret_name(paths), settings(job)["namespace"], _labels(paths),
                                  _annotations(paths)),
            "stringData": dict((n, str(values[n])) for n in names)}


def code_dir(job, paths, hash8=None):
    """The dir the job runs in, as job.json names it: <run_dir>/code-<hash8> of the shipped code (rgt_job.code_dir;
    hash8 = rgt_tree's hash of it), else rgt_job.k8s.workdir, the code baked into the image. K8sError when the
    job spec gives neither."""
    if (job or {}).get("code_dir"):
        return paths.code_dir(hash8)
    workdir = settings(job)["workdir"]
    if not workdir:
        raise K8sError("rgt_job.k8s.workdir", "the job spec ships no code (no rgt_job.code_dir), so the code must "
                       "be in the image, and rgt_job.k8s.workdir does not say where",
                       "set rgt_job.k8s.workdir to the absolute path of the code inside rgt_job.k8s.image, or set "
                       "rgt_job.code_dir to ship the code")
    return workdir


def claim_name(job, project):
    """The claim holding the durable root: the one the job spec names, else the one rgt generates per project
    (every run of a project shares its durable root: <root>/<project>/active/<run_id>, export/, ...)."""
    pvc = (((job or {}).get("k8s") or {}).get("pvc") or {})
    return pvc.get("claim_name") or object_name("rgt-durable", project)


def job_name(paths):
    return object_name("rgt", paths.project, paths.run_id)


def stage_name(paths):
    """The run's staging ConfigMap: the Job's name + '-stage' (a DNS subdomain; a ConfigMap's name may be 253)."""
    return job_name(paths) + "-stage"


def _metadata(name, namespace, labels, annotations):
    meta = {"name": name, "labels": labels, "annotations": annotations}
    if namespace:
        meta["namespace"] = namespace
    return meta


def stage_config_map(paths, stage, namespace, labels, annotations, recorded=()):
    """The ConfigMap the stage container reads: the text files as data, code.tar.gz (when shipped) as binaryData
    (base64, as the API wants it), and each of `recorded` [(file, manifest)] as `k8s.<file>` (deterministic JSON,
    which is YAML too), which the stage writes to <run_dir>/.rgt/k8s/<file>: the run keeps the manifests it was
    applied from."""
    missing = [name for name in STAGE_REQUIRED if not isinstance(stage.get(name), str)]
    if missing:
        raise ValueError("the stage lacks %s" % ", ".join(missing))
    data = dict((name, text) for name, text in stage.items() if name != STAGE_CODE and isinstance(text, str))
    data.update((RECORD_PREFIX + name, dumps(doc)) for name, doc in recorded)
    doc = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": _metadata(stage_name(paths), namespace, labels, annotations), "data": data}
    if stage.get(STAGE_CODE) is not None:
        doc["binaryData"] = {STAGE_CODE: base64.b64encode(stage[STAGE_CODE]).decode("ascii")}
    return doc


def build(job, profile, paths, network_env=None, stage=None):
    """[(file name, manifest)] of the run, in apply order. K8sError on bad input."""
    s = settings(job)
    project_labels = {LABEL_MANAGED_BY: "rgt", LABEL_PROJECT: label_value(paths.project)}
    labels = _labels(paths)
    annotations = _annotations(paths)
    claim = claim_name(job, paths.project)
    env = {}
    for source in (network_env or {}, job.get("env") or {}):
        for name, value in source.items():
            env[str(name)] = {"name": str(name), "value": _env_value(value)}
    for name in s["secrets"]:
        env[name] = {"name": name, "valueFrom": {"secretKeyRef": {"name": s["secret_name"], "key": name}}}
    for name in s["offload_credentials"]:  # the offload's rclone reads them from the wrapper's environment
        env[name] = {"name": name, "valueFrom": {"secretKeyRef": {"name": offload_secret_name(paths), "key": name}}}
    env[ENTRYPOINT_ENV] = {"name": ENTRYPOINT_ENV, "value": "1"}  # the log to stdout, the outcome as exit code
    container = {
        "name": CONTAINER,
        "image": s["image"],
        "command": [job["python"], paths.wrapper, paths.run_dir],
        "env": [env[name] for name in sorted(env)],
        "volumeMounts": [{"name": VOLUME, "mountPath": paths.durable_root}],
    }
    count = gpu_count(job)
    if count:
        container["resources"] = {"limits": {GPU_RESOURCE: str(count)}}  # requests default to the limits
    pod = {
        "restartPolicy": s["restart_policy"],
        "terminationGracePeriodSeconds": pod_grace_s(profile),
        "containers": [container],
        "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}],
    }
    if s["node_selector"]:
        pod["nodeSelector"] = s["node_selector"]
    if s["tolerations"]:
        pod["tolerations"] = s["tolerations"]
    if s["service_account"]:
        pod["serviceAccountName"] = s["service_account"]
    if stage is not None:
        pod["initContainers"] = [{
            "name": STAGE_CONTAINER,
            "image": s["image"],
            "command": [job["python"], posixpath.join(STAGE_MOUNT, STAGE_SCRIPT), paths.run_dir],
            "volumeMounts": [{"name": VOLUME, "mountPath": paths.durable_root},
                             {"name": STAGE_VOLUME, "mountPath": STAGE_MOUNT, "readOnly": True}],
        }]
        pod["volumes"].append({"name": STAGE_VOLUME, "configMap": {"name": stage_name(paths)}})
    spec = {"backoffLimit": s["backoff_limit"],
            "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod}}
    if s["active_deadline_s"] is not None:
        spec["activeDeadlineSeconds"] = s["active_deadline_s"]
    manifests = []
    if not s["claim_name"]:
        pvc_spec = {"accessModes": [s["access_mode"]], "resources": {"requests": {"storage": s["storage"]}}}
        if s["storage_class"]:
            pvc_spec["storageClassName"] = s["storage_class"]
        manifests.append((PVC_FILE, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _metadata(claim, s["namespace"], project_labels, {ANNOTATION_PROJECT: paths.project}),
            "spec": pvc_spec}))
    job_doc = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": _metadata(job_name(paths), s["namespace"], labels, annotations), "spec": spec}
    if stage is not None:
        recorded = manifests + [(JOB_FILE, job_doc)]
        manifests.append((STAGE_FILE, stage_config_map(paths, stage, s["namespace"], labels, annotations, recorded)))
    manifests.append((JOB_FILE, job_doc))
    return manifests


def dumps(manifest):
    """Deterministic JSON of one manifest (sorted keys)."""
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def _kind(manifests, kind):
    for name, doc in manifests:
        if isinstance(doc, dict) and doc.get("kind") == kind:
            return name, doc
    return None, None


def check(manifests, job, profile, paths):
    """[(field, message, fix)] for every rule of rgt's the manifests break (the schema cannot say these)."""
    problems = []
    fix_regen = "let rgt generate the manifests from the job spec (rgt-run train -C shows them)"
    secrets = list((job or {}).get("secrets") or [])
    secret_name = ((job or {}).get("k8s") or {}).get("secret_name")
    credentials = offload_credentials(job)
    for name, doc in manifests:
        if isinstance(doc, dict) and doc.get("kind") == "Secret":
            problems.append(("rgt_job.secrets", "%s is a Secret object: rgt never writes secret values into "
                             "manifests" % name, "create the Secret yourself and name it in rgt_job.k8s.secret_name"))
    file_name, kjob = _kind(manifests, "Job")
    if kjob is None:
        return problems + [("rgt_job.k8s", "no Job among the manifests", fix_regen)]
    pod = ((kjob.get("spec") or {}).get("template") or {}).get("spec") or {}
    where = "%s: spec.template.spec" % file_name
    restart = pod.get("restartPolicy")
    if restart not in RESTART_POLICIES:
        problems.append(("rgt_job.k8s.restart_policy", "%s.restartPolicy is %r; a Job's pod must not restart "
                         "Always" % (where, restart), "use Never (the default) or OnFailure"))
    grace = grace_s(profile)
    if pod.get("terminationGracePeriodSeconds") != pod_grace_s(profile):
        problems.append(("spot.grace_s", "%s.terminationGracePeriodSeconds is %r, not the job's grace %d s (the "
                         "profile's spot.grace_s) + %d s for the wrapper's end records"
                         % (where, pod.get("terminationGracePeriodSeconds"), grace, END_RECORDS_S), fix_regen))
    containers = pod.get("containers") or []
    volumes = dict((v.get("name"), v) for v in pod.get("volumes") or [] if isinstance(v, dict))
    want_claim = claim_name(job, paths.project)
    _pvc_file, pvc = _kind(manifests, "PersistentVolumeClaim")
    if pvc is not None and (pvc.get("metadata") or {}).get("name") != want_claim:
        problems.append(("rgt_job.k8s.pvc", "the generated claim is named %r, the Job mounts %r"
                         % ((pvc.get("metadata") or {}).get("name"), want_claim), fix_regen))
    durable = volumes.get(VOLUME) or {}
    got_claim = (durable.get("persistentVolumeClaim") or {}).get("claimName")
    if got_claim != want_claim:
        problems.append(("rgt_job.k8s.pvc.claim_name", "%s.volumes[%s] claims %r, not the durable root's claim %r"
                         % (where, VOLUME, got_claim, want_claim), fix_regen))
    problems += _check_stage(manifests, pod, volumes, where, paths, fix_regen)
    count = gpu_count(job)
    for i, container in enumerate(containers):
        cwhere = "%s.containers[%d]" % (where, i)
        mounts = dict((m.get("name"), m) for m in container.get("volumeMounts") or [] if isinstance(m, dict))
        for mname in sorted(mounts):
            if mname not in volumes:
                problems.append(("rgt_job.k8s.pvc", "%s mounts volume %r, which the pod does not have"
                                 % (cwhere, mname), fix_regen))
        if (mounts.get(VOLUME) or {}).get("mountPath") != paths.durable_root:
            problems.append(("rgt_durable_root", "%s does not mount the claim at the durable root %s"
                             % (cwhere, paths.durable_root), fix_regen))
        resources = container.get("resources") or {}
        limit = (resources.get("limits") or {}).get(GPU_RESOURCE)
        request = (resources.get("requests") or {}).get(GPU_RESOURCE)
        if count and str(limit) != str(count):
            problems.append(("rgt_job.gpu.count", "the job asks for %d GPU(s), and %s has %s limit %r"
                             % (count, cwhere, GPU_RESOURCE, limit),
                             "GPUs are only scheduled through resources.limits.%s: %s" % (GPU_RESOURCE, fix_regen)))
        if not count and limit not in (None, "0", 0):
            problems.append(("rgt_job.gpu.count", "%s has %s limit %r, and the job asks for no GPU"
                             % (cwhere, GPU_RESOURCE, limit), "set rgt_job.gpu.count, or %s" % fix_regen))
        if request is not None and str(request) != str(limit):
            problems.append(("rgt_job.gpu.count", "%s requests %r %s but limits %r: they must be equal"
                             % (cwhere, request, GPU_RESOURCE, limit), fix_regen))
        for entry in container.get("env") or []:
            name = entry.get("name")
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if name in secrets and ("value" in entry or not ref):
                problems.append(("rgt_job.secrets", "%s env %s is a secret given as a literal value" % (cwhere, name),
                                 "a secret comes only from the Secret rgt_job.k8s.secret_name by secretKeyRef"))
            if name in credentials:
                if "value" in entry or not ref or ref.get("name") != offload_secret_name(paths):
                    problems.append(("rgt_job.offload.credentials", "%s env %s is an offload credential not taken "
                                     "from the run's Secret %s" % (cwhere, name, offload_secret_name(paths)),
                                     fix_regen))
            elif ref is not None and ref.get("name") != secret_name:
                problems.append(("rgt_job.k8s.secret_name", "%s env %s references Secret %r, not %r"
                                 % (cwhere, name, ref.get("name"), secret_name), fix_regen))
        for entry in container.get("envFrom") or []:
            ref = entry.get("secretRef")
            if ref is not None and ref.get("name") != secret_name:
                problems.append(("rgt_job.k8s.secret_name", "%s envFrom references Secret %r, not %r"
                                 % (cwhere, ref.get("name"), secret_name), fix_regen))
        missing = [n for n in secrets + credentials
                   if n not in set(e.get("name") for e in container.get("env") or [])]
        if missing and not any("secretRef" in e for e in container.get("envFrom") or []):
            problems.append(("rgt_job.secrets", "%s does not receive the secret(s) %s" % (cwhere, ", ".join(missing)),
                             fix_regen))
    return problems


def _check_stage(manifests, pod, volumes, where, paths, fix_regen):
    """The staging rules: every init container mounts only volumes the pod has; when the run is staged (a stage
    container, a stage volume or a ConfigMap), the stage container mounts the claim at the durable root and the
    stage volume at STAGE_MOUNT, and that volume is the run's ConfigMap among the manifests."""
    problems = []
    inits = [c for c in pod.get("initContainers") or [] if isinstance(c, dict)]
    for i, container in enumerate(inits):
        for mount in container.get("volumeMounts") or []:
            if isinstance(mount, dict) and mount.get("name") not in volumes:
                problems.append(("rgt_job.k8s.pvc", "%s.initContainers[%d] mounts volume %r, which the pod does not "
                                 "have" % (where, i, mount.get("name")), fix_regen))
    stagers = [(i, c) for i, c in enumerate(inits) if c.get("name") == STAGE_CONTAINER]
    cm_file, config_map = _kind(manifests, "ConfigMap")
    if not stagers and STAGE_VOLUME not in volumes and config_map is None:
        return problems  # not staged here
    if not stagers:
        return problems + [("rgt_job.k8s", "%s has no init container %r, so nothing stages the run dir (wrapper, "
                            "job.json, code) on the claim" % (where, STAGE_CONTAINER), fix_regen)]
    i, stager = stagers[0]
    swhere = "%s.initContainers[%d]" % (where, i)
    mounts = dict((m.get("name"), m) for m in stager.get("volumeMounts") or [] if isinstance(m, dict))
    if (mounts.get(VOLUME) or {}).get("mountPath") != paths.durable_root:
        problems.append(("rgt_durable_root", "%s does not mount the claim at the durable root %s"
                         % (swhere, paths.durable_root), fix_regen))
    if (mounts.get(STAGE_VOLUME) or {}).get("mountPath") != STAGE_MOUNT:
        problems.append(("rgt_job.k8s", "%s does not mount the stage volume %r at %s" % (swhere, STAGE_VOLUME,
                                                                                        STAGE_MOUNT), fix_regen))
    referenced = ((volumes.get(STAGE_VOLUME) or {}).get("configMap") or {}).get("name")
    have = (config_map.get("metadata") or {}).get("name") if config_map is not None else None
    if config_map is None:
        problems.append(("rgt_job.k8s", "no ConfigMap among the manifests, and %s.volumes[%s] references %r"
                         % (where, STAGE_VOLUME, referenced), fix_regen))
    elif referenced != have or have != stage_name(paths):
        problems.append(("rgt_job.k8s", "%s.volumes[%s] references ConfigMap %r, and %s is %r (the run's is %r)"
                         % (where, STAGE_VOLUME, referenced, cm_file, have, stage_name(paths)), fix_regen))
    return problems
