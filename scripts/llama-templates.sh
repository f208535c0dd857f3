#!/usr/bin/env bash
# Copy the chat templates of well-known model families that llama.cpp keeps for its own
# tests (models/templates/*.jinja in its sources, as vendored in the pinned
# llama-cpp-python sdist) into DEST. The tests of the operator's models give a real GGUF
# those templates, to prove that each family's calls and reasoning are read back; the
# templates are the model authors', fetched at install, not kept in this repository.
#
#   scripts/llama-templates.sh VERSION DEST
set -euo pipefail
version=$1
dest=$2
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work" --wildcards "*/vendor/llama.cpp/models/templates/*.jinja"
mkdir -p "$dest"
install -m 0644 "$work"/llama_cpp_python-"$version"/vendor/llama.cpp/models/templates/*.jinja "$dest"/
touch "$dest"/.complete
