#!/usr/bin/env bash
# Build llama.cpp's own server (llama-server) from the llama.cpp sources vendored in the
# llama-cpp-python release the project pins, so the embedded model's runtime is one
# version of llama.cpp, and install it as DEST.
#
#   scripts/build-llama-server.sh VERSION DEST
#   scripts/build-llama-server.sh --flags     (the CMake flags this machine gets, one a line)
#
# The built binary is kept in a per-user cache keyed by the version and the build flags,
# so a second checkout on the same machine copies it instead of compiling again (about
# ten minutes on two cores). Only PyPI is contacted (pip download of the sdist).
set -euo pipefail
# Vector extensions: AVX2, FMA and F16C (the floor, every x86-64 CPU of the last decade),
# and AVX-512 with VNNI, VBMI and BF16 where the CPU this builds on has them (on a
# 2-core Xeon: prompt evaluation 67 -> 97 tokens/s, decoding 12.8 -> 15.8, same model
# file, both builds in one run). `make install` builds on the machine that serves; a
# build for other machines (the Dockerfile) sets ORS_LLAMA_PORTABLE=1 and gets the floor
# only. AMX (Intel's tile unit) where the CPU lists amx_tile and amx_int8 beside AVX-512
# VNNI: llama.cpp then keeps the weights in its tile layout and evaluates prompts on the
# tiles (Qwen2.5-Coder, 2-core Xeon, prompt chunks of 128: 95 -> 147 tokens/s; see
# ARCHITECTURE.md). The vendored code gets two changes for it (patches/, applied in order
# to every build): without the first, the first tile instruction dies with SIGILL as the
# model loads; the second decodes a step of 1 to 4 rows (the slots' streams) in one pass
# over the weights instead of on the 16-row tiles (four streams 30 -> 40 tokens/s). A
# kernel that refuses the tiles to the process makes llama.cpp fall back to its usual
# layouts. ORS_LLAMA_NO_AMX=1 builds without AMX.
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
cpu=(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
if [ -z "${ORS_LLAMA_PORTABLE:-}" ] && has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
  cpu+=(-DGGML_AVX512=ON)
  if has avx512vbmi; then cpu+=(-DGGML_AVX512_VBMI=ON); fi
  if has avx512_vnni; then cpu+=(-DGGML_AVX512_VNNI=ON); fi
  if has avx512_bf16; then cpu+=(-DGGML_AVX512_BF16=ON); fi
  if [ -z "${ORS_LLAMA_NO_AMX:-}" ] && has avx512_vnni && has amx_tile && has amx_int8; then
    cpu+=(-DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON)
    if has amx_bf16; then cpu+=(-DGGML_AMX_BF16=ON); fi
  fi
fi
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF "${cpu[@]}")
if [ "${1:-}" = "--flags" ]; then
  printf '%s\n' "${flags[@]}"
  exit 0
fi
version=$1
dest=$2
python=${PYTHON:-python3}
patches=$(dirname "$0")/patches
key=$( (printf '%s ' "$version" "${flags[@]}"; cat "$patches"/*.patch) | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ors/llama-server-$version-$key
if [ ! -x "$cache" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
  tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
  source_dir="$work/llama_cpp_python-$version/vendor/llama.cpp"
  for patch in "$patches"/*.patch; do
    patch --quiet --forward -p1 -d "$source_dir" < "$patch" || { echo "$patch does not apply to llama.cpp $version"; exit 1; }
  done
  cmake -S "$source_dir" -B "$work/build" "${flags[@]}" > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
  cmake --build "$work/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" > "$work/build.log" 2>&1 \
    || { tail -50 "$work/build.log"; exit 1; }
  mkdir -p "$(dirname "$cache")"
  install -m 0755 "$work/build/bin/llama-server" "$cache.tmp"
  mv "$cache.tmp" "$cache"
fi
install -m 0755 "$cache" "$dest"
