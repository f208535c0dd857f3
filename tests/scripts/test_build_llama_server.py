"""The flags ``scripts/build-llama-server.sh`` builds llama-server with: the AVX2 floor
everywhere, AVX-512 and AMX where this machine's CPU has them, the floor alone when a
portable build is asked for (the Dockerfile); and the installed binary, run: a batch on
the layout it was built for, and a batch of decoding sequences that gets, for each, what
it gets alone."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app.backends.llama_process import find_binary
from app.backends.model_files import ModelFiles
from tests.live import free_port
from tests.upstream_server import smollm2_gguf

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "build-llama-server.sh"
FLOOR = ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
AVX512 = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
QWEN = "qwen2.5-coder-1.5b-instruct"


def _flags(**env: str) -> list[str]:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("ORS_LLAMA_PORTABLE", "ORS_LLAMA_NO_AMX")} | env
    result = subprocess.run([str(SCRIPT), "--flags"], capture_output=True, text=True, env=environment, check=True)
    return result.stdout.split()


def _cpu_has(flag: str) -> bool:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return flag in line.split(":", 1)[1].split()
    return False


def test_the_build_uses_the_extensions_of_the_cpu_it_builds_on() -> None:
    flags = _flags()
    assert all(flag in flags for flag in FLOOR)
    assert ("-DGGML_AVX512=ON" in flags) == all(_cpu_has(flag) for flag in AVX512)
    if "-DGGML_AVX512=ON" in flags:
        assert ("-DGGML_AVX512_VNNI=ON" in flags) == _cpu_has("avx512_vnni")
        assert ("-DGGML_AVX512_BF16=ON" in flags) == _cpu_has("avx512_bf16")
        assert ("-DGGML_AVX512_VBMI=ON" in flags) == _cpu_has("avx512vbmi")
    assert "-DGGML_NATIVE=ON" not in flags


def test_a_portable_build_gets_the_floor_only() -> None:
    flags = _flags(ORS_LLAMA_PORTABLE="1")
    assert all(flag in flags for flag in FLOOR)
    assert not [flag for flag in flags if flag.startswith("-DGGML_AVX512")]


def test_the_dockerfile_asks_for_a_portable_build() -> None:
    assert "ORS_LLAMA_PORTABLE=1" in (ROOT / "Dockerfile").read_text()


def test_amx_where_the_cpu_has_it_and_never_in_a_portable_build() -> None:
    flags = _flags()
    has_amx = all(_cpu_has(flag) for flag in (*AVX512, "avx512_vnni", "amx_tile", "amx_int8"))
    assert ("-DGGML_AMX_TILE=ON" in flags) == has_amx
    assert ("-DGGML_AMX_INT8=ON" in flags) == has_amx
    assert not [flag for flag in _flags(ORS_LLAMA_PORTABLE="1") if flag.startswith("-DGGML_AMX")]
    without = _flags(ORS_LLAMA_NO_AMX="1")
    assert not [flag for flag in without if flag.startswith("-DGGML_AMX")]
    assert without == [flag for flag in flags if not flag.startswith("-DGGML_AMX")]


def _serving(server: subprocess.Popen[bytes], port: int, log: Path) -> str:
    """The base URL of ``server`` once it answers ``/health``."""
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, log.read_text()[-2000:]
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/health").status_code == 200:
                return base
        assert time.monotonic() < deadline, "llama-server did not start"
        time.sleep(0.1)


@pytest.mark.model
def test_the_installed_server_runs_a_batch_on_the_layout_it_was_built_for(tmp_path: Path) -> None:
    """The installed llama-server, on the small model, four prompts decoded together: where
    the build has AMX the weights are in its tile layout (the log says so) and the batch
    runs on the tiles; on the vendored code without ``scripts/patches`` that batch's first
    tile instruction killed the process (SIGILL)."""
    binary = find_binary()
    port = free_port()
    log = tmp_path / "llama-server.log"
    command = [str(binary), "--model", str(smollm2_gguf()), "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", "2048", "--parallel", "4", "--threads", "2", "--no-webui", "--verbosity", "4"]
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        base = _serving(server, port, log)

        def complete(subject: str) -> dict:
            body = {"prompt": f"Write two sentences about {subject}.", "n_predict": 24, "temperature": 0,
                    "ignore_eos": True}
            return httpx.post(f"{base}/completion", json=body, timeout=120).json()

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(complete, ["the sea", "a mountain", "a city", "the moon"]))
        assert server.poll() is None, log.read_text()[-2000:]
        assert [answer["tokens_predicted"] for answer in answers] == [24] * 4
        assert all(answer["content"].strip() for answer in answers)
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = log.read_text()
    # whether the binary has AMX is its build's choice (ORS_LLAMA_NO_AMX, ORS_LLAMA_PORTABLE)
    built_with_amx = "AMX_INT8 = 1" in text
    assert ("AMX model buffer size" in text) == (built_with_amx and "AMX is not ready" not in text)


@pytest.mark.model
def test_sequences_decoded_together_get_what_each_gets_alone(tmp_path: Path) -> None:
    """The installed llama-server on Qwen (Q4_K and Q6_K weights), four different questions
    asked one at a time and then at once: each gets the same tokens with the same
    probabilities, to the last digit. Decoding together runs a step of four rows through
    ``scripts/patches``' AMX kernels of several rows, alone a step of one; a row read from,
    or written to, another row's place, or a block of weights applied to the wrong rows,
    changes the numbers. Only where the binary runs on AMX: llama.cpp's other CPU paths
    (AVX-512 without AMX, AVX2) multiply a step of several rows in another order than a
    step of one, so their log-probabilities differ in the last digits (-0.7413 against
    -0.77 for a first token, seen on an AMD EPYC with AVX-512), and those paths are not
    ours."""
    model = ModelFiles(tmp_path / "models").path(QWEN)
    port = free_port()
    log = tmp_path / "llama-server.log"
    command = [str(find_binary()), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", "4096", "--parallel", "4", "--kv-unified", "--threads", "2", "--no-webui",
               "--verbosity", "4"]  # the buffer types loaded (an AMX one, or none) are logged from 4 on
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        base = _serving(server, port, log)
        if "AMX model buffer size" not in log.read_text(errors="replace"):
            pytest.skip("this llama-server does not run on AMX here, where the kernels of several rows are")

        def ask(question: str) -> list[tuple[int, list[float]]]:
            body = {"prompt": f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", "n_predict": 16,
                    "ignore_eos": True, "temperature": 0, "n_probs": 3, "cache_prompt": False}
            answer = httpx.post(f"{base}/completion", json=body, timeout=120).json()
            return [(token["id"], [top["logprob"] for top in token["top_logprobs"]])
                    for token in answer["completion_probabilities"]]

        questions = ["What is 17 times 3?", "What is the capital of France?", "Name the largest planet.",
                     "Who wrote Hamlet?"]
        alone = [ask(question) for question in questions]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(ask, questions))
        assert server.poll() is None, log.read_text()[-2000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert [len(tokens) for tokens in alone] == [16] * 4
    assert len({tuple(token for token, _ in tokens) for tokens in alone}) == 4
    assert together == alone
