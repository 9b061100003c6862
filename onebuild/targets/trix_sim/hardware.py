"""TRIX hardware presets: data files in `configs/`, loaded into a frozen dataclass."""

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from ...errors import UserError

CONFIGS = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class Hardware:
    name: str
    mac_rows: int  # reduction elements per cycle
    mac_cols: int  # output channels per cycle
    vector_lanes: int
    clock_mhz: int
    sram_bytes: int
    dram_bytes_per_cycle: int
    dma_latency_cycles: int
    dtypes: tuple[str, ...]
    max_kernel: int
    max_stride: int
    max_channels: int
    max_rank: int

    @property
    def macs_per_cycle(self) -> int:
        return self.mac_rows * self.mac_cols


def presets() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.toml"))


def load_hardware(name: str) -> Hardware:
    """A preset by name (`trix-s`, `trix-m`, ...)."""
    path = CONFIGS / f"{name}.toml"
    if not path.is_file():
        raise UserError(f"unknown TRIX hardware preset '{name}' (known: {', '.join(presets())})")
    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    names = {f.name for f in fields(Hardware)}
    if set(data) != names:
        raise UserError(f"{path}: keys {sorted(set(data) ^ names)} missing or unknown")
    data["dtypes"] = tuple(data["dtypes"])
    return Hardware(**data)
