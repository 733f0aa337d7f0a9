"""Where a session starts. Rank 0 alone reads the store and decides (the pointer to resume from, a fresh
start, or a refusal) and broadcasts the decision; each host's local rank 0 downloads and verifies the
pointer's files; every rank then loads the checkpoint, which must have been written under this run's
identity (its config hash), and all ranks agree on any error so that they exit together.

The decision takes the store's lease (rank 0's checkpointer). ``resume`` hands that checkpointer to the
caller in :class:`Start` when it returns; when it raises instead (a refusal, a crash, a SIGTERM), it has
released the lease first, so a failed start never leaves the store locked for the next machine.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from trainer.ckpt.checkpointer import Checkpointer, Pointer, read_pointer
from trainer.ckpt.load import load_checkpoint
from trainer.ckpt.scan import ResumeRefused, ResumeScan, fetch
from trainer.dist import Dist
from trainer.log import emit
from trainer.plan import RunPlan
from trainer.runconfig import RunIdentity, show_value
from trainer.store import RepoMissing, Store, StoreError, open_store, redact_url
from trainer.store.hub_settings import HubSettings


class Refused(Exception):
    """A precondition the run refuses to proceed without (exit code 3)."""


@dataclass
class Start:
    step: int  # the step this session starts after (0: a fresh start)
    loaded: dict[str, Any] | None  # the checkpoint's step, tokens, optimizer state and this rank's RNG
    checkpointer: Checkpointer | None  # rank 0's, over the store the pushes go to
    config_changes: list[dict[str, Any]]  # what --allow-config-change let this resume change (every rank)


def resume(
    dist: Dist,
    args: argparse.Namespace,
    plan: RunPlan,
    model: torch.nn.Module,
    *,
    identity: RunIdentity,
    log: Callable[[str], None],
    hub: HubSettings | None = None,
) -> Start:
    """Decide, fetch and load (module docstring); the weights go into `model`. Refused on every rank. ``hub``:
    the Hub client's settings main read (trainer/store/hub_settings.py)."""
    opener = partial(open_store, args.hub_repo, token=os.environ.get("HF_TOKEN") or None, hub=hub)
    held: list[Checkpointer] = []  # rank 0's checkpointer (and its lease) from the moment it exists
    try:
        pointer = _decide(dist, args, plan, identity=identity, opener=opener, held=held)
        return _start(dist, args, plan, model, pointer, held[0] if held else None, identity, log, opener)
    except BaseException:
        for checkpointer in held:
            checkpointer.close()  # the caller never gets it: the lease goes with the failed start
        raise


def _start(
    dist: Dist,
    args: argparse.Namespace,
    plan: RunPlan,
    model: torch.nn.Module,
    pointer: Pointer | None,
    checkpointer: Checkpointer | None,
    identity: RunIdentity,
    log: Callable[[str], None],
    opener: Callable[[], Store],
) -> Start:
    """Fetch and load what ``_decide`` chose; the weights go into `model`."""
    ckpt_dir = plan.resume_path if pointer is None else _fetch(dist, args, pointer, checkpointer, opener=opener)
    start, loaded = 0, None
    if ckpt_dir is not None:
        loaded = _load(dist, Path(ckpt_dir), model, plan, identity=identity)
        start = loaded["step"]
        where = pointer.path_in_repo if pointer is not None else str(ckpt_dir)
        log(f"resume from step {start} ({where}) tokens={loaded['tokens']}")
        for c in loaded["config_changes"]:  # allowed by --allow-config-change: said, and recorded in RUN_JSON
            log(
                f"config change allowed: {c['field']}: {show_value(c['old'])} -> {show_value(c['new'])} "
                f"(--allow-config-change)"
            )
    # A pointer AT the horizon that is not terminal: the session that trained to the horizon died between
    # its ckpt/ push and its final/ push. Resuming finishes that push, with no training.
    finishing = start == plan.total_steps == plan.stop_step
    if start >= plan.stop_step and not finishing:
        raise Refused(
            f"nothing to train: resumed at step {start} but this session stops at step "
            f"{plan.stop_step} (--stop-after-steps {args.stop_after_steps}); a stale stop step "
            "would overwrite newer checkpoints"
        )
    return Start(start, loaded, checkpointer, loaded["config_changes"] if loaded else [])


def _decide(
    dist: Dist,
    args: argparse.Namespace,
    plan: RunPlan,
    *,
    identity: RunIdentity,
    opener: Callable[[], Store],
    held: list[Checkpointer],
) -> Pointer | None:
    """Rank 0 opens the store and decides (the pointer to resume from, or None), every rank learns it. Rank 0's
    checkpointer goes into ``held`` as soon as it exists. Refused on every rank."""
    url = redact_url(args.hub_repo)
    decision: dict[str, Any] = {"error": None, "pointer": None}
    if dist.master:
        try:
            store = opener()
            checkpointer = Checkpointer(
                store,
                log=emit,
                prune=args.prune,
                keep_optimizer_states=args.keep_optimizer_states,
                allow_rollback=args.allow_pointer_rollback,
            )
            held.append(checkpointer)
            if plan.resume_mode in ("auto", "must"):
                scan = ResumeScan(checkpointer, allow_changes=plan.allowed_changes)
                decision["pointer"] = scan.decide(
                    identity=identity, horizon_step=plan.total_steps, require_run=plan.resume_mode == "must"
                )
            else:
                _check_store(store, url, refuse_a_run=plan.resume_mode == "never")
        except (ResumeRefused, StoreError, Refused, ValueError, OSError) as e:
            # ValueError: a malformed latest.json or store URL; OSError: an unusable local store.
            decision["error"] = str(e)
            for checkpointer in held:
                checkpointer.close()  # before the other ranks hear of the refusal and exit
    decision = dist.from_master(decision)
    if decision["error"]:
        raise Refused(decision["error"])
    return decision["pointer"]


def _fetch(
    dist: Dist,
    args: argparse.Namespace,
    pointer: Pointer,
    checkpointer: Checkpointer | None,
    *,
    opener: Callable[[], Store],
) -> Path:
    """Each host's local rank 0 downloads the pointer's files; every rank returns the directory its host
    fetched into. Refused on every rank."""
    ckpt_dir = None
    err = None
    if dist.local_rank == 0:
        try:
            store = checkpointer.store if checkpointer is not None else opener()
            ckpt_dir = fetch(store, pointer, args.out / "ckpt" / Path(pointer.path_in_repo).name)
        except (StoreError, OSError) as e:
            err = f"fetching {pointer.path_in_repo} from {redact_url(args.hub_repo)}: {e}"
    if err := dist.agree(err):
        raise Refused(err)
    # torchrun numbers the ranks of one host contiguously: the host's local rank 0 is rank - local_rank.
    paths = dist.gather(str(ckpt_dir) if dist.local_rank == 0 else None)
    return Path(paths[dist.rank - dist.local_rank])


def _load(
    dist: Dist, ckpt_dir: Path, model: torch.nn.Module, plan: RunPlan, *, identity: RunIdentity
) -> dict[str, Any]:
    """Every rank loads the checkpoint, each file checked (trainer/ckpt/load.py); Refused on every rank
    when any rank cannot."""
    err, loaded = None, None
    try:
        loaded = load_checkpoint(
            ckpt_dir,
            model,
            dist,
            identity=identity,
            tokens_per_step=plan.tokens_per_step,
            total_steps=plan.total_steps,
            allowed=plan.allowed_changes,
        )
    except (OSError, ValueError) as e:  # Unloadable and a refused config change are ValueErrors
        err = f"resume from {ckpt_dir}: {e}"
    if err := dist.agree(err):
        raise Refused(err)
    assert loaded is not None
    return loaded


def _check_store(store: Store, url: str, *, refuse_a_run: bool) -> None:
    """--resume never / PATH: the store must be usable for the pushes to come; `never` also insists that it
    holds no run yet, so a fresh start cannot silently fork an existing one."""
    try:
        ptr = read_pointer(store)
    except RepoMissing:
        store.create()
        ptr = None
    if not store.exists():
        store.create()
    if refuse_a_run and ptr is not None:
        raise Refused(
            f"--resume never but {url} already has a pointer at step {ptr.step} "
            f"({ptr.path_in_repo}); use --resume auto or a fresh repo"
        )
