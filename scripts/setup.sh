#!/usr/bin/env bash
# Installs the Debian packages megatron-cpp needs to build, test and run the demo.
# Idempotent and quiet when everything is present. Needs root (or sudo) to install.
set -euo pipefail

packages=(g++ cmake ninja-build ccache pkg-config libopenblas-openmp-dev libyaml-cpp-dev nlohmann-json3-dev
          libgtest-dev fortunes-min fortunes libpcre2-dev libsentencepiece-dev openmpi-bin libopenmpi-dev)

# node and npm run the tokenizer oracles (scripts/fetch-fixtures.sh). The machines ship them
# (NodeSource); only where they are absent take Debian's.
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
