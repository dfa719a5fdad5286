#!/usr/bin/env bash
# Runs the cross-language conformance scenario: starts a tumbler server
# (target/debug/tumbler dev, with its own private redis-server) and runs the
# Python, Node, Go and Ruby steps against it as separate processes.
# Assumes the toolchains are installed (clients/test.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 clients/conformance/driver.py "$@"
