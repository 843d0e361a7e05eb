"""The HTTP plumbing of the local fakes (control_planes.py, k8s_api.py): a threaded server on 127.0.0.1 with an
ephemeral port, every request handed to the subclass's `_dispatch(handler)`. `start()` / `stop()` or a `with`
block; `port` and `url` while it runs."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalHTTPFake:
    name = "fake"  # the server thread's name: fake-<name>
    nodelay = False  # TCP_NODELAY on replies (a client that waits on a small second write stalls 40 ms without it)

    _server: ThreadingHTTPServer | None = None

    def _dispatch(self, handler: BaseHTTPRequestHandler) -> None:  # pragma: no cover - every fake has its own
        raise NotImplementedError

    def start(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = self.nodelay

            def log_message(self, *args):  # keep test output clean
                pass

            def _serve(self):
                fake._dispatch(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fake-{self.name}",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server, "start() the fake first"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
