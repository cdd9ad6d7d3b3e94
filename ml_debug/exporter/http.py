"""The exporter's HTTP server: ``/metrics`` for Prometheus, a small page at ``/``, 404 elsewhere.

prometheus_client's own server answered every path with the metrics, kept one thread per connection
for as long as a client held it open (3,000 idle connections: 3,004 threads) and had no read timeout.
Here a connection is served by one of at most :data:`MAX_CONNECTIONS` threads; one more is closed at
once, and a client that sends nothing for :data:`IDLE_TIMEOUT_S` seconds is dropped, so idle
connections cannot pile up threads or keep a scrape from being served for long. ``HEAD`` gets the
headers of the ``GET`` (Content-Length included) and no body.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_CONNECTIONS = 32  # Prometheus keeps one or two per server scraping it
IDLE_TIMEOUT_S = 10.0  # a request that has not arrived by then (the default scrape timeout) is given up

LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>mldebug exporter</title></head>
<body><h1>mldebug exporter</h1>
<p>This node's health and its jobs' progress as Prometheus metrics: <a href="/metrics">/metrics</a>.</p>
<p>Docs: docs/commands/exporter.md in the mldebug repository.</p>
</body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = IDLE_TIMEOUT_S  # the socket's timeout: a silent client is dropped (StreamRequestHandler)
    protocol_version = "HTTP/1.1"  # keep-alive for Prometheus; every answer says its length

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            from prometheus_client.exposition import choose_encoder

            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            data, status = encoder(self.server.registry), 200
        elif path in ("/", "/index.html"):
            data, content_type, status = LANDING.encode(), "text/html; charset=utf-8", 200
        else:
            data, content_type, status = b"not found: the metrics are at /metrics\n", "text/plain; charset=utf-8", 404
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per scrape on stderr would bury what the exporter has to say


class MetricsServer(ThreadingHTTPServer):
    """``/metrics`` of `registry` on (host, port), at most :data:`MAX_CONNECTIONS` connections at once."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # a burst of connections waits in the kernel, not in SYN retries

    def __init__(self, host: str, port: int, registry: Any) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.registry = registry
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # every slot taken (idle clients?): this one is closed
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def start(host: str, port: int, registry: Any) -> MetricsServer:
    """The server, listening and serving in a daemon thread (stop it with ``shutdown()``, then
    ``server_close()``). An address that cannot be bound raises the OSError."""
    server = MetricsServer(host, port, registry)
    threading.Thread(target=server.serve_forever, name="mldebug-exporter-http", daemon=True).start()
    return server
