"""Access-log lines of served requests, formatted at the flush (gateway/accesslog.py)."""

from __future__ import annotations

from pathlib import Path

import orjson

from inferplane.gateway.accesslog import SERVED_KEYS, AccessLog, ServedRow


def _rows(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_a_served_row_is_the_json_of_its_fields_with_times_to_6_decimals(tmp_path: Path) -> None:
    log_path = tmp_path / "access.jsonl"
    log = AccessLog(str(log_path))
    row: ServedRow = (
        b'id "quoted" \\ \xe9', 1764659000.1234567, "m\u00fc", "r0", "http://10.0.0.1:8000",
        200, 17, 33, 1.5, 0.0000004, 0.00123456789, 2.0, 1,
    )  # fmt: skip
    log.write({"request_id": "refused", "status": 404})
    log.served(row)
    log.served((b"x", 1.0, "m\u00fc", "r1", "http://10.0.0.2:8000", 502, 0, 0, 0, 0, 0, 0, 2))
    log.flush()
    first, served, other = _rows(log_path)
    assert first == {"request_id": "refused", "status": 404}  # the order of the calls
    rounded = [round(v, 6) if isinstance(v, float) else v for v in row]
    rounded[0] = row[0].decode("latin-1")
    assert served == dict(zip(SERVED_KEYS, rounded, strict=True))
    assert list(served) == list(SERVED_KEYS)
    assert served["queue_wait_s"] == 0.0 and served["admission_s"] == 1.5
    assert other["replica"] == "r1" and other["model"] == "m\u00fc" and other["retries"] == 2


def test_the_escaped_names_cache_stays_bounded(tmp_path: Path) -> None:
    log_path = tmp_path / "access.jsonl"
    log = AccessLog(str(log_path))
    for i in range(3000):
        log.served((b"r", 1.0, "m", f"r{i}", f"http://h{i}:80", 200, 1, 1, 0, 0, 0, 0, 0))
    log.flush()
    assert [r["replica"] for r in _rows(log_path)] == [f"r{i}" for i in range(3000)]
    assert len(log._names) <= 1024
