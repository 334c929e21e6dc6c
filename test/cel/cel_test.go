// Package cel tests the CRDs' OpenAPI and CEL validation against a real kube-apiserver:
// every rule refuses a bad spec with a message naming the field, and valid specs get
// their documented defaults.
package cel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fairshare-dev/fairshare/test/framework"
)

var (
	k8s client.Client
	env *envtest.Environment
)

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Println("KUBEBUILDER_ASSETS is not set: run `make test-envtest` (it builds bin/kube-apiserver and bin/etcd)")
		os.Exit(0)
	}
	env = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(framework.RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		os.Exit(1)
	}
	k8s, err = client.New(cfg, client.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

var (
	tqGVK   = schema.GroupVersionKind{Group: "quota.fairshare.dev", Version: "v1alpha1", Kind: "TenantQuota"}
	poolGVK = schema.GroupVersionKind{Group: "quota.fairshare.dev", Version: "v1alpha1", Kind: "ProviderPool"}
)

func object(gvk schema.GroupVersionKind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace("default")
	u.SetName(name)
	return u
}

func validPool() map[string]any {
	return map[string]any{
		"upstream": map[string]any{"baseURL": "https://api.example.com"},
		"models":   []any{map[string]any{"name": "gpt-4o-mini"}},
	}
}

func validTenant() map[string]any {
	return map[string]any{"poolRef": map[string]any{"name": "p"}}
}

// with returns spec with the value at the dotted path set (maps created as needed).
func with(spec map[string]any, path string, v any) map[string]any {
	parts := strings.Split(path, ".")
	m := spec
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
	return spec
}

func without(spec map[string]any, key string) map[string]any {
	delete(spec, key)
	return spec
}

func TestCreateValidation(t *testing.T) {
	cases := map[string]struct {
		gvk     schema.GroupVersionKind
		spec    map[string]any
		wantErr []string // substrings of the API server's message; nil = accepted
		causes  int      // when > 0, the number of errors the API server reports
	}{
		"valid tenant":           {gvk: tqGVK, spec: validTenant()},
		"valid pool":             {gvk: poolGVK, spec: validPool()},
		"weight 0":               {gvk: tqGVK, spec: with(validTenant(), "weight", 0), wantErr: []string{"spec.weight", "greater than or equal to 1"}},
		"negative weighted rate": {gvk: tqGVK, spec: with(validTenant(), "tokens.weightedPerMinute", -1), wantErr: []string{"spec.tokens.weightedPerMinute", "greater than or equal to 0"}},
		"negative input rate":    {gvk: tqGVK, spec: with(validTenant(), "tokens.inputPerMinute", -5), wantErr: []string{"spec.tokens.inputPerMinute"}},
		"negative output rate":   {gvk: tqGVK, spec: with(validTenant(), "tokens.outputPerMinute", -5), wantErr: []string{"spec.tokens.outputPerMinute"}},
		"negative request rate":  {gvk: tqGVK, spec: with(validTenant(), "requests.perMinute", -1), wantErr: []string{"spec.requests.perMinute"}},
		"burst below rate": {gvk: tqGVK,
			spec:    with(with(validTenant(), "tokens.weightedPerMinute", 60000), "tokens.burst", 999),
			wantErr: []string{"spec.tokens.burst must be at least one second of spec.tokens.weightedPerMinute"}},
		"burst of exactly one second": {gvk: tqGVK,
			spec: with(with(validTenant(), "tokens.weightedPerMinute", 60000), "tokens.burst", 1000)},
		// BC-19: a positive rate with burst 0 would never admit anything.
		"BC-19 burst 0": {gvk: tqGVK,
			spec:    with(with(validTenant(), "tokens.weightedPerMinute", 600), "tokens.burst", 0),
			wantErr: []string{"spec.tokens.burst", "greater than or equal to 1"}},
		// BC-19: rate 0 is a valid, suspended plan (the scheduler refuses its first request).
		"BC-19 suspended tenant": {gvk: tqGVK, spec: with(validTenant(), "tokens.weightedPerMinute", 0)},
		"burst without rate": {gvk: tqGVK, spec: with(validTenant(), "tokens.burst", 1000),
			wantErr: []string{"spec.tokens.burst needs spec.tokens.weightedPerMinute"}},
		"request burst below rate": {gvk: tqGVK,
			spec:    with(with(validTenant(), "requests.perMinute", 600), "requests.burst", 9),
			wantErr: []string{"spec.requests.burst must be at least one second of spec.requests.perMinute"}},
		"request burst without rate": {gvk: tqGVK, spec: with(validTenant(), "requests.burst", 10),
			wantErr: []string{"spec.requests: Invalid value: \"object\": spec.requests.burst needs spec.requests.perMinute"}, causes: 1},
		"request burst with rate":    {gvk: tqGVK, spec: with(with(validTenant(), "requests.perMinute", 600), "requests.burst", 10)},
		"request rate without burst": {gvk: tqGVK, spec: with(validTenant(), "requests.perMinute", 600)},
		"missing poolRef":            {gvk: tqGVK, spec: without(validTenant(), "poolRef"), wantErr: []string{"spec.poolRef", "Required value"}},
		"empty poolRef name":         {gvk: tqGVK, spec: with(validTenant(), "poolRef.name", ""), wantErr: []string{"spec.poolRef.name"}},
		"bad tenantID":               {gvk: tqGVK, spec: with(validTenant(), "tenantID", "Not_Valid!"), wantErr: []string{"spec.tenantID"}},
		"bad enforcement":            {gvk: tqGVK, spec: with(validTenant(), "enforcement", "Maybe"), wantErr: []string{"spec.enforcement", "Unsupported value"}},
		"maxWaitTokens 0":            {gvk: poolGVK, spec: with(validPool(), "scheduler.maxWaitTokens", 0), wantErr: []string{"spec.scheduler.maxWaitTokens", "greater than or equal to 1"}},
		"bad queueingStrategy":       {gvk: poolGVK, spec: with(validPool(), "scheduler.queueingStrategy", "LIFO"), wantErr: []string{"spec.scheduler.queueingStrategy", "Unsupported value"}},
		"StrictFIFO is valid":        {gvk: poolGVK, spec: with(validPool(), "scheduler.queueingStrategy", "StrictFIFO")},
		"bad streamUsage":            {gvk: poolGVK, spec: with(validPool(), "upstream.streamUsage", "Never"), wantErr: []string{"spec.upstream.streamUsage", "Unsupported value"}},
		"CountDeltas is valid":       {gvk: poolGVK, spec: with(validPool(), "upstream.streamUsage", "CountDeltas")},
		"bad mode":                   {gvk: tqGVK, spec: with(validTenant(), "mode", "Audit"), wantErr: []string{"spec.mode", "Unsupported value"}},
		"DryRun is valid":            {gvk: tqGVK, spec: with(validTenant(), "mode", "DryRun")},
		"max output 0":               {gvk: tqGVK, spec: with(validTenant(), "maxOutputTokensPerRequest", 0), wantErr: []string{"spec.maxOutputTokensPerRequest", "greater than or equal to 1"}},
		"negative budget":            {gvk: tqGVK, spec: with(validTenant(), "budget.weightedTokens", -1), wantErr: []string{"spec.budget.weightedTokens"}},
		"reserve 100 percent":        {gvk: poolGVK, spec: with(validPool(), "reserve.interactivePercent", 100), wantErr: []string{"spec.reserve.interactivePercent", "less than or equal to 99"}},
		"negative reserve":           {gvk: poolGVK, spec: with(validPool(), "reserve.interactivePercent", -1), wantErr: []string{"spec.reserve.interactivePercent"}},
		"reserve 0 is valid":         {gvk: poolGVK, spec: with(validPool(), "reserve.interactivePercent", 0)},
		"baseURL without scheme":     {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "api.example.com"), wantErr: []string{"spec.upstream.baseURL must start with http:// or https://"}, causes: 1},
		"baseURL of another scheme": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "ftp://api.example.com"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must start with http:// or https://"}, causes: 1},
		"baseURL with a space in the host": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "http://exa mple.com"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must be a valid URL, for example https://api.openai.com"}, causes: 1},
		"baseURL with a fragment": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.example.com#x"),
			wantErr: []string{"spec.upstream.baseURL must be a valid URL, for example https://api.openai.com"}, causes: 1},
		"baseURL without a host": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must have a host, for example https://api.openai.com"}, causes: 1},
		"baseURL with a port and no host": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "http://:8080"),
			wantErr: []string{"spec.upstream.baseURL must have a host, for example https://api.openai.com"}, causes: 1},
		"baseURL ending in /v1": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.openai.com/v1"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must not end in /v1: the scheduler appends /v1/... (for example /v1/chat/completions) itself, so use https://api.openai.com, not https://api.openai.com/v1"}, causes: 1},
		"baseURL ending in /v1/": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.openai.com/v1/"),
			wantErr: []string{"spec.upstream.baseURL must not end in /v1: the scheduler appends /v1/..."}, causes: 1},
		"baseURL of a gateway path ending in /v1": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://gw.example.com/openai/v1"),
			wantErr: []string{"spec.upstream.baseURL must not end in /v1: the scheduler appends /v1/..."}, causes: 1},
		"baseURL with a query": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://gw.example.com/openai?api-version=2024-10-21"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must not have a query (?...): the scheduler appends the API path (/v1/chat/completions) to the URL, so a query would end up before it"}, causes: 1},
		"baseURL with an empty query": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.example.com?"),
			wantErr: []string{"spec.upstream.baseURL must not have a query (?...)"}, causes: 1},
		"baseURL with a fragment after a path": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.example.com/#frag"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must not have a fragment (#...): the scheduler appends the API path (/v1/chat/completions) to the URL, so a fragment would end up before it"}, causes: 1},
		"baseURL of a gateway path with a fragment": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://gw.example.com/openai#x"),
			wantErr: []string{"spec.upstream.baseURL must not have a fragment (#...)"}, causes: 1},
		"baseURL with credentials": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://user:sk-secret@api.example.com"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must not carry credentials (user:password@): put the provider's key in the Secret of spec.upstream.credentialsSecretRef"}, causes: 1},
		"baseURL with an @ in its path":     {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://gw.example.com/team@a")},
		"baseURL of a gateway path":         {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://gw.example.com/openai")},
		"baseURL with a path /v1beta":       {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://gw.example.com/v1beta")},
		"baseURL with a trailing slash":     {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.openai.com/")},
		"baseURL of a Service with a port":  {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "http://providersim.fairshare-system.svc:8080")},
		"baseURL of an IPv6 host":           {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://[::1]:8443")},
		"baseURL with an upper-case scheme": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "HTTPS://api.example.com")},
		"tokensPerMinute above 10^15": {gvk: poolGVK, spec: with(validPool(), "models", []any{map[string]any{"name": "m", "tokensPerMinute": int64(9223372036854775807)}}),
			wantErr: []string{"spec.models[0].tokensPerMinute: Invalid value: 9223372036854775807: spec.models[0].tokensPerMinute in body should be less than or equal to 1000000000000000"}, causes: 1},
		"requestsPerMinute above 10^15": {gvk: poolGVK, spec: with(validPool(), "models", []any{map[string]any{"name": "m", "requestsPerMinute": int64(1000000000000001)}}),
			wantErr: []string{"spec.models[0].requestsPerMinute: Invalid value: 1000000000000001: spec.models[0].requestsPerMinute in body should be less than or equal to 1000000000000000"}, causes: 1},
		"rateLimitGroup not a lowercase name": {gvk: poolGVK, spec: with(validPool(), "models", []any{map[string]any{"name": "m", "rateLimitGroup": "Claude Sonnet"}}),
			wantErr: []string{`spec.models[0].rateLimitGroup: Invalid value: "Claude Sonnet": spec.models[0].rateLimitGroup in body should match '^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$'`}, causes: 1},
		"two models in one rateLimitGroup": {gvk: poolGVK, spec: with(validPool(), "models", []any{map[string]any{"name": "claude-sonnet-4-5", "rateLimitGroup": "sonnet"}, map[string]any{"name": "claude-sonnet-4-5-20250929", "rateLimitGroup": "sonnet"}})},
		"model hints of 10^15":             {gvk: poolGVK, spec: with(validPool(), "models", []any{map[string]any{"name": "m", "tokensPerMinute": int64(1000000000000000), "requestsPerMinute": int64(1000000000000000)}})},
		"budget above 10^15": {gvk: tqGVK, spec: with(validTenant(), "budget.weightedTokens", int64(1000000000000001)),
			wantErr: []string{"spec.budget.weightedTokens: Invalid value: 1000000000000001: spec.budget.weightedTokens in body should be less than or equal to 1000000000000000"}, causes: 1},
		"budget of 10^15":    {gvk: tqGVK, spec: with(validTenant(), "budget.weightedTokens", int64(1000000000000000))},
		"no models":          {gvk: poolGVK, spec: with(validPool(), "models", []any{}), wantErr: []string{"spec.models"}},
		"output weight 0":    {gvk: poolGVK, spec: with(validPool(), "costModel.outputTokenWeight", 0), wantErr: []string{"spec.costModel.outputTokenWeight"}},
		"bad dialect":        {gvk: poolGVK, spec: with(validPool(), "upstream.dialect", "Klingon"), wantErr: []string{"spec.upstream.dialect", "Unsupported value"}},
		"bad identification": {gvk: poolGVK, spec: with(validPool(), "tenantIdentification.mode", "Cookie"), wantErr: []string{"spec.tenantIdentification.mode"}},
		"scheduler image with a space": {gvk: poolGVK, spec: with(validPool(), "scheduler.image", "registry.example.com/fairshare v1"),
			wantErr: []string{`spec.scheduler.image: Invalid value: "registry.example.com/fairshare v1": spec.scheduler.image in body should match`}, causes: 1},
		"scheduler image with an upper-case path": {gvk: poolGVK, spec: with(validPool(), "scheduler.image", "ghcr.io/Fairshare-Dev/fairshare:v1"),
			wantErr: []string{"spec.scheduler.image in body should match"}, causes: 1},
		"scheduler image with an empty tag": {gvk: poolGVK, spec: with(validPool(), "scheduler.image", "registry.example.com/fairshare:"),
			wantErr: []string{"spec.scheduler.image in body should match"}, causes: 1},
		"scheduler image with a registry port and a digest": {gvk: poolGVK,
			spec: with(validPool(), "scheduler.image", "registry.example.com:5000/platform/fairshare@sha256:"+strings.Repeat("0f", 32))},
		"scheduler image with a tag":  {gvk: poolGVK, spec: with(validPool(), "scheduler.image", "ghcr.io/fairshare-dev/fairshare:v0.1.0")},
		"scheduler image of one name": {gvk: poolGVK, spec: with(validPool(), "scheduler.image", "fairshare")},
		"zero replicas":               {gvk: poolGVK, spec: with(validPool(), "scheduler.replicas", 0), wantErr: []string{"spec.scheduler.replicas"}},
		"status interval 0":           {gvk: poolGVK, spec: with(validPool(), "scheduler.statusIntervalSeconds", 0), wantErr: []string{"spec.scheduler.statusIntervalSeconds"}},
		"bad job store type":          {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.type", "Disk"), wantErr: []string{"spec.scheduler.jobStore.type", "Unsupported value"}},
		"bad job store access":        {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.accessMode", "ReadOnlyMany"), wantErr: []string{"spec.scheduler.jobStore.accessMode", "Unsupported value"}},
		"job store size 0":            {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.size", "0"), wantErr: []string{`spec.scheduler.jobStore.size must be a positive quantity, not "0"`}, causes: 1},
		"job store size -1Gi":         {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.size", "-1Gi"), wantErr: []string{`spec.scheduler.jobStore.size: Invalid value: "": spec.scheduler.jobStore.size must be a positive quantity, not "-1Gi"`}, causes: 1},
		"job store size number 0":     {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.size", int64(0)), wantErr: []string{`spec.scheduler.jobStore.size must be a positive quantity, not "0"`}, causes: 1},
		"job store size garbage":      {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.size", "lots"), wantErr: []string{"spec.scheduler.jobStore.size"}},
		"empty storage class":         {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.storageClassName", ""), wantErr: []string{"spec.scheduler.jobStore.storageClassName"}},
		"replicas 2 with a ReadWriteOnce volume": {gvk: poolGVK, spec: with(validPool(), "scheduler.replicas", 2),
			wantErr: []string{"spec.scheduler.jobStore.accessMode must be ReadWriteMany when spec.scheduler.replicas > 1 with a Volume job store: a standby replica on another node cannot mount a ReadWriteOnce claim"}},
		"replicas 2 with an explicit ReadWriteOnce volume": {gvk: poolGVK,
			spec:    with(with(validPool(), "scheduler.replicas", 2), "scheduler.jobStore.accessMode", "ReadWriteOnce"),
			wantErr: []string{"spec.scheduler.jobStore.accessMode must be ReadWriteMany"}},
		"replicas 2 with a ReadWriteMany volume": {gvk: poolGVK,
			spec: with(with(validPool(), "scheduler.replicas", 2), "scheduler.jobStore.accessMode", "ReadWriteMany")},
		"replicas 2 with a Memory store": {gvk: poolGVK,
			spec: with(with(validPool(), "scheduler.replicas", 2), "scheduler.jobStore.type", "Memory")},
		// An int32 field above 2^31-1 was stored and then broke every
		// typed list of TenantQuotas (the operator's and the scheduler's
		// informers) in the cluster.
		"maxConcurrentRequests above int32": {gvk: tqGVK, spec: with(validTenant(), "maxConcurrentRequests", int64(2147483648)),
			wantErr: []string{"spec.maxConcurrentRequests", "less than or equal to 1000000"}, causes: 1},
		"maxConcurrentRequests of 10^6": {gvk: tqGVK, spec: with(validTenant(), "maxConcurrentRequests", 1000000)},
		"baseURL ending in /v1//": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.openai.com/v1//"),
			wantErr: []string{"spec.upstream.baseURL must not end in /v1: the scheduler appends /v1/..."}, causes: 1},
		"baseURL of a path ending in xv1/": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://gw.example.com/xv1/")},
		"baseURL with a space in the path": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.example.com/my path"),
			wantErr: []string{"spec.upstream.baseURL: Invalid value: \"string\": spec.upstream.baseURL must not contain a space: percent-encode it (%20)"}, causes: 1},
		"baseURL with an encoded space": {gvk: poolGVK, spec: with(validPool(), "upstream.baseURL", "https://api.example.com/my%20path")},
		"provider Secret key with a space": {gvk: poolGVK, spec: with(validPool(), "upstream.credentialsSecretRef", map[string]any{"name": "provider", "key": "api key"}),
			wantErr: []string{"spec.upstream.credentialsSecretRef.key", "should match"}, causes: 1},
		"provider Secret name not a DNS subdomain": {gvk: poolGVK, spec: with(validPool(), "upstream.credentialsSecretRef", map[string]any{"name": "Not_A_Name"}),
			wantErr: []string{"spec.upstream.credentialsSecretRef.name", "should match"}, causes: 1},
		"provider Secret of a dotted name and key": {gvk: poolGVK, spec: with(validPool(), "upstream.credentialsSecretRef", map[string]any{"name": "openai.prod", "key": "OPENAI_API_KEY.v2"})},
		"tenant Secret key with a space": {gvk: tqGVK, spec: with(validTenant(), "credentials", map[string]any{"secretRef": map[string]any{"name": "s", "key": "api key"}}),
			wantErr: []string{"spec.credentials.secretRef.key", "should match"}, causes: 1},
		"poolRef name no pool can have": {gvk: tqGVK, spec: with(validTenant(), "poolRef.name", "Bad_Pool!"),
			wantErr: []string{"spec.poolRef.name", "should match"}, causes: 1},
		"poolRef name of 54 characters": {gvk: tqGVK, spec: with(validTenant(), "poolRef.name", strings.Repeat("p", 54)),
			wantErr: []string{"spec.poolRef.name", "may not be more than 53"}},
		"explicit empty tier": {gvk: tqGVK, spec: with(validTenant(), "tier", "")},
		// A claim's class must be a DNS-1123 subdomain: refused here, not
		// accepted and then, being immutable once set, stuck on a claim the
		// API server refuses.
		"storage class not a DNS subdomain": {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.storageClassName", "Fast_SSD"),
			wantErr: []string{"spec.scheduler.jobStore.storageClassName", "should match"}, causes: 1},
		"storage class with a space": {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.storageClassName", "fast ssd"),
			wantErr: []string{"spec.scheduler.jobStore.storageClassName", "should match"}, causes: 1},
		"storage class of a dotted name": {gvk: poolGVK, spec: with(validPool(), "scheduler.jobStore.storageClassName", "ebs.csi.aws.com-gp3")},
		"image pull Secret not a DNS subdomain": {gvk: poolGVK, spec: with(validPool(), "scheduler.imagePullSecrets", []any{map[string]any{"name": "Reg_Cred"}}),
			wantErr: []string{"spec.scheduler.imagePullSecrets[0].name", "should match"}, causes: 1},
		"image pull Secret twice": {gvk: poolGVK, spec: with(validPool(), "scheduler.imagePullSecrets", []any{map[string]any{"name": "regcred"}, map[string]any{"name": "regcred"}}),
			wantErr: []string{"spec.scheduler.imagePullSecrets[1]", "Duplicate value"}, causes: 1},
		"image pull Secrets": {gvk: poolGVK, spec: with(validPool(), "scheduler.imagePullSecrets", []any{map[string]any{"name": "regcred"}, map[string]any{"name": "mirror.example"}})},
		"job store of 10Gi on a class": {gvk: poolGVK,
			spec: with(with(validPool(), "scheduler.jobStore.size", "10Gi"), "scheduler.jobStore.storageClassName", "fast")},
	}
	i := 0
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			i++
			obj := object(tc.gvk, fmt.Sprintf("case-%d", i), tc.spec)
			err := k8s.Create(context.Background(), obj)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want refused with %q, got accepted", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if tc.causes > 0 {
				if n := len(causes(err)); n != tc.causes {
					t.Errorf("error %q has %d causes, want %d", err, n, tc.causes)
				}
			}
		})
	}
}

// causes returns the field errors of an API server refusal.
func causes(err error) []metav1.StatusCause {
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Details == nil {
		return nil
	}
	return st.Status().Details.Causes
}

func TestDefaults(t *testing.T) {
	ctx := context.Background()
	tq := object(tqGVK, "defaults-tenant", validTenant())
	if err := k8s.Create(ctx, tq); err != nil {
		t.Fatal(err)
	}
	pool := object(poolGVK, "defaults-pool", validPool())
	if err := k8s.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		obj  *unstructured.Unstructured
		path []string
		want any
	}{
		{tq, []string{"spec", "weight"}, int64(1)},
		{tq, []string{"spec", "enforcement"}, "Hard"},
		{tq, []string{"spec", "mode"}, "Enforce"},
		{tq, []string{"spec", "batch", "maxQueuedJobs"}, int64(1000)},
		{tq, []string{"spec", "batch", "defaultDeadlineSeconds"}, int64(3600)},
		{pool, []string{"spec", "upstream", "dialect"}, "Auto"},
		{pool, []string{"spec", "upstream", "timeoutSeconds"}, int64(120)},
		{pool, []string{"spec", "reserve", "interactivePercent"}, int64(20)},
		{pool, []string{"spec", "costModel", "inputTokenWeight"}, int64(1)},
		{pool, []string{"spec", "costModel", "outputTokenWeight"}, int64(4)},
		{pool, []string{"spec", "costModel", "kvBlockTokens"}, int64(16)},
		{pool, []string{"spec", "costModel", "defaultMaxOutputTokens"}, int64(4096)},
		{pool, []string{"spec", "tenantIdentification", "mode"}, "APIKey"},
		{pool, []string{"spec", "tenantIdentification", "header"}, "X-Fairshare-Tenant"},
		{pool, []string{"spec", "scheduler", "replicas"}, int64(1)},
		{pool, []string{"spec", "scheduler", "upstreamConcurrency"}, int64(64)},
		{pool, []string{"spec", "scheduler", "quantumTokens"}, int64(4096)},
		{pool, []string{"spec", "scheduler", "queueingStrategy"}, "BestEffortFIFO"},
		{pool, []string{"spec", "upstream", "streamUsage"}, "IncludeUsage"},
		{pool, []string{"spec", "scheduler", "statusIntervalSeconds"}, int64(10)},
		{pool, []string{"spec", "scheduler", "jobStore", "type"}, "Volume"},
		{pool, []string{"spec", "scheduler", "jobStore", "size"}, "1Gi"},
		{pool, []string{"spec", "scheduler", "jobStore", "accessMode"}, "ReadWriteOnce"},
	}
	for _, c := range checks {
		got, found, err := unstructured.NestedFieldNoCopy(c.obj.Object, c.path...)
		if err != nil || !found || got != c.want {
			t.Errorf("%s %s: got %v (found %v, err %v), want %v", c.obj.GetKind(), strings.Join(c.path, "."), got, found, err, c.want)
		}
	}
}

func TestImmutableFields(t *testing.T) {
	ctx := context.Background()
	spec := with(validTenant(), "tenantID", "acme")
	tq := object(tqGVK, "immutable", spec)
	if err := k8s.Create(ctx, tq); err != nil {
		t.Fatal(err)
	}
	for path, v := range map[string]any{"poolRef.name": "other", "tenantID": "acme2"} {
		t.Run(path, func(t *testing.T) {
			cur := &unstructured.Unstructured{}
			cur.SetGroupVersionKind(tqGVK)
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(tq), cur); err != nil {
				t.Fatal(err)
			}
			spec := cur.Object["spec"].(map[string]any)
			with(spec, path, v)
			err := k8s.Update(ctx, cur)
			if err == nil || !strings.Contains(err.Error(), "spec."+strings.Split(path, ".")[0]+" is immutable") {
				t.Fatalf("update of spec.%s: got %v, want 'is immutable'", path, err)
			}
		})
	}
	// Adding or removing tenantID changes the effective tenant id too.
	for name, tc := range map[string]struct {
		create map[string]any
		mutate func(spec map[string]any)
	}{
		"add tenantID":    {validTenant(), func(spec map[string]any) { spec["tenantID"] = "added" }},
		"remove tenantID": {with(validTenant(), "tenantID", "present"), func(spec map[string]any) { delete(spec, "tenantID") }},
	} {
		t.Run(name, func(t *testing.T) {
			obj := object(tqGVK, strings.ToLower(strings.ReplaceAll(name, " ", "-")), tc.create)
			if err := k8s.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
			tc.mutate(obj.Object["spec"].(map[string]any))
			err := k8s.Update(ctx, obj)
			if err == nil || !strings.Contains(err.Error(), "spec.tenantID is immutable") {
				t.Fatalf("got %v, want 'spec.tenantID is immutable'", err)
			}
		})
	}
	// A mutable field still updates.
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(tqGVK)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(tq), cur); err != nil {
		t.Fatal(err)
	}
	with(cur.Object["spec"].(map[string]any), "weight", 5)
	if err := k8s.Update(ctx, cur); err != nil {
		t.Fatalf("updating weight: %v", err)
	}
}

// TestJobStoreTransitions: storageClassName and accessMode are immutable once
// set, size may grow but not shrink, and the type may switch.
func TestJobStoreTransitions(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		create  map[string]any // spec.scheduler.jobStore at creation
		update  map[string]any // fields set on spec.scheduler.jobStore by the update
		remove  string         // field removed from spec.scheduler.jobStore by the update
		wantErr string         // "" = accepted
	}{
		"change storage class": {create: map[string]any{"storageClassName": "fast"}, update: map[string]any{"storageClassName": "slow"},
			wantErr: "spec.scheduler.jobStore.storageClassName is immutable once set"},
		"remove storage class": {create: map[string]any{"storageClassName": "fast"}, remove: "storageClassName",
			wantErr: "spec.scheduler.jobStore.storageClassName is immutable once set"},
		"set storage class when unset": {create: map[string]any{}, update: map[string]any{"storageClassName": "fast"}},
		"change access mode": {create: map[string]any{}, update: map[string]any{"accessMode": "ReadWriteMany"},
			wantErr: "spec.scheduler.jobStore.accessMode is immutable once set"},
		"shrink is allowed":        {create: map[string]any{"size": "2Gi"}, update: map[string]any{"size": "1500Mi"}},
		"access mode while Memory": {create: map[string]any{"type": "Memory"}, update: map[string]any{"accessMode": "ReadWriteMany", "type": "Volume"}},
		"grow":                     {create: map[string]any{"size": "1Gi"}, update: map[string]any{"size": "2Gi"}},
		"same size, other unit":    {create: map[string]any{"size": "1Gi"}, update: map[string]any{"size": "1024Mi"}},
		"volume to memory":         {create: map[string]any{}, update: map[string]any{"type": "Memory"}},
	} {
		t.Run(name, func(t *testing.T) {
			obj := object(poolGVK, "js-"+strings.ToLower(strings.ReplaceAll(strings.ReplaceAll(name, " ", "-"), ",", "")), with(validPool(), "scheduler.jobStore", tc.create))
			if err := k8s.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
			js := obj.Object["spec"].(map[string]any)["scheduler"].(map[string]any)["jobStore"].(map[string]any)
			for k, v := range tc.update {
				js[k] = v
			}
			if tc.remove != "" {
				delete(js, tc.remove)
			}
			err := k8s.Update(ctx, obj)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want %q", err, tc.wantErr)
			}
		})
	}
}
