"""vLLM sleep mode in the simulator: what each level frees, keeps and costs to undo.

As vLLM does it (docs/features/sleep_mode, `CuMemAllocator`): memory is tagged
`weights` or `kv_cache`.

- `POST /sleep?level=1`: weights copied to pinned host RAM, KV cache discarded. Takes
  the device-to-host copy of the weights.
- `POST /sleep?level=2`: weights and KV cache discarded (buffers kept). Nearly free.
- `POST /wake_up[?tags=weights|kv_cache]`: reallocates the tagged memory (all without
  tags). After level 1 the weights come back from host RAM (host-to-device copy); after
  level 2 the reallocated weights hold garbage until `POST /collective_rpc
  {"method": "reload_weights"}` reads them from disk again.
- Either way the process, CUDA context, compiled kernels and CUDA graphs survive, which
  is why a wake costs seconds and a cold start (`--load-time-s`) minutes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST_LINK_BYTES_S = 25e9  # pinned PCIe Gen4 x16, either direction, as measured in practice
DISK_BYTES_S = 3e9  # weights re-read from local NVMe / page cache (level 2 reload)
REALLOC_S = 0.05  # reallocating a tagged pool (cuMemMap) and re-initialising the KV cache
TAGS = ("weights", "kv_cache")


@dataclass
class SleepState:
    weight_bytes: float  # per GPU (a TP rank copies its own shard, all ranks in parallel)
    level: int = 0  # 0 awake
    asleep: set[str] = field(default_factory=set)  # tags not allocated
    weights_valid: bool = True  # False after level 2 until reload_weights

    @property
    def sleeping(self) -> bool:
        return bool(self.asleep)

    def sleep(self, level: int) -> float:
        """Go to sleep; seconds it takes."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, not {level}")
        if self.sleeping:
            return 0.0
        self.level = level
        self.asleep = set(TAGS)
        if level == 2:
            self.weights_valid = False
            return REALLOC_S
        return self.weight_bytes / HOST_LINK_BYTES_S

    def wake(self, tags: list[str]) -> float:
        """Reallocate `tags` (all when empty); seconds it takes."""
        unknown = [t for t in tags if t not in TAGS]
        if unknown:
            raise ValueError(f"unknown wake_up tags {unknown}; use {list(TAGS)}")
        wanted = set(tags or TAGS) & self.asleep
        seconds = REALLOC_S if wanted else 0.0
        if "weights" in wanted and self.level == 1:
            seconds += self.weight_bytes / HOST_LINK_BYTES_S
        self.asleep -= wanted
        if not self.asleep:
            self.level = 0 if self.weights_valid else self.level
        return seconds

    def reload_weights(self) -> float:
        """`collective_rpc reload_weights`: read the weights from disk into their pool."""
        if "weights" in self.asleep:
            raise ValueError("the weights pool is asleep: POST /wake_up?tags=weights first")
        self.weights_valid = True
        if not self.asleep:
            self.level = 0
        return self.weight_bytes / DISK_BYTES_S


def cold_start_s(weight_bytes: float, *, init_s: float = 20.0) -> float:
    """A vLLM cold start for comparison: process and CUDA init, torch.compile and CUDA
    graph capture (`init_s`, warm caches) plus the weights read from disk."""
    return init_s + weight_bytes / DISK_BYTES_S
