"""What counts as the same run across a resume: :class:`RunIdentity` (the run config and its hash), the
run-config fields hashed, the changes a refusal names, and the recipe fields that ``--allow-config-change``
may let a resume change.

A checkpoint's ``trainer_state.json`` records the run config (built by trainer/plan.py ``run_identity``) and
its ``config_hash``; a resume whose hash differs is another run unless every changed field was allowed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = [
    "RunIdentity",
    "CONFIG_HASH_FIELDS",
    "CHANGEABLE_FIELDS",
    "config_hash",
    "config_diff",
    "config_changes",
    "show_value",
    "unallowed_changes",
    "judge_config_change",
]

# What a resume cannot silently change: every run_config field that changes the weights the run ends
# with (the data mix and the token stream, the step shape, the optimisation recipe, the precision and the model
# options that change what is computed, trainer/model/options.py). `mix` is the mix's hash
# (trainer/data/shards.py mix_hash): another mix of the same shape reads other documents at every position.
# Left out: tokens_per_step and total_steps, which are functions of the fields here.
CONFIG_HASH_FIELDS = (
    "mix",
    "model",
    "seq_len",
    "micro_batch",
    "accum",
    "world_size",
    "tokens",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "schedule",
    "seed",
    "precision",
    "numerics",
)
# What `--allow-config-change` may let a resume change on purpose: the recipe, and the mix (training on in
# another mix is a choice: a curriculum, a fine-tune). The others decide which samples each rank reads and the
# tensors' shapes (model, seq_len, micro_batch, accum, world_size) or the data order and the init (seed): a
# resume with another of them is another run, not a changed one.
CHANGEABLE_FIELDS = (
    "mix",
    "tokens",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "schedule",
    "precision",
    "numerics",
)
_ABSENT = object()


@dataclass(frozen=True)
class RunIdentity:
    """What makes a session part of one run: its run config (recorded in every checkpoint's
    trainer_state.json) and ``hash``, the config hash of the CONFIG_HASH_FIELDS that every pointer and
    checkpoint carries. The hash is computed here from the config, so the two cannot disagree or travel
    apart; anything else that decides whether two sessions are one run belongs in the config and its
    hashed fields. ValueError naming the fields a config lacks."""

    config: dict[str, Any]
    hash: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", dict(self.config))  # a copy: the caller's dict may change later
        object.__setattr__(self, "hash", config_hash(self.config))


def config_hash(run_config: Mapping[str, Any]) -> str:
    """sha256 over canonical JSON of CONFIG_HASH_FIELDS; ValueError naming any that are missing."""
    missing = [k for k in CONFIG_HASH_FIELDS if k not in run_config]
    if missing:
        raise ValueError(
            f"run config lacks {missing} needed for the resume config hash (fields: {list(CONFIG_HASH_FIELDS)})"
        )
    canon = json.dumps(
        {k: run_config[k] for k in CONFIG_HASH_FIELDS},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        default=str,
    )
    return hashlib.sha256(canon.encode()).hexdigest()


def config_diff(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(field, old, new) for each CONFIG_HASH_FIELDS field that differs between two run configs (None for an
    absent value); a dict-valued field (numerics) is compared key by key, as field.key."""
    out: list[tuple[str, Any, Any]] = []
    for k in CONFIG_HASH_FIELDS:
        a, b = old.get(k, _ABSENT), new.get(k, _ABSENT)
        if isinstance(a, dict) or isinstance(b, dict):
            a, b = (a if isinstance(a, dict) else {}), (b if isinstance(b, dict) else {})
            out += [
                (f"{k}.{n}", a.get(n), b.get(n))
                for n in sorted(set(a) | set(b))
                if a.get(n, _ABSENT) != b.get(n, _ABSENT)
            ]
        elif a != b:
            out.append((k, None if a is _ABSENT else a, None if b is _ABSENT else b))
    return out


def config_changes(old: dict, new: dict) -> list[str]:
    """config_diff() as 'field: old -> new' lines (values as JSON)."""
    return [f"{k}: {show_value(a)} -> {show_value(b)}" for k, a, b in config_diff(old, new)]


def show_value(value: Any) -> str:
    """A run-config value for a message: floats to 6 significant digits (lr/10 is 0.00030000000000000003),
    the rest as JSON."""
    if value is None:
        return "(absent)"
    if isinstance(value, float):
        return repr(value) if len(repr(value)) <= 12 else format(value, ".6g")
    return json.dumps(value, sort_keys=True, default=str)


def unallowed_changes(diff: list[tuple[str, Any, Any]], allowed: frozenset[str]) -> list[str]:
    """The fields of `diff` that `allowed` (names from --allow-config-change; `numerics` covers every
    numerics.* option) does not cover."""
    return [k for k, _, _ in diff if k not in allowed and k.split(".")[0] not in allowed]


def judge_config_change(
    stored: dict | None, stored_hash: str, identity: RunIdentity, allowed: frozenset[str], where: str
) -> list[dict[str, Any]]:
    """A config hash mismatch between a checkpoint (its stored run config and hash) and this run: the
    changes, as [{field, old, new}], when --allow-config-change covers every one; ValueError saying what
    changed and what to do otherwise."""
    if not isinstance(stored, dict):
        raise ValueError(
            f"{where} was written with config_hash {stored_hash}, this run has {identity.hash}: one of "
            f"{', '.join(CONFIG_HASH_FIELDS)} changed, and its run config cannot be read to say which; resuming "
            "would mix two runs. Resume with the original configuration or use a new repo."
        )
    diff = config_diff(stored, identity.config)
    lines = "; ".join(f"{k}: {show_value(a)} -> {show_value(b)}" for k, a, b in diff) or "no recorded field differs"
    bad = unallowed_changes(diff, allowed)
    if diff and not bad:
        return [{"field": k, "old": a, "new": b} for k, a, b in diff]
    fixed = [k for k in bad if k.split(".")[0] not in CHANGEABLE_FIELDS]
    how = (
        (
            f"these fields cannot change across a resume: {', '.join(fixed)} (they decide the step's shape, "
            "the samples each rank reads or the data order): use the original values or a new repo"
            if fixed
            else f"to change it on purpose, resume with --allow-config-change {','.join(bad)}; otherwise use the "
            "original flags or a new repo"
        )
        if diff
        else "use the original flags or a new repo"
    )
    raise ValueError(
        f"{where} was written under another configuration (changed: {lines}); resuming would "
        f"mix two runs silently. {how[0].upper()}{how[1:]}."
    )
