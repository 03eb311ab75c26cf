"""The GPU kinds `stare sim` and `stare plan --node-gpus` know: each one's datasheet peaks (dense bf16, no
sparsity), memory, and links. The cost model applies its efficiency factors (stare/app/sim/constants.py)
to these peaks once: no entry holds a measured or derated figure.

Sources (NVIDIA's product pages and datasheets; per GPU):

* H100 SXM 80GB, H200 SXM: https://www.nvidia.com/en-us/data-center/h100/ and /h200/ (bf16 1,979 TFLOP/s
  with sparsity, so 989 dense; 3.35 / 4.8 TB/s; NVLink 4 900 GB/s bidirectional; PCIe Gen5 x16).
* A100 80GB SXM: https://www.nvidia.com/en-us/data-center/a100/ (bf16 312 dense, 2,039 GB/s, NVLink 600 GB/s
  bidirectional, PCIe Gen4).
* L40S: https://www.nvidia.com/en-us/data-center/l40s/ (bf16 362 dense, 733 with sparsity; 48 GB GDDR6 at
  864 GB/s; PCIe Gen4 x16, no NVLink: GPU to GPU over PCIe).
* B200: https://www.nvidia.com/en-us/data-center/hgx/ and the DGX B200 datasheet (8 GPUs: 1,440 GB, 64 TB/s,
  NVLink 5 at 1.8 TB/s bidirectional per GPU; bf16 4.5 PFLOP/s per GPU with sparsity, 2.25 dense).
* H800 SXM: no public NVIDIA datasheet. Compute and HBM as the H100 SXM; NVLink 400 GB/s bidirectional as
  commonly reported, and DeepSeek-V3's technical report (arXiv 2412.19437, section 3.2.2) measured
  "NVLink ... 160 GB/s" per direction on its H800 nodes: the per-direction figure used here.
* H20: no public NVIDIA datasheet; the widely reported figures (148 TFLOP/s bf16 dense, 96 GB HBM3 at
  4.0 TB/s, NVLink 900 GB/s bidirectional, PCIe Gen5).

PCIe per direction: Gen5 x16 64 GB/s, Gen4 x16 32 GB/s (PCI-SIG: 32 / 16 GT/s a lane, 16 lanes, 128b/130b).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
PCIE5_BYTES_S = 64 * GB
PCIE4_BYTES_S = 32 * GB


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's datasheet numbers (dense bf16, no sparsity)."""

    name: str
    bf16_flops: float  # FLOP/s
    hbm_bytes_s: float  # B/s
    mem_gib: float  # GiB the engine and the learner see (the product's GB figure: 80 GB parts report 80 GiB)
    gpu_link_bytes_s: float  # GPU <-> GPU, per direction (NVLink; PCIe where there is none)
    host_link_bytes_s: float  # GPU <-> host, per direction (PCIe)
    datasheet: bool  # False: no public NVIDIA datasheet (the figures are as reported; see the module docstring)
    source: str


GPUS: dict[str, GpuSpec] = {
    "h100-80gb": GpuSpec(
        "h100-80gb",
        989e12,
        3.35e12,
        80,
        450 * GB,
        PCIE5_BYTES_S,
        True,
        "NVIDIA H100 SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s bidirectional",
    ),
    "h200": GpuSpec(
        "h200",
        989e12,
        4.8e12,
        141,
        450 * GB,
        PCIE5_BYTES_S,
        True,
        "NVIDIA H200 SXM: 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s bidirectional",
    ),
    "h800": GpuSpec(
        "h800",
        989e12,
        3.35e12,
        80,
        160 * GB,
        PCIE5_BYTES_S,
        False,
        "H800 SXM (no public datasheet): H100 compute and HBM; NVLink 160 GB/s a direction as DeepSeek-V3 "
        "measured (arXiv 2412.19437)",
    ),
    "h20": GpuSpec(
        "h20",
        148e12,
        4.0e12,
        96,
        450 * GB,
        PCIE5_BYTES_S,
        False,
        "H20 (no public datasheet): 148 TFLOP/s bf16 dense, 4.0 TB/s HBM3, 96 GB, NVLink 900 GB/s bidirectional "
        "as widely reported",
    ),
    "a100-80gb": GpuSpec(
        "a100-80gb",
        312e12,
        2.039e12,
        80,
        300 * GB,
        PCIE4_BYTES_S,
        True,
        "NVIDIA A100 80GB SXM: 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e, NVLink 600 GB/s bidirectional",
    ),
    "l40s": GpuSpec(
        "l40s",
        362e12,
        864e9,
        48,
        PCIE4_BYTES_S,
        PCIE4_BYTES_S,
        True,
        "NVIDIA L40S: 362 TFLOP/s bf16 dense (733 with sparsity), 864 GB/s GDDR6, 48 GB, PCIe Gen4 x16, "
        "no NVLink (GPU to GPU over PCIe)",
    ),
    "b200": GpuSpec(
        "b200",
        2250e12,
        8.0e12,
        180,
        900 * GB,
        PCIE5_BYTES_S,
        True,
        "NVIDIA B200 (HGX/DGX B200): 2.25 PFLOP/s bf16 dense (4.5 with sparsity), 8 TB/s HBM3e, 180 GB, "
        "NVLink 5 1.8 TB/s bidirectional",
    ),
}


def gpu(name: str) -> GpuSpec:
    """The kind called `name`, or a ValueError listing the known ones."""
    if name not in GPUS:
        raise ValueError(f"--gpu {name}: unknown; choose one of {', '.join(GPUS)} (or cpu with --profile)")
    return GPUS[name]
