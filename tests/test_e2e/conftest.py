"""The end-to-end runs' shared fixture: the session's P4 mix and reference runs (tests/p4_runs.py)."""

from __future__ import annotations

import pytest
from p4_runs import SharedP4, shared_p4


@pytest.fixture(scope="session")
def p4_shared(tmp_path_factory: pytest.TempPathFactory) -> SharedP4:
    return shared_p4(tmp_path_factory)
