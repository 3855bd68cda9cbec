"""Emptying a server's prefix cache before a cell: the project's fake server stands in for a
vLLM launched with avbench's route; a plain HTTP server stands in for an engine that keeps
refusing (vLLM answers success false while requests hold cached blocks) and for a server
without the route."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from avbench.serving import prefix_cache
from avbench.serving.prefix_cache import reset_prefix_cache
from avbench.testing.fake_server import ServerConfig, serve_in_thread


def test_a_launched_server_is_reset_with_the_api_key():
    with serve_in_thread(ServerConfig(api_key="sk-cell-3")) as server:
        key = {"Authorization": "Bearer sk-cell-3"}
        assert reset_prefix_cache(server.base_url, key) is True
        assert reset_prefix_cache(server.base_url, {}) is None  # refused: 401
        assert server.stats()["prefix_resets"] == 1


class _Handler(BaseHTTPRequestHandler):
    posts = 0
    answer: tuple[int, bytes] = (200, b"")

    def do_POST(self):
        type(self).posts += 1
        status, body = self.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def plain_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Handler.posts = 0
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_an_engine_that_keeps_refusing_is_retried_then_reported(plain_server, monkeypatch):
    # A second of retries 0.05 s apart: three posts leave each ~0.3 s on a loaded machine (in
    # 0.3 s, beside `make test`'s vLLM half, a run made two).
    monkeypatch.setattr(prefix_cache, "RETRY_S", 1.0)
    monkeypatch.setattr(prefix_cache, "RETRY_EVERY_S", 0.05)
    _Handler.answer = (200, json.dumps({"success": False}).encode())
    started = time.monotonic()
    assert reset_prefix_cache(plain_server, {}) is False
    assert time.monotonic() - started >= 1.0  # it gave up at the deadline, not before
    assert _Handler.posts >= 3


def test_a_server_without_the_route_is_none(plain_server):
    _Handler.answer = (404, b'{"detail":"Not Found"}')
    assert reset_prefix_cache(plain_server, {}) is None
    assert _Handler.posts == 1
