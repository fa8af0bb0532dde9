// Package conformance_test runs the upstream suite exactly as upstream's own
// conformance/conformance_test.go does; every option comes from its flags (run.sh).
package conformance_test

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
