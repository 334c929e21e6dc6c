package gateway

// The response protocol of the data plane (brief "The data plane
// contract"): 429 for the tenant's own limits, 503 for the pool's capacity,
// 413 for a request that can never fit; Retry-After in whole seconds,
// rounded up, at least 1; X-RateLimit-{Limit,Remaining,Reset}-{Tokens,
// Requests} of the dimension that tripped; the IETF RateLimit and
// RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-headers-11, RFC 9651
// Structured Field syntax); an OpenAI-style JSON error whose message names
// the limit and what to do; the same quota fields on successful responses.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// sfParam is one parameter of a Structured Field item.
type sfParam struct {
	key   string
	value any // int64, string (String), sfToken, bool, []byte marker
}

type sfToken string

// sfItem is one member of a Structured Field List (bare item and
// parameters, in order).
type sfItem struct {
	value  any
	params []sfParam
}

func (it sfItem) param(key string) (any, bool) {
	for _, p := range it.params {
		if p.key == key {
			return p.value, true
		}
	}
	return nil, false
}

// parseSFList parses a field value as a Structured Field List of Items
// (RFC 9651 sections 4.2.1, 4.2.3, 4.2.3.1, 4.2.3.2): Integers, Strings,
// Tokens, Booleans and Byte Sequences; Decimals and Inner Lists are not used
// by the RateLimit fields and are refused. It is strict: trailing commas,
// bad escapes, keys out of their alphabet and integers over 15 digits fail.
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: strings.Trim(s, " ")}
	var out []sfItem
	for p.i < len(p.s) {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.ows()
		if p.i == len(p.s) {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' after a member, got %q", p.i, p.s[p.i])
		}
		p.i++
		p.ows()
		if p.i == len(p.s) {
			return nil, fmt.Errorf("trailing comma")
		}
	}
	return out, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) ows() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{value: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		for p.i < len(p.s) && p.s[p.i] == ' ' {
			p.i++
		}
		k, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var val any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if val, err = p.bare(); err != nil {
				return sfItem{}, err
			}
		}
		for j := range it.params {
			if it.params[j].key == k {
				return sfItem{}, fmt.Errorf("duplicate parameter %q", k)
			}
		}
		it.params = append(it.params, sfParam{k, val})
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.i >= len(p.s) || !(p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] == '*') {
		return "", fmt.Errorf("at %d: bad key", p.i)
	}
	for p.i < len(p.s) && (p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] >= '0' && p.s[p.i] <= '9' || strings.IndexByte("_-.*", p.s[p.i]) >= 0) {
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bare() (any, error) {
	if p.i >= len(p.s) {
		return nil, fmt.Errorf("missing bare item")
	}
	switch c := p.s[p.i]; {
	case c == '-' || c >= '0' && c <= '9':
		start := p.i
		if c == '-' {
			p.i++
		}
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		digits := p.i - start
		if c == '-' {
			digits--
		}
		if digits < 1 || digits > 15 || (p.i < len(p.s) && p.s[p.i] == '.') {
			return nil, fmt.Errorf("at %d: not a Structured Field Integer", start)
		}
		return strconv.ParseInt(p.s[start:p.i], 10, 64)
	case c == '"':
		p.i++
		var b strings.Builder
		for p.i < len(p.s) {
			c := p.s[p.i]
			p.i++
			switch {
			case c == '\\':
				if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
					return nil, fmt.Errorf("bad escape in String")
				}
				b.WriteByte(p.s[p.i])
				p.i++
			case c == '"':
				return b.String(), nil
			case c < 0x20 || c > 0x7e:
				return nil, fmt.Errorf("bad character %q in String", c)
			default:
				b.WriteByte(c)
			}
		}
		return nil, fmt.Errorf("unterminated String")
	case c == '*' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
		start := p.i
		for p.i < len(p.s) && (strings.IndexByte("!#$%&'*+-.^_`|~:/", p.s[p.i]) >= 0 ||
			p.s[p.i] >= '0' && p.s[p.i] <= '9' || p.s[p.i] >= 'A' && p.s[p.i] <= 'Z' || p.s[p.i] >= 'a' && p.s[p.i] <= 'z') {
			p.i++
		}
		return sfToken(p.s[start:p.i]), nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, fmt.Errorf("bad Boolean")
	case c == ':':
		end := strings.IndexByte(p.s[p.i+1:], ':')
		if end < 0 {
			return nil, fmt.Errorf("unterminated Byte Sequence")
		}
		p.i += end + 2
		return []byte(nil), nil
	}
	return nil, fmt.Errorf("at %d: unexpected %q", p.i, p.s[p.i])
}

// checkIETFFields checks the RateLimit and RateLimit-Policy fields of h
// against draft-ietf-httpapi-ratelimit-headers-11: both Lists of Items
// whose bare item is a String (sections 3, 4); every policy has an Integer
// q >= 0 (3.1.1), a String qu if any (3.1.2), an Integer w > 0 if any
// (3.1.3); every service limit an Integer r >= 0 (4.1.1) and an Integer
// t >= 0 if any (4.1.2), naming a declared policy, no name twice; when
// Retry-After is present, no t ends after it (section 6). It returns the
// problems found.
func checkIETFFields(h http.Header) []string {
	var probs []string
	pol, rl := h.Get("RateLimit-Policy"), h.Get("RateLimit")
	if pol == "" && rl == "" {
		return nil
	}
	policies, err := parseSFList(pol)
	if err != nil || len(policies) == 0 {
		return []string{fmt.Sprintf("RateLimit-Policy %q: not a non-empty Structured Field List: %v", pol, err)}
	}
	limits, err := parseSFList(rl)
	if err != nil || len(limits) == 0 {
		return []string{fmt.Sprintf("RateLimit %q: not a non-empty Structured Field List: %v", rl, err)}
	}
	nonNeg := func(it sfItem, key string, required bool, least int64) string {
		v, ok := it.param(key)
		if !ok {
			if required {
				return fmt.Sprintf("%v: missing %s", it.value, key)
			}
			return ""
		}
		n, isInt := v.(int64)
		if !isInt || n < least {
			return fmt.Sprintf("%v: %s = %v, want an Integer >= %d", it.value, key, v, least)
		}
		return ""
	}
	declared := map[string]bool{}
	for _, it := range policies {
		name, ok := it.value.(string)
		if !ok {
			probs = append(probs, fmt.Sprintf("RateLimit-Policy member %v is not a String", it.value))
			continue
		}
		if declared[name] {
			probs = append(probs, fmt.Sprintf("RateLimit-Policy names %q twice", name))
		}
		declared[name] = true
		for _, msg := range []string{nonNeg(it, "q", true, 0), nonNeg(it, "w", false, 1)} {
			if msg != "" {
				probs = append(probs, "RateLimit-Policy "+msg)
			}
		}
		if qu, ok := it.param("qu"); ok {
			if _, isString := qu.(string); !isString {
				probs = append(probs, fmt.Sprintf("RateLimit-Policy %q: qu = %v, want a String", name, qu))
			}
		}
	}
	retryAfter := int64(-1)
	if ra := h.Get("Retry-After"); ra != "" {
		retryAfter, _ = strconv.ParseInt(ra, 10, 64)
	}
	seen := map[string]bool{}
	for _, it := range limits {
		name, ok := it.value.(string)
		if !ok {
			probs = append(probs, fmt.Sprintf("RateLimit member %v is not a String", it.value))
			continue
		}
		if seen[name] || !declared[name] {
			probs = append(probs, fmt.Sprintf("RateLimit names %q twice or without a policy", name))
		}
		seen[name] = true
		for _, msg := range []string{nonNeg(it, "r", true, 0), nonNeg(it, "t", false, 0)} {
			if msg != "" {
				probs = append(probs, "RateLimit "+msg)
			}
		}
		if tv, ok := it.param("t"); ok && retryAfter >= 0 {
			if n, _ := tv.(int64); n > retryAfter {
				probs = append(probs, fmt.Sprintf("RateLimit %q: t = %d ends after Retry-After %d", name, n, retryAfter))
			}
		}
	}
	return probs
}

// TestParseSFList: the strict parser of the tests accepts the draft's own
// examples and refuses malformed values, so the field checks can fail.
func TestParseSFList(t *testing.T) {
	for _, ok := range []string{
		`"burst";q=100;w=60,"daily";q=1000;w=86400`,
		`"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`,
		`"default";r=50;t=30`,
		`"a\"b";r=0`,
	} {
		if _, err := parseSFList(ok); err != nil {
			t.Errorf("parseSFList(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{
		`"tokens";r=1,`, `"tokens";R=1`, `"tokens";r=1000000000000000`, `"tokens";r=1.5`,
		`"tok\ens";r=1`, `"tokens;r=1`, `"tokens";r=1;r=2`, `"tokens" "requests"`,
	} {
		if _, err := parseSFList(bad); err == nil {
			t.Errorf("parseSFList(%q) accepted a malformed value", bad)
		}
	}
}

// quotaFieldNames are the response fields of the quota protocol.
var quotaFieldNames = []string{
	"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
	"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
	"Ratelimit", "Ratelimit-Policy", "Retry-After-Ms",
}

func quotaFields(h http.Header) map[string]string {
	got := map[string]string{}
	for _, k := range quotaFieldNames {
		if v := h.Get(k); v != "" {
			got[k] = v
		}
	}
	return got
}

// TestSetQuotaHeadersFormat: the exact fields written for each dimension
// (draft-ietf-httpapi-ratelimit-headers-11 sections 3 and 4; OpenAI's
// X-RateLimit-* for tokens and requests), one policy per dimension, and
// values that stay valid Structured Fields.
func TestSetQuotaHeadersFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		dims []quotaDim
		want map[string]string
	}{
		{"none", nil, map[string]string{}},
		{
			"tokens: qu names the unit, reset rounds up",
			[]quotaDim{{unit: unitTokens, limit: 6000, remaining: 200, reset: 12100 * time.Millisecond}},
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "6000", "X-Ratelimit-Remaining-Tokens": "200", "X-Ratelimit-Reset-Tokens": "13",
				"Ratelimit": `"tokens";r=200;t=13`, "Ratelimit-Policy": `"tokens";q=6000;qu="tokens";w=60`,
			},
		},
		{
			"requests: the draft's default unit is not written",
			[]quotaDim{{unit: unitRequests, limit: 6, remaining: 0, reset: 10 * time.Second}},
			map[string]string{
				"X-Ratelimit-Limit-Requests": "6", "X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "10",
				"Ratelimit": `"requests";r=0;t=10`, "Ratelimit-Policy": `"requests";q=6;w=60`,
			},
		},
		{
			"both dimensions: one list member each, in order",
			[]quotaDim{
				{unit: unitTokens, limit: 60000, remaining: 9850, reset: 150 * time.Millisecond},
				{unit: unitRequests, limit: 600, remaining: 99, reset: 100 * time.Millisecond},
			},
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "60000", "X-Ratelimit-Remaining-Tokens": "9850", "X-Ratelimit-Reset-Tokens": "1",
				"X-Ratelimit-Limit-Requests": "600", "X-Ratelimit-Remaining-Requests": "99", "X-Ratelimit-Reset-Requests": "1",
				"Ratelimit":        `"tokens";r=9850;t=1, "requests";r=99;t=1`,
				"Ratelimit-Policy": `"tokens";q=60000;qu="tokens";w=60, "requests";q=600;w=60`,
			},
		},
		{
			"full bucket: reset 0",
			[]quotaDim{{unit: unitRequests, limit: 600, remaining: 100}},
			map[string]string{
				"X-Ratelimit-Limit-Requests": "600", "X-Ratelimit-Remaining-Requests": "100", "X-Ratelimit-Reset-Requests": "0",
				"Ratelimit": `"requests";r=100;t=0`, "Ratelimit-Policy": `"requests";q=600;w=60`,
			},
		},
		{
			"concurrency: registered unit, no window, no X-RateLimit name",
			[]quotaDim{{unit: unitConcurrent, limit: 4, remaining: 0}},
			map[string]string{
				"Ratelimit": `"concurrency";r=0`, "Ratelimit-Policy": `"concurrency";q=4;qu="concurrent-requests"`,
			},
		},
		{
			"named policy (input tokens)",
			[]quotaDim{{unit: unitTokens, policy: "input-tokens", limit: 1200, remaining: 5, reset: 2 * time.Second}},
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "1200", "X-Ratelimit-Remaining-Tokens": "5", "X-Ratelimit-Reset-Tokens": "2",
				"Ratelimit": `"input-tokens";r=5;t=2`, "Ratelimit-Policy": `"input-tokens";q=1200;qu="tokens";w=60`,
			},
		},
		{
			"negative figures clamp to 0, huge ones to 15 digits",
			[]quotaDim{{unit: unitTokens, limit: 1 << 62, remaining: -40, reset: -time.Second}},
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "4611686018427387904", "X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "0",
				"Ratelimit": `"tokens";r=0;t=0`, "Ratelimit-Policy": `"tokens";q=999999999999999;qu="tokens";w=60`,
			},
		},
		{
			"a repeated policy is written once",
			[]quotaDim{
				{unit: unitTokens, limit: 100, remaining: 1, reset: time.Second},
				{unit: unitTokens, limit: 999, remaining: 999},
			},
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "100", "X-Ratelimit-Remaining-Tokens": "1", "X-Ratelimit-Reset-Tokens": "1",
				"Ratelimit": `"tokens";r=1;t=1`, "Ratelimit-Policy": `"tokens";q=100;qu="tokens";w=60`,
			},
		},
		{
			"policy names are escaped as Strings",
			[]quotaDim{{unit: unitRequests, policy: "a\"b\\c\n", limit: 1, remaining: 1}},
			map[string]string{
				"X-Ratelimit-Limit-Requests": "1", "X-Ratelimit-Remaining-Requests": "1", "X-Ratelimit-Reset-Requests": "0",
				"Ratelimit": `"a\"b\\c";r=1;t=0`, "Ratelimit-Policy": `"a\"b\\c";q=1;w=60`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			setQuotaHeaders(h, tc.dims...)
			if d := cmp.Diff(tc.want, quotaFields(h)); d != "" {
				t.Errorf("fields (-want +got):\n%s", d)
			}
			if probs := checkIETFFields(h); len(probs) > 0 {
				t.Errorf("IETF fields: %v", probs)
			}
		})
	}
}

// rejectionCase is one refusal of the interactive path and the response
// the contract asks for.
type rejectionCase struct {
	name string
	// do sends the request and returns the response.
	do         func(t *testing.T) *http.Response
	status     int
	retryAfter string            // "" when there must be none
	fields     map[string]string // exact quota fields; the others must be absent
	typ, code  string
	message    string   // exact message, when the contract's wording is settled
	msgParts   []string // what the message must name: the limit and what to do
	// gaps marks checks ("fields", "message") that the gateway does not
	// meet yet, with the reason: they are reported as CONTRACT GAP and
	// skipped, and fail once the gateway meets them (remove the mark).
	gaps map[string]string
}

// contractEnv is a gateway on the fake clock with one tenant "a".
func contractEnv(t *testing.T, up *upstream, tp registry.TenantPolicy, opts ...envOption) *env {
	if up == nil {
		up = newUpstream(t, okJSON(1, 1))
	}
	return newEnv(t, up, []registry.TenantPolicy{tp}, opts...)
}

// hold charges a reservation of prompt + output weighted tokens and one
// request against tenant a at t0 and keeps it in flight.
func hold(t *testing.T, e *env, prompt, output int64, m limiter.CostModel) {
	t.Helper()
	if _, rej := e.reg.Tenant("a").Limiter.Admit(t0, m.Cost(prompt, output)); rej != nil {
		t.Fatalf("holding %d+%d: %+v", prompt, output, rej)
	}
}

var unitCost = limiter.CostModel{InputWeight: 1, OutputWeight: 1}

// TestRejectionProtocol: every refusal of the interactive path, on the fake
// clock, with its exact status, Retry-After, quota fields, JSON error and
// message.
func TestRejectionProtocol(t *testing.T) {
	post := func(e *env, prompt int, maxTokens int64) *http.Response {
		return e.do("POST", "/v1/completions", "key-a", completionsBody(prompt, maxTokens, ""))
	}
	cases := []rejectionCase{
		{
			// Bucket 10 000 refilling 100/s, 200 left: 1500 is short by 1300,
			// 13 s.
			name: "token_rate_limit, whole seconds",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(10000), RequestsPerMinute: i64(6000)}))
				hold(t, e, 9800, 0, unitCost)
				return post(e, 500, 1000)
			},
			status: 429, retryAfter: "13",
			fields: map[string]string{
				"X-Ratelimit-Limit-Tokens": "6000", "X-Ratelimit-Remaining-Tokens": "200", "X-Ratelimit-Reset-Tokens": "13",
				"Ratelimit": `"tokens";r=200;t=13`, "Ratelimit-Policy": `"tokens";q=6000;qu="tokens";w=60`,
			},
			typ: "rate_limit_error", code: "token_rate_limit",
			message: "Rate limit exceeded: 6000 weighted tokens per minute. Retry in 13s.",
		},
		{
			// 1490 left: short by 10 tokens, 0.1 s, rounded up to 1.
			name: "token_rate_limit, 0.1 s rounds up to 1",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(10000)}))
				hold(t, e, 8510, 0, unitCost)
				return post(e, 500, 1000)
			},
			status: 429, retryAfter: "1",
			fields: map[string]string{
				"X-Ratelimit-Limit-Tokens": "6000", "X-Ratelimit-Remaining-Tokens": "1490", "X-Ratelimit-Reset-Tokens": "1",
				"Ratelimit": `"tokens";r=1490;t=1`, "Ratelimit-Policy": `"tokens";q=6000;qu="tokens";w=60`,
			},
			typ: "rate_limit_error", code: "token_rate_limit",
			message: "Rate limit exceeded: 6000 weighted tokens per minute. Retry in 1s.",
		},
		{
			// 7 requests per minute, bucket 1, empty: 60/7 = 8.57 s -> 9.
			name: "request_rate_limit, 8.57 s rounds up to 9",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), RequestsPerMinute: i64(7), RequestBurst: i64(1)}))
				hold(t, e, 0, 0, unitCost)
				return post(e, 10, 10)
			},
			status: 429, retryAfter: "9",
			fields: map[string]string{
				"X-Ratelimit-Limit-Requests": "7", "X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "9",
				"Ratelimit": `"requests";r=0;t=9`, "Ratelimit-Policy": `"requests";q=7;w=60`,
			},
			typ: "rate_limit_error", code: "request_rate_limit",
			message: "Rate limit exceeded: 7 requests per minute. Retry in 9s.",
		},
		{
			// One call in flight of at most 1: no refill estimate, Retry-After
			// is the floor of 1 s. The dimension that tripped is concurrency:
			// the draft's registered unit "concurrent-requests" describes it;
			// OpenAI's X-RateLimit-* have no name for it.
			name: "concurrency_limit",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), MaxConcurrent: i64(1)}))
				hold(t, e, 10, 10, unitCost)
				return post(e, 10, 10)
			},
			status: 429, retryAfter: "1",
			fields: map[string]string{
				"Ratelimit": `"concurrency";r=0`, "Ratelimit-Policy": `"concurrency";q=1;qu="concurrent-requests"`,
			},
			typ: "rate_limit_error", code: "concurrency_limit",
			message: "Concurrency limit exceeded: the tenant may have 1 requests in flight at a time. Retry in 1s.",
		},
		{
			// KV blocks of 100 tokens, at most 20, 15 held: a 1500-token
			// request needs 15 more. KV blocks are not a unit of the draft, so
			// no quota fields.
			name: "memory_limit",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), MaxKVBlocks: i64(20)}),
					withPool(func(p *registry.PoolPolicy) { p.CostModel.KVBlockTokens = 100 }))
				hold(t, e, 1000, 500, limiter.CostModel{InputWeight: 1, OutputWeight: 1, KVBlockTokens: 100})
				return post(e, 500, 1000)
			},
			status: 429, retryAfter: "1",
			typ: "rate_limit_error", code: "memory_limit",
			message: "KV-cache limit exceeded: 20 blocks. Retry in 1s.",
		},
		{
			// Bucket 8000: 3000 + 6000 can never fit. Not retryable: no
			// Retry-After (BC-10).
			name: "request_too_large",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(48000), WeightedBurst: i64(8000)}))
				return post(e, 3000, 6000)
			},
			status: 413,
			typ:    "invalid_request_error", code: "request_too_large",
			msgParts: []string{"9000", "8000", "Reduce the prompt or max_tokens"},
		},
		{
			name: "tenant_suspended",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(0)}))
				return post(e, 10, 10)
			},
			status: 403,
			typ:    "permission_error", code: "tenant_suspended",
			msgParts: []string{"suspended", "limits is 0", "TenantQuota"},
		},
		{
			// Budget 1000 per day, 900 used (seed): 500 does not fit until the
			// day resets at 2026-01-02T00:00:00Z, 86 400 s away.
			name: "budget_exhausted",
			do: func(t *testing.T) *http.Response {
				tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(60000)})
				tp.Budget = &registry.BudgetPolicy{WeightedTokens: 1000, Period: registry.BudgetDay}
				tp.BudgetSeed = &registry.BudgetSeed{Used: 900, ResetTime: t0.Add(24 * time.Hour)}
				e := contractEnv(t, nil, tp)
				return post(e, 250, 250)
			},
			status: 429, retryAfter: "86400",
			typ: "rate_limit_error", code: "budget_exhausted",
			msgParts: []string{"1000", "Day", "900", "2026-01-02T00:00:00Z", "Retry"},
		},
		{
			// The provider answers 429 with Retry-After 20: the model is
			// paused and the call refused as pool capacity.
			name: "upstream_quota_exhausted, provider 429 passed as 503",
			do: func(t *testing.T) *http.Response {
				up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
					w.Header().Set("Retry-After", "20")
					w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
					w.WriteHeader(http.StatusTooManyRequests)
					_, _ = w.Write([]byte(`{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`))
				})
				e := contractEnv(t, up, tenant("a", limiter.Limits{WeightedPerMinute: i64(60000)}))
				return post(e, 10, 10)
			},
			status: 503, retryAfter: "20",
			typ: "rate_limit_error", code: "upstream_quota_exhausted",
			message: "The provider's quota for this pool is exhausted. Retry in 20s.",
		},
		{
			// The model is paused for 20.5 s; the throttle adds a jitter of
			// 0 to 0.5 s, so the wait is 20.5 to 21 s: Retry-After 21.
			name: "upstream_quota_exhausted, paused model refused at admission",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(60000)}))
				m := e.reg.Model(testModel)
				p, ok, _ := m.Throttle.TryStart(t0, 1, throttle.Interactive)
				if !ok {
					t.Fatal("probe refused")
				}
				m.Throttle.OnTooManyRequests(t0, p, throttle.Quota{RetryAfter: 20500 * time.Millisecond, HasRetryAfter: true})
				return post(e, 10, 10)
			},
			status: 503, retryAfter: "21",
			typ: "rate_limit_error", code: "upstream_quota_exhausted",
			message: "The provider's quota for this pool is exhausted. Retry in 21s.",
		},
		{
			// One upstream slot, taken by a call the provider holds.
			name: "pool_concurrency_limit",
			do: func(t *testing.T) *http.Response {
				release := make(chan struct{})
				up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
					<-release
					okJSON(1, 1)(w, r, body)
				})
				e := contractEnv(t, up, tenant("a", limiter.Limits{WeightedPerMinute: i64(60000)}), withConcurrency(1))
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					readAll(t, post(e, 10, 10))
				}()
				t.Cleanup(wg.Wait)
				t.Cleanup(func() { close(release) })
				waitFor(t, "the first call to reach the provider", func() bool { return up.calls.Load() == 1 })
				return post(e, 10, 10)
			},
			status: 503, retryAfter: "1",
			typ: "rate_limit_error", code: "pool_concurrency_limit",
			message: "The pool has too many calls in flight to the provider. Retry in 1s.",
		},
		{
			name: "invalid_api_key",
			do: func(t *testing.T) *http.Response {
				e := contractEnv(t, nil, tenant("a", limiter.Limits{WeightedPerMinute: i64(60000)}))
				return e.do("POST", "/v1/completions", "sk-wrong-key", completionsBody(10, 10, ""))
			},
			status: 401,
			typ:    "authentication_error", code: "invalid_api_key",
			message: "Incorrect or missing API key.",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := tc.do(t)
			body := decode[errorBody](t, resp)
			probs := map[string][]string{}
			add := func(cat, format string, args ...any) { probs[cat] = append(probs[cat], fmt.Sprintf(format, args...)) }

			if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				add("status", "status %d %q, want %d application/json", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.retryAfter {
				add("retry-after", "Retry-After %q, want %q", got, tc.retryAfter)
			}
			want := tc.fields
			if want == nil {
				want = map[string]string{}
			}
			if d := cmp.Diff(want, quotaFields(resp.Header)); d != "" {
				add("fields", "quota fields (-want +got):\n%s", d)
			}
			for _, p := range checkIETFFields(resp.Header) {
				add("fields", "%s", p)
			}
			if body.Error.Type != tc.typ || body.Error.Code != tc.code || body.Error.Param != nil {
				add("body", "error type %q code %q param %v, want %q %q null", body.Error.Type, body.Error.Code, body.Error.Param, tc.typ, tc.code)
			}
			if tc.message != "" && body.Error.Message != tc.message {
				add("message", "message %q, want %q", body.Error.Message, tc.message)
			}
			for _, part := range tc.msgParts {
				if !strings.Contains(body.Error.Message, part) {
					add("message", "message %q does not name %q", body.Error.Message, part)
				}
			}
			if strings.Contains(body.Error.Message, "sk-") {
				add("message", "message %q echoes a key", body.Error.Message)
			}

			var gapNotes []string
			for _, cat := range []string{"status", "retry-after", "fields", "body", "message"} {
				reason, isGap := tc.gaps[cat]
				switch {
				case isGap && len(probs[cat]) > 0:
					gapNotes = append(gapNotes, fmt.Sprintf("%s: %s\n  %s", cat, reason, strings.Join(probs[cat], "\n  ")))
				case isGap:
					t.Errorf("%s now meets the contract: remove its gap mark (%s)", cat, reason)
				case len(probs[cat]) > 0:
					t.Errorf("%s", strings.Join(probs[cat], "\n"))
				}
			}
			if len(gapNotes) > 0 {
				t.Skipf("CONTRACT GAP, not fixed in the gateway yet:\n%s", strings.Join(gapNotes, "\n"))
			}
		})
	}
}

// TestSuccessCarriesQuotaFields: successful responses, streamed or not,
// carry the tenant's fields for both dimensions, so clients can
// self-throttle. Bucket 10 000 refilling 1000/s, 100 requests refilling
// 10/s; the settled call used 150 weighted tokens (100 + 50 of 1100
// charged), the stream's fields are written at its start with the full
// charge of 1100 held.
func TestSuccessCarriesQuotaFields(t *testing.T) {
	limits := limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000), RequestsPerMinute: i64(600)}
	for _, tc := range []struct {
		name   string
		handle func(w http.ResponseWriter, r *http.Request, body []byte)
		extra  string
		want   map[string]string
	}{
		{
			"non-streaming", okJSON(100, 50), "",
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "60000", "X-Ratelimit-Remaining-Tokens": "9850", "X-Ratelimit-Reset-Tokens": "1",
				"X-Ratelimit-Limit-Requests": "600", "X-Ratelimit-Remaining-Requests": "99", "X-Ratelimit-Reset-Requests": "1",
				"Ratelimit":        `"tokens";r=9850;t=1, "requests";r=99;t=1`,
				"Ratelimit-Policy": `"tokens";q=60000;qu="tokens";w=60, "requests";q=600;w=60`,
			},
		},
		{
			"streaming", sseStream(50, 100), `,"stream":true`,
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "60000", "X-Ratelimit-Remaining-Tokens": "8900", "X-Ratelimit-Reset-Tokens": "2",
				"X-Ratelimit-Limit-Requests": "600", "X-Ratelimit-Remaining-Requests": "99", "X-Ratelimit-Reset-Requests": "1",
				"Ratelimit":        `"tokens";r=8900;t=2, "requests";r=99;t=1`,
				"Ratelimit-Policy": `"tokens";q=60000;qu="tokens";w=60, "requests";q=600;w=60`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := contractEnv(t, newUpstream(t, tc.handle), tenant("a", limits))
			resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 1000, tc.extra))
			readAll(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			if d := cmp.Diff(tc.want, quotaFields(resp.Header)); d != "" {
				t.Errorf("quota fields (-want +got):\n%s", d)
			}
			if probs := checkIETFFields(resp.Header); len(probs) > 0 {
				t.Errorf("IETF fields: %v", probs)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				t.Errorf("Retry-After %q on a success", ra)
			}
		})
	}
}
