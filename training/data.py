"""Training data.

* ``synthetic``: images and labels generated **on the training device** from a counter-based seed
  derived from (seed, step, rank). No loader, no host work, no state: batch ``step`` of rank ``r`` is
  the same tensor in an uninterrupted run and after any resume.
* ImageFolder (``--data PATH``): a :class:`ResumableSampler` shards a per-epoch permutation over the
  ranks and records its position, so a resumed run continues with exactly the next sample (also
  after a relaunch with another ``--batch-size``, and with another world size: :func:`shard_consumed`).
  The loader never draws from the global RNG (its
  generator is seeded from (seed, rank, start step)), so resuming does not shift the training RNG.
  DataLoader workers are forked and ignore the stop signals (see :mod:`training.stop`).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .stop import ignore_stop_signals_in_worker


def batch_seed(seed: int, step: int, rank: int) -> int:
    digest = hashlib.blake2b(f"kit-synthetic:{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class SyntheticData:
    def __init__(self, batch_size: int, image_size: int, num_classes: int, seed: int, rank: int,
                 device: torch.device):
        self.batch_size, self.image_size, self.num_classes = batch_size, image_size, num_classes
        self.seed, self.rank, self.device = seed, rank, device
        self.generator = torch.Generator(device=device)

    def batch(self, step: int):
        g = self.generator
        g.manual_seed(batch_seed(self.seed, step, self.rank))
        x = torch.randn(self.batch_size, 3, self.image_size, self.image_size, generator=g, device=self.device)
        y = torch.randint(0, self.num_classes, (self.batch_size,), generator=g, device=self.device)
        return x, y

    def state_dict(self, step: int) -> dict:
        return {"kind": "synthetic", "step": step}

    def load_state_dict(self, state: dict) -> None:
        pass

    def load_states(self, step: int, states: Sequence[dict | None]) -> None:
        pass  # batch ``step`` is a pure function of (seed, step, rank)

    def close(self) -> None:
        pass


def per_rank(n: int, world_size: int) -> int:
    """Samples each rank reads per epoch: the permutation padded (wrapping around) to a multiple of the world size."""
    return -(-n // world_size)


def consumed(state: dict, samples_per_rank: int) -> int:
    """Samples a rank has read before its saved position ``{"epoch", "index"}``."""
    return int(state["epoch"]) * samples_per_rank + int(state["index"])


class ResumableSampler(torch.utils.data.Sampler):
    """Distributed sampler over a per-epoch permutation with a saved position.

    Rank ``r`` of ``w`` takes indices ``perm[r::w]`` (padded so every rank gets the same count).
    ``state_dict()`` is ``{"epoch", "index"}`` where ``index`` counts samples already handed out
    in this epoch; iteration restarts there.
    """

    def __init__(self, n: int, rank: int, world_size: int, seed: int, shuffle: bool = True):
        if n <= 0:
            raise ValueError("empty dataset")
        self.n, self.rank, self.world_size, self.seed, self.shuffle = n, rank, world_size, seed, shuffle
        self.epoch = 0
        self.index = 0
        self.per_rank = per_rank(n, world_size)

    def _indices(self, epoch: int) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.n, generator=g).tolist()
        else:
            perm = list(range(self.n))
        total = self.per_rank * self.world_size
        perm = (perm * (total // self.n + 1))[:total]
        return perm[self.rank::self.world_size]

    def __iter__(self):
        while True:
            idx = self._indices(self.epoch)
            while self.index < len(idx):
                i = idx[self.index]
                self.index += 1
                yield i
            self.epoch += 1
            self.index = 0

    def __len__(self) -> int:
        return self.per_rank

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def shard_consumed(states: Sequence[dict], n: int, rank: int, world_size: int) -> int:
    """Samples rank ``rank`` of ``world_size`` counts as consumed (``epoch * per_rank + index`` of its
    :class:`ResumableSampler`) to continue exactly where the ranks whose saved positions are ``states``
    (one per rank of that run, any other world size) stopped.

    Rank ``r`` of ``w`` reads its ``c``-th sample from position ``c * w + r`` of the stream of padded
    epochs (epoch ``c // per_rank``, ``perm[r::w][c % per_rank]``). Ranks that advance together have read
    a prefix ``[0, L)`` of that stream, ``L`` the sum of their counts (``sum_r ceil((L - r) / w) == L``).
    The permutation of an epoch depends on the seed and the epoch only, so the new ranks continue
    the same epoch at its first unread position, each taking the next one of its residue class; only
    the padding (repeated samples filling the last row) differs between world sizes.
    """
    old_per_rank = per_rank(n, len(states))
    read = sum(consumed(s, old_per_rank) for s in states)
    epoch, pos = divmod(read, old_per_rank * len(states))
    if pos >= n:  # only the old run's padding of this epoch was left
        epoch, pos = epoch + 1, 0
    start = epoch * per_rank(n, world_size) * world_size + pos
    return -(-(start - rank) // world_size)  # the first position c * w + rank >= start


def loader_seed(seed: int, rank: int, step: int) -> int:
    digest = hashlib.blake2b(f"kit-loader:{seed}:{rank}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _is_position(state: dict) -> bool:
    return state.get("kind") == "imagefolder" and "epoch" in state and "index" in state


class ImageFolderData:
    """ImageFolder with a resumable position. The position is derived from the step (batches
    consumed since the last loaded position), never from the (prefetching) loader, so it is exact
    whatever the number of workers."""

    def __init__(self, root: str, batch_size: int, image_size: int, seed: int, rank: int, world_size: int,
                 device: torch.device, workers: int = 4):
        from torchvision import datasets, transforms

        if not Path(root).is_dir():
            raise FileNotFoundError(root)
        tf = transforms.Compose([
            transforms.Resize(image_size), transforms.CenterCrop(image_size), transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ])
        self.dataset = datasets.ImageFolder(root, transform=tf)
        self.num_classes = len(self.dataset.classes)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.device, self.workers = device, workers
        self.sampler = ResumableSampler(len(self.dataset), rank, world_size, seed)
        self._iter: Iterator[Any] | None = None
        self._next_step: int | None = None
        # samples of this rank consumed before step ``_base_step`` (from a checkpoint: its saved
        # position, which may come from a run with another batch size)
        self._base_step, self._base_consumed = 0, 0

    def _consumed(self, step: int) -> int:
        return self._base_consumed + (step - self._base_step) * self.batch_size

    def _start(self, step: int) -> Iterator[Any]:
        self.sampler.epoch, self.sampler.index = divmod(self._consumed(step), self.sampler.per_rank)
        # fork: workers inherit the trainer's flag-only handlers until worker_init_fn ignores the
        # stop signals (spawn/forkserver workers would die on a SIGTERM in that window)
        context = "fork" if self.workers > 0 else None
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, sampler=self.sampler, num_workers=self.workers,
            pin_memory=self.device.type == "cuda", worker_init_fn=ignore_stop_signals_in_worker,
            persistent_workers=False, drop_last=True,
            # its base seed would otherwise be drawn from the global RNG (restored on resume)
            generator=torch.Generator().manual_seed(loader_seed(self.seed, self.rank, step)),
            multiprocessing_context=context,
        )
        self._iter = iter(loader)
        self._next_step = step
        return self._iter

    def batch(self, step: int):
        batches = self._iter
        if batches is None or step != self._next_step:
            batches = self._start(step)
        x, y = next(batches)
        self._next_step = step + 1
        nb = self.device.type == "cuda"
        return x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)

    def state_dict(self, step: int) -> dict:
        epoch, index = divmod(self._consumed(step), self.sampler.per_rank)
        return {"kind": "imagefolder", "step": step, "epoch": epoch, "index": index}

    def load_state_dict(self, state: dict) -> None:
        """Continue from this rank's saved position (``{"kind": "imagefolder", "step", "epoch",
        "index"}``); any other state (``{"step": N}``) derives it from the step and the batch size."""
        step = int(state.get("step", 0))
        if _is_position(state):
            self._continue(step, consumed(state, self.sampler.per_rank))
        else:
            self._continue(step, step * self.batch_size)

    def load_states(self, step: int, states: Sequence[dict | None]) -> None:
        """Continue at ``step`` where a run of ``len(states)`` ranks (every rank's saved state, None
        where missing) stopped: this rank's own position in the same world, otherwise each sample of
        the interrupted epoch exactly once across the ranks (:func:`shard_consumed`)."""
        own = states[self.rank] if len(states) == self.world_size else None
        if own is not None:
            self.load_state_dict(own)
            return
        positions = [s for s in states if s is not None and _is_position(s)]
        if len(positions) < len(states):  # not all saved (another kind of data): count step x batch x ranks
            positions = [{"epoch": 0, "index": step * self.batch_size}] * len(states)
        self._continue(step, shard_consumed(positions, len(self.dataset), self.rank, self.world_size))

    def _continue(self, step: int, count: int) -> None:
        self._iter = None
        self._base_step, self._base_consumed = step, count

    def close(self) -> None:
        self._iter = None
