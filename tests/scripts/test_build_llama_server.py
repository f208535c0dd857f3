"""The flags ``scripts/build-llama-server.sh`` builds llama-server with: the AVX2 floor
everywhere, AVX-512 where this machine's CPU has it, the floor alone when a portable
build is asked for (the Dockerfile)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "build-llama-server.sh"
FLOOR = ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
AVX512 = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")


def _flags(**env: str) -> list[str]:
    environment = {key: value for key, value in os.environ.items() if key != "ORS_LLAMA_PORTABLE"} | env
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
