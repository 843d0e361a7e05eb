"""module_utils/rgt_cloud speaks HTTP through Ansible's `open_url`: the controller's proxy settings apply unless
the caller turns them off (`use_proxy`). The retry/409/429/re-query rules are in test_rgt_cloud.py."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud as c
from tests.fakes import control_planes as fk

TOKEN = "transport-token"
API = {"client": "runpod_rest", "base_url": "http://127.0.0.1:9", "key_env": "RGT_TEST_KEY"}


class Proxy:
    """A forward proxy that records the absolute URLs it is asked for and answers every one with `status`."""

    def __init__(self, status: int):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                seen.append(self.path)
                body = b'{"error": "from the proxy"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    plane = fk.PLANES["runpod"](token=TOKEN).start()
    plane.add_pod("pod-1")
    yield plane
    plane.stop()


@pytest.fixture
def proxy_env(monkeypatch):
    made = []

    def _proxy(status):
        proxy = Proxy(status)
        made.append(proxy)
        for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("http_proxy", proxy.url)
        return proxy

    yield _proxy
    for proxy in made:
        proxy.stop()


def test_requests_go_through_the_controllers_proxy_unless_use_proxy_is_off(fake, proxy_env):
    proxy = proxy_env(404)  # the proxy answers "no such pod": only a proxied request can see that
    proxied = c.make_client(API, env={"RGT_TEST_KEY": TOKEN}, base_url=fake.url)
    assert proxied.state("pod-1") == c.GONE
    assert proxy.seen == [fake.url + "/v2/pods/pod-1"]
    assert fake.calls() == []

    direct = c.make_client(API, env={"RGT_TEST_KEY": TOKEN}, base_url=fake.url, use_proxy=False)
    assert direct.state("pod-1") != c.GONE  # the fake control plane's own answer: the pod is there
    assert len(proxy.seen) == 1 and [r["path"] for r in fake.calls()] == ["/v2/pods/pod-1"]

