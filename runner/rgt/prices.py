"""The platform's own price of a box, for budgets (rgt.budget; docs/unattended.md "Budgets and idle meters").

Where the host's profile names a meter-stop client whose API says what the instance costs (RunPod REST v2 `cost`,
USD/hour of the pod; vast.ai `dph_total`, dollars per hour of the instance: module_util rgt_cloud,
`Client.price_per_hour`), that price is used instead of the configured one (rgt_job.price_per_hour, from the
inventory or the job spec); the budget says which (`source`: platform | inventory). The price is asked at most
every ASK_EVERY_S per host and kept in `<ledger>/prices.json` (atomic, schema rgt/prices/v1: {hosts: {host:
{instance_id, platform, price_per_hour, at} | {instance_id, platform, error, at}}}), so status reads it without a
call and a watch started again does not ask at once. A failed call (no key, 401, a timeout, a body without a price)
falls back to the configured price and is said once, until a call works again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from rgt import paths
from rgt.ledger import atomic_write_json, read_json
from rgt.safetext import printable

SCHEMA = "rgt/prices/v1"
ASK_EVERY_S = 300.0
HTTP_TIMEOUT_S = 10.0
PLATFORM = "platform"
INVENTORY = "inventory"


def _cloud():
    return paths.module_util("rgt_cloud")


def api_of(host) -> dict | None:
    """The meter-stop API of the host's profile when its client can say an instance's price, else None."""
    api = ((getattr(host, "profile", None) or {}).get("meter_stop") or {}).get("api")
    client = _cloud().CLIENTS.get((api or {}).get("client")) if isinstance(api, dict) else None
    return api if client is not None and client.prices else None


class Prices:
    """The platform prices of a watch's or a status's hosts: `refresh()` asks what is due, `of(host)` the price."""

    def __init__(self, ledger: Path, hosts: list, console: Console, env: dict | None = None,
                 clock: Callable[[], float] = time.time, http_timeout: float = HTTP_TIMEOUT_S):
        self.ledger, self.console, self.clock = ledger, console, clock
        self.hosts = {h.name: h for h in hosts}
        self.env = os.environ if env is None else env
        self.http_timeout = http_timeout

    def _load(self) -> dict:
        doc = read_json(self.ledger / "prices.json")
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("hosts"), dict):
            return {"schema": SCHEMA, "hosts": {}}
        return doc

    def refresh(self, names: list[str] | None = None) -> dict[str, dict]:
        """Ask the platform the price of each host (of `names`) whose cached one is older than ASK_EVERY_S or of
        another instance; never raises. Returns the cache's hosts."""
        doc = self._load()
        now = self.clock()
        changed = False
        for name in sorted(names if names is not None else self.hosts):
            host = self.hosts.get(name)
            api = api_of(host) if host is not None else None
            instance = str((getattr(host, "vars", None) or {}).get("rgt_instance_id") or "")
            if api is None or not instance:
                continue
            old = doc["hosts"].get(name) if isinstance(doc["hosts"].get(name), dict) else {}
            if old.get("instance_id") == instance and now - float(old.get("at") or 0) < ASK_EVERY_S:
                continue
            record = self._ask(api, instance, now)
            if "error" in record and not ("error" in old and old.get("instance_id") == instance):
                self.console.print(printable(f"price: {name}: {record['platform']} did not say the price of "
                                             f"{instance} ({record['error']}); using the configured "
                                             "rgt_job.price_per_hour"), highlight=False, markup=False)
            doc["hosts"][name] = record
            changed = True
        if changed:
            atomic_write_json(self.ledger / "prices.json", doc)
        return doc["hosts"]

    def _ask(self, api: dict, instance: str, now: float) -> dict:
        cloud = _cloud()
        platform = getattr(cloud.CLIENTS.get(api.get("client")), "platform", "the platform")
        record = {"instance_id": instance, "platform": platform, "at": now}
        try:
            price = cloud.make_client(api, env=self.env, http_timeout=self.http_timeout,
                                      max_retry_after=self.http_timeout).price_per_hour(instance)
        except cloud.CloudError as exc:
            return {**record, "error": exc.message}
        except Exception as exc:  # noqa: BLE001 - a price the platform cannot give falls back to the configured one
            return {**record, "error": f"{type(exc).__name__}: {exc}"}
        if price is None:
            return {**record, "error": "its answer carries no price"}
        return {**record, "price_per_hour": price}

    def of(self, name: str) -> float | None:
        """The platform's price of the host from the cache (refresh first), or None: use the configured one."""
        record = self._load()["hosts"].get(name)
        host = self.hosts.get(name)
        instance = str((getattr(host, "vars", None) or {}).get("rgt_instance_id") or "")
        if not isinstance(record, dict) or record.get("instance_id") != instance:
            return None
        price = record.get("price_per_hour")
        return float(price) if isinstance(price, (int, float)) and not isinstance(price, bool) and price >= 0 \
            else None

    def table(self) -> dict[str, float]:
        """{host: the platform's price} of every host the cache has one for."""
        return {name: price for name in self.hosts if (price := self.of(name)) is not None}
