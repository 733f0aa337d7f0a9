"""The trainer's two kinds of output.

Protocol lines (`step 5/20 loss ...`, `CKPT push step=10 -> ...`, `RUN_JSON {...}`: docs/DESIGN.md,
"Trainer output lines") are the contract the specs grep: they go through `emit()` exactly as written,
one flushed write per line. Diagnostics (Hub retries, kernel fallbacks, warnings) go through `logging`,
which `setup_logging()` configures once per process with the time and the rank on every record.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TextIO

_lock = threading.Lock()

LOG_FORMAT = "%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"


def emit(line: str, stream: TextIO | None = None) -> None:
    """Write one protocol line. One write per line, under a lock: the push thread writes while the
    training thread prints, and a kill right after a line must not lose it."""
    with _lock:
        s = stream or sys.stdout
        s.write(line + "\n")
        s.flush()


def setup_logging(rank: int, stream: TextIO | None = None) -> None:
    """Diagnostics of this process to `stream` (stderr), each record with its time and `rank`; Python
    warnings (a kernel's fallback) become records too, so they carry both."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT.format(rank=rank)))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_specprobe", False)]:
        root.removeHandler(old)
    handler._specprobe = True  # type: ignore[attr-defined]
    root.addHandler(handler)  # the root keeps Python's WARNING level: no library's INFO chatter
    logging.captureWarnings(True)
