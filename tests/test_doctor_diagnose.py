"""`inferplane diagnose`: computed fixes, JSON schema, instance logs and pods (recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.doctor.diagnose import diagnose_text, find_model_dir
from inferplane.doctor.k8s import RecordedApi, parse_pod_ref, pod_text
from inferplane.errors import InferplaneError
from inferplane.estimator.memory import estimate_memory
from inferplane.estimator.rules import valid_tp_sizes
from inferplane.estimator.types import EngineSettings
from inferplane.gpus.catalog import lookup_gpu
from inferplane.models import load_profile

_register_commands()
DATA = Path(__file__).parent / "data" / "diagnose"
MODELS = Path(__file__).parent / "data" / "models"
runner = CliRunner()


def _finding(text: str, sig: str, **kwargs: Any) -> Any:
    result = diagnose_text(text, source="t", **kwargs)
    return next(f for f in result.findings if f.signature.id == sig)


def test_max_model_len_fix_is_the_estimators_and_changes_with_model_and_gpu() -> None:
    text = "INFO vLLM API server version 0.9.2\n" + (DATA / "kv-cache-too-small.log").read_text()
    seen = set()
    for model, gpu in (("meta-llama--Llama-3.1-8B-Instruct", "L4"),
                       ("meta-llama--Llama-3.1-8B-Instruct", "A10"),
                       ("Qwen--Qwen3-8B", "L4")):
        f = _finding(text, "kv-cache-too-small", model_dir=MODELS / model, gpu_name=gpu)
        fit = int(f.values["max_model_len_fit"])

        def fits(length: int, model: str = model, gpu: str = gpu) -> bool:
            return estimate_memory(
                load_profile(MODELS / model),
                EngineSettings(max_model_len=length, vllm_version="0.9.2"), gpu=lookup_gpu(gpu),
            ).fits

        assert fits(fit) and not fits(fit + 16)  # the longest that fits, by the estimator
        assert f"--max-model-len {fit} " in f.fix and "the log's own figure is 5632" in f.fix
        assert f.numbers_computed
        seen.add(fit)
    assert len(seen) == 3


def test_without_a_model_the_fix_uses_the_logs_own_numbers() -> None:
    f = _finding((DATA / "kv-cache-too-small.log").read_text(), "kv-cache-too-small")
    assert "--max-model-len 5632" in f.fix
    assert not f.numbers_computed


def test_tp_fix_lists_the_models_valid_sizes() -> None:
    text = (DATA / "tp-heads-not-divisible.log").read_text()
    plain = _finding(text, "tp-heads-not-divisible")
    assert "1, 2, 4, 13, 26, 52" in plain.fix  # divisors of the 52 heads in the message
    for model in ("Qwen--Qwen2.5-7B-Instruct", "Qwen--Qwen3-32B"):
        f = _finding(text, "tp-heads-not-divisible", model_dir=MODELS / model)
        valid = ", ".join(map(str, valid_tp_sizes(load_profile(MODELS / model), limit=16)))
        assert f"valid sizes for this model: {valid})" in f.fix


def test_tp_fix_without_the_asked_size_lists_the_divisors_and_picks_none() -> None:
    # the heads message copied with its TP number cut (vllm-ascend#2139's wording)
    text = ("the model's total number of attention heads (14) must be divisible by tensor "
            "parallel size. (4 -> 2)")
    f = _finding(text, "tp-heads-not-divisible")
    assert "sizes that divide the 14 attention heads: 1, 2, 7, 14" in f.fix
    assert "--tensor-parallel-size 7" not in f.fix and not f.missing


def test_free_memory_fix_computes_utilization_from_the_logs_numbers() -> None:
    line = ("ValueError: Free memory on device cuda:0 ({free}/44.39 GiB) on startup is less "
            "than desired GPU memory utilization (0.55, 24.42 GiB).")
    small = _finding(line.format(free="30.00"), "free-memory-below-utilization",
                     model_dir=MODELS / "Qwen--Qwen3-Embedding-0.6B")
    assert "--gpu-memory-utilization 0.66 " in small.fix  # floor((30 - 0.5) / 44.39, 2)
    assert "fits with max_model_len" in small.fix
    big = _finding(line.format(free="10.00"), "free-memory-below-utilization",
                   model_dir=MODELS / "Qwen--Qwen3-32B")
    assert "--gpu-memory-utilization 0.21 " in big.fix
    assert "does not fit in that share" in big.fix
    full = _finding(line.format(free="0.41"), "free-memory-below-utilization")
    assert "this card is full" in full.fix


def test_graph_oom_fix_uses_estimated_graph_memory() -> None:
    text = (DATA / "cuda-graph-capture-oom.log").read_text()
    f = _finding(text, "cuda-graph-capture-oom", model_dir=MODELS / "Qwen--Qwen3-8B",
                 gpu_name="L40S")
    assert f.numbers_computed and "GiB to" in f.fix
    generic = _finding(text, "cuda-graph-capture-oom")
    assert "cudagraph_capture_sizes" in generic.fix and not generic.numbers_computed


def test_liveness_fix_sizes_the_startup_probe_from_the_weights() -> None:
    text = (DATA / "k8s-liveness-kill-during-load.log").read_text()
    small = _finding(text, "k8s-liveness-kill-during-load",
                     model_dir=MODELS / "Qwen--Qwen3-8B", gpu_name="H100")
    big = _finding(text, "k8s-liveness-kill-during-load",
                   model_dir=MODELS / "Qwen--Qwen3-32B", gpu_name="H100")
    assert int(big.values["startup_s"]) > int(small.values["startup_s"])


def test_json_schema_is_stable() -> None:
    result = runner.invoke(app, ["diagnose", str(DATA / "removed-flag.log"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert list(doc) == ["schema", "source", "context", "computed_for", "findings", "unknown",
                         "notes", "generic", "similar"]  # keys are only ever added, at the end
    assert doc["schema"] == "inferplane.diagnose/v1"
    finding = doc["findings"][0]
    assert list(finding) == ["id", "title", "kind", "pitfall", "pitfalls", "evidence",
                             "occurrences", "values", "cause", "fix", "numbers_computed",
                             "sources", "missing"]
    assert finding["id"] == "removed-flag" and finding["pitfall"] == "P32"
    assert finding["evidence"] == [{"line": 1, "text": "vllm serve: error: unrecognized "
                                    "arguments: --swap-space 16"}]
    assert "removed in vLLM 0.11.0" in finding["fix"]


def test_unknown_log_in_json_and_text() -> None:
    result = runner.invoke(app, ["diagnose", str(DATA / "unknown.log"), "--json"])
    doc = json.loads(result.output)
    assert doc["findings"] == [] and doc["unknown"]["first_error"]["line"] == 2
    text = runner.invoke(app, ["diagnose", "-"], input="all good\n")
    assert "no known failure signature" in text.output
    assert "no error line found" in text.output


def test_stdin_and_text_output() -> None:
    result = runner.invoke(app, ["diagnose", "-"],
                           input=(DATA / "awq-bfloat16.log").read_text())
    assert result.exit_code == 0
    assert "P07" in result.output and "--dtype float16" in result.output


def test_bad_inputs_are_usage_errors() -> None:
    from inferplane.cli.diagnose import read_source

    with pytest.raises(InferplaneError, match="exactly one"):
        read_source(None, None, None, None, None)
    with pytest.raises(InferplaneError, match="exactly one"):
        read_source("x.log", "a", None, None, None)
    with pytest.raises(InferplaneError, match="no such log"):
        read_source("/nonexistent.log", None, None, None, None)
    with pytest.raises(InferplaneError, match="NAMESPACE/POD"):
        parse_pod_ref("just-a-pod")


def test_instance_log_from_the_state_dir(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "qwen-0.log.1").write_text((DATA / "tp-heads-not-divisible.log").read_text())
    (logs / "qwen-0.log").write_text("INFO 05-01 restarting\n")
    (tmp_path / "state.json").write_text(json.dumps({"instances": [{"name": "qwen-0"}]}))
    result = runner.invoke(app, ["diagnose", "--instance", "qwen-0", "--json",
                                 "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["source"].endswith("qwen-0.log")
    assert [f["id"] for f in doc["findings"]] == ["tp-heads-not-divisible"]
    missing = runner.invoke(app, ["diagnose", "--instance", "nope", "--state-dir", str(tmp_path)])
    assert isinstance(missing.exception, InferplaneError)  # main() turns it into exit 2


def test_pod_logs_and_events_from_recorded_responses() -> None:
    api = RecordedApi(DATA / "k8s" / "pending-gpu-pod")
    text = pod_text(api, "inference", "vllm-7b-server-7d9f8-x2k4p")
    ids = [f.signature.id for f in diagnose_text(text, source="pod").findings]
    assert "k8s-rollout-pending-gpu" in ids and "k8s-insufficient-gpu" in ids
    crash = pod_text(RecordedApi(DATA / "k8s" / "crashloop-pod"), "default", "x")
    assert "log of the previous container" in crash
    crash_ids = [f.signature.id for f in diagnose_text(crash, source="pod").findings]
    assert crash_ids == ["k8s-liveness-kill-during-load"]


def test_pod_option_uses_the_kubernetes_api(monkeypatch: pytest.MonkeyPatch) -> None:
    import inferplane.doctor.k8s as k8s

    monkeypatch.setattr(k8s, "KubernetesApi",
                        lambda: RecordedApi(DATA / "k8s" / "crashloop-pod"))
    result = runner.invoke(app, ["diagnose", "--pod", "default/x", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["findings"][0]["pitfall"] == "P24"


def test_model_named_in_the_log_is_found_in_the_hf_cache(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((MODELS / "Qwen--Qwen3-8B" / "config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert find_model_dir("Qwen/Qwen3-8B") == snap
    assert find_model_dir("Qwen/Unknown") is None
    text = ("INFO Initializing a V1 LLM engine (v0.9.2) with config: model='Qwen/Qwen3-8B', "
            "tensor_parallel_size=1\n" + (DATA / "cuda-oom-startup.log").read_text())
    result = diagnose_text(text, source="t")
    assert result.model_profile is not None and result.findings[0].numbers_computed


def test_readme_diagnosis_is_what_the_command_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Path(__file__).parents[1]
    command = ("$ inferplane diagnose tests/data/diagnose/kv-cache-too-small.v0.log --model "
               "tests/data/models/meta-llama--Llama-3.1-8B-Instruct --gpu RTX-3090\n")
    block = (repo / "README.md").read_text().split(command, 1)[1].split("\n```", 1)[0]
    monkeypatch.chdir(repo)
    result = runner.invoke(app, command.split()[2:])
    assert result.output.rstrip("\n") == block.rstrip("\n")


def test_kubernetes_api_wrapper_serialises_client_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client, config

    from inferplane.doctor.k8s import KubernetesApi

    class FakeCore:
        def read_namespaced_pod(self, name: str, namespace: str) -> Any:
            status = client.V1PodStatus(phase="Running", container_statuses=[
                client.V1ContainerStatus(
                    name="vllm", image="i", image_id="", ready=False, restart_count=2,
                    last_state=client.V1ContainerState(terminated=client.V1ContainerStateTerminated(
                        exit_code=137, reason="OOMKilled")))])
            return client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                                status=status)

        def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> str:
            return "INFO loading\n" if not kw["previous"] else "INFO previous run\n"

        def list_namespaced_event(self, namespace: str, field_selector: str) -> Any:
            assert field_selector == "involvedObject.name=vllm-0"
            return client.CoreV1EventList(items=[client.CoreV1Event(
                metadata=client.V1ObjectMeta(name="e"), involved_object=client.V1ObjectReference(),
                type="Warning", reason="BackOff", count=3,
                message="Back-off restarting failed container vllm")])

    monkeypatch.setattr(config, "load_kube_config", lambda: None)
    monkeypatch.setattr(client, "CoreV1Api", FakeCore)
    text = pod_text(KubernetesApi(), "inference", "vllm-0")
    assert "Reason: OOMKilled" in text and "Exit Code: 137" in text
    assert "INFO previous run" in text and "Back-off restarting" in text
    ids = [f.signature.id for f in diagnose_text(text, source="pod").findings]
    assert "k8s-oomkilled" in ids


def test_no_memory_fix_names_the_smallest_tp_that_fits() -> None:
    text = (DATA / "no-memory-for-kv-cache.log").read_text()
    big = _finding(text, "no-memory-for-kv-cache", model_dir=MODELS / "Qwen--Qwen3-32B",
                   gpu_name="L40S")
    assert "the smallest TP that fits is 2" in big.fix
    huge = _finding(text, "no-memory-for-kv-cache", model_dir=MODELS / "Qwen--Qwen3-32B",
                    gpu_name="L4")
    assert "the smallest TP that fits is 4" in huge.fix
    small = _finding(text, "no-memory-for-kv-cache", model_dir=MODELS / "Qwen--Qwen3-8B",
                     gpu_name="H100")
    assert "TP 1 fits by the estimator" in small.fix


def test_preemption_fix_computes_kv_capacity() -> None:
    text = (DATA / "kv-cache-preemption.log").read_text()
    h100 = _finding(text, "kv-cache-preemption", model_dir=MODELS / "Qwen--Qwen3-32B",
                    gpu_name="H100")
    h200 = _finding(text, "kv-cache-preemption", model_dir=MODELS / "Qwen--Qwen3-32B",
                    gpu_name="H200")
    assert int(h200.values["kv_tokens_fit"]) > int(h100.values["kv_tokens_fit"])
    assert h100.numbers_computed and f"--max-num-seqs at {h200.values['seqs_fit']}" in h200.fix


def test_pod_with_several_containers_reads_the_gpu_one() -> None:
    from inferplane.doctor.k8s import _engine_container

    pod = {"spec": {"containers": [
        {"name": "sidecar"}, {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    assert _engine_container(pod) == "vllm"
    assert _engine_container({"spec": {"containers": [{"name": "only"}]}}) is None
    assert _engine_container({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}) == "a"


def test_sampler_warmup_fix_is_the_largest_max_num_seqs_that_fits_outside_the_budget() -> None:
    # vllm#27508 / llm-d#787: the warm-up runs after the KV cache is allocated, so it has only
    # the memory outside --gpu-memory-utilization; the fix is the largest multiple of 8 that
    # fits there, by the estimator's sampler model (oracle: recompute it from the estimate).
    from inferplane.estimator.overheads import sampler_bytes_per_logit

    text = (DATA / "sampler-warmup-oom.llmd787.log").read_text()
    f = _finding(text, "sampler-warmup-oom", model_dir=MODELS / "Qwen--Qwen3-32B", gpu_name="H100")
    assert f.numbers_computed and "max_model_len" not in f.fix.split("(")[0]
    seqs = int(f.values["seqs_fit"])
    est = estimate_memory(load_profile(MODELS / "Qwen--Qwen3-32B"), EngineSettings(
        tensor_parallel_size=2, gpu_memory_utilization=0.95, max_model_len=-1,
        max_num_seqs=1024, vllm_version="0.11.0"), gpu=lookup_gpu("H100"))  # the assumed one
    outside = est.cuda_context_gib + (0 if est.cuda_graph_in_budget else est.cuda_graph_gib)
    headroom = est.total_memory_gib * (1 - 0.95) - outside
    per_seq = load_profile(MODELS / "Qwen--Qwen3-32B").vocab_size * sampler_bytes_per_logit(
        est.vllm_version) / 2**30
    assert seqs % 8 == 0 and seqs * per_seq <= headroom < (seqs + 8) * per_seq
    assert f"--max-num-seqs {seqs} " in f.fix
    plain = _finding(text, "sampler-warmup-oom")
    assert "--max-num-seqs: 512" in plain.fix and not plain.numbers_computed
