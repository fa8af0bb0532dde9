#!/usr/bin/env bash
# Runs the upstream Gateway API conformance suite, unmodified (conformance_test.go calls
# upstream's RunConformance), against the running local cluster with aether installed:
# profiles MESH-HTTP and MESH-GRPC with every mesh extended feature supported, plus the
# features the seven mesh tests outside both profiles need, so that all 22 mesh tests run and
# none is skipped. No Gateway feature: aether is a mesh only.
#
# Writes the suite's own ConformanceReport to $AETHER_REPORTS/gateway-conformance-report.yaml
# (outside the checkout) and its output beside it. The suite deletes its namespaces at the end
# without waiting; this script waits until they are gone, so the next test starts clean.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../cluster/lib.sh"
. "$here/../../images/lib.sh"

AETHER_REPORTS="${AETHER_REPORTS:-$AETHER_CACHE/reports}"
report="$AETHER_REPORTS/gateway-conformance-report.yaml"
output="$AETHER_REPORTS/gateway-conformance.log"
mkdir -p "$AETHER_REPORTS"

features=(
    # MESH-HTTP and MESH-GRPC core features, and every mesh extended feature.
    Mesh HTTPRoute GRPCRoute
    MeshClusterIPMatching MeshConsumerRoute MeshHTTPRouteRewritePath MeshHTTPRouteSchemeRedirect
    MeshHTTPRouteRedirectPort MeshHTTPRouteRedirectPath MeshHTTPRouteBackendRequestHeaderModification
    MeshHTTPRouteQueryParamMatching MeshHTTPRouteNamedRouteRule
    # What MeshFrontend, MeshFrontendHostname, MeshPorts, MeshConsumerRoute and the 303, 307
    # and 308 redirect tests need besides.
    HTTPRouteResponseHeaderModification HTTPRouteParentRefPort HTTPRoute303RedirectStatusCode
    HTTPRoute307RedirectStatusCode HTTPRoute308RedirectStatusCode
)
namespaces=(gateway-conformance-mesh gateway-conformance-mesh-consumer)

url="${AETHER_PROJECT_URL:-$(git -C "$here" remote get-url origin 2>/dev/null || true)}"
[[ "$url" == http* ]] || url="aether's repository (no public URL configured: set AETHER_PROJECT_URL)"
version="$(app_version)+$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"

kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

# A namespace left by an earlier run would be mid-deletion when the suite applies to it.
kubectl delete namespace "${namespaces[@]}" --ignore-not-found --wait=true --timeout=180s >/dev/null

cd "$here"
status=0
KUBECONFIG="$AETHER_KUBECONFIG" go test -count=1 -timeout 40m -v . -run '^TestConformance$' -args \
    --conformance-profiles=MESH-HTTP,MESH-GRPC \
    --supported-features="$(IFS=,; echo "${features[*]}")" \
    --namespace-labels=aether.io/managed=true \
    --report-output="$report" \
    --organization=aether --project=aether --url="$url" --version="$version" \
    --contact="${AETHER_CONTACT:-aether maintainers}" \
    >"$output" 2>&1 || status=$?

# The mesh tests' results as the suite reported them (the other tests are Gateway tests,
# which go test reports skipped because no Gateway feature is supported).
results="$(grep -E '^    --- (PASS|FAIL|SKIP): TestConformance/Mesh' "$output" | sed 's/^ *--- //; s/ (.*//' | sort -k2)"
echo "$results"
kubectl delete namespace "${namespaces[@]}" --ignore-not-found --wait=true --timeout=180s >/dev/null
if [ "$status" -ne 0 ]; then
    echo "gateway conformance: go test failed (exit $status); its output: $output" >&2
    tail -n 60 "$output" >&2
    exit "$status"
fi
passed="$(grep -c '^PASS:' <<<"$results" || true)"
if [ "$passed" -ne 22 ] || grep -q '^SKIP:' <<<"$results" || grep -qE 'Skipped: [1-9]' "$report"; then
    echo "gateway conformance: expected all 22 mesh tests to pass and none skipped; $passed passed (output $output)" >&2
    exit 1
fi
echo "gateway conformance: 22 of 22 mesh tests passed; report $report"
