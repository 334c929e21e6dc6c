package gateway

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// rawHook records the headers and body of every delivery, answering 204.
type rawHook struct {
	srv *httptest.Server
	mu  sync.Mutex
	hdr []http.Header
	bod [][]byte
}

func newRawHook(t *testing.T) *rawHook {
	t.Helper()
	h := &rawHook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.hdr = append(h.hdr, r.Header.Clone())
		h.bod = append(h.bod, b)
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *rawHook) deliveries() ([]http.Header, [][]byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]http.Header(nil), h.hdr...), append([][]byte(nil), h.bod...)
}

// TestWebhookSignedPerStandardWebhooks: a tenant with a signing secret gets
// deliveries that the Standard Webhooks reference library verifies with the
// secret in its documented "whsec_" form, with webhook-id = the job ID and
// webhook-timestamp = the gateway clock's now; a wrong secret or a changed
// body fails verification; a tenant without a secret gets no signature.
func TestWebhookSignedPerStandardWebhooks(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	signed := tenant("a", limiter.Limits{})
	signed.WebhookSigning = &registry.WebhookSigning{Key: key}
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{signed, tenant("b", limiter.Limits{})})
	t.Cleanup(func() { stopWebhooks(e.gw) })
	h := newRawHook(t)

	ja := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	waitWebhook(t, e, ja.ID, webhookDelivered)
	jb := e.submit("key-b", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	waitWebhook(t, e, jb.ID, webhookDelivered)

	hdrs, bodies := h.deliveries()
	if len(hdrs) != 2 {
		t.Fatalf("deliveries = %d, want 2", len(hdrs))
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	// The fake clock is not the wall clock, so the timestamp is checked
	// here and the library's tolerance window is skipped.
	if err := wh.VerifyIgnoringTimestamp(bodies[0], hdrs[0]); err != nil {
		t.Errorf("tenant a's delivery does not verify: %v (headers %v)", err, hdrs[0])
	}
	if got, want := hdrs[0].Get("webhook-id"), ja.ID; got != want {
		t.Errorf("webhook-id = %q, want the job ID %q", got, want)
	}
	if got, want := hdrs[0].Get("webhook-timestamp"), strconv.FormatInt(e.clock.Now().Unix(), 10); got != want {
		t.Errorf("webhook-timestamp = %q, want %q", got, want)
	}
	other, _ := standardwebhooks.NewWebhookRaw([]byte("another-key-of-32-bytes-length!!"))
	if err := other.VerifyIgnoringTimestamp(bodies[0], hdrs[0]); err == nil {
		t.Error("a delivery verified with the wrong secret")
	}
	tampered := append([]byte(nil), bodies[0]...)
	tampered[len(tampered)-2] ^= 1
	if err := wh.VerifyIgnoringTimestamp(tampered, hdrs[0]); err == nil {
		t.Error("a changed body verified")
	}
	for _, k := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
		if v := hdrs[1].Get(k); v != "" {
			t.Errorf("unsigned tenant b's delivery carries %s: %q", k, v)
		}
	}
}

// TestWebhookUnusableSecretFailsUnsent: signing asked for with a secret that
// cannot be used is retried like a failed delivery (the Secret may be
// mid-rotation) and fails after the last attempt, sending nothing: the body
// never goes out unsigned.
func TestWebhookUnusableSecretFailsUnsent(t *testing.T) {
	bad := tenant("a", limiter.Limits{})
	bad.WebhookSigning = &registry.WebhookSigning{Invalid: "the value is not base64"}
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{bad})
	t.Cleanup(func() { stopWebhooks(e.gw) })
	h := newRawHook(t)
	j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	for k := int64(1); k < webhookMaxAttempts; k++ {
		stepBackoff(t, e, k, webhookRetryBase<<(k-1)/2)
	}
	if n := waitWebhook(t, e, j.ID, webhookFailed); n != webhookMaxAttempts {
		t.Errorf("attempts = %d, want %d", n, webhookMaxAttempts)
	}
	if hdrs, _ := h.deliveries(); len(hdrs) != 0 {
		t.Errorf("%d deliveries sent, want none", len(hdrs))
	}
}
