package kube

import (
	"bytes"
	"encoding/base64"
	"testing"
)

// TestWebhookSigningDecode: the Secret value forms the Standard Webhooks
// libraries accept ("whsec_"+base64, base64 alone, surrounding whitespace)
// decode to the same key; missing, non-base64 and short values are
// refused with a reason and no key.
func TestWebhookSigningDecode(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	b64 := base64.StdEncoding.EncodeToString(key)
	for _, v := range []string{"whsec_" + b64, b64, " whsec_" + b64 + "\n"} {
		got := WebhookSigning([]byte(v))
		if got.Invalid != "" || !bytes.Equal(got.Key, key) {
			t.Errorf("WebhookSigning(%q) = %+v, want the key", v, got)
		}
	}
	for _, tc := range []struct{ v, want string }{
		{"", "the Secret has no value under webhookSigningKey"},
		{"whsec_", "the Secret has no value under webhookSigningKey"},
		{"whsec_not*base64", "the value is not base64 (expected whsec_<base64>)"},
		{"whsec_" + base64.StdEncoding.EncodeToString([]byte("short")), "the key is 5 bytes; at least 16 are required"},
	} {
		got := WebhookSigning([]byte(tc.v))
		if got.Invalid != tc.want || got.Key != nil {
			t.Errorf("WebhookSigning(%q) = %+v, want Invalid %q", tc.v, got, tc.want)
		}
	}
	if s := WebhookSigning([]byte(b64)).String(); s != "WebhookSigning{key: <redacted>}" {
		t.Errorf("String() = %q reveals or misnames the key", s)
	}
}
