"""A traceback printed by a logging call below ERROR (`logger.warning(..., exc_info=True)`) was handled: a warning,
never the first failure. A C++ warning of c10d's that merely comes before a rank's own traceback does not make it
handled (found on the rig: `[W1128 04:18:40.186 socket.cpp:207] [c10d] The hostname ...` then rank 2's ValueError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ml_debug.logs.triage import triage

TRACEBACK = """Traceback (most recent call last):
  File "/job/train.py", line 47, in <module>
    main()
  File "/job/train.py", line 39, in main
    raise ValueError("bad batch on rank 2")
ValueError: bad batch on rank 2
"""


@pytest.mark.parametrize(("before", "handled"), [
    ("2026-11-28 04:18:40,186 WARNING retrying the batch\n", True),
    ("WARNING:root:retrying the batch\n", True),
    ("W1128 04:18:40.186430 140212 train.py:88] retrying the batch\n", True),  # absl's glog-style record
    ("[W1128 04:18:40.186430027 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. "
     "err=-3\n", False),
    ("step 12 loss 2.31\n", False),
])
def test_a_traceback_after_a_logging_record_below_error_is_handled(tmp_path: Path, before: str, handled: bool) -> None:
    log = tmp_path / "rank2.log"
    log.write_text("starting\n" + before + TRACEBACK)
    v = triage([str(log)]).verdict
    if handled:
        assert v.status != "failure" or v.primary is None or "ValueError" not in v.primary.message, v.summary
    else:
        assert v.status == "failure" and v.primary is not None and "ValueError: bad batch" in v.primary.message, \
            v.summary
