"""Process-group setup from the torchrun environment, and state broadcast from a checkpoint holder.

The rendezvous endpoint always comes from the environment torchrun exports (``MASTER_ADDR``/
``MASTER_PORT`` from ``--rdzv-endpoint``/``--master-addr``), so relaunching with a new head node
after a replacement needs no change here. Control-plane collectives (stop flag, checkpoint step
agreement, small per-rank states) go through a gloo group on CPU so they never synchronise the GPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    control_group: dist.ProcessGroup | None = None  # gloo group (None = default group / no distribution)

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_node_writer(self) -> bool:
        """Local rank 0 of each node writes that node's full checkpoint copy."""
        return self.local_rank == 0


def init_distributed(device_kind: str, timeout_s: float = 180.0) -> DistInfo:
    """``timeout_s`` bounds every collective (data and control group): how long the survivors wait
    for a peer that vanished (spot reclaim without a FIN) before they fail and exit. It must exceed
    the longest legitimate wait between ranks (a peer verifying/loading the checkpoint, the first
    step's torch.compile, a synchronous save): ``--dist-timeout-s``, default 180 s."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    node_rank = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    info = DistInfo(rank, world, local_rank, local_world, node_rank, device)
    if world > 1:
        backend = "nccl" if device_kind == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device if backend == "nccl" else None)
        # new_group's own default is 30 min for gloo, not the timeout above: pass it explicitly.
        group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else dist.group.WORLD
        info.control_group = group if isinstance(group, dist.ProcessGroup) else None  # every rank is a member
    return info


def destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_gather_object(obj, info: DistInfo) -> list:
    if not info.is_distributed:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj, group=info.control_group)
    return out


def all_reduce_max_int(value: int, info: DistInfo) -> int:
    if not info.is_distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=info.control_group)
    return int(t.item())


def barrier(info: DistInfo) -> None:
    if info.is_distributed:
        dist.barrier(group=info.control_group)


class _TensorSlot:
    __slots__ = ("dtype", "index", "shape")

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, tuple(shape), dtype


def _skeleton(obj, tensors: list):
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, obj.shape, obj.dtype)
    if isinstance(obj, dict):
        return {k: _skeleton(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_skeleton(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_skeleton(v, tensors) for v in obj)
    return obj


def _fill(obj, tensors: list):
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_fill(v, tensors) for v in obj)
    return obj


def broadcast_state(state, src: int, info: DistInfo):
    """Send a nested dict of CPU tensors and plain values from rank ``src`` to every rank.

    The structure travels as a pickled skeleton over the gloo control group; tensors travel one by
    one over the data backend (NCCL on GPU, so a 1 GB state moves at interconnect speed).
    Returns the state (CPU tensors) on every rank.
    """
    if not info.is_distributed:
        return state
    tensors: list = []
    holder = [_skeleton(state, tensors) if info.rank == src else None]
    dist.broadcast_object_list(holder, src=src, group=info.control_group)
    skeleton = holder[0]
    slots: list[_TensorSlot] = []

    def collect(o):
        if isinstance(o, _TensorSlot):
            slots.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                collect(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                collect(v)

    collect(skeleton)
    slots.sort(key=lambda s: s.index)
    on_gpu = info.device.type == "cuda"
    received = []
    for slot in slots:
        if info.rank == src:
            t = tensors[slot.index].contiguous()
            buf = t.to(info.device) if on_gpu else t
        else:
            buf = torch.empty(slot.shape, dtype=slot.dtype, device=info.device)
        dist.broadcast(buf, src=src)
        received.append(buf.cpu() if on_gpu else buf)
    return _fill(skeleton, received)
