"""The network term of a phase split over RPC devices: what the link adds to a decode step or a prefill.

With layers on RPC devices the devices run one after another, and the client waits at each answer it needs
(a device's output for the next device, the logits at the end). So the link adds to a phase, in series with
the compute:

    t_phase(link) = t_phase(no added delay) + round_trips × RTT + bytes × 8 / link bits/s

where ``round_trips`` and ``bytes`` are what the phase carried, counted on the link itself
(:class:`~chatphase.bench.rpc.link.LinkCounters`), not assumed from the layer split. This is the roofline's
network term: a decode step is at least ``max(bytes read ÷ memory bandwidth on each device, round trips × RTT
+ activations ÷ link bandwidth)``; measured steps sit near the sum, since the devices take turns. The
baseline is the same load through the same proxy with nothing added, so the loopback's and the proxy's own
costs are in it and cancel.
"""

from __future__ import annotations

from chatphase.bench.rpc.link import LinkCounters, LinkShape


def network_ms(carried: LinkCounters, shape: LinkShape, per: float = 1.0) -> float:
    """Milliseconds the link ``shape`` adds to what carried ``carried`` (divided by ``per``: the tokens or
    steps it spans): one RTT per round trip, and every byte at the link's rate (none when uncapped)."""
    if per <= 0:
        raise ValueError(f"per must be above 0 (got {per:g})")
    rate_ms = (carried.bytes_up + carried.bytes_down) * 8 / (shape.mbit_per_s * 1e3) if shape.mbit_per_s else 0.0
    return (carried.round_trips * shape.rtt_ms + rate_ms) / per


def predicted_ms(base_ms: float | None, carried: LinkCounters, shape: LinkShape, per: float = 1.0) -> float | None:
    """``base_ms`` (the phase measured with nothing added) plus :func:`network_ms`; ``None`` without a base."""
    return None if base_ms is None else base_ms + network_ms(carried, shape, per)
