#!/usr/bin/env bash
# Build llama.cpp's own server (llama-server) from the llama.cpp sources vendored in the
# llama-cpp-python release the project pins, so the embedded model's runtime is one
# version of llama.cpp, and install it as DEST.
#
#   scripts/build-llama-server.sh VERSION DEST
#
# The built binary is kept in a per-user cache keyed by the version and the build flags,
# so a second checkout on the same machine copies it instead of compiling again (about
# ten minutes on two cores). Only PyPI is contacted (pip download of the sdist).
set -euo pipefail
version=$1
dest=$2
python=${PYTHON:-python3}
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
       -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
key=$(printf '%s ' "$version" "${flags[@]}" | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ors/llama-server-$version-$key
if [ ! -x "$cache" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
  tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
  source_dir="$work/llama_cpp_python-$version/vendor/llama.cpp"
  cmake -S "$source_dir" -B "$work/build" "${flags[@]}" > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
  cmake --build "$work/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" > "$work/build.log" \
    || { tail -50 "$work/build.log"; exit 1; }
  mkdir -p "$(dirname "$cache")"
  install -m 0755 "$work/build/bin/llama-server" "$cache.tmp"
  mv "$cache.tmp" "$cache"
fi
install -m 0755 "$cache" "$dest"
