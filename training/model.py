"""The model: how it is built from the flags (timm), and the digest of its parameters.

``params_sha256`` is the one fingerprint of a finished run: the trainer logs it and writes it to
the progress file, ``training.export`` recomputes it from the exported checkpoint, and an exact
resume is tested by comparing it with an undisturbed run's.
"""
from __future__ import annotations

import hashlib
from typing import Any


def create_model(name: str, num_classes: int, image_size: int, drop_path_rate: float = 0.0):
    import timm

    extra: dict[str, Any] = {"drop_path_rate": drop_path_rate} if drop_path_rate else {}
    try:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, img_size=image_size, **extra)
    except TypeError:  # models without an img_size argument (CNNs)
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **extra)


def parameter_names(args: dict) -> set[str]:
    """Names of the model's parameters (not buffers), from the args saved in a checkpoint; the model
    is built on the meta device, so this costs no memory whatever its size."""
    import torch

    with torch.device("meta"):
        model = create_model(args["model"], int(args["num_classes"]), int(args["image_size"]))
    return {name for name, _ in model.named_parameters()}


def params_sha256_of(state_dict: dict, names: set[str]) -> str:
    """SHA-256 of the parameters in ``names``, in state_dict order, as raw bytes."""
    import torch

    h = hashlib.sha256()
    for key, value in state_dict.items():
        if key in names:
            h.update(value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def params_sha256(model) -> str:
    """The digest of a live model's parameters (the same bytes ``params_sha256_of`` reads from a checkpoint)."""
    import torch

    with torch.no_grad():
        return params_sha256_of(model.state_dict(), {n for n, _ in model.named_parameters()})
