"""Fake cloud control planes on 127.0.0.1, one class per platform, shaped after each platform's documented REST API.

Each fake is stateful (an `instances` dict), records every request (method, path, query, headers with the
Authorization value replaced by "<redacted>", parsed body) and has knobs for the unpleasant parts:

- `token`: required credential; a missing or different one gets 401 (None: no auth check)
- `rate_limit_first=N`, `retry_after=S`: the first N requests get 429 with `Retry-After: S`
- `lag_s`: a deleted/terminated instance stays listed (old status) for this many seconds
- `hang={"POST /instance-operations/terminate": 5.0}`: the server applies the call, then waits before answering
- `error_body=True`: HTTP 200 with an error body (AutoDL code != Success, vast success false)
- `conflict=True`: the meter-stop call answers 409 (invalid transition)

CLI, for molecule: `python -m tests.fakes.control_planes runpod --instance pod-1 --port-file F [--token T]`
serves until killed, writing its port to F once it listens.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.fakes.httpfake import LocalHTTPFake

Reply = tuple[int, object, dict]  # status, JSON document (None: no body), extra headers


class FakePlane(LocalHTTPFake):
    """Base: the HTTP plumbing, the request log and the generic knobs. Subclasses implement `route`."""

    auth_prefix = "Bearer "
    name = "fake"

    def __init__(self, token: str | None = "test-token", rate_limit_first: int = 0, retry_after: float = 1,
                 lag_s: float = 0.0, hang: dict | None = None, error_body: bool = False, conflict: bool = False):
        self.token = token
        self.rate_limit_first = rate_limit_first
        self.retry_after = retry_after
        self.lag_s = lag_s
        self.hang = dict(hang or {})
        self.error_body = error_body
        self.conflict = conflict
        self.instances: dict[str, dict] = {}
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    # ---------------------------------------------------------------- assertions

    def calls(self, method: str | None = None, path_prefix: str = "") -> list[dict]:
        with self.lock:
            return [r for r in self.requests
                    if (method is None or r["method"] == method) and r["path"].startswith(path_prefix)]

    def mutating_calls(self) -> list[dict]:
        return [r for r in self.calls() if r["method"] != "GET"]

    # ---------------------------------------------------------------- helpers for subclasses

    def add(self, instance_id: str, **fields) -> dict:
        with self.lock:
            self.instances[instance_id] = {"id": instance_id, **fields}
            return self.instances[instance_id]

    def visible(self, instance_id: str) -> dict | None:
        """The instance as a read sees it: None once it is gone and the listing lag has passed."""
        inst = self.instances.get(instance_id)
        if inst is None:
            return None
        gone_at = inst.get("_gone_at")
        if gone_at is not None and time.monotonic() - gone_at >= self.lag_s:
            return None
        return inst

    def mark_gone(self, instance_id: str) -> None:
        self.instances[instance_id]["_gone_at"] = time.monotonic()

    @staticmethod
    def public(inst: dict) -> dict:
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def _authorized(self, headers) -> bool:
        if self.token is None:
            return True
        return headers.get("Authorization", "") == f"{self.auth_prefix}{self.token}"

    def unauthorized(self) -> Reply:
        return 401, {"error": "unauthorized"}, {}

    def route(self, method: str, path: str, query: dict, body) -> Reply:  # pragma: no cover - abstract
        raise NotImplementedError

    # ---------------------------------------------------------------- plumbing

    def _dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        headers = {k: ("<redacted>" if k.lower() == "authorization" else v) for k, v in handler.headers.items()}
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        record = {"method": handler.command, "path": parts.path, "query": query, "headers": headers, "body": body,
                  "t": time.monotonic()}
        with self.lock:
            self.requests.append(record)
            limited = len(self.requests) <= self.rate_limit_first
        if limited:
            status, doc, extra = 429, {"error": "rate limited"}, {"Retry-After": str(self.retry_after)}
        elif not self._authorized(handler.headers):
            status, doc, extra = self.unauthorized()
        else:
            with self.lock:
                status, doc, extra = self.route(handler.command, parts.path, query, body)
            delay = self.hang.get(f"{handler.command} {parts.path}")
            if delay:
                time.sleep(delay)  # the call took effect; the answer is late
        record["status"] = status
        payload = b"" if doc is None else json.dumps(doc).encode()
        try:
            handler.send_response(status)
            for key, value in extra.items():
                handler.send_header(key, value)
            if doc is not None:
                handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            if payload:
                handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (hung-call tests)
            pass


class RunPodV2(FakePlane):
    """RunPod REST v2: GET/DELETE /v2/pods/{id}, POST /v2/pods/{id}/action; errors in RFC 9457 shape."""

    name = "runpod"

    def add_pod(self, pod_id: str, status: str = "RUNNING", cost: float = 0.69) -> dict:
        return self.add(pod_id, status=status, cost=cost, actions=["stop", "terminate"], runtime={})

    @staticmethod
    def problem(status: int, title: str, detail: str) -> Reply:
        return status, {"title": title, "status": status, "detail": detail}, {}

    def unauthorized(self) -> Reply:
        return self.problem(401, "Unauthorized", "missing or invalid API key")

    def route(self, method, path, query, body):
        parts = path.strip("/").split("/")
        if parts[:2] != ["v2", "pods"]:
            return self.problem(404, "Not Found", path)
        if len(parts) == 2 and method == "GET":
            return 200, {"pods": [self.public(p) for k in list(self.instances) if (p := self.visible(k))]}, {}
        pod_id = parts[2] if len(parts) > 2 else ""
        pod = self.visible(pod_id)
        if pod is None:
            return self.problem(404, "Not Found", f"pod {pod_id} not found")
        terminate = (method == "DELETE" and len(parts) == 3) or (
            method == "POST" and parts[3:] == ["action"] and (body or {}).get("action") == "terminate")
        if method == "GET" and len(parts) == 3:
            return 200, self.public(pod), {}
        if terminate:
            if self.conflict or pod.get("_gone_at") is not None:
                return self.problem(409, "Conflict", "terminate is not valid for the pod's current status")
            self.mark_gone(pod_id)  # stays listed (old status) for lag_s
            return 204, None, {}
        return self.problem(404, "Not Found", path)


class Vast(FakePlane):
    """vast.ai: DELETE /api/v0/instances/{id}/, GET /api/v0/instances/{id}/?owner=me → {instances: {...}|null}."""

    name = "vast"

    def add_instance(self, instance_id: str, actual_status: str = "running") -> dict:
        return self.add(instance_id, actual_status=actual_status, intended_status=actual_status, dph_total=0.42)

    def route(self, method, path, query, body):
        parts = path.strip("/").split("/")
        if parts[:3] != ["api", "v0", "instances"] or len(parts) != 4:
            return 404, {"success": False, "error": "not_found", "msg": path}, {}
        inst_id = parts[3]
        inst = self.visible(inst_id)
        if method == "GET":
            return 200, {"instances": self.public(inst) if inst else None}, {}
        if method == "DELETE":
            if inst is None:
                return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}, {}
            if self.error_body:
                return 200, {"success": False, "error": "destroy_failed", "msg": "Instance is locked"}, {}
            if inst.get("_gone_at") is None:
                self.mark_gone(inst_id)
            return 200, {"success": True}, {}
        return 405, {"success": False, "msg": "method not allowed"}, {}


class Lambda(FakePlane):
    """Lambda Cloud: POST /instance-operations/terminate, GET /instances[/{id}]; {"data": ...} / {"error": ...}."""

    name = "lambda"

    def add_instance(self, instance_id: str, status: str = "active", file_systems: list | None = None) -> dict:
        return self.add(instance_id, name=instance_id, status=status, file_system_names=list(file_systems or []),
                        region={"name": "us-south-1"}, instance_type={"name": "gpu_1x_a100"})

    @staticmethod
    def err(status: int, code: str, message: str) -> Reply:
        return status, {"error": {"code": code, "message": message}}, {}

    def unauthorized(self) -> Reply:
        return self.err(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.")

    def _state(self, inst_id: str) -> dict | None:
        inst = self.instances.get(inst_id)
        if inst is None:
            return None
        gone_at = inst.get("_gone_at")
        if gone_at is not None:
            age = time.monotonic() - gone_at
            if age >= 2 * self.lag_s and age > 0:
                return None
            inst["status"] = "terminating" if age < self.lag_s else "terminated"
        return inst

    def route(self, method, path, query, body):
        prefix = "/api/v1"
        if path.startswith(prefix):
            path = path[len(prefix):]
        if method == "GET" and path == "/instances":
            return 200, {"data": [self.public(i) for k in list(self.instances) if (i := self._state(k))]}, {}
        if method == "GET" and path.startswith("/instances/"):
            inst = self._state(path.split("/")[2])
            if inst is None:
                return self.err(404, "global/object-does-not-exist", "Specified instance does not exist.")
            return 200, {"data": self.public(inst)}, {}
        if method == "POST" and path == "/instance-operations/terminate":
            ids = (body or {}).get("instance_ids") or []
            done = []
            for inst_id in ids:
                inst = self._state(inst_id)
                if inst is None:
                    return self.err(404, "global/object-does-not-exist", f"instance {inst_id} does not exist")
                if self.conflict:
                    return self.err(409, "global/invalid-state", "instance cannot be terminated now")
                if inst.get("_gone_at") is None:
                    self.mark_gone(inst_id)
                inst["status"] = "terminating"
                done.append(self.public(inst))
            return 200, {"data": {"terminated_instances": done}}, {}
        return self.err(404, "global/not-found", path)


class Paperspace(FakePlane):
    """Paperspace (pspace API v1): DELETE/GET /machines/{id}, lists /public-ips, /storage, /snapshots."""

    name = "paperspace"
    RESOURCE_LISTS = ("public-ips", "storage", "snapshots")

    def __init__(self, **kw):
        super().__init__(**kw)
        self.resources: dict[str, list[dict]] = {k: [] for k in self.RESOURCE_LISTS}

    def add_machine(self, machine_id: str, state: str = "ready") -> dict:
        return self.add(machine_id, name=machine_id, state=state)

    def route(self, method, path, query, body):
        parts = path.strip("/").split("/")
        if parts and parts[0] == "v1":
            parts = parts[1:]
        if len(parts) == 1 and parts[0] in self.RESOURCE_LISTS and method == "GET":
            return 200, {"items": list(self.resources[parts[0]]), "hasMore": False}, {}
        if len(parts) == 2 and parts[0] == "machines":
            inst = self.visible(parts[1])
            if inst is None:
                return 404, {"message": "Machine not found", "status": 404}, {}
            if method == "GET":
                return 200, self.public(inst), {}
            if method == "DELETE":
                if self.conflict:
                    return 409, {"message": "Machine is in a state that cannot be deleted", "status": 409}, {}
                if inst.get("_gone_at") is None:
                    self.mark_gone(parts[1])
                    inst["state"] = "stopping"
                return 204, None, {}
        return 404, {"message": f"not found: {path}", "status": 404}, {}


class AutoDL(FakePlane):
    """AutoDL container-instance Pro API: POST .../pro/power_off, GET .../pro/status; {code, msg, data}."""

    name = "autodl"
    auth_prefix = ""  # `Authorization: <developer token>`, no Bearer
    BASE = "/api/v1/dev/instance/pro"

    def add_instance(self, uuid: str, status: str = "running") -> dict:
        return self.add(uuid, status=status)

    def unauthorized(self) -> Reply:
        return 401, {"code": "AuthorizeFailed", "msg": "token invalid", "data": None}, {}

    def _status(self, uuid: str) -> str | None:
        inst = self.instances.get(uuid)
        if inst is None:
            return None
        gone_at = inst.get("_gone_at")
        if gone_at is not None:
            inst["status"] = "shutdown" if time.monotonic() - gone_at >= self.lag_s else "shutting_down"
        return inst["status"]

    def route(self, method, path, query, body):
        if method == "GET" and path == f"{self.BASE}/status":
            status = self._status(query.get("instance_uuid", ""))
            if status is None:
                return 200, {"code": "InstanceNotFound", "msg": "instance not found", "data": None}, {}
            return 200, {"code": "Success", "msg": "", "data": status}, {}
        if method == "POST" and path == f"{self.BASE}/power_off":
            uuid = (body or {}).get("instance_uuid", "")
            status = self._status(uuid)
            if self.error_body or status is None:
                return 200, {"code": "InstanceNotFound" if status is None else "OperateFailed",
                             "msg": "power off failed", "data": None}, {}
            if status == "running":
                self.mark_gone(uuid)
                self.instances[uuid]["status"] = "shutting_down"
            return 200, {"code": "Success", "msg": "", "data": None}, {}
        return 404, {"code": "NotFound", "msg": path, "data": None}, {}


PLANES = {"runpod": RunPodV2, "vast": Vast, "lambda": Lambda, "paperspace": Paperspace, "autodl": AutoDL}


def seed(plane: FakePlane, instance_id: str) -> None:
    adder = {RunPodV2: "add_pod", Vast: "add_instance", Lambda: "add_instance", Paperspace: "add_machine",
             AutoDL: "add_instance"}[type(plane)]
    getattr(plane, adder)(instance_id)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="serve one fake control plane on 127.0.0.1 until killed")
    p.add_argument("platform", choices=sorted(PLANES))
    p.add_argument("--instance", action="append", default=[], help="an instance to create (repeatable)")
    p.add_argument("--token", default="test-token")
    p.add_argument("--port-file", required=True, help="written with the port once the server listens")
    p.add_argument("--log-file", help="every request, one JSON line each, written on exit and every second")
    args = p.parse_args(argv)
    plane = PLANES[args.platform](token=args.token).start()
    for inst in args.instance:
        seed(plane, inst)
    Path(args.port_file).write_text(f"{plane.port}\n")
    try:
        while True:
            time.sleep(1)
            if args.log_file:
                lines = [json.dumps({k: v for k, v in r.items() if k != "t"}) for r in plane.calls()]
                Path(args.log_file).write_text("".join(line + "\n" for line in lines))
    except KeyboardInterrupt:
        pass
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
