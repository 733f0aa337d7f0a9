"""Reference runs: a run step that runs the same configuration uninterrupted to the horizon, whose
evidence is reused across runs while its definition and inputs are unchanged.

A reference step names its directory (`reference.dir`, one that does not depend on the run): it
writes there, and the engine keeps there, in `.specprobe/`, the reference's record (`reference.json`:
the step's evidence, its definition, the digests of its inputs and of the folders it keeps) and a
copy of its log. The reuse key is the step's fingerprint plus its inputs' digests
(engine/run/digests.py: the code's git tree and uncommitted changes, package versions, files). On a
match, with every kept folder present and unchanged since, the run copies the saved record into
its evidence and runs nothing; otherwise it says in one line why not, empties the directory and
runs the step, and saves the record only when the step ended ok. A collect step with
`reference: {of: STEP}` belongs to the reference STEP: it is reused with it.

Concurrent runs share the directory through a lock (`.specprobe/lock`): a run reading a
reference holds it shared until its end, a run making one holds it exclusively while it empties
the directory and runs the step; waiting is bounded by the step's own worst case. Every file the
engine keeps there is written atomically, and a reference is invalidated before its directory is
touched, so a half-written or failed reference is never reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine.run import evidence
from engine.run.digests import changes, input_digests, keyed, tree_digest
from engine.run.output import reharvest
from engine.run.snapshot import remove_path
from engine.spec.plan import fingerprint, step_definition
from engine.text import definition_changes

FORMAT = 1
ENGINE_DIR = ".specprobe"
RECORD = "reference.json"
LOCK_POLL_S = 0.2
NONE_SAVED = "none saved there yet"


class ReferenceError(Exception):
    """The reference directory cannot be used (not the engine's, locked for too long, unwritable)."""


def reuse_key(step: Mapping[str, Any], digests: Mapping[str, Any]) -> str:
    """sha256 of the step's fingerprint and the keyed part of its inputs' digests."""
    text = json.dumps({"fingerprint": fingerprint(step), "inputs": keyed(digests)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A document the engine keeps in a reference dir, or why it cannot be used."""
    try:
        doc = evidence.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("record"), dict):
        return None, f"{path} is not a reference record this engine writes"
    return doc, None


class ReferenceDir:
    """One reference's directory, as one run uses it: the lock (held from the decision to the end
    of the run), the saved record, and what this run made or reused."""

    def __init__(self, root: Path, say: Callable[[str], None]) -> None:
        self.root = root
        self.home = root / ENGINE_DIR
        self.say = say
        self.fd: int | None = None
        self.saved: dict[str, Any] | None = None  # the record reused, or the one this run saved

    # ------------------------------------------------------------------ the lock

    def _open_lock(self) -> int:
        if self.root.exists() and not (self.home / "lock").exists() and any(self.root.iterdir()):
            raise ReferenceError(
                f"reference dir {self.root} holds files and no {ENGINE_DIR}/: the engine empties a reference "
                f"dir before it makes a reference, and this one is not a reference's; choose a new directory"
            )
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            return os.open(self.home / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise ReferenceError(f"reference dir {self.root}: cannot lock it: {exc.strerror or exc}") from None

    def lock(self, exclusive: bool, wait_s: float) -> None:
        """Hold the lock shared (reading) or exclusive (making); waits at most `wait_s`, saying so once."""
        if self.fd is None:
            self.fd = self._open_lock()
        else:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        how = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(self.fd, how | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            if time.monotonic() >= deadline:
                raise ReferenceError(
                    f"reference dir {self.root}: another run held it for {wait_s:g} s (the step's worst case) "
                    f"while {'reading' if exclusive else 'making'} its reference"
                )
            if not told:
                told = True
                self.say(f"   waiting for the reference in {self.root}: another run is making or reading it")
            time.sleep(LOCK_POLL_S)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None

    # ------------------------------------------------------------------ the saved record

    def read(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the saved record, None), or (None, why there is none to reuse)."""
        doc, why = _read_json(self.home / RECORD)
        if doc is None:
            return None, why or NONE_SAVED
        return doc, None

    def kept_digests(self, keep: list[str]) -> dict[str, Any]:
        """Each kept path (relative to the dir) -> its tree digest (None when absent)."""
        return {rel: tree_digest(self.root / rel, (ENGINE_DIR,) if rel == "." else ()) for rel in keep}

    def mismatch(
        self,
        saved: Mapping[str, Any],
        key: str,
        definition: Mapping[str, Any],
        digests: Mapping[str, Any],
        keep: list[str],
    ) -> list[str]:
        """Why the saved reference is not this one (empty when it is, kept folders unchanged included)."""
        if saved.get("key") != key:
            old_def = saved.get("definition") if isinstance(saved.get("definition"), dict) else {}
            why = [f"definition: {c}" for c in definition_changes(old_def, dict(definition))]
            why += changes(saved.get("inputs") or {}, digests)
            return why or ["its key differs (a secret value of the definition, which the record does not keep)"]
        log = saved.get("log")
        if not isinstance(log, str) or not (self.home / Path(log).name).is_file():
            return [f"its log is missing from {self.home}"]
        kept = saved.get("kept") if isinstance(saved.get("kept"), dict) else {}
        try:
            now = self.kept_digests(keep)
        except OSError as exc:
            return [f"a kept folder cannot be read: {exc}"]
        out = []
        for rel, found in now.items():
            if found is None:
                out.append(f"kept {rel} is missing")
            elif (kept.get(rel) or {}).get("sha256") != found["sha256"]:
                out.append(f"kept {rel} changed since it was made")
        return out

    def invalidate(self) -> None:
        """Forget the saved reference (its record, members and log), then empty the directory but the lock."""
        for entry in sorted(self.home.iterdir()) if self.home.is_dir() else []:
            if entry.name != "lock":
                remove_path(entry)
        for entry in sorted(self.root.iterdir()):
            if entry.name != ENGINE_DIR:
                remove_path(entry)
        self.saved = None

    def write(self, name: str, doc: Mapping[str, Any]) -> None:
        evidence.write_document(self.home / name, evidence.dumps(doc) + "\n")


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "step"


class References:
    """The reference steps of one run: decided when each comes up (`before`), saved when it ends ok
    (`after`), their locks released when the run ends (`close`). `mask` is the run's secret filter,
    `say` its console, `fresh` the run's --fresh-reference."""

    def __init__(
        self,
        run_dir: Path,
        started_at: str,
        mask: Callable[[Any], Any],
        say: Callable[[str], None],
        fresh: bool = False,
    ) -> None:
        self.run_dir, self.started_at, self.mask, self.say, self.fresh = run_dir, started_at, mask, say, fresh
        self.dirs: dict[str, ReferenceDir] = {}
        self.made: dict[str, dict[str, Any]] = {}  # step -> {key, inputs} of a reference this run is making

    def before(self, step: Mapping[str, Any], record: dict[str, Any], state: dict[str, Any]) -> bool:
        """Before a step that is (or belongs to) a reference runs: True when its evidence was reused
        (filled into `record`, and `state` for a member), False when it must run. ReferenceError when
        its directory cannot be used."""
        ref = step.get("reference") or {}
        if ref.get("of"):
            return self._member_reused(step, ref["of"], record, state)
        if not ref.get("dir"):
            return False
        return self._decide(step, record)

    def _decide(self, step: Mapping[str, Any], record: dict[str, Any]) -> bool:
        ref, name = step["reference"], step["name"]
        root = Path(os.path.abspath(os.path.expanduser(str(ref["dir"]))))
        keep = [os.path.normpath(str(k)) for k in ref.get("keep") or ["."]]
        wait_s = float(step["run"]["timeout_s"]) + float(step["run"].get("grace_s") or 0)
        place = self.dirs[name] = ReferenceDir(root, self.say)
        place.lock(False, wait_s)
        digests = input_digests(ref.get("inputs") or {})
        for folder in [f for f, rev in (digests.get("git") or {}).items() if rev.get("missing")]:
            # Keyed as "missing", no change of that code would move the key: said, not silent. (An installed
            # package has no source folder beside the spec; its version, when a packages input, keys it.)
            self.say(
                f"   WARNING: reference input {folder} is not there: no change of that code makes a new "
                f"reference; name the folder the run's code lives in"
            )
        key = reuse_key(step, digests)
        definition = self.mask(step_definition(step))
        why = ["--fresh-reference"] if self.fresh else self._why_not(place, key, definition, digests, keep)
        if not why:
            return self._reuse(step, place, record, keep)
        place.lock(True, wait_s)
        if not self.fresh and not self._why_not(place, key, definition, digests, keep):  # made meanwhile
            place.lock(False, wait_s)
            return self._reuse(step, place, record, keep)
        if why == [NONE_SAVED]:
            self.say(f"   no reference saved in {root} yet: making it")
        else:
            self.say(f"   not reusing the reference in {root}: {'; '.join(why)}; making a new one")
        place.invalidate()
        self.made[name] = {"key": key, "inputs": digests, "definition": definition, "keep": keep}
        record["reference"] = {"dir": str(root), "key": key, "inputs": digests, "reused_from": None, "saved": False}
        return False

    def _why_not(self, place: ReferenceDir, key: str, definition: Any, digests: Any, keep: list[str]) -> list[str]:
        saved, why = place.read()
        return [why] if saved is None else place.mismatch(saved, key, definition, digests, keep)

    def _reuse(self, step: Mapping[str, Any], place: ReferenceDir, record: dict[str, Any], keep: list[str]) -> bool:
        saved, _ = place.read()
        assert saved is not None
        place.saved = saved
        name = step["name"]
        log_rel = f"logs/{_safe_name(name)}.log"
        remove_path(self.run_dir / log_rel)  # never written through what an earlier step left there
        shutil.copyfile(place.home / Path(saved["log"]).name, self.run_dir / log_rel)
        record.clear()
        record.update(saved["record"])
        record["log"] = log_rel
        # Harvested again with the spec's current output rules: they are not part of the key.
        fresh = reharvest(step, self.run_dir / log_rel, self.run_dir)
        record.update({k: fresh[k] for k in ("harvest", "harvest_errors", "lines", "progress")})
        record["reference"] = {
            "dir": str(place.root),
            "key": saved["key"],
            "inputs": saved.get("inputs"),
            "kept": saved.get("kept"),
            "reused_from": saved.get("made_in"),
            "made_at": saved.get("made_at"),
        }
        self.say(f"   reusing reference from {saved.get('made_in')} (same definition)")
        return True

    def after(self, step: Mapping[str, Any], record: dict[str, Any], state: dict[str, Any]) -> None:
        """After a step that is (or belongs to) a reference ran: save it for later runs when it ended ok."""
        ref = step.get("reference") or {}
        if ref.get("of"):
            self._save_member(step, ref["of"], record, state)
        elif step["name"] in self.made:
            self._save(step, record)

    def _save(self, step: Mapping[str, Any], record: dict[str, Any]) -> None:
        name = step["name"]
        made, place = self.made.pop(name), self.dirs[name]
        if record.get("status") != "ok":
            self.say(f"   the reference {name} did not end ok: nothing kept for later runs")
            return
        kept = place.kept_digests(made["keep"])
        missing = [rel for rel, found in kept.items() if found is None]
        if missing:
            record.update({"status": "failed", "error": f"the reference left no {', '.join(missing)} in {place.root}"})
            self.say(f"   {record['error']}: nothing kept for later runs")
            return
        log_name = f"{_safe_name(name)}.log"
        shutil.copyfile(self.run_dir / str(record["log"]), place.home / log_name)
        record["reference"].update({"kept": kept, "saved": True, "made_at": self.started_at})
        saved = {
            "format": FORMAT,
            "step": name,
            "key": made["key"],
            "fingerprint": fingerprint(step),
            "definition": made["definition"],
            "inputs": made["inputs"],
            "kept": kept,
            "record": self.mask(record),
            "log": f"{ENGINE_DIR}/{log_name}",
            "made_in": str(self.run_dir),
            "made_at": self.started_at,
        }
        place.write(RECORD, saved)
        place.saved = saved
        # The lock stays exclusive to the end of the run: handed down to shared, another run could
        # take it between the two and empty what this run's later steps read.
        self.say(f"   saved the reference in {place.root} for later runs (key {made['key'][:12]})")

    def _member_reused(self, step: Mapping[str, Any], of: str, record: dict[str, Any], state: dict[str, Any]) -> bool:
        place = self.dirs.get(of)
        if place is None or place.saved is None or of in self.made:
            return False
        doc, _ = _read_json(place.home / f"member-{_safe_name(step['name'])}.json")
        if doc is None or doc.get("key") != place.saved.get("key") or doc.get("fingerprint") != fingerprint(step):
            return False
        record.clear()
        record.update(doc["record"])
        record["reference"] = {"of": of, "reused_from": doc.get("made_in")}
        if "state" in doc:
            state[step["name"]] = doc["state"]
        self.say(f"   reusing {step['name']} with the reference {of} from {doc.get('made_in')}")
        return True

    def _save_member(self, step: Mapping[str, Any], of: str, record: dict[str, Any], state: Mapping[str, Any]) -> None:
        place = self.dirs.get(of)
        if place is None or place.saved is None or record.get("status") != "ok":
            return
        doc = {
            "format": FORMAT,
            "step": step["name"],
            "key": place.saved["key"],
            "fingerprint": fingerprint(step),
            "record": self.mask(record),
            "made_in": str(self.run_dir),
        }
        if step["name"] in state:
            doc["state"] = self.mask(state[step["name"]])
        place.write(f"member-{_safe_name(step['name'])}.json", doc)
        record["reference"] = {"of": of, "reused_from": None}

    def carried(self, step: Mapping[str, Any], record: Mapping[str, Any]) -> str | None:
        """A reference a resumed run (`--from` a later step) takes over from the earlier attempt: its
        directory locked (shared) for this run, and why it no longer holds what that attempt
        recorded (another run made a new one since), or None."""
        ref, kept = record.get("reference"), (record.get("reference") or {}).get("kept")
        if not (step.get("reference") or {}).get("dir") or not isinstance(ref, dict) or not isinstance(kept, dict):
            return None
        place = self.dirs[step["name"]] = ReferenceDir(Path(str(ref.get("dir"))), self.say)
        place.lock(False, float(step["run"]["timeout_s"]) + float(step["run"].get("grace_s") or 0))
        place.saved, _ = place.read()
        now = place.kept_digests(list(kept))
        moved = [
            rel for rel, found in now.items() if (found or {}).get("sha256") != (kept.get(rel) or {}).get("sha256")
        ]
        if moved:
            return (
                f"the reference in {place.root} changed since the run it is reused from ({', '.join(moved)}): "
                f"another run made a new one; resume at {step['name']} (--from {step['name']})"
            )
        return None

    def close(self) -> None:
        for place in self.dirs.values():
            place.release()


def reusable(plan: Any, name: str) -> bool:
    """Whether the saved reference of step `name` has this plan's key (without the lock, and
    without reading its kept folders): for the budget, where a reused reference costs nothing."""
    step = next((s for s in plan.steps if s["name"] == name), None)
    ref = (step or {}).get("reference") or {}
    if not ref.get("dir"):
        return False
    place = ReferenceDir(Path(os.path.abspath(os.path.expanduser(str(ref["dir"])))), lambda text: None)
    saved, _ = place.read()
    return saved is not None and saved.get("key") == reuse_key(step, input_digests(ref.get("inputs") or {}))
