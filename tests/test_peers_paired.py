"""The paired peers report (`benchmarks/peers_paired.py`): which way its ratios point."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _peers_paired() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import peers_paired

    return peers_paired


def test_pair_row_is_a_over_b_with_cpu_b_over_a() -> None:
    pp = _peers_paired()
    gw = pp.Sample(rps=1000.0, p50_ms=2.0, p99_ms=6.0, cpu_us=200.0, cpu_share=0.45)
    nginx = pp.Sample(rps=2000.0, p50_ms=1.0, p99_ms=3.0, cpu_us=50.0, cpu_share=0.30)
    fast = pp.Sample(rps=4000.0, p50_ms=1.0, p99_ms=3.0, cpu_us=50.0, cpu_share=0.30)
    busy = {0: 1.0, 1: 0.5}
    rounds = [(gw, nginx, busy), (gw, fast, busy), (gw, nginx, busy)]
    text = pp.render({("ns", 32, "gw", "nginx"): rounds}, {})
    row = next(line for line in text.splitlines() if "gw / nginx" in line)
    assert "0.500 0.250 0.500" in row  # each round's RPS A/B, in order
    assert row.split()[-5:] == ["0.500", "0.250", "45+30%", "100%", "50%"]


def test_solo_latency_is_added_over_direct() -> None:
    pp = _peers_paired()
    direct = pp.Sample(rps=20000.0, p50_ms=1.0, p99_ms=2.0, cpu_us=30.0, cpu_share=0.6)
    runs = ((9000.0, 2.0, 5.0), (8000.0, 3.0, 9.0), (7000.0, 4.0, 7.0))
    gw = [pp.Sample(rps=r, p50_ms=p50, p99_ms=p99, cpu_us=70.0, cpu_share=1.0)
          for r, p50, p99 in runs]  # fmt: skip
    text = pp.render({}, {("ns", "direct"): [direct], ("ns", "gw"): gw})
    row = next(line for line in text.splitlines() if line.split()[2:3] == ["gw"])
    assert row.split()[3:] == ["8,000", "3.00", "7.00", "+2.00", "+5.00"]
