#!/usr/bin/env bash
# Checks the deployment files (run by CTest):
#  - docker-compose config -q for the CPU and GPU variants
#  - promtool check config / check rules
#  - kubectl kustomize renders the base and the GPU and TLS overlays; every
#    object is valid against the Kubernetes API schemas (offline), and each
#    pod's grace period covers its worker's --drain-seconds
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
kubectl kustomize deploy/k8s/overlays/gateway >"$WORK/gateway.yaml"
grep -q "clusterIP: None" "$WORK/base.yaml"
grep -q "nvidia.com/gpu: 1" "$WORK/gpu.yaml"
grep -q -- "DEVICE: cuda" "$WORK/gpu.yaml"
echo "kustomize: base, gpu, tls and gateway overlays render"

# Every rendered object against the Kubernetes API's schemas, offline
# (kubernetes-validate from PyPI carries them; strict: unknown fields fail).
# The PodMonitor is a Prometheus Operator CRD with no schema there.
VENV=${TANDEM_K8S_VALIDATE_VENV:-$HOME/.cache/tandem/kubernetes-validate}
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q kubernetes-validate==1.37.0 \
    || { echo "check: cannot install kubernetes-validate from PyPI into $VENV" >&2; exit 1; }
fi
rc=0
out=$("$VENV/bin/kubernetes-validate" --strict --quiet --kubernetes-version 1.30.0 \
        "$WORK/base.yaml" "$WORK/gpu.yaml" "$WORK/tls.yaml" "$WORK/gateway.yaml" 2>&1) || rc=$?
# CRDs without schemas there: the PodMonitor, and the gateway overlay's
# InferencePool and HTTPRoute (checked against the decode pods below).
grep -v -E "kind (PodMonitor|InferencePool|HTTPRoute)" <<<"$out" >&2 || true
[ "$rc" -eq 0 ] || exit 1
echo "kubernetes-validate: every object valid against Kubernetes 1.30's schemas"

# The gateway overlay: the InferencePool selects the decode pods, on the
# port their OpenAI API listens on, and names the EPP's Service and port; the
# HTTPRoute sends to the pool.
/usr/bin/python3 - "$WORK/gateway.yaml" <<'PY'
import re, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
by = lambda kind, name: next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
pool = by("InferencePool", "tandem")
decode = by("Deployment", "tandem-decode")
labels = decode["spec"]["template"]["metadata"]["labels"]
for k, v in pool["spec"]["selector"]["matchLabels"].items():
    assert labels.get(k) == v, f"InferencePool selector {k}={v} does not select the decode pods {labels}"
args = decode["spec"]["template"]["spec"]["containers"][0]["args"]
http = [int(m.group(1)) for a in args for m in [re.fullmatch(r"--http-address=[^:]*:(\d+)", a)] if m]
assert [p["number"] for p in pool["spec"]["targetPorts"]] == http, (pool["spec"]["targetPorts"], http)
ref = pool["spec"]["endpointPickerRef"]
svc = by("Service", ref["name"])
assert ref["port"]["number"] in [p["port"] for p in svc["spec"]["ports"]], (ref, svc["spec"]["ports"])
epp = by("Deployment", ref["name"])
assert svc["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
assert f"--pool-name={pool['metadata']['name']}" in epp["spec"]["template"]["spec"]["containers"][0]["args"]
route = by("HTTPRoute", "tandem")
assert route["spec"]["rules"][0]["backendRefs"][0] == {
    "group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "tandem"}
print("gateway: the InferencePool selects the decode pods' OpenAI port and names its EPP")
PY

# Each pod's grace period covers its worker's drain, plus 10 s to exit.
/usr/bin/python3 - "$WORK/base.yaml" <<'PY'
import re, sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc["kind"] not in ("Deployment", "StatefulSet"):
        continue
    pod = doc["spec"]["template"]["spec"]
    for c in pod["containers"]:
        drain = [int(m.group(1)) for a in c.get("args", [])
                 for m in [re.fullmatch(r"--drain-seconds=(\d+)", a)] if m]
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if not drain or grace < drain[0] + 10:
            sys.exit(f"{doc['metadata']['name']}: terminationGracePeriodSeconds={grace} "
                     f"must be at least --drain-seconds ({drain}) + 10")
print("kubernetes: every grace period covers its worker's --drain-seconds")
PY

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
export TANDEM_PROMETHEUS_PORT=$(free_port) TANDEM_HTTP_PORT=$(free_port)
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
