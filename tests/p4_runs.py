"""What every real run of a P4 spec in the session shares: the synthetic mix and the reference runs.

A P4 spec's reference step (the run that never stopped) trains the whole horizon once more. Made once per
(spec, mode) for the whole session, whichever test and xdist worker gets there first, it is reused by every
other run of that spec: `SharedP4.sets(spec, mode)` are the `--set`s that point a run at the shared mix and
the shared reference dir. The engine's own lock on a reference dir orders the runs that reach it together
(one makes it, the others wait and reuse it); the mix is built once, under a file lock, before any run reads it.

A run that changes what its reference trains (another horizon, another mix) must not use these: it would
remake the shared reference, and the next run would remake it again.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from trainer_helpers import shared

REPO_ROOT = Path(__file__).resolve().parents[1]
# The local target's mix (specs/lib/p4_common.yaml `mix_fetch_extra`), built where the specs' fetch finds it.
MIX_BUILD = ["--if-missing-build-synthetic", "--tokens", "4000000", "--val-tokens", "400000", "--vocab", "512"]


@dataclass(frozen=True)
class SharedP4:
    root: Path

    @property
    def mix_repo(self) -> str:
        return f"file://{self.root}/store/local/mix-synthetic-v1"

    def reference_dir(self, spec: str, mode: str = "smoke") -> Path:
        return self.root / "reference" / f"{Path(spec).stem}-{mode}"

    def mix_sets(self) -> tuple[str, ...]:
        """`--set`s for a run that only shares the mix (one whose reference trains something else)."""
        return (f"mix_root={self.root / 'mix'}", f"mix_repo={self.mix_repo}")

    def sets(self, spec: str, mode: str = "smoke") -> tuple[str, ...]:
        """`--set`s for `engine run SPEC`: the shared mix, the shared reference dir of (spec, mode), and the
        trainer's code named as one path (a spec in a temporary folder names it from there otherwise)."""
        return (
            *self.mix_sets(),
            f"reference_dir={self.reference_dir(spec, mode)}",
            f"trainer_code={REPO_ROOT / 'trainer'}",
        )


def _build(where: Path) -> Path:
    argv = [sys.executable, "-m", "trainer.data.mix", "fetch", "--repo", SharedP4(where).mix_repo]
    argv += ["--out", str(where / "mix"), *MIX_BUILD]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"building the shared mix failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return where


def shared_p4(tmp_path_factory: pytest.TempPathFactory) -> SharedP4:
    """The session's shared P4 work (built by the first caller): the fixture `p4_shared` of tests/test_e2e/."""
    return SharedP4(shared("p4-e2e", tmp_path_factory, _build))
