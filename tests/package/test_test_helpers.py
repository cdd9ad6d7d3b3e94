"""The suite's own rules, checked: a missing golden file or real part fails in CI instead of passing
or skipping, a golden file is written only on request, and the port helpers really hold their port."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import closed_port, read_golden, require_module, reserved_port


@pytest.mark.parametrize("ci", [True, False])
def test_a_missing_golden_file_fails_in_ci_and_is_never_written(ci: bool, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "IN_CI", ci)
    monkeypatch.delenv("MLDEBUG_UPDATE_GOLDEN", raising=False)
    golden = tmp_path / "golden.txt"
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match="is missing"):
        read_golden(golden, "fresh output\n")
    assert not golden.exists()


def test_update_golden_writes_and_skips_outside_ci_and_fails_in_ci(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    golden = tmp_path / "golden.txt"
    golden.write_text("old\n")
    monkeypatch.setenv("MLDEBUG_UPDATE_GOLDEN", "1")
    monkeypatch.setattr(conftest, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="compare .* with itself"):
        read_golden(golden, "new\n")
    assert golden.read_text() == "old\n"
    monkeypatch.setattr(conftest, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="wrote golden file"):  # never a vacuous pass
        read_golden(golden, "new\n")
    assert golden.read_text() == "new\n"


def test_a_present_golden_file_is_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLDEBUG_UPDATE_GOLDEN", raising=False)
    golden = tmp_path / "golden.txt"
    golden.write_text("same\n")
    conftest.check_golden(golden, "same\n")
    with pytest.raises(AssertionError, match="differs from golden file"):
        conftest.check_golden(golden, "other\n")


def test_a_missing_module_fails_when_real_parts_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "REQUIRE_REAL", True)
    with pytest.raises(pytest.fail.Exception, match="no_such_module_for_mldebug"):
        require_module("no_such_module_for_mldebug")
    monkeypatch.setattr(conftest, "REQUIRE_REAL", False)
    with pytest.raises(pytest.skip.Exception):
        require_module("no_such_module_for_mldebug")
    assert require_module("json").dumps([1]) == "[1]"


def test_closed_port_refuses_and_cannot_be_taken() -> None:
    with closed_port() as port:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
        with socket.socket() as other, pytest.raises(OSError) as e:
            other.bind(("127.0.0.1", port))
        assert e.value.errno == errno.EADDRINUSE


def test_reserved_port_admits_only_a_server_that_reuses_the_address() -> None:
    with reserved_port() as port:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # a random program cannot take it
        with socket.socket() as server:  # the way torch's TCPStore binds
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("", port))
            server.listen(1)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = server.accept()
                conn.close()
