"""Transfer engine: batched, asynchronous block copies between an engine's paged KV cache and a
:class:`~kvtier.dataplane.HostBlockPool`.

The engine's KV cache is one tensor ``[num_device_blocks, *block_shape]`` or several tensors
``[num_device_blocks, *block_shape[1:]]`` (``block_shape[0]`` of them, e.g. one per layer);
tensor ``t`` then maps to ``pool.tensor[:, t]``. Block ``b`` of the engine is index ``b`` of
dimension 0 of every tensor.

Every job is a list of (source, destination) block pairs and is copied with a few batched
index operations per tensor (``index_select`` / ``index_copy_`` on the block dimension), never
a Python loop per block per tensor:

* **CPU** (KV cache tensors on the CPU): a worker thread runs the jobs in submission order.
  Per tensor, a job is one call when the pool-side or the engine-side ids form a consecutive
  range (``index_put_`` from a slice, or ``index_select`` into a slice); otherwise it is
  gathered into a small reusable staging buffer (``staging_bytes``, sized to stay in cache)
  and scattered from it, one pair of calls per tensor per staging chunk.
* **CUDA** (KV cache tensors on a CUDA device): the copies are queued at submit time on a
  dedicated store stream (device->host) or load stream (host->device), each of which first
  waits for the caller's current stream; a ``torch.cuda.Event`` recorded after the job is
  polled with ``query()``. Blocks are gathered/scattered on the device (``index_select`` /
  ``index_copy_`` into a device staging buffer in the pool's layout) and moved over PCIe
  with one ``copy_(non_blocking=True)`` per run of consecutive pool slots (the job is sorted
  by pool slot first, so a job whose slots were allocated together is one DMA per chunk).

Jobs on the same direction finish in submission order. On CPU, stores and loads share one
FIFO worker; on CUDA they run on two streams and are not ordered against each other, so a
caller must not load a slot whose store is still in flight (the
:class:`~kvtier.OffloadingManager` enforces exactly that: a pending block cannot be loaded).

A failed copy never raises into the caller's loop: :meth:`TransferEngine.poll` reports the job
with ``ok=False`` and :meth:`TransferEngine.take_errors` returns the exception.

Layout: :class:`TransferEngine` checks and numbers the jobs and reports them; the copies are
made by one of two back ends behind the small :class:`_CopyBackend` interface,
:class:`_CpuBackend` (worker thread) and :class:`_CudaBackend` (streams and events). Both hand
finished jobs to one :class:`_Completions` record. The CPU worker thread is stopped by
:meth:`TransferEngine.close`, by garbage collection of the engine, and at interpreter exit
(a ``weakref.finalize``), so a program that exits with copies in flight exits with its own
status instead of aborting inside a torch op.
"""

from __future__ import annotations

import operator
import threading
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from kvtier.checks import check_timeout
from kvtier.dataplane.pool import HostBlockPool

if TYPE_CHECKING:  # typing.Self is Python 3.11+; kvtier supports 3.10
    from typing_extensions import Self

__all__ = ["TransferEngine", "TransferResult"]

STORE = "store"
LOAD = "load"


class TransferResult(NamedTuple):
    """A finished job, as returned by :meth:`TransferEngine.poll`.

    Attributes:
        job_id: the id given at submit time.
        ok: ``True`` when every block of the job was copied; ``False`` when a copy failed
            (some blocks may have been written, some not).
    """

    job_id: Hashable
    ok: bool


@dataclass
class _Job:
    job_id: Hashable
    kind: str  # STORE (device -> pool) or LOAD (pool -> device)
    pool_ids: list[int]  # sorted ascending
    dev_ids: list[int]  # paired with pool_ids
    event: Any = None  # torch.cuda.Event on the CUDA path
    error: BaseException | None = None  # CUDA path: failed while queueing its copies
    keep: list = field(default_factory=list)  # tensors to keep alive until the event


def block_id_sequence(name: str, values: Any) -> Sequence:
    """``values`` as a sequence of block ids: a 1-D integer ``torch.Tensor`` or numpy array
    becomes a list of ints; any other sequence is returned as it is (its items are checked
    by the caller).

    Raises:
        TypeError: ``values`` is a str / bytes, not a sequence, or a tensor / array that is
            not 1-D or not of an integer dtype (``name`` in the message).
    """
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype == torch.bool:
            raise TypeError(f"{name} must be a 1-D integer tensor or a sequence of ints")
        return values.tolist()
    if type(values).__module__ == "numpy" and hasattr(values, "ndim"):  # no numpy import
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise TypeError(f"{name} must be a 1-D integer array or a sequence of ints, got "
                            f"a {values.ndim}-D array of {values.dtype}")
        return values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    return values


def _as_id_list(name: str, values: Any, limit: int, what: str) -> list[int]:
    values = block_id_sequence(name, values)
    out: list[int] = []
    for v in values:
        if isinstance(v, bool):
            raise TypeError(f"{name}: {v!r} is not a block id (bool)")
        try:
            i = operator.index(v)
        except TypeError:
            raise TypeError(f"{name}: {v!r} is not an int block id") from None
        if not 0 <= i < limit:
            raise ValueError(f"{name}: {what} {i} is out of range 0..{limit - 1}")
        out.append(i)
    return out


def _runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive ids: (position in ids, first id, length)."""
    runs: list[tuple[int, int, int]] = []
    if not ids:
        return runs
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((start, ids[start], i - start))
            start = i
    return runs


_WIDE_DTYPES = (torch.complex128, torch.int64, torch.int32)


def _as_wide_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` viewed with the widest element type both layouts allow (same bytes).

    Only a reinterpretation: no copy, and bit patterns (NaN, -0.0) are untouched.
    """
    for dtype in _WIDE_DTYPES:
        if dtype.itemsize <= a.element_size():
            break
        try:
            return a.view(dtype), b.view(dtype)
        except RuntimeError:
            continue
    return a, b


def _is_range(ids: list[int]) -> bool:
    """True when ids are ``a, a+1, ..., a+n-1`` (n >= 1)."""
    return bool(ids) and all(b == a + 1 for a, b in zip(ids, ids[1:], strict=False))  # pairs


class _Completions:
    """Finished jobs and the in-flight count, shared by the engine (the caller's thread) and
    a back end (the CPU worker thread). Every method takes the one lock."""

    def __init__(self) -> None:
        self.cv = threading.Condition(threading.Lock())
        self.done: deque[TransferResult] = deque()
        self.errors: dict[Hashable, BaseException] = {}
        self.outstanding = 0  # submitted and not finished

    def started(self) -> None:
        with self.cv:
            self.outstanding += 1

    def finish(self, job: _Job, ok: bool, error: BaseException | None) -> None:
        with self.cv:
            self.done.append(TransferResult(job.job_id, ok))
            if error is not None:
                self.errors[job.job_id] = error
            self.outstanding -= 1
            self.cv.notify_all()

    def take_done(self) -> list[TransferResult]:
        with self.cv:
            out = list(self.done)
            self.done.clear()
        return out

    def take_errors(self) -> dict[Hashable, BaseException]:
        with self.cv:
            errors, self.errors = self.errors, {}
        return errors

    def wait_idle(self, timeout: float | None) -> bool:
        with self.cv:
            return self.cv.wait_for(lambda: self.outstanding == 0, timeout)


class _CopyBackend(ABC):
    """How the copies of a checked job are made. The engine calls, on the caller's thread:
    ``submit(job)`` (queue the copies), ``reap()`` (report jobs that finished, non-blocking),
    ``wait(timeout)`` (block until every job finished), ``stop(timeout)`` (no job will come).
    Finished jobs go to ``completions.finish``. ``before_copy`` is a test hook called as
    ``hook(job_id, kind, tensor_index)`` before each tensor's copy of a job; an exception
    fails the job mid-batch."""

    def __init__(self, kv_caches: list[torch.Tensor], pool_views: list[torch.Tensor],
                 pool: HostBlockPool, staging_bytes: int, completions: _Completions) -> None:
        self.kv_caches = kv_caches
        self.pool_views = pool_views
        self.pool = pool
        self.staging_bytes = staging_bytes
        self.completions = completions
        self.single = len(kv_caches) == 1 and pool_views[0] is pool.tensor
        self.before_copy: Callable[[Hashable, str, int], None] | None = None

    @abstractmethod
    def submit(self, job: _Job) -> None:
        """Queue the copies of ``job`` (the CPU back end: to its worker thread; CUDA: on
        its copy stream)."""

    def reap(self) -> None:
        """Report the jobs that finished (nothing to do where a thread reports them)."""

    def wait(self, timeout: float | None) -> bool:
        return self.completions.wait_idle(timeout)

    def stop(self, timeout: float | None) -> None:
        """Release the back end's resources; the jobs in flight have finished."""


def _stop_cpu_worker(queue: deque, qcv: threading.Condition, worker: threading.Thread) -> None:
    """Stop a CPU worker: jobs not started are dropped, the running one ends first. Run by
    ``close`` (after the jobs finished), on garbage collection of the engine, and at
    interpreter exit (``weakref.finalize``), before daemon threads are frozen: a worker left
    inside a torch op at that point aborts the whole process (SIGABRT)."""
    with qcv:
        queue.clear()
        queue.append(None)
        qcv.notify()
    if worker is not threading.current_thread():
        worker.join()


class _CpuBackend(_CopyBackend):
    """CPU KV cache: one worker thread runs the jobs in submission order (see the module
    docstring for the copy plan). The worker holds only this object, never the engine."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        per_block = max(t[0].numel() for t in self.kv_caches)
        itemsize = self.kv_caches[0].element_size()
        self.stage_blocks = max(1, self.staging_bytes // (per_block * itemsize))
        # Allocated lazily by the worker on first use of the staged path.
        self.staging: torch.Tensor | None = None
        self.queue: deque[_Job | None] = deque()
        self.qcv = threading.Condition()
        self.worker = threading.Thread(target=self._loop, name="kvtier-transfer", daemon=True)
        self.worker.start()

    def submit(self, job: _Job) -> None:
        with self.qcv:
            self.queue.append(job)
            self.qcv.notify()

    def stop(self, timeout: float | None) -> None:
        with self.qcv:
            self.queue.append(None)
            self.qcv.notify()
        self.worker.join(timeout)

    def _loop(self) -> None:
        while True:
            with self.qcv:
                while not self.queue:
                    self.qcv.wait()
                job = self.queue.popleft()
            if job is None:
                return
            try:
                # Inference mode lets the copies write tensors created under inference mode
                # as well as normal ones, and keeps autograd out of the way.
                with torch.inference_mode():
                    self._run(job)
            except Exception as e:  # noqa: BLE001 - reported as ok=False, never raised
                self.completions.finish(job, False, e)
            else:
                self.completions.finish(job, True, None)

    def _stage(self, numel: int) -> torch.Tensor:
        if self.staging is None:
            per_block = max(t[0].numel() for t in self.kv_caches)
            self.staging = torch.empty(self.stage_blocks * per_block, dtype=self.pool.dtype)
        return self.staging[:numel]

    def _run(self, job: _Job) -> None:
        n = len(job.pool_ids)
        if n == 0:
            return
        pool_idx = torch.tensor(job.pool_ids, dtype=torch.long)
        dev_idx = torch.tensor(job.dev_ids, dtype=torch.long)
        pool_range = _is_range(job.pool_ids)
        dev_range = _is_range(job.dev_ids)
        p0, d0 = job.pool_ids[0], job.dev_ids[0]
        hook = self.before_copy
        for t, (dev, pv) in enumerate(zip(self.kv_caches, self.pool_views, strict=True)):
            if hook is not None:
                hook(job.job_id, job.kind, t)
            if job.kind == STORE:
                src, dst, src_idx, dst_idx = dev, pv, dev_idx, pool_idx
                src_range, dst_range, s0, t0 = dev_range, pool_range, d0, p0
            else:
                src, dst, src_idx, dst_idx = pv, dev, pool_idx, dev_idx
                src_range, dst_range, s0, t0 = pool_range, dev_range, p0, d0
            # CPU index kernels copy element by element: the same bytes viewed with 16-byte
            # elements move about twice as fast (measured: 2.0 -> 4.0 GB/s for 2 MiB blocks).
            src, dst = _as_wide_pair(src, dst)
            # index_put_ (advanced-index assignment) measured faster than index_copy_ on CPU.
            if src_range and dst_range:
                dst[t0 : t0 + n].copy_(src[s0 : s0 + n])
            elif src_range:
                dst.index_put_((dst_idx,), src[s0 : s0 + n])
            elif dst_range:
                # writes in place also into a strided view (one layer of the pool)
                torch.index_select(src, 0, src_idx, out=dst[t0 : t0 + n])
            else:
                block_shape = tuple(src.shape[1:])
                per_block = src[0].numel()
                step = self.stage_blocks
                narrow_per_block = per_block * src.element_size() // self.pool.dtype.itemsize
                for c in range(0, n, step):
                    k = min(step, n - c)
                    stg = self._stage(k * narrow_per_block).view(src.dtype).view(k, *block_shape)
                    torch.index_select(src, 0, src_idx[c : c + k], out=stg)
                    dst.index_put_((dst_idx[c : c + k],), stg)


class _CudaBackend(_CopyBackend):
    """CUDA KV cache: copies queued at submit time on a store stream (device->host) or a load
    stream (host->device); a ``torch.cuda.Event`` per job is polled with ``query()`` (see the
    module docstring). No thread. Not run by the test suite (no GPU there):
    ``benchmarks/cuda_check.sh`` checks it on a GPU."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.device = self.kv_caches[0].device
        self.store_stream = torch.cuda.Stream(device=self.device)
        self.load_stream = torch.cuda.Stream(device=self.device)
        self.jobs: deque[_Job] = deque()

    def submit(self, job: _Job) -> None:
        stream = self.store_stream if job.kind == STORE else self.load_stream
        try:
            with torch.inference_mode():
                self._enqueue(job, stream)
        except Exception as e:  # noqa: BLE001 - any failure: reported as ok=False, not raised
            job.error = e
        if job.event is None:
            # Copies queued before the failure may still be running: report the job only
            # once they are done, so its blocks are not reused under a running copy.
            try:
                job.event = torch.cuda.Event()
                job.event.record(stream)
            except Exception as e:  # noqa: BLE001 - any failure finishes the job with ok=False
                job.keep.clear()
                self.completions.finish(job, False, job.error or e)
                return
        self.jobs.append(job)

    def wait(self, timeout: float | None) -> bool:
        for job in list(self.jobs):
            if job.event is not None:
                job.event.synchronize()
        self.reap()
        return self.completions.outstanding == 0

    def _enqueue(self, job: _Job, stream: Any) -> None:
        # Stores read blocks the compute stream wrote; loads overwrite blocks it may still read.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        n = len(job.pool_ids)
        pool = self.pool.tensor
        cap = max(1, self.staging_bytes // self.pool.block_nbytes)
        hook = self.before_copy
        with torch.cuda.stream(stream):
            for c in range(0, n, cap):
                k = min(cap, n - c)
                pool_ids = job.pool_ids[c : c + k]
                dev_idx = torch.tensor(job.dev_ids[c : c + k], dtype=torch.long).to(
                    self.device, non_blocking=True
                )
                stg = torch.empty((k, *self.pool.block_shape), dtype=pool.dtype, device=self.device)
                if job.kind == STORE:
                    for t, dev in enumerate(self.kv_caches):
                        if hook is not None:
                            hook(job.job_id, job.kind, t)
                        if self.single:
                            torch.index_select(dev, 0, dev_idx, out=stg)
                        else:
                            stg.select(1, t).copy_(dev.index_select(0, dev_idx))
                    for i0, s0, length in _runs(pool_ids):
                        pool[s0 : s0 + length].copy_(stg[i0 : i0 + length], non_blocking=True)
                else:
                    for i0, s0, length in _runs(pool_ids):
                        stg[i0 : i0 + length].copy_(pool[s0 : s0 + length], non_blocking=True)
                    for t, dev in enumerate(self.kv_caches):
                        if hook is not None:
                            hook(job.job_id, job.kind, t)
                        dev.index_copy_(0, dev_idx, stg if self.single else stg.select(1, t))
                job.keep.append(stg)
                job.keep.append(dev_idx)
            job.event = torch.cuda.Event()
            job.event.record(stream)

    def reap(self) -> None:
        remaining: deque[_Job] = deque()
        while self.jobs:
            job = self.jobs.popleft()
            try:
                done = job.event.query()
            except Exception as e:  # noqa: BLE001 - an asynchronous CUDA error surfaces here
                job.keep.clear()
                self.completions.finish(job, False, e)
                continue
            if done:
                job.keep.clear()
                self.completions.finish(job, job.error is None, job.error)
            else:
                remaining.append(job)
        self.jobs = remaining


class TransferEngine:
    """Copies KV blocks between an engine's paged KV cache and a host block pool.

    Args:
        kv_caches: the engine's KV cache: one tensor ``[num_device_blocks, *pool.block_shape]``
            or a sequence of ``pool.block_shape[0]`` tensors
            ``[num_device_blocks, *pool.block_shape[1:]]``, all on one device (CPU or CUDA),
            with ``pool.dtype``. They are used in place (never copied).
        pool: the host pool the manager's slot ids refer to.
        staging_bytes: size of the staging buffer, in bytes (>= one block of the largest
            tensor is always used). CPU: the reusable gather/scatter buffer (default 32 MiB,
            small enough to stay in cache). CUDA: the largest device staging buffer one chunk
            of a job allocates (default 32 MiB too; raise it for fewer, larger DMAs).

    Raises:
        TypeError: a KV cache entry is not a tensor, or ``pool`` is not a HostBlockPool.
        ValueError: empty ``kv_caches``; tensors on different devices, of a dtype other than
            ``pool.dtype``, with different block counts, or a shape that does not match the
            pool's ``block_shape`` as described above; a non-positive ``staging_bytes``.

    The engine is driven from one thread (the caller's); the CPU worker thread touches only
    tensors. Use as a context manager, or call :meth:`close`, to stop the worker (it is also
    stopped on garbage collection and at interpreter exit).
    """

    def __init__(
        self,
        kv_caches: torch.Tensor | Sequence[torch.Tensor],
        pool: HostBlockPool,
        *,
        staging_bytes: int = 32 * 2**20,
    ) -> None:
        if not isinstance(pool, HostBlockPool):
            raise TypeError(f"pool must be a HostBlockPool, got {type(pool).__name__}")
        if isinstance(kv_caches, torch.Tensor):
            tensors = [kv_caches]
        elif isinstance(kv_caches, Sequence) and not isinstance(kv_caches, (str, bytes)):
            tensors = list(kv_caches)
        else:
            raise TypeError(
                f"kv_caches must be a tensor or a sequence of tensors, got {type(kv_caches).__name__}"
            )
        if not tensors:
            raise ValueError("kv_caches must hold at least one tensor, got an empty sequence")
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"kv_caches[{i}] must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != pool.dtype:
                raise ValueError(
                    f"kv_caches[{i}] has dtype {t.dtype}, but the pool's dtype is {pool.dtype}"
                )
            if t.device != tensors[0].device:
                raise ValueError(
                    f"kv_caches[{i}] is on {t.device}, kv_caches[0] on {tensors[0].device}: "
                    "all KV cache tensors must be on one device"
                )
            if t.dim() < 1:
                raise ValueError(f"kv_caches[{i}] has shape (): a KV cache tensor needs a "
                                 "block dimension (dimension 0)")
            if t.shape[0] < 1:
                raise ValueError(f"kv_caches[{i}] has shape {tuple(t.shape)}: no device blocks "
                                 "(dimension 0 must be >= 1)")
            if t.shape[0] != tensors[0].shape[0]:
                raise ValueError(
                    f"kv_caches[{i}] has shape {tuple(t.shape)}: every tensor needs the same "
                    f"number of blocks ({tensors[0].shape[0]}) on dimension 0"
                )
        bs = tuple(pool.block_shape)
        if len(tensors) == 1 and tuple(tensors[0].shape[1:]) == bs:
            pool_views = [pool.tensor]
        elif len(tensors) == bs[0] and all(tuple(t.shape[1:]) == bs[1:] for t in tensors):
            pool_views = [pool.tensor.select(1, i) for i in range(len(tensors))]
        else:
            raise ValueError(
                f"KV cache shapes {[tuple(t.shape) for t in tensors]} do not match the pool's "
                f"block_shape {list(bs)}: expected one tensor [num_device_blocks, *{list(bs)}] "
                f"or {bs[0]} tensors [num_device_blocks, *{list(bs[1:])}]"
            )
        if isinstance(staging_bytes, bool) or not isinstance(staging_bytes, int) or staging_bytes < 1:
            raise ValueError(f"staging_bytes must be a positive int, got {staging_bytes!r}")

        self.pool = pool
        self.kv_caches = tensors
        self.device = tensors[0].device
        self.num_device_blocks = int(tensors[0].shape[0])
        self.staging_bytes = staging_bytes
        self._unreported: set[Hashable] = set()  # submitted, not yet returned by poll()
        self._completions = _Completions()
        self._closed = False
        self.is_cuda = self.device.type == "cuda"
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"unsupported KV cache device {self.device} (CPU or CUDA only)")
        backend_cls = _CudaBackend if self.is_cuda else _CpuBackend
        self._backend: _CopyBackend = backend_cls(
            tensors, pool_views, pool, staging_bytes, self._completions
        )
        self._finalizer = None
        if isinstance(self._backend, _CpuBackend):
            b = self._backend
            self._finalizer = weakref.finalize(self, _stop_cpu_worker, b.queue, b.qcv, b.worker)

    @property
    def _before_copy(self) -> Callable[[Hashable, str, int], None] | None:
        """Test hook, see :class:`_CopyBackend`."""
        return self._backend.before_copy

    @_before_copy.setter
    def _before_copy(self, hook: Callable[[Hashable, str, int], None] | None) -> None:
        self._backend.before_copy = hook

    # -- submission ------------------------------------------------------------------------
    def submit_store(
        self, job_id: Hashable, src_block_ids: Sequence[int], dst_slots: Sequence[int]
    ) -> None:
        """Queue a copy of engine blocks ``src_block_ids`` into pool slots ``dst_slots``.

        Args:
            job_id: any hashable id but a bool (``True == 1``), unique among jobs not yet
                returned by :meth:`poll`.
            src_block_ids: engine block ids, ``0 <= id < num_device_blocks`` (repeats allowed).
            dst_slots: pool slots, ``0 <= slot < pool.num_blocks``, pairwise distinct, same
                length as ``src_block_ids``.

        Raises:
            ValueError: duplicate, unhashable or bool job id, ids out of range, different
                lengths, a slot named twice, or the engine is closed. Nothing is queued then.
            TypeError: an id is not an int.
        """
        self._submit(STORE, job_id, src_block_ids, dst_slots)

    def submit_load(
        self, job_id: Hashable, src_slots: Sequence[int], dst_block_ids: Sequence[int]
    ) -> None:
        """Queue a copy of pool slots ``src_slots`` into engine blocks ``dst_block_ids``.

        Args:
            job_id: any hashable id, unique among jobs not yet returned by :meth:`poll`.
            src_slots: pool slots, ``0 <= slot < pool.num_blocks`` (repeats allowed).
            dst_block_ids: engine block ids, ``0 <= id < num_device_blocks``, pairwise
                distinct, same length as ``src_slots``.

        Raises:
            ValueError / TypeError: as :meth:`submit_store`. Nothing is queued then.
        """
        self._submit(LOAD, job_id, src_slots, dst_block_ids)

    def _submit(self, kind: str, job_id: Hashable, src: Any, dst: Any) -> None:
        if self._closed:
            raise ValueError("the transfer engine is closed")
        try:
            hash(job_id)
        except TypeError:
            raise ValueError(f"job_id {job_id!r} is not hashable") from None
        if type(job_id).__name__ in ("bool", "bool_"):  # numpy's too (numpy.bool)
            raise ValueError(f"job_id {job_id!r} is a bool: True and 1 (False and 0) are the "
                             "same id in Python; use ints, strs or other hashable ids")
        if job_id in self._unreported:
            raise ValueError(f"job_id {job_id!r} is already in use (not yet returned by poll)")
        if kind == STORE:
            dev = _as_id_list("src_block_ids", src, self.num_device_blocks, "engine block id")
            pool_ids = _as_id_list("dst_slots", dst, self.pool.num_blocks, "pool slot")
            dst_ids, dst_name = pool_ids, "dst_slots"
        else:
            pool_ids = _as_id_list("src_slots", src, self.pool.num_blocks, "pool slot")
            dev = _as_id_list("dst_block_ids", dst, self.num_device_blocks, "engine block id")
            dst_ids, dst_name = dev, "dst_block_ids"
        if len(dev) != len(pool_ids):
            raise ValueError(
                f"{kind}: {len(src)} sources but {len(dst)} destinations; they must pair up"
            )
        if len(set(dst_ids)) != len(dst_ids):
            seen: set[int] = set()
            dup = next(i for i in dst_ids if i in seen or seen.add(i))
            raise ValueError(f"{dst_name} names {dup} twice: each destination must be distinct")
        order = sorted(range(len(pool_ids)), key=pool_ids.__getitem__)
        job = _Job(job_id, kind, [pool_ids[i] for i in order], [dev[i] for i in order])

        self._unreported.add(job_id)
        self._completions.started()
        self._backend.submit(job)

    # -- completion ------------------------------------------------------------------------
    def poll(self) -> list[TransferResult]:
        """Return the jobs finished since the last call, as ``(job_id, ok)`` pairs.

        Never blocks and never raises for a failed copy (see :meth:`take_errors`).
        """
        self._backend.reap()
        out = self._completions.take_done()
        for r in out:
            self._unreported.discard(r.job_id)
        return out

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted job has finished (not necessarily polled).

        Args:
            timeout: seconds to wait at most; ``None`` (or ``inf``) waits forever.

        Returns:
            ``True`` when nothing is in flight any more, ``False`` on timeout.

        Raises:
            ValueError: ``timeout`` is negative, NaN, a bool or not a number.
        """
        return self._backend.wait(check_timeout(timeout, "wait"))

    @property
    def in_flight(self) -> int:
        """Number of jobs submitted and not finished yet."""
        self._backend.reap()
        return self._completions.outstanding

    def take_errors(self) -> dict[Hashable, BaseException]:
        """Return and clear the exception of each failed job, by job id."""
        return self._completions.take_errors()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (no job is accepted any more)."""
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Finish the jobs in flight, then stop the worker thread. Idempotent.

        Also done without ``close``: when the engine is garbage-collected, and at interpreter
        exit, the CPU worker is stopped after the copy it is running (jobs not started are
        dropped), so exiting with copies in flight keeps the program's exit status.
        """
        if self._closed:
            return
        timeout = check_timeout(timeout, "close")  # before anything is stopped
        self.wait(timeout)
        self._closed = True
        self._backend.stop(timeout)
        if self._finalizer is not None:
            self._finalizer.detach()

    def __enter__(self) -> Self:  # a subclass's returns the subclass
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
