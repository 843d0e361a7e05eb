# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Controller-side meter-stop clients, one per `meter_stop.api.client` named in profiles/*.yml.

Every client speaks its platform's documented REST shapes (the ones tests/fakes/control_planes.py serves)
through one HTTP helper on Ansible's `open_url`
(proxies from the environment unless `use_proxy=False`; `validate_certs`, `ca_path`, `timeout` as in `uri`):
- the key is read from the environment variable NAMED by the profile (`api.key_env`); it never appears in argv,
  a log line, an exception or a return value;
- the base URL comes from the variable named by `api.base_url_env` when set, else the profile's `api.base_url`
  (a caller may pass an explicit override, e.g. a test's fake server);
- 429 honours Retry-After (bounded), 401/403 name the variable to set, 409 is an invalid transition, and
  HTTP-200-with-error bodies (vast `success: false`, AutoDL `code != "Success"`, Lambda `error`) are errors.

`teardown()` is the one algorithm for all of them: look first (already gone: no call), call the meter-stop
ONCE, re-query on a timeout or a 409 instead of calling again, then poll until the platform says gone (bounded).
Its `on_call` hook lets the caller record the intent atomically right before the call and again once it is
answered, so a run killed anywhere after that point leaves a record that `record_state()` reads as a stop in
flight: the next run polls the same instance and never calls again.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import time
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url

GONE = "gone"
STOPPED = "stopped"
UNKNOWN = "unknown — check the console"
# the record's final_state from right before the meter-stop call until the poll sees a terminal state: a record
# left like this was interrupted (Ctrl-C, a kill, a crash) and the call may have reached the platform
REQUESTED = "requested — not reported gone yet"
RECORDED_GONE = (GONE, "already " + GONE)  # a record that says so ends a later teardown before anything is touched

# what record_state() says of an earlier record of one instance
RECORD_GONE = "gone"
RECORD_IN_FLIGHT = "in_flight"
RECORD_NONE = "none"


class CloudError(Exception):
    """kind: auth | conflict | rate_limited | timeout | network | api | config. `status`: the HTTP status."""

    def __init__(self, message, kind="api", status=None):
        super(CloudError, self).__init__(message)
        self.message = message
        self.kind = kind
        self.status = status


class Http(object):
    """A tiny JSON-over-HTTP client that records every call as {method, path, status} (no query values)."""

    def __init__(self, base_url, auth_header, key_env, timeout=30.0, max_retries_429=4, max_retry_after=60.0,
                 sleep=time.sleep, platform="the platform", validate_certs=True, ca_path=None, use_proxy=True):
        self.base_url = base_url.rstrip("/")
        self.validate_certs = validate_certs
        self.ca_path = ca_path
        self.use_proxy = use_proxy
        self._auth = auth_header  # (name, value) — private; never logged or returned
        self.key_env = key_env
        self.timeout = timeout
        self.max_retries_429 = max_retries_429
        self.max_retry_after = max_retry_after
        self.sleep = sleep
        self.platform = platform
        self.calls = []

    def request(self, method, path, body=None, query=None, timeout=None, allow=(404,)):
        """Returns (status, doc). Statuses in `allow` are returned; other non-2xx raise CloudError."""
        url = self.base_url + path + (("?" + urlencode(query)) if query else "")
        data = None if body is None else json.dumps(body).encode()
        attempt = 0
        while True:
            headers = {"Accept": "application/json", self._auth[0]: self._auth[1]}
            if data is not None:
                headers["Content-Type"] = "application/json"
            entry = {"method": method, "path": path, "status": None}
            self.calls.append(entry)
            try:
                # use_netrc off: the key named by the profile is the only credential ever sent
                resp = open_url(url, data=data, headers=headers, method=method, timeout=timeout or self.timeout,
                                validate_certs=self.validate_certs, ca_path=self.ca_path, use_proxy=self.use_proxy,
                                use_netrc=False, http_agent="rgt")
                status, raw, headers = resp.status, resp.read(), resp.headers
            except HTTPError as exc:  # open_url raises it for every non-2xx answer: the status decides below
                status, raw, headers = exc.code, exc.read() or b"", exc.headers
            except (socket.timeout, TimeoutError) as exc:
                entry["status"] = "timeout"
                raise CloudError("%s %s: %s gave no answer within %.0f s (%s)" % (
                    method, path, self.platform, timeout or self.timeout, exc), kind="timeout") from None
            except URLError as exc:
                reason = getattr(exc, "reason", exc)
                entry["status"] = "timeout" if isinstance(reason, (socket.timeout, TimeoutError)) else "error"
                raise CloudError("%s %s: cannot reach %s (%s)" % (method, path, self.platform, reason),
                                 kind="timeout" if entry["status"] == "timeout" else "network") from None
            except UrlsConnectionError as exc:  # TLS validation, proxy refusal: the request never got an answer
                entry["status"] = "error"
                raise CloudError("%s %s: cannot reach %s (%s)" % (method, path, self.platform, exc),
                                 kind="network") from None
            entry["status"] = status
            doc = _parse(raw)
            if status == 429 and attempt < self.max_retries_429:
                attempt += 1
                self.sleep(_retry_after(headers, self.max_retry_after, attempt))
                continue
            if status == 429:
                raise CloudError("%s rate-limited %s %s %d times; try again in a minute" %
                                 (self.platform, method, path, attempt + 1), kind="rate_limited", status=429)
            if status in (401, 403):
                raise CloudError("%s refused the API key (HTTP %d on %s %s): set %s to a valid key with the "
                                 "needed scope" % (self.platform, status, method, path, self.key_env),
                                 kind="auth", status=status)
            if status in allow:
                return status, doc
            if status == 409:
                raise CloudError("%s: invalid transition for %s %s (HTTP 409): %s" %
                                 (self.platform, method, path, _error_text(doc)), kind="conflict", status=409)
            if status >= 400:
                raise CloudError("%s answered HTTP %d to %s %s: %s" % (self.platform, status, method, path,
                                                                       _error_text(doc)), status=status)
            return status, doc


def _parse(raw):
    if not raw:
        return None
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return {"raw": raw[:500].decode("utf-8", "replace")}


def _retry_after(headers, cap, attempt):
    value = headers.get("Retry-After") if headers is not None else None
    try:
        wait = float(value)
    except (TypeError, ValueError):
        wait = float(2 ** attempt)
    return max(0.0, min(wait, cap))


def _error_text(doc):
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err.get("code") or err)
        for key in ("detail", "msg", "message", "title", "error"):
            if doc.get(key):
                return str(doc[key])
    return str(doc)[:300] if doc is not None else "(no body)"


class Client(object):
    """Base meter-stop client. Subclasses: `name` (the registry's name of the client, `meter_stop.api.client`),
    `state(id)`, `stop(id)`, `gone(state, after_call)`."""

    name = None
    auth_scheme = "Bearer "
    reversible = False
    done_label = GONE
    platform = "the platform"

    def __init__(self, api, env=None, base_url=None, http_timeout=30.0, sleep=time.sleep, max_retry_after=60.0,
                 validate_certs=True, ca_path=None, use_proxy=True):
        env = os.environ if env is None else env
        api = api or {}
        self.key_env = api.get("key_env") or ""
        base_env = api.get("base_url_env")
        url = base_url or (env.get(base_env) if base_env else None) or api.get("base_url")
        if not url:
            raise CloudError("no base URL for %s: the profile's meter_stop.api.base_url is empty" % self.platform,
                             kind="config")
        key = env.get(self.key_env) if self.key_env else None
        if not key:
            raise CloudError("%s is not set: export %s=<your %s API key> on the controller (the key is read "
                             "from the environment, never from a command line)" %
                             (self.key_env or "the API key variable", self.key_env or "KEY", self.platform),
                             kind="auth")
        self.http = Http(url, ("Authorization", self.auth_scheme + key), self.key_env, timeout=http_timeout,
                         sleep=sleep, max_retry_after=max_retry_after, platform=self.platform,
                         validate_certs=validate_certs, ca_path=ca_path, use_proxy=use_proxy)
        self.warnings = []

    @property
    def calls(self):
        return self.http.calls

    def state(self, instance_id):
        raise NotImplementedError

    def stop(self, instance_id):
        raise NotImplementedError

    def gone(self, state, after_call):
        return state == GONE

    def leftovers(self, instance_id):
        """Resources that outlive the instance and keep billing (Paperspace lists them)."""
        return []

    prices = False  # price_per_hour says what the platform bills the instance (rgt.prices: budgets)

    def price_per_hour(self, instance_id):
        """What the platform bills the instance now, USD per hour, or None when its answer carries no price (or
        a price of 0: an instance that is not running bills no compute now). CloudError when it cannot say."""
        raise CloudError("%s says no price through rgt" % self.platform, kind="config")


def _price(value):
    """A platform's price field as a positive float, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        price = float(value)
    except ValueError:
        return None
    return price if price > 0 else None


class RunPodRest(Client):
    """RunPod REST v2: DELETE /v2/pods/{id} → 204; GET /v2/pods/{id} until 404 (or status TERMINATED)."""

    name = "runpod_rest"
    platform = "RunPod"

    def state(self, instance_id):
        status, doc = self.http.request("GET", "/v2/pods/" + quote(instance_id, safe=""))
        if status == 404:
            return GONE
        pod_status = str((doc or {}).get("status") or (doc or {}).get("desiredStatus") or "unknown")
        return GONE if pod_status.upper() == "TERMINATED" else pod_status.lower()

    def stop(self, instance_id):
        self.http.request("DELETE", "/v2/pods/" + quote(instance_id, safe=""), allow=())

    prices = True

    def price_per_hour(self, instance_id):
        """The pod's `cost` (REST v2, USD/hr; 0.0 when EXITED or TERMINATED), or v1's `adjustedCostPerHr` /
        `costPerHr`."""
        status, doc = self.http.request("GET", "/v2/pods/" + quote(instance_id, safe=""))
        if status == 404:
            raise CloudError("RunPod has no pod %s" % instance_id, kind="api", status=404)
        doc = doc if isinstance(doc, dict) else {}
        for key in ("cost", "adjustedCostPerHr", "costPerHr"):
            if key in doc:
                return _price(doc[key])
        return None


class VastRest(Client):
    """vast.ai: DELETE /api/v0/instances/{id}/ then GET .../{id}/?owner=me until 404, null, exited or destroyed."""

    name = "vast_rest"
    platform = "vast.ai"

    def state(self, instance_id):
        status, doc = self.http.request("GET", "/api/v0/instances/%s/" % quote(instance_id, safe=""),
                                        query={"owner": "me"})
        if status == 404:
            return GONE
        inst = (doc or {}).get("instances")
        if not inst:
            return GONE
        if isinstance(inst, list):
            inst = inst[0]
        return str(inst.get("actual_status") or inst.get("cur_state") or "unknown").lower()

    def gone(self, state, after_call):
        # `exited` is also a stopped (disk-billing) instance: it counts as gone only after our destroy
        return state in (GONE, "destroyed") or (after_call and state == "exited")

    prices = True

    def price_per_hour(self, instance_id):
        """The instance's `dph_total` (dollars per hour, everything it bills while running)."""
        status, doc = self.http.request("GET", "/api/v0/instances/%s/" % quote(instance_id, safe=""),
                                        query={"owner": "me"})
        inst = (doc or {}).get("instances") if isinstance(doc, dict) else None
        if isinstance(inst, list):
            inst = inst[0] if inst else None
        if status == 404 or not isinstance(inst, dict):
            raise CloudError("vast.ai has no instance %s" % instance_id, kind="api", status=status)
        return _price(inst.get("dph_total"))

    def stop(self, instance_id):
        _, doc = self.http.request("DELETE", "/api/v0/instances/%s/" % quote(instance_id, safe=""), body={},
                                   allow=())
        if isinstance(doc, dict) and doc.get("success") is False:
            raise CloudError("vast.ai refused the destroy: %s" % _error_text(doc), kind="api", status=200)


class LambdaRest(Client):
    """Lambda Cloud: POST /instance-operations/terminate (client timeout), GET /instances/{id} until terminated."""

    name = "lambda_rest"
    platform = "Lambda Cloud"

    def state(self, instance_id):
        status, doc = self.http.request("GET", "/instances/" + quote(instance_id, safe=""))
        if status == 404:
            return GONE
        if isinstance(doc, dict) and doc.get("error"):
            raise CloudError("Lambda Cloud: %s" % _error_text(doc), status=status)
        inst = (doc or {}).get("data") or {}
        fs = inst.get("file_system_names") or []
        if fs and not any("filesystem" in w for w in self.warnings):
            self.warnings.append("attached filesystem(s) %s keep billing until deleted in the console "
                                 "(Storage → Delete)" % ", ".join(fs))
        state = str(inst.get("status") or "unknown").lower()
        return GONE if state == "terminated" else state

    def gone(self, state, after_call):
        if state in ("alert", "unhealthy") and after_call:
            self.warnings.append("the instance reported '%s' while terminating: check the console" % state)
        return state == GONE

    def stop(self, instance_id):
        _, doc = self.http.request("POST", "/instance-operations/terminate", body={"instance_ids": [instance_id]},
                                   allow=())
        if isinstance(doc, dict) and doc.get("error"):
            raise CloudError("Lambda Cloud refused the terminate: %s" % _error_text(doc), status=200)


class PaperspaceRest(Client):
    """Paperspace: DELETE /machines/{id}, GET /machines/{id} until 404; then list what still bills (never delete)."""

    name = "paperspace_rest"
    platform = "Paperspace"
    LISTS = (("public-ips", "public IP"), ("storage", "storage volume"), ("snapshots", "snapshot"))

    def state(self, instance_id):
        status, doc = self.http.request("GET", "/machines/" + quote(instance_id, safe=""))
        if status == 404:
            return GONE
        return str((doc or {}).get("state") or "unknown").lower()

    def stop(self, instance_id):
        self.http.request("DELETE", "/machines/" + quote(instance_id, safe=""), allow=())

    def leftovers(self, instance_id):
        found = []
        for path, label in self.LISTS:
            try:
                _, doc = self.http.request("GET", "/" + path, allow=())
            except CloudError as exc:
                found.append("could not list %ss (%s): check the console" % (label, exc.message))
                continue
            items = doc.get("items", []) if isinstance(doc, dict) else (doc or [])
            for item in items:
                if not isinstance(item, dict):
                    continue
                name = item.get("ip") or item.get("name") or item.get("id")
                owner = item.get("assignedMachineId") or item.get("machineId") or item.get("sourceMachineId")
                tie = " (from this machine)" if owner == instance_id else ""
                found.append("%s %s%s still bills until deleted or released (needs its own confirmation)" %
                             (label, name, tie))
        return found


class AutoDLToken(Client):
    """AutoDL Pro API: POST .../pro/power_off {instance_uuid} (reversible 关机), GET .../pro/status until shutdown."""

    name = "autodl_token"
    platform = "AutoDL"
    auth_scheme = ""  # `Authorization: <developer token>`, no Bearer
    reversible = True
    done_label = STOPPED
    BASE = "/api/v1/dev/instance/pro"

    def _check(self, doc, what):
        if not isinstance(doc, dict) or doc.get("code") != "Success":
            raise CloudError("AutoDL %s failed: code %s: %s" % (what, (doc or {}).get("code"), _error_text(doc)),
                             kind="api", status=200)
        return doc.get("data")

    def state(self, instance_id):
        _, doc = self.http.request("GET", self.BASE + "/status", query={"instance_uuid": instance_id}, allow=())
        data = self._check(doc, "status")
        status = data.get("status") if isinstance(data, dict) else data
        return str(status or "unknown").lower()

    def gone(self, state, after_call):
        return state == "shutdown"

    def stop(self, instance_id):
        _, doc = self.http.request("POST", self.BASE + "/power_off", body={"instance_uuid": instance_id}, allow=())
        self._check(doc, "power_off")


# The clients by the registry's name (built from the classes; every API verb of rgt_registry.METER_STOPS has its
# class here and every class its entry there: tests/unit/test_registry.py).
CLIENTS = dict((cls.name, cls) for cls in (RunPodRest, VastRest, LambdaRest, PaperspaceRest, AutoDLToken))


def make_client(api, **kw):
    name = (api or {}).get("client")
    if name not in CLIENTS:
        raise CloudError("no meter-stop client named %r (known: %s)" % (name, ", ".join(sorted(CLIENTS))),
                         kind="config")
    return CLIENTS[name](api, **kw)


def _accepted_or_unanswered(call):
    """A recorded non-GET call that the platform accepted (2xx) or that got no answer (it may have taken effect)."""
    if not isinstance(call, dict) or call.get("method") in (None, "GET"):
        return False
    status = call.get("status")
    return status in ("timeout", None) or (isinstance(status, int) and status < 300)


def record_state(record, instance_id):
    """What an earlier teardown record (the ledger's `<host>.json`) says of `instance_id`: RECORD_GONE (nothing
    to do), RECORD_IN_FLIGHT (a meter-stop call was made, or was about to be, and no terminal state was seen:
    poll the instance, never call again) or RECORD_NONE (no record of it, another instance's, or a stop that
    was refused or never made). Anything that is not a record reads as RECORD_NONE, never as a fact."""
    if not isinstance(record, dict) or record.get("instance_id") != instance_id:
        return RECORD_NONE
    final = record.get("final_state")
    final = final if isinstance(final, str) else ""
    if final in RECORDED_GONE:
        return RECORD_GONE
    if final == REQUESTED:
        return RECORD_IN_FLIGHT
    calls = record.get("calls") if isinstance(record.get("calls"), list) else []
    if final.startswith("unknown") and any(_accepted_or_unanswered(c) for c in calls):
        return RECORD_IN_FLIGHT
    return RECORD_NONE


def teardown(client, instance_id, poll_timeout_s=300.0, poll_interval_s=5.0, clock=time.monotonic,
             sleep=time.sleep, resume_poll=False, on_call=None):
    """Stop the meter once and poll until the platform says so. Returns a result dict; raises CloudError for
    auth/config errors and for a refused call, and returns final_state UNKNOWN when the poll runs out.
    `resume_poll`: an earlier run made the call (or was killed making it) and saw no terminal state: only poll.
    `on_call(stage)`: called right before the meter-stop call ("requested") and once it was answered or found
    to have taken effect ("answered"): the caller records the intent there, before the poll can be interrupted."""
    result = {"final_state": None, "already": False, "stop_called": False, "warnings": client.warnings,
              "states": []}
    first = client.state(instance_id)
    result["states"].append(first)
    if client.gone(first, after_call=resume_poll):
        # gone at the first look: already gone, unless it is the stop an earlier run requested that ended
        result.update(final_state=client.done_label, already=not resume_poll)
        return result
    try:
        if resume_poll:
            client.warnings.append("the meter-stop call was made by an earlier run; polling again, not calling")
        else:
            result["stop_called"] = True
            if on_call:
                on_call("requested")
            client.stop(instance_id)
    except CloudError as exc:
        if exc.kind not in ("timeout", "network", "conflict") and exc.status != 404:
            raise
        # the call may have taken effect: look, never call again
        seen = client.state(instance_id)
        result["states"].append(seen)
        progressing = client.gone(seen, after_call=True) or seen in ("terminating", "stopping", "shutting_down",
                                                                      "exited", "destroying", "releasing")
        if not progressing:
            raise CloudError("%s; the instance still reports '%s' — not calling again: check the console" %
                             (exc.message, seen), kind=exc.kind, status=exc.status) from None
        client.warnings.append("%s; the platform already reports '%s', so the call took effect" %
                               (exc.message, seen))
    if result["stop_called"] and on_call:
        on_call("answered")
    deadline = clock() + poll_timeout_s
    while True:
        try:
            seen = client.state(instance_id)
        except CloudError as exc:
            if exc.kind in ("auth", "config"):
                raise
            seen = "error: %s" % exc.message
        if not result["states"] or result["states"][-1] != seen:
            result["states"].append(seen)
        if client.gone(seen, after_call=True):
            result["final_state"] = client.done_label
            return result
        if clock() >= deadline:
            result["final_state"] = UNKNOWN
            result["last_seen"] = seen
            return result
        sleep(max(0.0, min(poll_interval_s, deadline - clock())))
