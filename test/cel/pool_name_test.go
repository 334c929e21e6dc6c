package cel

import (
	"context"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/render"
)

const poolNameMessage = `Invalid value: "object": metadata.name of a ProviderPool must be a DNS-1035 label of at most 53 characters ` +
	`(lowercase letters, digits and '-', starting with a letter and ending with a letter or digit): the operator names the pool's objects <name>-scheduler`

// TestPoolNames: a ProviderPool's name must be what the operator can render
// "<pool>-scheduler" from (render.MaxPoolNameLength, a DNS-1035 label);
// a TenantQuota's name is any object name.
func TestPoolNames(t *testing.T) {
	ctx := context.Background()
	if render.MaxPoolNameLength != 53 {
		t.Fatalf("render.MaxPoolNameLength = %d: the ProviderPool CEL rule and its message say 53", render.MaxPoolNameLength)
	}
	longest := "p" + strings.Repeat("0", render.MaxPoolNameLength-1)
	for name, refused := range map[string]bool{
		"openai.prod":                 true,
		"1pool":                       true,
		longest + "1":                 true,
		"a" + strings.Repeat("b", 59): true,
		longest:                       false,
		"a":                           false,
		"openai-prod":                 false,
		"pool-2":                      false,
	} {
		t.Run(name, func(t *testing.T) {
			err := k8s.Create(ctx, object(poolGVK, name, validPool()))
			if !refused {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), poolNameMessage) || len(causes(err)) != 1 {
				t.Fatalf("got %v, want one error %q", err, poolNameMessage)
			}
		})
	}
	// The rule is the pool's only: a TenantQuota may have a dotted name.
	if err := k8s.Create(ctx, object(tqGVK, "openai.prod", validTenant())); err != nil {
		t.Fatalf("TenantQuota openai.prod: %v", err)
	}
}
