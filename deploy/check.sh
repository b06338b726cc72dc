#!/usr/bin/env bash
# Checks the deployment files (run by CTest):
#  - docker-compose config -q for the CPU and GPU variants
#  - promtool check config / check rules
#  - kubectl kustomize renders the base and the GPU overlay
#  - yamllint over deploy/
#  - the Grafana dashboard parses, and every metric its PromQL and the alert
#    rules name is exported by a running worker (live /metrics of a local pair)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/bin}
cd "$ROOT"
WORK=$(mktemp -d)
trap 'TANDEM_LOCAL_DIR=$WORK/local deploy/local/down.sh; rm -rf "$WORK"' EXIT

docker-compose -f deploy/docker-compose.yml config -q
docker-compose -f deploy/docker-compose.yml -f deploy/docker-compose.gpu.yml config -q
docker-compose -f deploy/docker-compose.yml -f deploy/docker-compose.tls.yml config -q
echo "compose: cpu, gpu and tls variants valid"

# promtool resolves rule_files relative to the config: check a copy next to the rules.
sed "s#/etc/prometheus/alerts.yml#alerts.yml#" deploy/prometheus/prometheus.yml \
  >deploy/prometheus/.prometheus.check.yml
promtool check config deploy/prometheus/.prometheus.check.yml
rm -f deploy/prometheus/.prometheus.check.yml
promtool check rules deploy/prometheus/alerts.yml

kubectl kustomize deploy/k8s/base >"$WORK/base.yaml"
kubectl kustomize deploy/k8s/overlays/gpu >"$WORK/gpu.yaml"
kubectl kustomize deploy/k8s/overlays/tls >"$WORK/tls.yaml"
grep -q "clusterIP: None" "$WORK/base.yaml"
grep -q "nvidia.com/gpu: 1" "$WORK/gpu.yaml"
grep -q -- "DEVICE: cuda" "$WORK/gpu.yaml"
echo "kustomize: base, gpu and tls overlays render"

yamllint -c deploy/.yamllint deploy/
echo "yamllint: clean"

# Metric names used by the dashboard and the alerts.
/usr/bin/python3 - "$WORK/names.txt" <<'PY'
import json, re, sys, yaml
names = set()
dash = json.load(open("deploy/grafana/dashboards/tandem.json"))
for panel in dash["panels"]:
    for target in panel.get("targets", []):
        names |= set(re.findall(r"\btandem_[a-z0-9_]+", target["expr"]))
for group in yaml.safe_load(open("deploy/prometheus/alerts.yml"))["groups"]:
    for rule in group["rules"]:
        names |= set(re.findall(r"\btandem_[a-z0-9_]+", rule["expr"]))
open(sys.argv[1], "w").write("\n".join(sorted(names)) + "\n")
print(f"dashboard and alerts name {len(names)} metrics")
PY

# A live pair on free ports; its /metrics must carry every one of them.
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export TANDEM_LOCAL_DIR=$WORK/local TANDEM_BIN_DIR=$BIN
export TANDEM_PREFILL_PORT=$(free_port) TANDEM_DECODE_PORT=$(free_port)
export TANDEM_PREFILL_METRICS_PORT=$(free_port) TANDEM_DECODE_METRICS_PORT=$(free_port)
export TANDEM_PROMETHEUS_PORT=$(free_port)
deploy/local/up.sh >/dev/null
"$BIN/tandem" generate --address=127.0.0.1:$TANDEM_DECODE_PORT --prompt-token-ids=1,2,3 \
  --max-tokens=4 >/dev/null
{ curl -sf http://127.0.0.1:$TANDEM_PREFILL_METRICS_PORT/metrics
  curl -sf http://127.0.0.1:$TANDEM_DECODE_METRICS_PORT/metrics; } | grep -v '^#' \
  | sed -E 's/[{ ].*//' | sort -u >"$WORK/live.txt"
missing=$(comm -23 "$WORK/names.txt" "$WORK/live.txt")
if [ -n "$missing" ]; then
  echo "metrics named by the dashboard or alerts but not exported:" >&2
  echo "$missing" >&2
  exit 1
fi
echo "every metric in the dashboard and alerts is exported by a live worker"
echo "1 passed, 0 failed"
