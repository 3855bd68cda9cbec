"""The fake streaming server speaks vLLM 0.32's format (as captured from a live CPU server); its
command line refuses bad options in one line."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from avbench.testing.cli import run_cli
from avbench.testing.fake_server import ServerConfig, cli, serve_in_subprocess, serve_in_thread

FIX = Path(__file__).parent / "fixtures"


def _events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: ")
        payload = block[6:]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _shape(ev) -> tuple:
    """Keys of a chunk and of its choice/delta: the format, without the values."""
    if ev == "[DONE]":
        return ("[DONE]",)
    ch = ev["choices"][0] if ev["choices"] else {}
    delta = ch.get("delta", {})
    return (
        tuple(sorted(ev)),
        tuple(sorted(ch)),
        tuple(sorted(delta)),
        ch.get("finish_reason") is not None,
    )


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_format_matches_captured_vllm(api):
    fixture = _events((FIX / f"{api}_stream.txt").read_text())
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    body = {"max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    with serve_in_thread(ServerConfig(tokens_per_chunk=1)) as srv:
        r = httpx.post(srv.base_url + path, json=body, timeout=10)
    assert r.headers["transfer-encoding"] == "chunked"
    ours = _events(r.text)
    # Same sequence of chunk shapes: (role chunk,) content chunks, finish chunk, usage, [DONE].
    assert {_shape(e) for e in ours} == {_shape(e) for e in fixture}
    assert _shape(ours[0]) == _shape(fixture[0])
    assert [_shape(e) for e in ours[-3:]] == [_shape(e) for e in fixture[-3:]]
    assert ours[-2]["usage"]["completion_tokens"] == 7


def test_token_ids_and_several_tokens_per_chunk():
    body = {
        "prompt": "hi",
        "max_tokens": 10,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    with serve_in_thread(ServerConfig(tokens_per_chunk=4)) as srv:
        evs = _events(httpx.post(srv.base_url + "/v1/completions", json=body, timeout=10).text)
        em = srv.emissions()
    ids = [e["choices"][0]["token_ids"] for e in evs[:-2]]
    assert [len(x) for x in ids] == [4, 4, 2]
    assert em[0]["tokens"] == [4, 4, 2] and len(em[0]["times"]) == 3


def test_subprocess_server_starts_and_stops():
    with serve_in_subprocess(ServerConfig()) as srv:
        assert httpx.get(srv.base_url + "/health", timeout=10).status_code == 200
        pid = srv.proc.pid
    assert srv.proc.poll() is not None, f"server pid {pid} still running"


def _raw_request(sock: socket.socket, prompt: str) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": 6, "stream": True}).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )


def _read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        got = sock.recv(65536)
        if not got:
            break
        data += got
    return data


def test_interim_and_bad_chunk_faults_are_on_the_wire():
    with serve_in_thread(ServerConfig(tokens_per_chunk=1)) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            _raw_request(s, "@fault:interim")
            wire = _read_until(s, b"0\r\n\r\n")
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            _raw_request(s, "@fault:bad_chunk")
            bad = _read_until(s, b"0\r\n\r\n")
    assert wire.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n")
    assert b"\r\n\r\nHTTP/1.1 200 OK\r\n" in wire and wire.endswith(b"0\r\n\r\n")
    assert b"5\r\nhelloXX" in bad  # a chunk whose data is not followed by CRLF


@pytest.mark.parametrize("reset", [True, False], ids=["rst", "fin"])
def test_idle_keep_alive_connection_is_closed_after_the_timeout(reset):
    cfg = ServerConfig(tokens_per_chunk=2, idle_timeout_s=0.2, idle_reset=reset)
    with serve_in_thread(cfg) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            _raw_request(s, "hi")
            assert _read_until(s, b"0\r\n\r\n").endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
            t0 = time.perf_counter()
            try:
                end = s.recv(10)
            except ConnectionResetError:
                end = "reset"
            idle = time.perf_counter() - t0
        assert srv.stats()["idle_closed"] == 1
    assert end == ("reset" if reset else b"")
    assert 0.15 < idle < 5.0


def test_a_misspelt_fault_is_refused_not_ignored():
    with serve_in_thread(ServerConfig()) as srv:
        body = {"model": "fake-model", "prompt": "@fault:stal", "max_tokens": 4, "stream": True}
        r = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=10)
        ok = httpx.post(
            f"{srv.base_url}/v1/completions", json=body | {"prompt": "@fault:http_4xx"}, timeout=10
        )
    assert r.status_code == 400 and "unknown fault 'stal'" in r.json()["error"]["message"]
    assert ok.status_code == 400 and ok.json()["error"]["message"] == "injected 4xx"


def _fake_server(*args: str) -> tuple[int, str]:
    """``python -m avbench.testing.fake_server ARGS``, run in this process: exit code, stderr."""
    res = run_cli(*args, app=cli)
    return res.returncode, res.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (("--port", "70000"), "--port: expected a TCP port 1-65535, got 70000"),
        (("--port", "-1"), "--port: expected a TCP port 1-65535, got -1"),
        (("--port", "0", "--host", "nonsense.invalid"), "cannot listen"),
        (("--port", "0", "--host", "256.1.1.1"), "cannot listen"),
        (("--tokens-per-chunk", "0"), "Invalid value for '--tokens-per-chunk'"),
        (("--inter-chunk-ms", "-1"), "Invalid value for '--inter-chunk-ms'"),
        (("--inter-chunk-ms", "nan"), "Invalid value for '--inter-chunk-ms'"),
        (("--first-token-ms", "inf"), "Invalid value for '--first-token-ms'"),
    ],
)
def test_bad_options_are_one_line_errors(args, says):
    code, err = _fake_server(*args)
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_a_busy_port_names_its_holder_in_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = _fake_server("--port", str(port))
    assert code == 2 and f"--port {port}: already in use on 127.0.0.1" in err, err
    assert err.count("\n") == 1
