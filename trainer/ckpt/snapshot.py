"""Checkpoint snapshots: rank 0's copy of the training state into host memory, taken on the training
thread and read by the push thread.

sync (the CPU default): blocking copies into a shadow model and a host copy of the optimizer state.
async (the CUDA default): pinned host buffers are allocated once, before the first step, and a copy plan
is built once, after it; a snapshot only enqueues the copies on a side stream (which first waits for the
step that produced the state) and records an event. The next optimizer step waits for that event on the
device (it would overwrite what is being copied), and the push thread waits for it before reading. The
pause a snapshot costs the training loop (`snapshot_s=` on the `CKPT save` line) is the thread's time
plus the time the training stream waited for the copies (`device_wait_s=`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn as nn


def to_host(obj: Any) -> Any:
    """Deep copy of a (nested) state dict with every tensor copied to CPU memory."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return obj


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class PendingCopy:
    """Snapshot copies in flight on a side stream (cuda), or already done (cpu: `event` is None)."""

    def __init__(self, event: Any = None, device: Any = None):
        self.event, self.device = event, device
        self.reached: Any = None  # timing event recorded where the training stream waits for `event`

    def wait_on_current_stream(self) -> None:
        """Training thread, just before the optimizer step: the device waits, this thread does not."""
        if self.event is None:
            return
        reached = torch.cuda.Event(enable_timing=True)
        reached.record()
        torch.cuda.current_stream().wait_event(self.event)
        self.reached = reached  # set only once recorded: the push thread may read it at any time

    def finish(self) -> float:
        """Push thread: blocks until the copies are done; returns the seconds the training stream spent
        waiting for them (0 when it had not reached its optimizer step by then)."""
        if self.event is None:
            return 0.0
        with torch.cuda.device(self.device):
            self.event.synchronize()
            reached = self.reached
            # `reached` not recorded yet, or not yet reached by the device: the copies are done, so the
            # stream will pass its wait without stopping. Reached: it stopped from then to the copies' end.
            if reached is None or not reached.query():
                return 0.0
            return max(reached.elapsed_time(self.event), 0.0) / 1000


class _Slot(NamedTuple):
    """Where a state tensor lands in HostBuffers' flat buffer of its dtype."""

    dtype: Any
    offset: int
    shape: tuple


def copy_runs(items: Sequence[tuple[Any, int]], limits: dict) -> list[tuple[int, int]]:
    """[(i, j)]: items[i:j] (dtype, numel) copied as one run, consecutive and of one dtype, at most
    limits[dtype] elements together (no limit for a dtype not in limits); an item over its limit alone."""
    runs: list[tuple[int, int]] = []
    start, total = 0, 0
    for k, (dtype, n) in enumerate(items):
        limit = limits.get(dtype)
        if k > start and (dtype != items[start][0] or (limit is not None and total + n > limit)):
            runs.append((start, k))
            start, total = k, 0
        total += n
    if items:
        runs.append((start, len(items)))
    return runs


class HostBuffers:
    """Host buffers for snapshots, allocated once and reused: one flat buffer per dtype (pinned on cuda, so
    copies are async DMA), each state tensor a view of its slice.

    `start` enqueues the copy of every device tensor of the weights and of the optimizer state on a side
    stream that first waits for the training stream (the step that produced the state), and returns
    host-side state dicts that must not be read before `PendingCopy.finish()`. The tensors go in chunks:
    on cuda one torch.cat into a device staging buffer of at most STAGING_BYTES and one device-to-host copy
    a chunk, about 40 calls for the frozen model's ~800 tensors instead of 800 copies, each with its
    record_stream: enqueuing those one by one was most of the training thread's pause. The plan of runs
    and host views is built once (see prepare) and replayed by every later snapshot of the same tensors."""

    STAGING_BYTES = 64 * 2**20  # device memory lent to the copies: small next to a 4 GB budget

    def __init__(self, device: Any):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.flat: dict[Any, Any] = {}  # dtype -> flat host buffer
        self.staging: dict[Any, Any] = {}  # dtype -> flat device buffer (cuda)
        self.plan: _CopyPlan | None = None

    def _ensure(self, need: dict) -> int:
        """Flat host buffers of at least need[dtype] elements; returns the bytes newly allocated."""
        added = 0
        for dtype, n in need.items():
            have = self.flat.get(dtype)
            if have is None or have.numel() < n:
                self.flat[dtype] = torch.empty(n, dtype=dtype, pin_memory=self.cuda)
                added += n * self.flat[dtype].element_size()
            if self.cuda and dtype not in self.staging:
                rows = max(1, min(n, self.STAGING_BYTES // self.flat[dtype].element_size()))
                self.staging[dtype] = torch.empty(rows, dtype=dtype, device=self.device)
        return added

    def reserve(self, specs: Sequence[tuple]) -> int:
        """Room for every (shape, dtype) in specs (a multiset); returns the bytes allocated."""
        need: dict = {}
        for shape, dtype in specs:
            need[dtype] = need.get(dtype, 0) + math.prod(shape)
        return self._ensure(need)

    def start(self, weights: dict, opt_sd: dict, *, delay_s: float = 0.0) -> tuple[dict, dict, PendingCopy, int]:
        """weights: the model's state_dict(keep_vars=True) (the live tensors, the same objects every step);
        opt_sd: the optimizer's state_dict() (its state values are the live tensors too)."""
        added = self.prepare(weights, opt_sd)
        plan = self.plan
        ctx = contextlib.nullcontext()
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            ctx = torch.cuda.stream(self.stream)
        with ctx, torch.no_grad():
            if self.cuda and delay_s > 0:  # the torn-copy trap: copies start after the next step's opt
                torch.cuda._sleep(int(delay_s * 2e9))
            for srcs, stage, dst in plan.runs:
                if len(srcs) == 1:  # one tensor, straight into its host slice
                    dst.copy_(srcs[0], non_blocking=self.cuda)
                elif stage is not None:  # gathered on the device (one kernel), then one DMA to pinned memory
                    torch.cat(srcs, out=stage)
                    dst.copy_(stage, non_blocking=True)
                else:
                    torch.cat(srcs, out=dst)
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)

        def host(v: Any) -> Any:  # a cached view; any other tensor (a CPU scalar): copied now
            if isinstance(v, _Slot):
                return plan.views[v]
            return v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v

        w = {k: host(v) for k, v in plan.weights.items()}
        state = {k: {n: host(v) for n, v in st.items()} for k, st in plan.state.items()}
        rest = {k: to_host(v) for k, v in opt_sd.items() if k != "state"}
        # What the copies read stays alive in plan.live; a new plan replaces it only in a later start(),
        # after the push thread saw these copies finish (the trainer waits for the push first).
        return w, {"state": state, **rest}, PendingCopy(event, self.device), added

    def prepare(self, weights: dict, opt_sd: dict) -> int:
        """The copy plan for these live tensors, built unless the current one is theirs; returns the bytes
        of host buffers newly allocated. The trainer calls it once the optimizer state exists (after the
        first step), so that no checkpoint's pause pays for the build."""
        live = [*weights.values(), *(v for st in opt_sd["state"].values() for v in st.values())]
        if (
            self.plan is not None
            and len(live) == len(self.plan.live)
            and all(a is b for a, b in zip(live, self.plan.live))
        ):
            return 0
        return self._build_plan(weights, opt_sd, live)

    def _build_plan(self, weights: dict, opt_sd: dict, live: list) -> int:
        """Where each live tensor lands (its dtype's flat buffer, in walk order), the copy runs and the host
        views, built once: later snapshots of the same tensors only replay the runs (~40 calls). Returns
        the bytes of host buffers newly allocated."""
        offsets: dict = {}
        sources: list = []  # (flat device view, dtype, offset)

        def place(t: Any) -> Any:
            if not torch.is_tensor(t):
                return t
            if t.device.type != self.device.type or not t.is_contiguous():
                return t  # copied at each snapshot (see start); a flat view needs contiguity
            off = offsets.get(t.dtype, 0)
            offsets[t.dtype] = off + t.numel()
            sources.append((t.detach().reshape(-1), t.dtype, off))
            return _Slot(t.dtype, off, tuple(t.shape))

        w = {k: place(v) for k, v in weights.items()}
        state = {k: {n: place(v) for n, v in st.items()} for k, st in opt_sd["state"].items()}
        added = self._ensure(offsets)
        limits = {d: b.numel() for d, b in self.staging.items()}
        runs = []
        for i, j in copy_runs([(dt, t.numel()) for t, dt, _ in sources], limits):
            srcs, dtype, off = [t for t, _, _ in sources[i:j]], sources[i][1], sources[i][2]
            n = sum(t.numel() for t in srcs)
            stage = self.staging[dtype][:n] if self.cuda and len(srcs) > 1 else None
            runs.append((srcs, stage, self.flat[dtype][off : off + n]))
        views = {
            slot: self.flat[slot.dtype][slot.offset : slot.offset + math.prod(slot.shape)].view(slot.shape)
            for slot in [*w.values(), *(v for st in state.values() for v in st.values())]
            if isinstance(slot, _Slot)
        }
        self.plan = _CopyPlan(live, runs, w, state, views)
        return added


class _CopyPlan(NamedTuple):
    """HostBuffers' copies of one set of live tensors, replayed while start() is given the same objects."""

    live: list  # the tensors, in walk order (the plan's key, compared by identity)
    runs: list  # (flat sources, device staging slice or None, host slice)
    weights: dict  # the state dicts' structure: _Slot where a tensor is copied, else the value
    state: dict
    views: dict  # _Slot -> its host view


def snapshot_diff(got: Any, want: Any, path: str = "") -> str:
    """'ok tensors=N' when every tensor of `got` equals `want` bitwise (same dtype/shape/bytes), else
    'MISMATCH <first differing path>'. For SPECPROBE_SNAPSHOT_CHECK."""
    count = 0

    def walk(a: Any, b: Any, p: str) -> str | None:
        nonlocal count
        if torch.is_tensor(a) or torch.is_tensor(b):
            if not (torch.is_tensor(a) and torch.is_tensor(b)) or a.dtype != b.dtype or a.shape != b.shape:
                return p
            count += 1
            same = torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) if a.numel() else True
            return None if same else p
        if isinstance(a, dict) and isinstance(b, dict):
            if set(a) != set(b):
                return p + "{keys}"
            return next((r for k in a if (r := walk(a[k], b[k], f"{p}/{k}"))), None)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                return p + "[len]"
            return next((r for i, (x, y) in enumerate(zip(a, b)) if (r := walk(x, y, f"{p}[{i}]"))), None)
        return None if a == b else p

    bad = walk(got, want, path)
    return f"MISMATCH {bad}" if bad is not None else f"ok tensors={count}"


@dataclass
class Snapshot:
    """One checkpoint's training state on the host, as the training thread hands it to the push thread."""

    step: int
    opt_state: dict  # {"optimizer", "scheduler", "scaler"} state dicts on the host
    nbytes: int  # bytes of the weights and the optimizer state
    pause_s: float  # the training thread's time taking it
    parts: str = ""  # async: where that time went, for the CKPT save line
    weights: dict | None = None  # async: host views of the weights, valid once `pending` finished
    pending: PendingCopy | None = None  # async: the copies in flight
    check: tuple | None = None  # SPECPROBE_SNAPSHOT_CHECK: a blocking copy to compare with


class Snapshotter:
    """Rank 0's snapshots (module docstring). `new_model` builds a throwaway model of the same shape: the
    shadow whose state_dict the checkpoint writes. `emit` prints the `CKPT snapshot` lines."""

    def __init__(
        self,
        mode: str,
        check: float | None,
        device: torch.device,
        new_model: Callable[[], nn.Module],
        emit: Callable[[str], None],
    ):
        self.mode, self.check, self.device = mode, check, device
        self._new_model, self._emit = new_model, emit
        self.shadow: nn.Module | None = None
        self.buffers: HostBuffers | None = None
        self.wait: PendingCopy | None = None  # copies the next optimizer step must wait for
        self.pause_max_s = 0.0  # the longest pause of the training loop for a snapshot

    def _ensure_shadow(self) -> nn.Module:
        if self.shadow is None:
            with torch.random.fork_rng(devices=[]):  # its throwaway init must not advance rank 0's RNG
                self.shadow = self._new_model()
        return self.shadow

    def prepare(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        """async: the shadow model and the pinned host buffers, once, before the first step (allocation is
        not a training pause). The buffers are sized for the weights and for AdamW's state (two moments like
        each parameter and a scalar step), which does not exist yet on a fresh start; a layout that differs
        after all gets its missing buffers at the first snapshot, inside the measured pause."""
        self._ensure_shadow()
        self.buffers = HostBuffers(self.device)
        specs = [(tuple(t.shape), t.dtype) for t in model.state_dict().values()]
        if opt.state:
            specs += [
                (tuple(t.shape), t.dtype)
                for st in opt.state.values()
                for t in st.values()
                if torch.is_tensor(t) and t.device.type == self.device.type
            ]
        else:  # AdamW (fused on cuda): exp_avg and exp_avg_sq like the parameter, `step` an fp32 scalar
            for g in opt.param_groups:
                for prm in g["params"]:
                    specs += [(tuple(prm.shape), prm.dtype)] * 2 + [((), torch.float32)]
        t0 = time.perf_counter()
        nbytes = self.buffers.reserve(specs)
        self._emit(
            f"CKPT snapshot buffers: {nbytes} bytes {'pinned ' if self.device.type == 'cuda' else ''}"
            f"host memory in {time.perf_counter() - t0:.2f}s (async snapshot)"
        )

    def prepare_plan(self, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
        """async, after the session's first step (the optimizer state exists from then on): the copy plan,
        so that the first checkpoint replays it like every later one."""
        if self.buffers is None:
            return
        t0 = time.perf_counter()
        added = self.buffers.prepare(model.state_dict(keep_vars=True), opt.state_dict())
        plan = self.buffers.plan
        self._emit(
            f"CKPT snapshot plan: {len(plan.live)} tensors in {len(plan.runs)} copy runs, built after "
            f"step={step} in {time.perf_counter() - t0:.4f}s" + (f" ({added} more bytes)" if added else "")
        )

    def take(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        sched: Any,
        scaler: Any,
        *,
        step: int,
        t0: float,
        t_rng: float,
    ) -> Snapshot:
        """The state after `step`. t0: when the pause began; t_rng: when the RNG gather had been started."""
        check = None
        if self.mode == "async":
            if self.buffers is None:
                self.prepare(model, opt)
            # keep_vars: the live parameters themselves, the same objects every time, so HostBuffers reuses
            # its copy plan (a plain state_dict() detaches new tensor objects at every call).
            model_sd, dev_opt_sd = model.state_dict(keep_vars=True), opt.state_dict()
            t_sd = time.perf_counter()
            plan_before = self.buffers.plan
            weights, opt_sd, pending, new_bytes = self.buffers.start(model_sd, dev_opt_sd, delay_s=self.check or 0.0)
            # Where the training thread's pause goes (the next lever on it depends on which part is big).
            parts = (
                f" snapshot_parts_s=rng:{t_rng - t0:.4f}/state_dict:{t_sd - t_rng:.4f}"
                f"/copies:{time.perf_counter() - t_sd:.4f}"
                f" copy_plan={'replayed' if self.buffers.plan is plan_before else 'built'}"
            )
            if new_bytes:
                self._emit(f"CKPT snapshot buffers: {new_bytes} more bytes at step={step} (layout not foreseen)")
            self.wait = pending
            if self.check is not None:  # the step's state, copied the blocking way, to compare
                check = (to_host(model.state_dict()), to_host(opt.state_dict()))
            opt_state = {"optimizer": opt_sd, "scheduler": sched.state_dict(), "scaler": scaler.state_dict()}
            nbytes = tensor_bytes(opt_sd) + tensor_bytes(weights)
            return Snapshot(step, opt_state, nbytes, time.perf_counter() - t0, parts, weights, pending, check)
        shadow = self._ensure_shadow()
        shadow.load_state_dict(model.state_dict())  # copies into host memory
        opt_state = {
            "optimizer": to_host(opt.state_dict()),
            "scheduler": sched.state_dict(),
            "scaler": scaler.state_dict(),
        }
        nbytes = tensor_bytes(opt_state) + tensor_bytes(shadow.state_dict())
        pause = time.perf_counter() - t0
        self.pause_max_s = max(self.pause_max_s, pause)
        return Snapshot(step, opt_state, nbytes, pause)

    def before_optimizer_step(self) -> None:
        """Training thread: the optimizer step overwrites the weights and moments a snapshot may still be
        copying, so the device (not this thread) waits for those copies first."""
        if self.wait is not None:
            self.wait.wait_on_current_stream()
            self.wait = None

    def land(self, snap: Snapshot) -> tuple[nn.Module, float, str]:
        """Push thread: (the shadow model holding the snapshot's weights, the whole pause, the device-wait
        text for the CKPT save line). async: waits for the copies first; a SPECPROBE_SNAPSHOT_CHECK copy
        that differs raises."""
        if snap.pending is None:
            return self.shadow, snap.pause_s, ""
        # The copies must have landed before anything reads the buffers; the device wait they cost the
        # training stream (if it reached the optimizer step first) is part of the pause.
        device_wait = snap.pending.finish()
        pause = snap.pause_s + device_wait
        self.pause_max_s = max(self.pause_max_s, pause)
        self.shadow.load_state_dict(snap.weights)
        if snap.check is not None:
            verdict = snapshot_diff((snap.weights, snap.opt_state["optimizer"]), snap.check)
            self._emit(f"CKPT snapshot-check step={snap.step} {verdict}")
            if not verdict.startswith("ok"):
                raise RuntimeError(f"async snapshot of step {snap.step} differs from the step's state: {verdict}")
        return self.shadow, pause, f" device_wait_s={device_wait:.3f}"
