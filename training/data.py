"""Training data.

* ``synthetic``: images and labels generated **on the training device** from a counter-based seed
  derived from (seed, step, rank). No loader, no host work, no state: batch ``step`` of rank ``r`` is
  the same tensor in an uninterrupted run and after any resume.
* ImageFolder (``--data PATH``): a :class:`ResumableSampler` shards a per-epoch permutation over the
  ranks and records its position, so a resumed run continues with exactly the next sample.
  DataLoader workers ignore SIGTERM/SIGINT (see :mod:`training.stop`).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

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

    def close(self) -> None:
        pass


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
        self.per_rank = -(-n // world_size)

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


class ImageFolderData:
    """ImageFolder with a resumable position. Position is derived from the step (batches consumed),
    never from the (prefetching) loader, so it is exact whatever the number of workers."""

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
        self._iter = None
        self._next_step = None

    def _start(self, step: int) -> None:
        consumed = step * self.batch_size
        self.sampler.epoch, self.sampler.index = divmod(consumed, self.sampler.per_rank)
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, sampler=self.sampler, num_workers=self.workers,
            pin_memory=self.device.type == "cuda", worker_init_fn=ignore_stop_signals_in_worker,
            persistent_workers=False, drop_last=True,
        )
        self._iter = iter(loader)
        self._next_step = step

    def batch(self, step: int):
        if self._iter is None or step != self._next_step:
            self._start(step)
        x, y = next(self._iter)
        self._next_step = step + 1
        nb = self.device.type == "cuda"
        return x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)

    def state_dict(self, step: int) -> dict:
        epoch, index = divmod(step * self.batch_size, self.sampler.per_rank)
        return {"kind": "imagefolder", "step": step, "epoch": epoch, "index": index}

    def load_state_dict(self, state: dict) -> None:
        self._iter = None

    def close(self) -> None:
        self._iter = None
