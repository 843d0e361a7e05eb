"""`rgt-run init`: a starter inventory and a commented job.yml in your own project, from a platform's facts.

Writes `inventory/hosts.yml` (one box, with the platform's SSH user and port, a placeholder instance id to replace;
for the kubernetes profile one cluster, reached with kubectl: rgt_kubeconfig and rgt_kube_context, no SSH),
`job.yml` (every field commented, paths relative to the file itself; for kubernetes with its `k8s` block: the
image, namespace, claim) and, when the project has neither a .rgtignore nor a .gitignore, a `.rgtignore` that
keeps runs/ and inventory/ off the box, into the directory you name (default: here). It never overwrites: if a
file exists, nothing is written and it says which. Then it prints the next steps for that platform.
"""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath

from rich.console import Console

from rgt import engines, errors, output, profiles
from rgt.errors import InputError
from rgt.ledger import atomic_write_bytes

HELP = "write a starter inventory and a commented job.yml into your project (never overwrites)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="generic_ssh", metavar="NAME",
                        help="the platform the box is on (see `rgt-run profiles`); default generic_ssh")
    parser.add_argument("--dir", default=".", metavar="DIR", help="your project directory (default: here)")


def _yaml_line(value: object) -> str:
    import yaml  # 11 ms of every start; only `rgt-run init` writes YAML

    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip().removesuffix("\n...")


K8S_HOST = "cluster"  # the inventory host of a kubernetes project (docs/kubernetes.md)
K8S_INVENTORY = """\
# rgt inventory for one Kubernetes cluster (`rgt-run profiles show {name}`): no SSH, no box to pin. rgt-run runs
# each run as a Job, applied with kubectl from this machine; the job spec (image, namespace, claim) is in ../job.yml.
# Set rgt_instance_id to a name for this cluster (what `rgt-run teardown --confirm` asks for). kubectl's own
# defaults apply unless you set them: the kubeconfig $KUBECONFIG or ~/.kube/config, and its current-context.
---
all:
  hosts:
    {host}:
      rgt_profile: {name}
      rgt_instance_id: CHANGE-ME-cluster-name
      # rgt_kubeconfig: ~/.kube/config   # the cluster's kubeconfig (a path; credentials stay in it)
      # rgt_kube_context: my-context     # a context of that kubeconfig
"""


def inventory_text(profile: dict) -> str:
    ssh = profile.get("ssh") or {}
    name = profile["name"]
    if not engines.engine_of(profile).over_ssh:
        return K8S_INVENTORY.format(name=name, host=K8S_HOST)
    lines = [f"# rgt inventory for one {profile.get('title', name)} box (`rgt-run profiles show {name}`).",
             "# Add a host per box; the job spec is in ../job.yml (rgt-run ... -e @job.yml)."]
    if name == "local":
        host = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "rgt_profile": name, "rgt_instance_id": "localhost",
                "rgt_durable_root": "{{ inventory_dir }}/../.rgt/local-box/durable",
                "rgt_scratch_root": "{{ inventory_dir }}/../.rgt/local-box/scratch"}
        lines.append("# This machine, no SSH: the runs live under .rgt/local-box/ of this project.")
    else:
        host = {"ansible_host": ssh.get("host_pattern") or "<address>", "rgt_profile": name,
                "rgt_instance_id": "CHANGE-ME-instance-id"}
        if ssh.get("user"):
            host["ansible_user"] = ssh["user"]
        host["ansible_port"] = ssh.get("port") or 22
        lines += ["# Replace ansible_host, ansible_port and rgt_instance_id with the console's values, then pin the",
                  "# box's host key: rgt-run pin -i inventory (compare the fingerprint with the console)."]
        if ssh.get("notes"):
            lines.append(f"# SSH on {name}: {ssh['notes']}")
    import yaml  # 11 ms of every start; only `rgt-run init` writes YAML

    body = yaml.safe_dump({"all": {"hosts": {"box1": host}}}, sort_keys=False, allow_unicode=True, width=110)
    return "\n".join(lines) + "\n---\n" + body


def job_text(profile: dict) -> str:
    interpreter = (profile.get("env_contract") or {}).get("interpreter")
    # the command runs the interpreter declared below by its own name (its directory comes first on the job's PATH)
    runs = PurePosixPath(interpreter or "/usr/bin/python3").name
    spot = bool((profile.get("spot") or {}).get("available"))
    roots = profile.get("roots") or {}
    on_k8s = not engines.engine_of(profile).over_ssh
    out = [
        "# rgt job spec: every field is in docs/job-spec.md. Relative paths are relative to this file.",
        f"# The claim mounted at {roots.get('durable')} keeps runs under {roots.get('durable')}/<project>/active/"
        f"<run_id> ({profile['name']} profile; docs/kubernetes.md)." if on_k8s else
        f"# The box keeps runs under {roots.get('durable')}/<project>/active/<run_id> ({profile['name']} profile).",
    ]
    out += [f"# Beware: {clock}" for clock in profile.get("danger_clocks") or []]
    fields = [
        ("name", "my-run", "the run id: letters, digits, '.', '_', '-'; the same name is the same run"),
        ("command", f"{runs} train.py", "run from the shipped code dir, through bash, exactly as written"),
        ("python", interpreter or "/usr/bin/python3",
         "the interpreter inside the image (the wrapper runs with it)" if on_k8s else
         "the interpreter on the box (never guessed)" + ("" if interpreter else ": check it with env_check")),
        ("code_dir", ".", "staged through a ConfigMap (under 900 KiB; honours .rgtignore), else bake it into the "
                          "image and set k8s.workdir" if on_k8s else
                          "shipped to the box (honours .rgtignore, else .gitignore)"),
        ("env", {}, "plain settings; secrets go in `secrets`"),
        ("secrets", [], "NAMES of environment variables here, e.g. [WANDB_API_KEY]; never values"),
        ("gpu", {"count": 0 if profile["name"] == "local" else 1},
         "the pod's GPUs (its nvidia.com/gpu limit)" if on_k8s else "what probe must find: count, min_memory_mib, "
                                                                    "name"),
        ("checkpoint", {"glob": "*"}, "complete checkpoints under $RGT_CKPT_DIR (load the newest from "
                                      "$RGT_RESUME_FROM)"),
        ("outputs", [], "files, directories or globs under $RGT_OUT_DIR that mean 'finished'"),
        ("auto_resume", spot, "relaunch a preempted run from its newest checkpoint"),
        ("price_per_hour", 0.0, "for cost so far"),
        ("smoke_command", "python train.py --help", "1-2 batches on your CPU before anything is rented"),
    ]
    out.append("rgt_job:")
    for key, value, comment in fields:
        out.append(f"  {key}: {_yaml_line(value)}".ljust(40) + f"  # {comment}")
    if on_k8s:
        out += [f"{text.ljust(40)}  # {comment}" if comment else text for text, comment in K8S_JOB_BLOCK]
    else:
        out.append("  # data_dir: data                     # shipped once into <run>/data, resumable")
    out.append("  # expected_duration_s: 3600          # a finish in under half of it is flagged (set it once known)")
    return "\n".join(out) + "\n"


# the job's Kubernetes Job (rgt_job.k8s, docs/kubernetes.md): what a first run needs, the rest commented out
K8S_JOB_BLOCK = [
    ("  k8s:", "the run's Kubernetes Job (docs/kubernetes.md)"),
    ("    image: CHANGE-ME/train:tag", "the image is the env: pin it by digest (registry/name@sha256:...)"),
    ("    pvc: {storage: 50Gi}", "the claim rgt makes for the durable root; or {claim_name: an existing one}"),
    ("    # namespace: ml", "default: the kubeconfig context's"),
    ("    # secret_name: train-secrets", "the Secret with one key per name in `secrets`"),
    ("    # active_deadline_s: 86400", "the Job's walltime"),
    ("    # tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]", ""),
]


IGNORE_TEXT = """\
# What `rgt-run` does not ship to the box from this code dir (gitignore syntax; this file wins over .gitignore).
runs/
inventory/
*.log
"""


def next_steps(profile: dict, inv: Path, job: Path) -> list[str]:
    """What to do after init, for this platform: commands that work on what init wrote, once it is edited."""
    if profile["name"] == "local":
        return [f"rgt-run lifecycle -i {inv} -e @{job}"]
    if not engines.engine_of(profile).over_ssh:  # no SSH: nothing to pin or probe; the plan shows the validated
        # manifests
        return [f"edit {inv / 'hosts.yml'} (rgt_instance_id; rgt_kubeconfig / rgt_kube_context unless kubectl's "
                f"defaults) and {job} (k8s.image, python, k8s.namespace)",
                f"rgt-run train -i {inv} -e @{job} -C", f"rgt-run lifecycle -i {inv} -e @{job}"]
    return [f"edit {inv / 'hosts.yml'} (address, port, instance id) and {job}", f"rgt-run pin -i {inv}",
            f"rgt-run playbooks/probe.yml -i {inv}", f"rgt-run playbooks/train.yml -i {inv} -e @{job}"]


def run(args: argparse.Namespace, console: Console) -> int:
    try:
        profile = profiles.load_profile(args.profile)
    except profiles.ProfileError as exc:
        raise InputError(str(exc), fix=exc.fix or "see `rgt-run profiles`", field="--profile") from exc
    root = Path(args.dir).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise InputError(f"{root} is a file, not a directory", fix="pass --dir <your project directory>",
                         field="--dir")
    targets = {root / "inventory" / "hosts.yml": inventory_text(profile), root / "job.yml": job_text(profile)}
    if not (root / ".rgtignore").exists() and not (root / ".gitignore").exists():
        # the job ships its code dir (`.` here): never the pulled results, the inventory, or logs
        targets[root / ".rgtignore"] = IGNORE_TEXT
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise InputError(f"{', '.join(existing)} already exist(s): nothing was written",
                         fix="move it away or init another directory (--dir)", field="--dir")
    for path, text in targets.items():
        atomic_write_bytes(path, text.encode("utf-8"))
        console.print(f"wrote {path}")
    steps = next_steps(profile, root / "inventory", root / "job.yml")
    if (root / ".gitignore").exists() and not (root / ".rgtignore").exists():
        console.print(f"note: the code dir ships what {root / '.gitignore'} does not ignore: add runs/ and "
                      "inventory/ to it (or write a .rgtignore)")
    console.print("next: " + "\n      ".join(steps))
    output.emit({"command": "init", "profile": profile["name"], "files": [str(p) for p in targets], "next": steps,
                 "exit_code": errors.OK}, getattr(args, "json", False))
    return errors.OK
