"""`inferplane bench` against an established tool (guidellm) on the same simulated target.

    python -m venv /tmp/guidellm-venv && /tmp/guidellm-venv/bin/pip install guidellm
    python benchmarks/bench_vs_guidellm.py --guidellm /tmp/guidellm-venv/bin/guidellm

guidellm lives in its own venv (it pulls torch); nothing here imports it. The script
writes a model directory (the simulator's default Qwen3-0.6B shape plus a small
whitespace WordLevel `tokenizer.json`, so both tools and the simulator count the same
tokens), starts `inferplane sim` on it (step times x `--slowdown`, so the numbers are
about the engine rather than loopback HTTP), runs both tools with the same load - closed
loop at `--concurrency`, synthetic prompts of `--input-len` tokens, `--output-len` tokens
out - one after the other, and prints each metric side by side with the difference.

Below each table, what the server saw during each tool's run - its own mean TTFT and
queue time (the simulator's /metrics before and after) - and how the tool's requests
arrived: the mean number sent within 2 ms of each other (`sent_ms` of inferplane's
requests.csv, guidellm's request_start_time). The client-side TTFT minus the server's is
the tool's own overhead; a difference in the server's TTFT is a difference in the load.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def faker_words(guidellm: str) -> list[str]:
    """The English words guidellm's synthetic prompts are made of (Faker's lorem list),
    read from guidellm's own venv."""
    python = Path(guidellm).with_name("python")
    out = subprocess.run(
        [str(python), "-c", "import json; from faker.providers.lorem.en_US import Provider; "
         "print(json.dumps(Provider.word_list))"],
        check=True, capture_output=True, text=True,
    )
    words: list[str] = json.loads(out.stdout)
    return words


def model_dir(path: Path, words: list[str]) -> Path:
    """Every word (lower and capitalized) and punctuation mark is one token, so guidellm's
    prompts, ours and the simulator's count agree exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from inferplane.sim.build import DEFAULT_PROFILE_CONFIG

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[UNK]", ".", ",", "?", "!", "'", "-"]
    for word in words:
        vocab += [word, word.capitalize()]
    ids = {w: i for i, w in enumerate(dict.fromkeys(vocab))}
    tok = Tokenizer(models.WordLevel(ids, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
        "model_max_length": 40960,
    }))
    (path / "config.json").write_text(json.dumps(DEFAULT_PROFILE_CONFIG))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_up(url: str, timeout_s: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"simulator at {url} did not come up")


def scrape(url: str) -> dict[str, float]:
    """The simulator's TTFT and queue-time histogram sums and counts."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    wanted = ("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
              "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count")
    values = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


def server_side(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean TTFT and queue time (ms) the server measured between two scrapes."""
    def mean(metric: str) -> float:
        n = after[f"{metric}_count"] - before[f"{metric}_count"]
        return (after[f"{metric}_sum"] - before[f"{metric}_sum"]) / n * 1000 if n else 0.0

    return {"server TTFT ms": mean("vllm:time_to_first_token_seconds"),
            "server queue ms": mean("vllm:request_queue_time_seconds")}


def burst_size(sent_s: list[float], window_s: float = 0.002) -> float:
    """Mean size of the groups of requests sent within `window_s` of the previous one."""
    times = sorted(sent_s)
    groups = [1]
    for prev, cur in itertools.pairwise(times):
        if cur - prev < window_s:
            groups[-1] += 1
        else:
            groups.append(1)
    return sum(groups) / len(groups)


def ours(url: str, args: argparse.Namespace, model: Path, out_dir: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "inferplane", "bench", url, "--model", "sim-model",
         "--concurrency", str(args.level), "--num-requests", str(args.requests),
         "--input-len", str(args.input_len), "--output-len", str(args.output_len),
         "--tokenizer", str(model), "--out", str(out_dir / "ours"), "--json"],
        check=True, capture_output=True, text=True, cwd=REPO,
    )
    run = json.loads(out.stdout)["run"]
    with (out_dir / "ours" / "requests.csv").open() as handle:
        sent = [float(row["sent_ms"]) / 1000 for row in csv.DictReader(handle)]
    return {
        "TTFT mean ms": run["ttft_ms"]["mean"], "TTFT median ms": run["ttft_ms"]["median"],
        "ITL mean ms": run["itl_ms"]["mean"], "TPOT mean ms": run["tpot_ms"]["mean"],
        "E2EL mean ms": run["e2el_ms"]["mean"],
        "output tok/s": run["output_throughput_tok_s"],
        "requests/s": run["request_throughput_req_s"],
        "sent together": burst_size(sent),
    }


def theirs(url: str, args: argparse.Namespace, model: Path, out_dir: Path) -> dict[str, float]:
    report = out_dir / "guidellm.json"
    subprocess.run(
        [args.guidellm, "run",
         "--backend", f"kind=openai_http,target={url},model=sim-model,"
                      "request_format=/v1/completions",
         "--profile", f"kind=concurrent,streams={args.level}",
         "--constraint", f"kind=max_requests,count={args.requests}",
         "--data", f"kind=synthetic_text,prompt_tokens={args.input_len},"
                   f"output_tokens={args.output_len}",
         "--tokenizer", f"kind=hf_auto,model={model}",
         "--output", f"kind=json,path={report}", "--disable-progress"],
        check=True, capture_output=True, text=True,
    )
    bench: dict[str, Any] = json.loads(report.read_text())["benchmarks"][0]
    m = bench["metrics"]
    sent = [r["request_start_time"] for r in bench["requests"]["successful"]]

    def ok(name: str, stat: str = "mean") -> float:
        return float(m[name]["successful"][stat])

    return {
        "TTFT mean ms": ok("time_to_first_token_ms"),
        "TTFT median ms": ok("time_to_first_token_ms", "median"),
        "ITL mean ms": ok("inter_token_latency_ms"), "TPOT mean ms": ok("time_per_output_token_ms"),
        "E2EL mean ms": ok("request_latency") * 1000,
        "output tok/s": ok("output_tokens_per_second"),
        "requests/s": ok("requests_per_second"),
        "sent together": burst_size(sent),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guidellm", required=True, help="the guidellm executable")
    parser.add_argument("--concurrency", default="1,4,16", help="levels, e.g. 1,4")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--slowdown", type=float, default=10.0)
    compare(parser.parse_args())


def compare(args: argparse.Namespace) -> None:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir(Path(tmp) / "model", faker_words(args.guidellm))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        sim = subprocess.Popen(
            [sys.executable, "-m", "inferplane", "sim", "--model", "sim-model", "--model-dir",
             str(model), "--port", str(port), "--slowdown", str(args.slowdown)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_up(url)
            for level in [int(c) for c in args.concurrency.split(",")]:
                args.level = level
                before = scrape(url)
                a = ours(url, args, model, Path(tmp))
                middle = scrape(url)
                b = theirs(url, args, model, Path(tmp))
                after = scrape(url)
                # inferplane's one warm-up request is in its server-side numbers
                results.append((level, {**a, **server_side(before, middle)},
                                {**b, **server_side(middle, after)}))
        finally:
            sim.terminate()
            sim.wait(timeout=10)
    print(f"\nsame target: inferplane sim (Qwen3-0.6B shape, H100, slowdown {args.slowdown:g}), "
          f"{args.requests} requests per level, {args.input_len} -> {args.output_len} tokens")
    for level, a, b in results:
        print(f"\nconcurrency {level}")
        print(f"{'metric':<16} {'inferplane':>11} {'guidellm':>11} {'diff':>8}")
        for key, value in a.items():
            other = b[key]
            diff = (value / other - 1) * 100 if other else float("nan")
            print(f"{key:<16} {value:>11.2f} {other:>11.2f} {diff:>+7.1f}%")


if __name__ == "__main__":
    main()
