"""mldebug's Debug Adapter Protocol client, called directly over a real socket pair whose other end plays
the adapter (debugpy itself, attached to real processes: tests/cli/test_attach.py)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from ml_debug.debugger.dap import MAX_BODY, DapClient, DapError, Framer, encode


def test_a_message_in_pieces_and_many_in_one_read() -> None:
    wire = encode({"seq": 1, "type": "event", "event": "output"}) + encode({"seq": 2, "type": "response"})
    framer = Framer()
    got = [msg for byte in range(len(wire)) for msg in framer.feed(wire[byte:byte + 1])]
    assert [m["seq"] for m in got] == [1, 2]
    assert [m["seq"] for m in Framer().feed(wire)] == [1, 2]
    assert wire.startswith(b"Content-Length: %d\r\n\r\n" % len(json.dumps({"seq": 1, "type": "event",
                                                                              "event": "output"}, separators=(",", ":"))))


@pytest.mark.parametrize(("wire", "words"), [
    (b"x" * 5000, "no message header"),
    (b"Content-Length: nine\r\n\r\n{}", "bad Content-Length"),
    (b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1), "bad Content-Length"),
    (b"Content-Length: 3\r\n\r\nabc", "not JSON"),
])
def test_a_peer_that_does_not_speak_dap_is_named(wire: bytes, words: str) -> None:
    with pytest.raises(DapError, match=words):
        Framer().feed(wire)


@pytest.fixture
def adapter() -> Iterator[tuple[DapClient, list[dict]]]:
    """A client whose peer answers `threads` (after an event), refuses `evaluate`, and ignores `pause`."""
    ours, theirs = socket.socketpair()
    seen: list[dict] = []

    def serve() -> None:
        framer = Framer()
        with theirs:
            while data := theirs.recv(65536):
                for req in framer.feed(data):
                    seen.append(req)
                    answer = {"type": "response", "request_seq": req["seq"], "command": req["command"]}
                    if req["command"] == "threads":
                        theirs.sendall(encode({"type": "event", "event": "stopped", "body": {"threadId": 7}}))
                        theirs.sendall(encode({**answer, "success": True, "body": {"threads": [{"id": 7}]}}))
                    elif req["command"] == "evaluate":
                        theirs.sendall(encode({**answer, "success": False, "message": "name 'x' is not defined"}))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = DapClient(sock=ours, timeout=0.5)
    yield client, seen
    client.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_requests_get_their_own_answers_and_events_are_kept(adapter: tuple[DapClient, list[dict]]) -> None:
    client, seen = adapter
    assert client.request("threads") == {"threads": [{"id": 7}]}
    assert client.wait_event("stopped", 1.0, match={"threadId": 7}) == {"threadId": 7}
    assert client.wait_event("stopped", 0.1) is None  # taken once
    with pytest.raises(DapError, match="evaluate: name 'x' is not defined"):
        client.request("evaluate", {"expression": "x"})
    assert [(r["seq"], r["command"]) for r in seen] == [(1, "threads"), (2, "evaluate")]
    assert seen[1]["arguments"] == {"expression": "x"}


def test_an_adapter_that_does_not_answer_or_is_not_there_is_an_error_in_bounded_time(
        adapter: tuple[DapClient, list[dict]]) -> None:
    client, _ = adapter
    with pytest.raises(DapError, match="did not answer 'pause' within 0.2 s"):
        client.request("pause", timeout=0.2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused at once
        port = s.getsockname()[1]
        with pytest.raises(DapError, match=f"no debug adapter answered on 127.0.0.1:{port} within 0.3 s"):
            DapClient.connect("127.0.0.1", port, timeout=0.3)
