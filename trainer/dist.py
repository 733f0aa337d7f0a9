"""Distribution in one place: this process's rank and device under torchrun, the collectives the trainer
runs (agreeing on an error, gathering and broadcasting small Python objects, sums and maxima), and the
data-parallel gradient averaging (GradientSync). A single process is a world of one: every call returns at once.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

OBJ_BYTES = 64 * 2**10  # room for one rank's RNG state in a fixed-size gather (it pickles to ~15 KB)
# Long: ranks 1.. wait in a collective while rank 0 pushes a checkpoint to the Hub.
TIMEOUT = datetime.timedelta(minutes=60)


class Dist:
    """rank, local_rank, world_size, master and device of this process, and its collectives."""

    def __init__(self, device_type: str, environ: Mapping[str, str]):
        self.ddp = int(environ.get("RANK", -1)) != -1  # launched by torchrun?
        self.obj_group: Any = None  # the process group of object collectives (None: the default group)
        self._gather_pending: Callable[[], list[Any]] | None = None
        if not self.ddp:
            self.rank, self.local_rank, self.world_size = 0, 0, 1
            self.device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        else:
            self.rank, self.local_rank = int(environ["RANK"]), int(environ["LOCAL_RANK"])
            self.world_size = int(environ["WORLD_SIZE"])
            if device_type == "cuda":
                torch.cuda.set_device(self.local_rank)
                self.device = torch.device("cuda", self.local_rank)
            else:
                self.device = torch.device("cpu")
            dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", timeout=TIMEOUT)
            # Python objects (RNG states, errors, the resume decision) go over gloo, host to host: over
            # NCCL each one is staged through the GPUs and syncs them.
            if device_type == "cuda":
                self.obj_group = dist.new_group(backend="gloo", timeout=TIMEOUT)
        self.master = self.rank == 0

    def agree(self, err: str | None) -> str | None:
        """Every rank learns the first error any rank hit (None if none), so all exit together."""
        return next((e for e in self.gather(err) if e), None)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order."""
        if not self.ddp:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.obj_group)
        return out

    def gather_later(self, obj: Any) -> Callable[[], list[Any]]:
        """Start gathering obj from every rank without waiting (a fixed-size gloo all_gather, asynchronous);
        the returned function waits and returns the list. For a checkpoint's RNG states: a blocking gather
        would wait out the ranks' skew inside the training pause, and only rank 0's push thread needs them.
        Every rank must call wait_gathers() before its next collective, so none can overtake it."""
        if not self.ddp:
            return lambda: [obj]
        mine = pack_object(obj)
        outs = [mine.new_empty(mine.shape) for _ in range(self.world_size)]
        work = dist.all_gather(outs, mine, group=self.obj_group, async_op=True)
        done: list[list[Any]] = []

        def wait() -> list[Any]:
            if not done:
                work.wait()
                done.append([unpack_object(t) for t in outs])
            return done[0]

        self._gather_pending = wait
        return wait

    def wait_gathers(self) -> None:
        """Finish this rank's gather_later(), if one is running."""
        if self._gather_pending is not None:
            self._gather_pending()
            self._gather_pending = None

    def from_master(self, obj: Any) -> Any:
        """Rank 0's obj, on every rank."""
        if not self.ddp:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.obj_group)
        return box[0]

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """t summed over the ranks, in place."""
        if self.ddp:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """Each value's maximum over the ranks."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.ddp:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()


def pack_object(obj: Any, capacity: int = OBJ_BYTES) -> torch.Tensor:
    """obj pickled (as all_gather_object does; only ever between this run's own ranks) into a uint8 tensor
    of exactly `capacity` bytes, its length first: every rank's fits one fixed-size all_gather, which can
    then run asynchronously (variable sizes would need a blocking size exchange first)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) + 8 > capacity:
        raise ValueError(f"object of {len(data)} bytes exceeds the {capacity - 8} bytes of a packed gather")
    buf = bytearray(capacity)
    buf[:8] = len(data).to_bytes(8, "little")
    buf[8 : 8 + len(data)] = data
    return torch.frombuffer(buf, dtype=torch.uint8)


def unpack_object(t: torch.Tensor) -> Any:
    """The object pack_object() packed into t."""
    raw = t.numpy().tobytes()
    n = int.from_bytes(raw[:8], "little")
    if not 0 < n <= len(raw) - 8:
        raise ValueError(f"packed object: length {n} does not fit its {len(raw)}-byte buffer")
    return pickle.loads(raw[8 : 8 + n])


class GradientSync:
    """Data-parallel gradients without DistributedDataParallel: each rank accumulates its micro-steps'
    gradients locally, then ONE all-reduce averages one flat buffer, after the last micro-step.

    Why not DDP: under gradient accumulation its overlap of the all-reduce with the backward helps only the
    last micro-step, while its per-micro-step machinery runs on every one (forward pre-hooks, per-parameter
    autograd hooks, and Dynamo's DDPOptimizer cutting the compiled model into a graph per bucket); one
    all-reduce of the whole buffer after the backward costs about a millisecond on NVLink. Measured in
    docs/performance.md. Each parameter's .grad is a view into the flat buffer (allocated here, so it also
    stays allocated, as CUDA graphs need): zero it in place (zero_grad(set_to_none=False)), never replace it.
    """

    def __init__(self, params: list[torch.nn.Parameter], world_size: int):
        self.world_size = world_size
        if len({(p.dtype, p.device) for p in params}) > 1:
            raise ValueError("GradientSync needs every parameter in one dtype on one device")
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        offset = 0
        for p in params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        if world_size > 1:  # rank 0's weights everywhere, as DDP's constructor does
            with torch.no_grad():
                for p in params:
                    dist.broadcast(p.data, src=0)

    def all_reduce(self) -> None:
        """Every rank's accumulated gradients replaced by their mean over the ranks (divided first, then
        summed, as DDP's default reduction does, so a sum cannot overflow in fp16)."""
        if self.world_size > 1:
            self.flat.div_(self.world_size)
            dist.all_reduce(self.flat, op=dist.ReduceOp.SUM)

    def views_intact(self) -> bool:
        """Whether every .grad is still this buffer's view (zero_grad(set_to_none=True) would break that)."""
        base = self.flat.untyped_storage().data_ptr()
        return all(p.grad is not None and p.grad.untyped_storage().data_ptr() == base for p in self.params)
