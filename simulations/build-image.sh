#!/usr/bin/env bash
# Builds the static agentmesh binary and the FROM-scratch image (default tag agentmesh:latest).
# Usage: simulations/build-image.sh [TAG]
# Needs only cargo and a Docker engine: no base image is pulled from any registry.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-agentmesh:latest}"
target=x86_64-unknown-linux-gnu

# glibc, statically linked; --target keeps these flags off build scripts and proc-macros. getrandom
# uses the syscall, since a scratch image has no /dev/urandom. RUSTFLAGS replaces the rustflags of
# .cargo/config.toml, so its curve25519-dalek backend is named here too.
RUSTFLAGS='-C target-feature=+crt-static --cfg getrandom_backend="linux_getrandom" --cfg curve25519_dalek_backend="avx512"' \
  cargo build --release --locked --target "$target"

context=target/image
rm -rf "$context"
mkdir -p "$context/data" "$context/cards"
cp "target/$target/release/agentmesh" "$context/agentmesh"
strip "$context/agentmesh" 2>/dev/null || true
cp simulations/cards/*.json "$context/cards/"
docker build --quiet -t "$tag" -f Dockerfile "$context" >/dev/null
echo "built $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.1f MB", $1/1e6}'))"
