"""One parallel round over multiplexed SSH: the status of every host without an ansible-playbook start.

Each host is reached with the connection Ansible would use for it (ansible_host/user/port/private key, the
`ssh_args` of ansible.cfg, ansible_ssh_common_args) plus the runner's host-key pin (`UserKnownHostsFile=<the
inventory's known_hosts> HostKeyAlias=<rgt_instance_id> StrictHostKeyChecking=yes`, rgt.phases.SSH_PIN_ARGS) and
a ControlMaster whose socket is named by everything that identifies the connection, pin included, so successive
ticks reuse it and a host with another pin never rides on it. `ansible_connection: local` hosts run locally.

What runs on the box is the monitor module's own code: the status bundle (module_utils/rgt_bundle: the entry
plugins/module_utils/rgt_statusround.py, which calls rgt_statusdoc, rgt_logread for `rgt-run logs` and rgt_sweep,
and every module_util they import), one zipapp named by its content hash (rgt.bundle.status_zipapp). It is
shipped once per box and unpacked to `${XDG_CACHE_HOME:-~/.cache}/rgt/status-<hash>/` (a temp directory, every
file fsynced, renamed into place), reused while present (with the bytecode Python caches beside it), shipped
again when the hash changes. A tick is one `python3 <file>` per host with
the arguments as JSON on stdin (never in argv). All hosts at once: an unreachable host costs one ConnectTimeout,
in parallel with the others.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rgt import paths
from rgt.bundle import status_zipapp
from rgt.events import HOST_KEY_PATTERNS
from rgt.inventory import Host, known_hosts_file

MISSING_RC = 97  # the cached zipapp is not on the box (yet): ship it, then call again
SSH_FAILED_RC = 255
ANSWER_TIMEOUT_S = 90  # connect, plus the status collectors' own bounded calls (nvidia-smi 10 s, df, tmux)
MAX_PARALLEL = 64
# what the box runs: the cached copy when present, else MISSING_RC (no byte of the arguments is read). The copy
# is the zipapp unpacked into a directory named by its hash, so Python keeps the bytecode of the module_utils
# beside them (__pycache__) and a tick does not compile them again (a zip is compiled on every import).
RUN_CACHED = ('d="${{XDG_CACHE_HOME:-$HOME/.cache}}/rgt"; f="$d/status-{digest}/__main__.py"; '
              'if [ -f "$f" ]; then PYTHONDONTWRITEBYTECODE= exec {python} "$f"; else exit {missing}; fi')
# ships the zipapp on stdin: unpacked into a temp directory (every file fsynced), renamed to status-<hash> (atomic;
# when a concurrent ship got there first, its copy is kept and this one removed); copies of other versions not
# shipped for 7 days are removed (a runner of another version still in use reships its own)
SHIP = ('import io,os,shutil,sys,tempfile,zipfile\n'
        'd=os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),"rgt")\n'
        'os.makedirs(d,exist_ok=True)\n'
        'zf=zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read()))\n'
        'tmp=tempfile.mkdtemp(dir=d,prefix=".status-")\n'
        'for name in zf.namelist():\n'
        '    path=os.path.join(tmp,*name.split("/"))\n'
        '    os.makedirs(os.path.dirname(path),exist_ok=True)\n'
        '    with open(path,"wb") as h:\n'
        '        h.write(zf.read(name)); h.flush(); os.fsync(h.fileno())\n'
        'final=os.path.join(d,"status-"+sys.argv[1])\n'
        'try:\n'
        '    os.rename(tmp,final)\n'
        'except OSError:\n'
        '    if not os.path.isfile(os.path.join(final,"__main__.py")):\n'
        '        raise\n'
        '    shutil.rmtree(tmp,ignore_errors=True)\n'
        'import time\n'
        'for old in os.listdir(d):\n'
        '    p=os.path.join(d,old)\n'
        '    if old.startswith("status-") and p!=final and os.path.getmtime(p)<time.time()-7*86400:\n'
        '        shutil.rmtree(p,ignore_errors=True)\n')


# ---------------------------------------------------------------- the connection

@dataclass
class SshConfig:
    """What ansible.cfg says about SSH (the same file Ansible reads for this runner, rgt.paths.ANSIBLE_CFG)."""
    ssh_args: list[str] = field(default_factory=list)
    control_path_dir: str = "~/.ansible/cp"
    timeout: int = 10


def ssh_config(cfg_path: Path | None = None, env: dict | None = None) -> SshConfig:
    env = os.environ if env is None else env
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cfg_path or paths.ANSIBLE_CFG)
    args = env.get("ANSIBLE_SSH_ARGS") or parser.get("ssh_connection", "ssh_args", fallback="")
    cp_dir = env.get("ANSIBLE_SSH_CONTROL_PATH_DIR") or parser.get("ssh_connection", "control_path_dir",
                                                                    fallback="~/.ansible/cp")
    timeout = env.get("ANSIBLE_TIMEOUT") or parser.get("defaults", "timeout", fallback="10")
    return SshConfig(ssh_args=shlex.split(args), control_path_dir=cp_dir, timeout=int(timeout))


def templated(value: object) -> bool:
    """Is `value` (a string, or any string inside a dict or list) a Jinja template Ansible would render?"""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(templated(v) for v in value.values())
    if isinstance(value, list):
        return any(templated(v) for v in value)
    return False


def _var(hv: dict, *names: str):
    for name in names:
        if hv.get(name) not in (None, ""):
            return hv[name]
    return None


def _has_option(args: list[str], option: str) -> bool:
    """True when an `-o Option=...` (or `-oOption=...`) in args sets `option` (ssh keeps the first value)."""
    option = option.lower()
    for index, arg in enumerate(args):
        if arg == "-o" and index + 1 < len(args):
            text = args[index + 1]
        elif arg.startswith("-o") and len(arg) > 2:
            text = arg[2:]
        else:
            continue
        if text.replace(" ", "=", 1).split("=", 1)[0].strip().lower() == option:
            return True
    return False


@dataclass
class Target:
    """How to run a command on one host: `argv + [command]` (ssh), or `sh -c command` for a local host."""
    name: str
    argv: list[str]
    python: str
    local: bool = False
    control_path: str | None = None


def python_of(host: Host) -> str:
    interp = host.vars.get("ansible_python_interpreter")
    if isinstance(interp, str) and interp and not templated(interp) and not interp.startswith("auto"):
        return interp
    return sys.executable if host.is_local else "python3"


def target_for(inventory: str, host: Host, extravars: dict | None = None, cfg: SshConfig | None = None) -> Target:
    """The argv Ansible's ssh connection would build for this host (ansible-core's ssh plugin, in its order: the
    config's ssh_args, Port, IdentityFile, the no-password options, User, ConnectTimeout, common args, extra args,
    ControlPath), with the runner's pin in the extra args. Raises ValueError for a connection value that is still
    a template: only Ansible can evaluate it."""
    hv = host.vars
    if host.is_local:
        return Target(host.name, [], python_of(host), local=True)
    connection = hv.get("ansible_connection")
    if connection not in (None, "", "ssh", "smart", "ansible.builtin.ssh"):
        raise ValueError(f"ansible_connection is {connection}; only Ansible can use it")
    if _var(hv, "ansible_password", "ansible_ssh_pass", "ansible_ssh_password"):
        raise ValueError("the host logs in with a password (sshpass); only Ansible passes it")
    cfg = cfg or ssh_config()
    address = _var(hv, "ansible_host", "ansible_ssh_host") or host.name
    user = _var(hv, "ansible_user", "ansible_ssh_user")
    port = _var(hv, "ansible_port", "ansible_ssh_port")
    key = _var(hv, "ansible_ssh_private_key_file", "ansible_private_key_file")
    common = _var(hv, "ansible_ssh_common_args") or ""
    own_args = _var(hv, "ansible_ssh_args")
    for what, value in (("ansible_host", address), ("ansible_user", user), ("ansible_port", port),
                        ("ansible_ssh_private_key_file", key), ("ansible_ssh_common_args", common),
                        ("ansible_ssh_args", own_args), ("rgt_known_hosts", hv.get("rgt_known_hosts"))):
        if templated(value):
            raise ValueError(f"{what} is a template ({value}); only Ansible can evaluate it")
    known_hosts = str(known_hosts_file(inventory, host))
    ssh_args = shlex.split(own_args) if own_args else list(cfg.ssh_args)
    argv = ["ssh", *ssh_args]
    if port:
        argv += ["-o", f"Port={int(port)}"]
    if key:
        argv += ["-o", f'IdentityFile="{os.path.expanduser(str(key))}"']
    argv += ["-o", "KbdInteractiveAuthentication=no", "-o",
             "PreferredAuthentications=gssapi-with-mic,gssapi-keyex,hostbased,publickey",
             "-o", "PasswordAuthentication=no"]
    if user:
        argv += ["-o", f"User={user}"]
    argv += ["-o", f"ConnectTimeout={cfg.timeout}"]
    argv += shlex.split(common)
    # the pin (rgt.phases.SSH_PIN_ARGS): ssh takes the first value of an option, and nothing before it sets these
    argv += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
             "-o", f"HostKeyAlias={host.instance_id}"]
    extra = (extravars or {}).get("ansible_ssh_extra_args")
    if isinstance(extra, str) and extra and not templated(extra):
        argv += shlex.split(extra)
    if not _has_option(argv, "BatchMode"):
        argv += ["-o", "BatchMode=yes"]  # never a password prompt in a round
    if not _has_option(argv, "ControlMaster"):
        argv += ["-o", "ControlMaster=auto"]
    if not _has_option(argv, "ControlPersist"):
        argv += ["-o", "ControlPersist=120s"]
    control = None
    if not _has_option(argv, "ControlPath"):
        # named by every value that identifies the connection: a host with another pin or key never shares it
        ident = "\0".join(str(v) for v in (address, port, user, key, host.instance_id, known_hosts, common))
        cp_dir = Path(os.path.expanduser(cfg.control_path_dir))
        control = str(cp_dir / f"rgt-{hashlib.sha256(ident.encode()).hexdigest()[:20]}")
        argv += ["-o", f"ControlPath={control}"]
    argv.append(str(address))
    return Target(host.name, argv, python_of(host), control_path=control)


def _ensure_control_dir(target: Target) -> None:
    if target.control_path:
        Path(target.control_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)


# ---------------------------------------------------------------- calls

@dataclass
class Answer:
    rc: int
    stdout: bytes
    stderr: str
    timed_out: bool = False


def command_argv(target: Target, command: str) -> list[str]:
    return ["sh", "-c", command] if target.local else [*target.argv, command]


def call(target: Target, command: str, stdin: bytes = b"", timeout: float = ANSWER_TIMEOUT_S) -> Answer:
    _ensure_control_dir(target)
    try:
        proc = subprocess.run(command_argv(target, command), input=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return Answer(SSH_FAILED_RC, exc.stdout or b"", f"no answer within {timeout:.0f} s", timed_out=True)
    return Answer(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


def run_cached(target: Target, stdin: bytes, timeout: float = ANSWER_TIMEOUT_S) -> Answer:
    """Run the cached zipapp with `stdin`; ship it first when the box does not have this hash."""
    digest, data = status_zipapp()
    command = RUN_CACHED.format(digest=digest, python=shlex.quote(target.python), missing=MISSING_RC)
    answer = call(target, command, stdin, timeout)
    if answer.rc != MISSING_RC:
        return answer
    shipped = ship(target, digest, data, timeout)
    if shipped.rc != 0:
        return shipped
    return call(target, command, stdin, timeout)


def ship(target: Target, digest: str, data: bytes, timeout: float = ANSWER_TIMEOUT_S) -> Answer:
    return call(target, f"{shlex.quote(target.python)} -c {shlex.quote(SHIP)} {digest}", data, timeout)


def is_host_key_refusal(stderr: str) -> bool:
    return any(p.lower() in stderr.lower() for p in HOST_KEY_PATTERNS)


def first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


# ---------------------------------------------------------------- the status round

@dataclass
class Outcome:
    """One host's answer: a status document, or why there is none."""
    status: dict | None = None
    unreachable: bool = False
    host_key_mismatch: bool = False
    error: str | None = None


def status_params(host: Host) -> dict:
    """The module's arguments for this host (module_utils rgt_statusdoc.params_from_vars: one derivation)."""
    statusdoc = paths.module_util("rgt_statusdoc")
    durable = ((host.profile or {}).get("roots") or {}).get("durable")
    return statusdoc.params_from_vars(host.vars, durable, host.other_runs)


def classify(answer: Answer) -> Outcome:
    if answer.rc == SSH_FAILED_RC and (answer.timed_out or not answer.stdout):
        return Outcome(unreachable=True, host_key_mismatch=is_host_key_refusal(answer.stderr),
                       error=first_line(answer.stderr) or "unreachable")
    try:
        doc = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Outcome(error=f"the status call gave no document (rc={answer.rc}): "
                             f"{first_line(answer.stderr) or first_line(answer.stdout.decode(errors='replace'))}")
    if doc.get("failed") or not isinstance(doc.get("status"), dict):
        return Outcome(error=str(doc.get("msg") or "the status call did not return a status document"))
    return Outcome(status=doc["status"])


def status_one(target: Target, params: dict) -> Outcome:
    statusdoc = paths.module_util("rgt_statusdoc")
    problem = statusdoc.check_names(params)
    if problem:  # the role's assert, before any connection
        return Outcome(error=problem)
    return classify(run_cached(target, (json.dumps({"op": "status", **params}) + "\n").encode()))


def status_round(inventory: str, hosts: list[Host], extravars: dict | None = None) -> dict[str, Outcome]:
    """{host name: Outcome} for every host, all at once (a thread per host, at most MAX_PARALLEL)."""
    cfg = ssh_config()
    jobs = {}
    out: dict[str, Outcome] = {}
    for host in hosts:
        try:
            jobs[host.name] = (target_for(inventory, host, extravars, cfg), status_params(host))
        except ValueError as exc:
            out[host.name] = Outcome(error=str(exc))
    if jobs:
        status_zipapp()  # once, before the threads start
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(jobs))) as pool:
            futures = {name: pool.submit(status_one, *job) for name, job in jobs.items()}
            out.update({name: f.result() for name, f in futures.items()})
    return out


def roster_round(inventory: str, hosts: list[Host], extravars: dict | None, project: str,
                 sweep: str) -> dict[str, dict]:
    """{host name: that box's own roster of the sweep (module_util rgt_sweep.box_roster: {cells {id: host},
    created_at})} for every host that answered and keeps one, all at once, read-only. A host only Ansible can reach
    (a templated connection or durable root) or that does not answer is left out: the runner cannot look there
    before the play."""
    cfg = ssh_config()
    statusdoc = paths.module_util("rgt_statusdoc")
    jobs = {}
    for host in hosts:
        try:
            durable = ((host.profile or {}).get("roots") or {}).get("durable")
            params = {"durable_root": statusdoc.params_from_vars(host.vars, durable)["durable_root"],
                      "project": project, "sweep": sweep}
            jobs[host.name] = (target_for(inventory, host, extravars, cfg), params)
        except ValueError:
            continue
    if not jobs:
        return {}
    status_zipapp()

    def one(target: Target, params: dict) -> dict | None:
        answer = run_cached(target, (json.dumps({"op": "roster", **params}) + "\n").encode())
        try:
            doc = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None
        return doc.get("roster") if isinstance(doc, dict) and isinstance(doc.get("roster"), dict) else None

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(jobs))) as pool:
        futures = {name: pool.submit(one, *job) for name, job in jobs.items()}
        found = {name: f.result() for name, f in futures.items()}
    return {name: roster for name, roster in found.items() if roster}


def ask(target: Target, op: str, params: dict, timeout: float = ANSWER_TIMEOUT_S) -> tuple[dict | None, Answer]:
    """One `op` of the status zipapp (module_utils/rgt_statusround) on one box: (its JSON answer, or None when the
    box gave none, and the raw answer: rc 255 with no output is a box that did not answer)."""
    answer = run_cached(target, (json.dumps({"op": op, **params}) + "\n").encode(), timeout)
    try:
        doc = json.loads(answer.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        doc = None
    return (doc if isinstance(doc, dict) else None), answer


def durable_root_of(host: Host) -> str | None:
    """The host's durable root as the launch takes it: rgt_durable_root, else its profile's."""
    return host.vars.get("rgt_durable_root") or ((host.profile or {}).get("roots") or {}).get("durable")


def can_round(inventory: str, host: Host, extravars: dict | None = None) -> bool:
    """False for a host only Ansible can reach (templated connection or status arguments)."""
    try:
        target_for(inventory, host, extravars)
        status_params(host)
    except ValueError:
        return False
    return True
