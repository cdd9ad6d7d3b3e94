"""A small Debug Adapter Protocol client: the wire format and request/response over one socket.

DAP messages are JSON bodies behind a ``Content-Length: N\\r\\n\\r\\n`` header (the same framing as
the Language Server Protocol). Requests carry a ``seq``; the adapter answers with a ``response``
whose ``request_seq`` names it, and sends ``event`` messages at any time (``stopped``,
``output``, ``terminated``). Every read has a deadline: a dead adapter or a wedged target never
blocks mldebug (see docs/commands/attach.md).
"""

from __future__ import annotations

import json
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from ml_debug.core.errors import MLDebugError


class DapError(MLDebugError):
    """The adapter refused a request, went away, or did not answer in time."""


HEADER_END = b"\r\n\r\n"
MAX_BODY = 64 * 1024 * 1024  # a larger body means the peer is not a debug adapter


def encode(message: dict[str, Any]) -> bytes:
    """One DAP message on the wire."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Framer:
    """Bytes in, whole DAP messages out (a message may arrive in many pieces, or many in one)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        while True:
            end = self._buf.find(HEADER_END)
            if end < 0:
                if len(self._buf) > 4096:
                    raise DapError("the peer does not speak the Debug Adapter Protocol (no message header)")
                return out
            length = None
            for line in self._buf[:end].split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    try:
                        length = int(value.strip())
                    except ValueError:
                        length = None
            if length is None or not 0 <= length <= MAX_BODY:
                raise DapError("the peer does not speak the Debug Adapter Protocol (bad Content-Length)")
            start = end + len(HEADER_END)
            if len(self._buf) < start + length:
                return out
            body, self._buf = self._buf[start:start + length], self._buf[start + length:]
            try:
                msg = json.loads(body)
            except ValueError as e:
                raise DapError(f"the debug adapter sent a message that is not JSON ({e})") from None
            if isinstance(msg, dict):
                out.append(msg)


class Wire(Protocol):
    """What the DAP client reads and writes: a socket, or a paramiko channel (the same calls)."""

    def settimeout(self, value: float | None) -> None: ...
    def recv(self, size: int) -> bytes: ...
    def sendall(self, data: bytes) -> None: ...
    def close(self) -> None: ...


@dataclass
class DapClient:
    """One connection to a debug adapter (debugpy's), every call bounded by `timeout` seconds."""

    sock: Wire
    timeout: float
    events: deque[dict[str, Any]] = field(default_factory=deque)
    _seq: int = 0
    _framer: Framer = field(default_factory=Framer)
    _responses: dict[int, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def connect(cls, host: str, port: int, timeout: float) -> DapClient:
        """Connect with retries until `timeout` (the adapter may still be starting)."""
        deadline = time.monotonic() + timeout
        last: OSError | None = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
                return cls(sock=sock, timeout=timeout)
            except OSError as e:
                last = e
                time.sleep(0.1)
        raise DapError(f"no debug adapter answered on {host}:{port} within {timeout:g} s ({last})")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, command: str, arguments: dict[str, Any] | None = None) -> int:
        self._seq += 1
        msg: dict[str, Any] = {"seq": self._seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        try:
            self.sock.sendall(encode(msg))
        except OSError as e:
            raise DapError(f"the debug adapter went away ({e})") from None
        return self._seq

    def _pump(self, deadline: float) -> bool:
        """Read what has arrived (until `deadline`); False when nothing came in time."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except OSError as e:
            raise DapError(f"the debug adapter went away ({e})") from None
        if not data:
            raise DapError("the debug adapter closed the connection")
        for msg in self._framer.feed(data):
            if msg.get("type") == "response":
                self._responses[int(msg.get("request_seq", -1))] = msg
            elif msg.get("type") == "event":
                self.events.append(msg)
        return True

    def wait_response(self, seq: int, command: str, timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while seq not in self._responses:
            if not self._pump(deadline) and time.monotonic() >= deadline:
                raise DapError(f"the debug adapter did not answer '{command}' within "
                               f"{self.timeout if timeout is None else timeout:g} s")
        msg = self._responses.pop(seq)
        if not msg.get("success", False):
            raise DapError(f"{command}: {msg.get('message') or (msg.get('body') or {}).get('error') or 'refused'}")
        body = msg.get("body")
        return body if isinstance(body, dict) else {}

    def request(self, command: str, arguments: dict[str, Any] | None = None,
                timeout: float | None = None) -> dict[str, Any]:
        """Send one request and return its response's body (DapError if refused or late)."""
        return self.wait_response(self.send(command, arguments), command, timeout)

    def wait_event(self, name: str, timeout: float, match: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The first event `name` (whose body holds `match`) within `timeout`; None when none came."""
        deadline = time.monotonic() + timeout
        while True:
            for ev in list(self.events):
                body = ev.get("body") or {}
                if ev.get("event") == name and all(body.get(k) == v for k, v in (match or {}).items()):
                    self.events.remove(ev)
                    return body if isinstance(body, dict) else {}
            if time.monotonic() >= deadline:
                return None
            self._pump(deadline)
