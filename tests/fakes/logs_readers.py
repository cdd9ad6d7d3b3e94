"""`mldebug logs` reader processes that fail on purpose (``MLDEBUG_TEST_HOOKS=tests.fakes.logs_readers``).

``MLDEBUG_FAKE_READER=die``: a reader dies before its second share, as one the OOM killer ended; the shares
it did not send back must be read again by mldebug, and the report must be the one a single reader writes.
``MLDEBUG_FAKE_READER=stall``: every reader stops before its first share, as one stuck on a dead file
system; a SIGTERM of mldebug must still end it and every reader.
"""

from __future__ import annotations

import os
import time

SEEN: list[int] = []


def logs_reader_share(share: int) -> None:
    SEEN.append(share)
    what = os.environ.get("MLDEBUG_FAKE_READER")
    if what == "die" and len(SEEN) == 2:
        os._exit(9)
    while what == "stall":
        time.sleep(1)
