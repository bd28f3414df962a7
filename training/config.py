"""The training job's settings: one definition for the trainer's flags and the spec's ``training:`` section.

``training.train`` builds its command-line flags from :data:`FIELDS` (``--batch-size`` for
``batch_size``), ``kit.spec`` builds its ``training`` section model from the same list (defaults,
bounds, help), and ``kit.spec.training_args`` turns a spec back into these flags. A new setting is one
line here. Standard library only: the launcher parses flags on hosts where nothing else is installed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.contract import CKPT_DIR


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    help: str
    minimum: float | None = None     # inclusive
    positive: bool = False           # > 0 (for floats)
    choices: tuple[str, ...] | None = None
    optional: bool = False           # None allowed (and the default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


FIELDS: tuple[Setting, ...] = (
    Setting("model", str, "vit_base_patch16_224", "timm model name"),
    Setting("image_size", int, 224, "input resolution", minimum=1),
    Setting("num_classes", int, 1000, "classifier outputs", minimum=1),
    Setting("batch_size", int, 32, "per rank", minimum=1),
    Setting("steps", int, 1000, "total optimizer steps", minimum=1),
    Setting("lr", float, 1e-3, "peak learning rate", positive=True),
    Setting("warmup_steps", int, 100, "linear warmup before the cosine decay", minimum=0),
    Setting("ckpt_dir", str, CKPT_DIR, "this node's checkpoint directory"),
    Setting("ckpt_every", int, 100, "periodic save every N steps (0 = off)", minimum=0),
    Setting("ckpt_every_seconds", float, None, "also save every S seconds", positive=True, optional=True),
    Setting("keep", int, 3, "complete checkpoints kept (>= 2: the newest may be mid-write when a node dies)",
            minimum=2),
    Setting("seed", int, 0, "seed of the weights, the data and the RNG streams", minimum=0),
    Setting("data", str, "synthetic", "'synthetic' or an ImageFolder directory"),
    Setting("log_every", int, 10, "log every N steps", minimum=1),
    Setting("device", str, None, "default: cuda if available", choices=("cpu", "cuda"), optional=True),
    Setting("deterministic", bool, False, "deterministic kernels (bit-exact resume)"),
    Setting("compile", bool, False, "torch.compile the model"),
)


def to_flags(values: dict[str, Any]) -> list[str]:
    """Trainer flags for ``values`` (booleans only when true, None left out)."""
    out: list[str] = []
    for s in FIELDS:
        value = values.get(s.name, s.default)
        if value is None or value is False:
            continue
        out += [s.flag] if value is True else [s.flag, repr(value) if isinstance(value, float) else str(value)]
    return out
