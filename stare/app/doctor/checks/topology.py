"""topology: the GPUs, how each pair is connected, the transport NCCL really takes, and the container's IPC.

python -m stare.app.doctor.checks.topology nccl-rank RANK PORT OUT    (one rank of topology.nccl)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from stare.app.doctor.checks.common import command, cuda, gpus
from stare.app.doctor.registry import Check, Context, Row, timed

CHECKS = [
    Check(
        "topology.gpus",
        "every visible GPU: name, memory, compute capability",
        "no GPU visible to this process",
        "CUDA_VISIBLE_DEVICES, the container's GPU request (--gpus, "
        "deploy.resources), the Kubernetes nvidia.com/gpu limit",
        gpu=True,
    ),
    Check(
        "topology.links",
        "P2P access and NVLink between each GPU pair, and the NCCL transport each pair should get "
        "(P2P with peer access, else SHM)",
        "pairs without peer access (PCIe across sockets, IOMMU, a VM): weight "
        "broadcasts between them go through host memory at a fraction of NVLink's rate",
        "place the learner and the engines it feeds on GPUs with P2P (nvidia-smi topo -m; stare up --learner-gpus / "
        "--rollout-gpus)",
        gpu=True,
    ),
    Check(
        "topology.nccl",
        "a 2-process NCCL all-reduce between GPUs 0 and 1 and the transport NCCL_DEBUG=INFO says it took",
        "NCCL fell back to NET (sockets) between GPUs of one host: different host hashes (containers with "
        "their own hostnames) or no shared IPC",
        "one NCCL_HOSTID and ipc: host for every GPU container "
        "(docker-compose.yml x-learner-gpu), or run the roles in one container",
        gpu=True,
    ),
    Check(
        "topology.container",
        "inside a container: NCCL_HOSTID set and /dev/shm large enough for NCCL's SHM "
        "transport (the host's, with ipc: host)",
        "NCCL will see the containers as different hosts (NET) or run out of /dev/shm",
        "docker-compose.yml's GPU services set both (x-learner-gpu / x-rollout-gpu); for docker "
        "run: --ipc=host -e NCCL_HOSTID=<one value>",
        gpu=True,
    ),
]

SHM_MIN = 1 << 30  # NCCL's SHM transport maps buffers per channel and peer; docker's private default is 64 MiB


def gpu_list() -> Row:
    if why := cuda():
        return Row("topology.gpus", "skip", why)
    import torch

    figures = {}
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        figures[f"gpu{i}"] = f"{p.name} {p.total_memory / 2**30:.0f} GiB sm_{p.major}{p.minor}"
    free, total = torch.cuda.mem_get_info(0)
    figures["gpu0_free_gib"] = round(free / 2**30, 1)
    return Row("topology.gpus", "pass", "", figures)


def _nvlink_pairs() -> set[tuple[int, int]]:
    """GPU pairs `nvidia-smi topo -m` marks NV# (NVLink)."""
    code, out = command(["nvidia-smi", "topo", "-m"], 20)
    pairs: set[tuple[int, int]] = set()
    if code != 0:
        return pairs
    for line in out.splitlines():
        m = re.match(r"^GPU(\d+)\s+(.*)$", line.strip())
        if not m:
            continue
        cells = m.group(2).split()
        for j, cell in enumerate(cells):
            if cell.startswith("NV"):
                pairs.add(tuple(sorted((int(m.group(1)), j))))
    return pairs


def links() -> Row:
    if why := cuda():
        return Row("topology.links", "skip", why)
    n = gpus()
    if n < 2:
        return Row("topology.links", "skip", f"{n} GPU: no pair to connect")
    import torch

    nvlink, figures, without = _nvlink_pairs(), {}, []
    for i in range(n):
        for j in range(i + 1, n):
            p2p = torch.cuda.can_device_access_peer(i, j)
            figures[f"{i}-{j}"] = ("NVLink" if (i, j) in nvlink else "PCIe") + (" P2P" if p2p else " no-P2P (SHM)")
            if not p2p:
                without.append(f"{i}-{j}")
    if without:
        return Row("topology.links", "fail", f"no peer access between {', '.join(without)}", figures)
    return Row("topology.links", "pass", "", figures)


def nccl(out: Path) -> Row:
    if why := cuda():
        return Row("topology.nccl", "skip", why)
    if gpus() < 2:
        return Row("topology.nccl", "skip", f"{gpus()} GPU: NCCL refuses two ranks on one GPU")
    from stare.runtime.net import free_port

    port = free_port()
    env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,SHM,NET", "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "stare.app.doctor.checks.topology", "nccl-rank", str(r), str(port), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=60)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0] + "\n(timed out after 60 s)")
    text = "\n".join(logs)
    (out / "topology.nccl.log").write_text(text)
    via = sorted(set(re.findall(r"via (\S+)", text)))
    gbps = re.findall(r"busbw_gbps=([\d.]+)", text)
    figures = {"transports": " ".join(via) or "unknown", "busbw_gbps": float(gbps[0]) if gbps else None}
    if any(p.returncode for p in procs):
        return Row("topology.nccl", "fail", f"the NCCL all-reduce failed (log: {out / 'topology.nccl.log'})", figures)
    if any(v.startswith("NET") for v in via):
        return Row("topology.nccl", "fail", "NCCL used the network between two GPUs of this host", figures)
    return Row("topology.nccl", "pass", "", figures)


def _nccl_rank(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    x = torch.ones(64 * 2**20, device="cuda")  # 256 MiB
    dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / 5
    if rank == 0:  # all-reduce bus bandwidth: 2 (n - 1) / n x bytes / time (nccl-tests' busbw)
        print(f"busbw_gbps={x.numel() * 4 / seconds / 1e9:.1f}")
    dist.destroy_process_group()


def container() -> Row:
    if why := cuda():
        return Row("topology.container", "skip", f"{why}: NCCL is not used here")
    marks = [p for p in ("/.dockerenv", "/run/.containerenv") if Path(p).exists()]
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        cgroup = ""
    if not marks and not re.search(r"docker|kubepods|containerd|libpod", cgroup):
        return Row("topology.container", "skip", "not in a container")
    st = os.statvfs("/dev/shm")
    shm = st.f_frsize * st.f_blocks
    figures = {"dev_shm_gib": round(shm / 2**30, 2), "nccl_hostid": os.environ.get("NCCL_HOSTID", "unset")}
    problems = []
    if "NCCL_HOSTID" not in os.environ:
        problems.append(
            "NCCL_HOSTID is unset: NCCL hashes this container's hostname, so GPU containers look like different hosts"
        )
    if shm < SHM_MIN:
        problems.append(f"/dev/shm is {shm / 2**20:.0f} MiB (a private IPC namespace): NCCL's SHM transport needs more")
    return Row("topology.container", "fail" if problems else "pass", "; ".join(problems), figures)


def run(ctx: Context, report) -> None:
    check = timed(report)
    check("topology.gpus", gpu_list)
    check("topology.links", links)
    check("topology.nccl", lambda: nccl(Path(ctx.out)))
    check("topology.container", container)


if __name__ == "__main__" and sys.argv[1:2] == ["nccl-rank"]:
    _nccl_rank(int(sys.argv[2]), int(sys.argv[3]))
