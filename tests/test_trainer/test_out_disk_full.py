"""A full disk under the trainer's --out: the checkpoint cannot be written, and the trainer says that the disk is
full, naming the folder, instead of torch's "unexpected pos N vs M" (trainer/ckpt/checkpointer.py disk_full).

The disk is really full: --out is a small tmpfs mounted in a mount namespace of the trainer's own (unshare, as an
unprivileged user where the machine allows user namespaces), so the write fails with ENOSPC inside torch.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys

import pytest
from trainer_helpers import explain, pointer, run_trainer, single_cmd, store_url, tiny_mix, trainer_args

from trainer.ckpt.checkpointer import disk_full

CKPT_BYTES = 1_439_376  # the tiny model's five checkpoint files at step 2 (`CKPT save ... bytes=`)


def can_mount_a_private_tmpfs() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return False
    probe = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not can_mount_a_private_tmpfs(), reason="no unprivileged tmpfs (user namespaces) on this machine")
def test_a_full_out_disk_is_reported_as_a_full_disk_naming_the_folder(tmp_path, tmp_path_factory):
    mix, out, repo = tiny_mix(tmp_path_factory), tmp_path / "out", store_url(tmp_path / "store")
    out.mkdir()
    args = trainer_args(root=mix, out=out, repo=repo, steps=4, push_every=2, nproc=1, val_tokens=0)
    # 700 KiB for --out: the first checkpoint (about 1.4 MB) does not fit.
    mount = 'mount -t tmpfs -o size=700k tmpfs "$1" && shift && exec "$@"'
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount, "sh", str(out), *single_cmd(args)]
    run = run_trainer(cmd, timeout=120)
    assert run.rc == 4, explain(run)
    (failed,) = run.starting("CKPT FAILED: ")
    folder = out / "ckpt" / "checkpoint-2"
    assert failed.startswith(
        f"CKPT FAILED: push of step=2 to {repo} failed: DiskFull: cannot write the checkpoint of step 2 into "
        f"{folder}: the disk is full ("
    ), explain(run)
    assert f"the checkpoint takes about {CKPT_BYTES:,}). Free space there or give --out a folder on a larger disk" in (
        failed
    )
    assert pointer(repo) is None  # nothing was pushed


def test_a_full_disk_is_told_from_another_write_failure(tmp_path):
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(tmp_path, enospc).startswith("No space left on device; ")
    wrapped = RuntimeError("writing failed")
    wrapped.__cause__ = enospc
    assert disk_full(tmp_path, wrapped).startswith("No space left on device; ")
    # This disk has room: torch's short-write error alone does not make it full.
    assert disk_full(tmp_path, RuntimeError("unexpected pos 532352 vs 532244"), expect_bytes=CKPT_BYTES) is None
    assert disk_full(tmp_path, OSError(errno.EACCES, "Permission denied")) is None
