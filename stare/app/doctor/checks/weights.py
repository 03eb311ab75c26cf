"""weights: the weight broadcast from the learner to an engine, and the stream fences of the publish and receive.

python -m stare.app.doctor.checks.weights receiver PORT    (the engine end of weights.nccl_broadcast)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stare.app.doctor.checks.common import cuda, gpus
from stare.app.doctor.registry import Check, Context, Row, timed

if TYPE_CHECKING:
    import torch

STATE_MIB = {"cpu": 64, "cuda": 1024}  # the broadcast's size: a 64 MiB model over gloo, 1 GiB over NCCL
# The slowest rate a healthy link gives a 1 GiB broadcast (GB/s): well under NVLink's 450 per direction (H100)
# and PCIe Gen4 x16's 32; a transfer slower than this went through sockets or host memory.
FLOOR_GBPS = {"NVLink": 40.0, "PCIe": 4.0}

CHECKS = [
    Check(
        "weights.gloo_broadcast",
        "the learner's broadcast over gloo to a subscriber (the CPU path, and the GPU path's "
        "fallback): every byte arrives; GB/s",
        "the rendezvous store or gloo group does not form on loopback (a firewall, a port in use), or bytes are lost",
        "system.broadcast_host / broadcast_port reachable from the rollout workers; report it",
    ),
    Check(
        "weights.nccl_broadcast",
        "the learner's NCCL broadcast from GPU 0 to a receiver process on GPU 1: every byte "
        "arrives; GB/s against the link (topology.links)",
        "NCCL does not connect the two processes, or runs far below the link (sockets instead of P2P)",
        "see topology.nccl; system.weight_sync_communicator=gloo as a stopgap",
        gpu=True,
    ),
    Check(
        "weights.fence_fake",
        "two versions published back to back into one receive buffer set never mix in the "
        "engine's copies, and a background send completes while the learner's next step holds its stream, on a "
        "device that runs stream work in the worst order allowed (the unfenced control must mix)",
        "the weight sync's stream fences are broken: engines may sample from half-updated weights",
        "report it; system.inflight_weight_updates=false and system.max_staleness=0 avoid the paths",
    ),
    Check(
        "weights.fence_gpu",
        "the same on this GPU's streams, the engine's copy delayed by a sleep kernel; also run "
        "unfenced as a control (whether the race shows here)",
        "versions mixed on the GPU with the fences on",
        "report it; system.inflight_weight_updates=false",
        gpu=True,
    ),
    Check(
        "weights.overlap_gpu",
        "a background send completes while the learner's stream is busy with a long kernel "
        "(the send waits only for its snapshot)",
        "the send waits for training work: weight versions arrive late (receivers time out at 7B)",
        "report it; system.max_staleness=0 (synchronous publish)",
        gpu=True,
    ),
]


def _state(mib: int, device: str, shift: float = 0.0) -> dict[str, torch.Tensor]:
    """A model-like state: big matrices, small vectors (packed into buckets), one bf16 tensor."""
    import torch

    n = mib * 2**20 // 4 // 8
    g = torch.Generator().manual_seed(1)
    out = {f"layers.{i}.weight": torch.randn(n, generator=g) + shift for i in range(7)}
    out["norm.weight"] = torch.ones(256) + shift
    out["head.weight"] = (torch.randn(n, generator=g) + shift).to(torch.bfloat16)
    return {k: v.to(device) for k, v in out.items()}


def _checksum(state) -> float:
    return float(sum(v.double().sum() for v in state.values()))


def gloo_broadcast() -> Row:
    import torch

    from stare.weight_sync.broadcast import BroadcastPublisher, BroadcastSubscriber

    state = _state(STATE_MIB["cpu"], "cpu")
    pub = BroadcastPublisher("127.0.0.1", 0, timeout_s=30, communicator="gloo")
    sub = BroadcastSubscriber("127.0.0.1", pub.store.port, "doctor", timeout_s=30, poll_s=0.01, communicator="gloo")
    try:
        deadline = time.monotonic() + 30
        while pub.store.add("joins", 0) < 1:
            if time.monotonic() > deadline:
                return Row("weights.gloo_broadcast", "fail", "the receiver never asked to join")
            time.sleep(0.01)
        t0 = time.perf_counter()
        pub.publish(1, state)
        seconds = time.perf_counter() - t0
        if not sub.wait_for(1, 30):
            return Row("weights.gloo_broadcast", "fail", "version 1 never arrived")
        _, got = sub.fetch(0)
        same = all(torch.equal(got[k], v) for k, v in state.items())
    finally:
        sub.close()
        pub.close()
    size = sum(v.numel() * v.element_size() for v in state.values())
    figures = {"mib": round(size / 2**20), "gb_per_s": round(size / seconds / 1e9, 2)}
    return Row("weights.gloo_broadcast", "pass" if same else "fail", "" if same else "bytes differ", figures)


def nccl_broadcast(out: Path) -> Row:
    import torch

    if why := cuda():
        return Row("weights.nccl_broadcast", "skip", why)
    if gpus() < 2:
        return Row("weights.nccl_broadcast", "skip", f"{gpus()} GPU: NCCL refuses the learner and an engine on one GPU")
    from stare.app.doctor.checks.topology import _nvlink_pairs
    from stare.weight_sync.broadcast import BroadcastPublisher

    torch.cuda.set_device(0)
    pub = BroadcastPublisher("127.0.0.1", 0, timeout_s=60, communicator="nccl")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": _visible(1)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stare.app.doctor.checks.weights", "receiver", str(pub.store.port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while pub.store.add("joins", 0) < 1:
            if time.monotonic() > deadline or proc.poll() is not None:
                return Row("weights.nccl_broadcast", "fail", "the receiver never asked to join")
            time.sleep(0.05)
        times = []
        for version in (1, 2):
            state = _state(STATE_MIB["cuda"], "cuda", shift=version)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            pub.publish(version, state)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        want = _checksum(state)
        text = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close()
    (out / "weights.nccl_receiver.log").write_text(text)
    got = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("checksum=")]
    size = sum(v.numel() * v.element_size() for v in state.values())
    link = "NVLink" if (0, 1) in _nvlink_pairs() else "PCIe"
    gbps = size / times[-1] / 1e9  # the second version: the group formed, the buffers made
    figures = {
        "gib": round(size / 2**30, 2),
        "gb_per_s": round(gbps, 1),
        "link": link,
        "communicator": pub.communicator,
    }
    if not got or abs(float(got[-1]) - want) > 1e-6 * abs(want):
        return Row(
            "weights.nccl_broadcast", "fail", "the receiver's bytes differ (log: weights.nccl_receiver.log)", figures
        )
    if gbps < FLOOR_GBPS[link]:
        return Row(
            "weights.nccl_broadcast",
            "fail",
            f"{gbps:.1f} GB/s over {link}, under the {FLOOR_GBPS[link]:g} GB/s a healthy link gives",
            figures,
        )
    return Row("weights.nccl_broadcast", "pass", "", figures)


def _visible(index: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of this process's GPU `index`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[index] if visible else str(index)


def _receiver(port: int) -> None:
    import torch

    from stare.weight_sync.broadcast import BroadcastSubscriber

    torch.cuda.set_device(0)
    sub = BroadcastSubscriber(
        "127.0.0.1", port, "doctor-engine", timeout_s=60, poll_s=0.01, communicator="nccl", buffer_sets=1
    )
    try:
        if not sub.wait_for(2, 120):
            print("version 2 never arrived", flush=True)
            sys.exit(1)
        _, state = sub.fetch(0)
        print(f"checksum={_checksum(state)!r}", flush=True)
    finally:
        sub.close()


def fence_fake() -> Row:
    from stare.weight_sync.fake_streams import FakeStreams
    from stare.weight_sync.fence_check import back_to_back, send_while_training

    fake = FakeStreams()
    fenced = back_to_back(fake, finish=fake.drain)
    control = FakeStreams()
    unfenced = back_to_back(control, fenced=False, finish=control.drain)
    held = FakeStreams()

    def finish():
        held.release_all()
        held.drain()

    overlap = send_while_training(
        held, busy=lambda s: held.hold(s) or s, is_busy=lambda s: s.held_from is not None, finish=finish
    )
    figures = {
        "fenced_mixed": sum(map(len, fenced.mixed.values())),
        "unfenced_mixed": sum(map(len, unfenced.mixed.values())),
        "send_while_held": overlap.sent_while_busy,
    }
    problems = []
    if not fenced.clean:
        problems.append(f"with the fences, versions mixed: {fenced.mixed}")
    if unfenced.clean:
        problems.append("the unfenced control did not mix: the check cannot see the race")
    if not (overlap.sent_while_busy and overlap.bytes_ok):
        problems.append("a background send waited for the learner's held stream, or sent the wrong bytes")
    return Row("weights.fence_fake", "fail" if problems else "pass", "; ".join(problems), figures)


def _sleep_kernel(seconds: float):
    """Work that keeps the current stream busy for about `seconds` (torch.cuda._sleep spins clock cycles)."""
    import torch

    cycles = (
        int(seconds * torch.cuda.get_device_properties(0).clock_rate * 1e3)
        if hasattr(torch.cuda.get_device_properties(0), "clock_rate")
        else int(seconds * 1.5e9)
    )
    return lambda: torch.cuda._sleep(cycles)


def fence_gpu() -> Row:
    import torch

    if why := cuda():
        return Row("weights.fence_gpu", "skip", why)
    from stare.weight_sync.fence_check import back_to_back
    from stare.weight_sync.streams import CudaStreams

    streams = CudaStreams(torch.device("cuda", 0))
    fenced = back_to_back(streams, delay=_sleep_kernel(0.3))
    unfenced = back_to_back(streams, fenced=False, delay=_sleep_kernel(0.3))
    figures = {
        "fenced_mixed": sum(map(len, fenced.mixed.values())),
        "unfenced_mixed": sum(map(len, unfenced.mixed.values())),
        "seconds": round(fenced.seconds, 2),
    }
    note = (
        "the unfenced control mixed: the race is real on this GPU"
        if not unfenced.clean
        else "the unfenced control did not mix this time (the race depends on timing)"
    )
    if not fenced.clean:
        return Row("weights.fence_gpu", "fail", f"with the fences, versions mixed: {fenced.mixed}; {note}", figures)
    return Row("weights.fence_gpu", "pass", note, figures)


def overlap_gpu() -> Row:
    import torch

    if why := cuda():
        return Row("weights.overlap_gpu", "skip", why)
    from stare.weight_sync.fence_check import send_while_training
    from stare.weight_sync.streams import CudaStreams

    streams = CudaStreams(torch.device("cuda", 0))
    spin = _sleep_kernel(2.0)

    def busy(stream):
        import torch

        with torch.cuda.stream(stream):
            spin()
            return stream.record_event()

    result = send_while_training(
        streams, busy=busy, is_busy=lambda event: not event.query(), finish=torch.cuda.synchronize
    )
    figures = {"send_s": round(result.send_s, 3), "sent_while_busy": result.sent_while_busy}
    if not result.bytes_ok:
        return Row("weights.overlap_gpu", "fail", "the receiver got other bytes than the snapshot", figures)
    if not result.sent_while_busy:
        return Row("weights.overlap_gpu", "fail", "the send finished only after the learner's busy stream", figures)
    return Row("weights.overlap_gpu", "pass", "", figures)


def run(ctx: Context, report) -> None:
    check = timed(report)
    check("weights.gloo_broadcast", gloo_broadcast)
    check("weights.nccl_broadcast", lambda: nccl_broadcast(Path(ctx.out)))
    check("weights.fence_fake", fence_fake)
    check("weights.fence_gpu", fence_gpu)
    check("weights.overlap_gpu", overlap_gpu)


if __name__ == "__main__" and sys.argv[1:2] == ["receiver"]:
    _receiver(int(sys.argv[2]))
