#!/usr/bin/env bash
# Runs the cross-language conformance scenario. The driver runs the steps
# with the installed packages, so this builds and installs them first:
# it is clients/test.sh (arguments are passed on to driver.py).
set -euo pipefail
exec "$(dirname "$0")/../test.sh" "$@"
