"""The stream parser on whole response bodies, as vLLM 0.32 frames them: an error the server
sends after its 200 fails the request with its own kind and message; so does a stream that
reaches [DONE] without saying why it stopped."""

from __future__ import annotations

import json

from avbench.loadgen.client import parse_stream
from avbench.loadgen.records import RequestRecord
from avbench.testing.fake_server import ENGINE_DEAD_EVENT

ROLE = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"tiny-target","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
    b"\n\n"
)
DONE = b"data: [DONE]\n\n"


def _chunk(text: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish, "token_ids": ids}
    return b"data: " + json.dumps({"id": "chatcmpl-1", "choices": [choice]}).encode() + b"\n\n"


def _parsed(*events: bytes, split: int | None = None) -> RequestRecord:
    """The record of a body that arrived in one read (or two, cut at byte ``split``)."""
    body = b"".join(events)
    reads = [(1.0, body)] if split is None else [(1.0, body[:split]), (1.1, body[split:])]
    rec = RequestRecord(conversation_id="c0", turn=0, sent_at=0.5)
    parse_stream(rec, reads)
    return rec


def test_an_error_event_after_the_role_chunk_fails_the_request_with_the_servers_message():
    rec = _parsed(ROLE, ENGINE_DEAD_EVENT, DONE)
    assert not rec.ok and rec.error_kind == "server_error"
    assert "InternalServerError 500" in rec.error and "EngineCore encountered an issue" in rec.error
    assert rec.chunk_tokens == [] and rec.finish_reason is None


def test_an_error_event_after_tokens_fails_it_too_and_keeps_what_came():
    rec = _parsed(ROLE, _chunk(" a", [5]), _chunk(" b", [6]), ENGINE_DEAD_EVENT, DONE, split=150)
    assert rec.error_kind == "server_error" and rec.chunk_tokens == [1, 1]
    assert rec.output_text == " a b"


def test_done_without_a_finish_reason_is_incomplete():
    rec = _parsed(ROLE, _chunk(" a", [5]), DONE)
    assert not rec.ok and rec.error_kind == "incomplete"
    assert "[DONE] without a finish_reason after 1 token chunk" in rec.error


def test_a_finish_reason_and_done_is_a_success_and_no_done_a_cut():
    assert _parsed(ROLE, _chunk(" a", [5], "stop"), DONE).ok
    cut = _parsed(ROLE, _chunk(" a", [5]))
    assert cut.error_kind == "stream_cut" and cut.chunk_tokens == [1]


def test_finish_reason_error_is_a_server_error():
    rec = _parsed(ROLE, _chunk(" a", [5], "error"), DONE)
    assert rec.error_kind == "server_error" and "finish_reason error" in rec.error


def test_an_error_body_instead_of_a_stream_is_a_server_error():
    body = b'{"error": {"message": "engine gone", "type": "InternalServerError", "code": 500}}'
    rec = _parsed(body)
    assert rec.error_kind == "server_error" and rec.error.endswith("engine gone")
