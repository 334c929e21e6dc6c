package gateway

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// A signed tenant's webhook cut off by a stop must not go out unsigned from
// the next scheduler while its registry has not loaded the tenants yet (the
// scheduler's registry starts empty; tenants arrive with the cache sync).
func TestReviewUndeliveredSignedWebhookNotSentUnsigned(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	h := newRawHook(t)
	signed := tenant("a", limiter.Limits{})
	signed.WebhookSigning = &registry.WebhookSigning{Key: []byte("0123456789abcdef0123456789abcdef")}
	path := filepath.Join(t.TempDir(), "jobs.db")

	e1 := newDurableEnv(t, up, []registry.TenantPolicy{signed}, path, t0, true)
	cut, err := e1.bolt.Create(jobs.Job{Tenant: "a", Status: jobs.StatusSucceeded, Endpoint: endpointCompletions, Model: testModel,
		CreatedAt: t0, FinishedAt: t0, Deadline: t0.Add(time.Hour), WebhookURL: h.srv.URL, WebhookStatus: jobs.WebhookPending, WebhookAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e1.stop()

	// Next leader: tenants not loaded yet (as right after the election).
	e2 := newDurableEnv(t, up, nil, path, t0.Add(time.Minute), false)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if hdrs, _ := h.deliveries(); len(hdrs) > 0 {
			if hdrs[0].Get("webhook-signature") == "" {
				t.Fatalf("job %s of signing tenant a delivered UNSIGNED: %v", cut.ID, hdrs[0])
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = e2
}
