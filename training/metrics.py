"""Throughput, model FLOPs utilisation (MFU) and peak memory."""
from __future__ import annotations

import resource
import sys

import torch

# Dense bf16 peak per GPU, FLOP/s (vendor datasheets; H100/H200 SXM).
PEAK_BF16 = {
    "H100": 989e12,
    "H200": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 125e12,
    "A10": 125e12,
}

# Known training FLOPs per sample at 224 px (forward + backward = 3 x forward, 2 FLOP per MAC).
KNOWN_TRAIN_FLOPS = {"vit_base_patch16_224": 105.5e9}


def peak_flops(device: str, override_tflops: float | None = None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    if device != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    if "H100" in name and "PCIe" in name:
        return 756e12
    if "H100" in name and "NVL" in name:
        return 835e12
    for key in sorted(PEAK_BF16, key=len, reverse=True):
        if key in name:
            return PEAK_BF16[key]
    return None


def train_flops_per_sample(model: torch.nn.Module, model_name: str, image_size: int, device: str) -> float:
    """3 x forward FLOPs of one sample, counted with FlopCounterMode (known value for ViT-B/16 @224)."""
    if image_size == 224 and model_name in KNOWN_TRAIN_FLOPS:
        return KNOWN_TRAIN_FLOPS[model_name]
    from torch.utils import flop_counter

    x = torch.zeros(1, 3, image_size, image_size, device=device)
    # FlopCounterMode knows the CUDA SDPA kernels but not the CPU one (ViT-B/16: 101.1 instead of
    # 105.4 GFLOP); count it with the same formula.
    custom = {}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None and hasattr(flop_counter, "sdpa_flop_count"):
        def cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

        custom[cpu_sdpa] = cpu_sdpa_flop
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping=custom)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), counter:
            model(x)
    finally:
        model.train(was_training)
    return 3.0 * counter.get_total_flops()


def mfu(samples_per_s: float, flops_per_sample: float, peak_per_device: float | None, devices: int) -> float | None:
    if not peak_per_device:
        return None
    return samples_per_s * flops_per_sample / (peak_per_device * devices)


def peak_memory(device: str) -> dict[str, float | None]:
    """This process's peak memory in GB: ``host`` its peak resident set (``getrusage``'s ``ru_maxrss``,
    kilobytes on Linux and bytes on macOS; pinned staging buffers count, they are resident), and on CUDA
    ``gpu`` the most its tensors held at once (``torch.cuda.max_memory_allocated``) and ``gpu_reserved``
    the most the caching allocator held (what other processes on the GPU could not have);
    https://pytorch.org/docs/stable/notes/cuda.html#memory-management."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    cuda = device == "cuda" and torch.cuda.is_available()
    return {"host": rss / 1e9,
            "gpu": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
            "gpu_reserved": torch.cuda.max_memory_reserved() / 1e9 if cuda else None}


def memory_line(device: str) -> str:
    """``memory peak_host_gb=... peak_gpu_gb=... peak_gpu_reserved_gb=...`` (``n/a`` off CUDA): the trainer logs
    it when it stops or finishes, and bench/trainer.py reads it."""
    peak = peak_memory(device)
    return "memory " + " ".join(f"peak_{k}_gb={'n/a' if v is None else f'{v:.3f}'}" for k, v in peak.items())
