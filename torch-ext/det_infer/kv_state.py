"""KVState, one sequence's KV cache, and the memory check made before allocating one (or the
weights) so that a cache too large for the device is a clear error, not an allocator crash."""
import os

import torch

from .config import ModelConfig


class KVState:
    """One sequence's KV cache: a (2, capacity, floats per position) fp32 tensor, the keys then the
    values of every layer that computes its own, and the number of positions filled so far
    (positions 0 .. length-1 hold valid keys and values). Only its size follows that shape: the
    memory runs by layer, KV head, then position, keys in panels of 16 positions (docs/SPEC.md
    §13.8), so that one head's keys lie together."""

    def __init__(self, cfg: ModelConfig, capacity: int, device="cpu"):
        need = capacity * cfg.kv_bytes_per_position()
        check_memory(need, f"a KV cache of {capacity} positions", device)
        self.cache = torch.zeros((2, capacity, cfg.kv_floats_per_position()), dtype=torch.float32, device=device)
        self.capacity = capacity
        self.length = 0
        self.weights_version = 0  # the model's weights_version its positions were filled under

    def fork(self) -> "KVState":
        """An independent copy: both continue from the same filled positions."""
        twin = KVState.__new__(KVState)
        twin.cache, twin.capacity, twin.length = self.cache.clone(), self.capacity, self.length
        twin.weights_version = self.weights_version
        return twin

    def reset(self):
        self.length = 0


def check_memory(nbytes, what, device="cpu"):
    try:
        if torch.device(device).type == "cuda":
            avail = torch.cuda.mem_get_info(torch.device(device))[0]
        else:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError, RuntimeError):
        return
    if nbytes > avail:
        raise MemoryError(f"det-infer: {what} needs {nbytes / 2**20:.1f} MiB, but only "
                          f"{avail / 2**20:.1f} MiB of memory is available; use a smaller max_context")
