package render

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

var testOptions = Options{
	DefaultImage:         "ghcr.io/fairshare-dev/fairshare:v0.1.0",
	SchedulerClusterRole: DefaultSchedulerClusterRole,
}

// defaultPool is a pool as a user writes it, with no API defaults filled in.
func defaultPool() *v1alpha1.ProviderPool {
	return &v1alpha1.ProviderPool{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "demo",
			Namespace: "fairshare-demo",
			UID:       types.UID("0b0e3c1a-5d8f-4b7e-9a61-2f1c7d9e4a10"),
		},
		Spec: v1alpha1.ProviderPoolSpec{
			Upstream: v1alpha1.UpstreamSpec{BaseURL: "http://127.0.0.1:8090"},
			Models:   []v1alpha1.ModelSpec{{Name: "sim-gpt"}},
		},
	}
}

// fullPool sets every option of the spec.
func fullPool() *v1alpha1.ProviderPool {
	p := defaultPool()
	p.Name = "openai-prod"
	p.Namespace = "ml-platform"
	p.Spec = v1alpha1.ProviderPoolSpec{
		Upstream: v1alpha1.UpstreamSpec{
			BaseURL:              "https://api.openai.com",
			Dialect:              v1alpha1.DialectOpenAI,
			CredentialsSecretRef: &v1alpha1.SecretKeyRef{Name: "openai-key", Key: "token"},
			TimeoutSeconds:       60,
		},
		Models: []v1alpha1.ModelSpec{
			{Name: "gpt-4o", TokensPerMinute: ptr.To[int64](2_000_000), RequestsPerMinute: ptr.To[int64](10_000)},
			{Name: "gpt-4o-mini", TokensPerMinute: ptr.To[int64](10_000_000)},
		},
		Reserve:   v1alpha1.ReserveSpec{InteractivePercent: ptr.To[int32](30), BatchBorrowAfterSeconds: ptr.To[int32](60)},
		CostModel: v1alpha1.CostModel{InputTokenWeight: 1, OutputTokenWeight: 3, KVBlockTokens: 32, DefaultMaxOutputTokens: 2048},
		TenantIdentification: v1alpha1.TenantIdentification{
			Mode:   v1alpha1.IdentifyByTrustedHeader,
			Header: "X-Tenant",
		},
		Scheduler: v1alpha1.SchedulerSpec{
			Replicas: ptr.To[int32](3),
			Image:    "registry.example.com/fairshare:v0.2.0",
			// A private registry: the pods pull with the pool's own
			// Secrets, in the listed order.
			ImagePullSecrets: []v1alpha1.LocalSecretReference{{Name: "registry-b"}, {Name: "registry-a"}},
			Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			},
			UpstreamConcurrency:   256,
			QuantumTokens:         8192,
			MaxQueuedJobs:         500_000,
			StatusIntervalSeconds: 30,
			JobStore: v1alpha1.JobStoreSpec{
				Type:             v1alpha1.JobStoreVolume,
				Size:             ptr.To(resource.MustParse("5Gi")),
				StorageClassName: ptr.To("shared-nfs"),
				AccessMode:       v1alpha1.JobStoreReadWriteMany,
			},
		},
	}
	return p
}

// memoryPool keeps its jobs in memory.
func memoryPool() *v1alpha1.ProviderPool {
	p := defaultPool()
	p.Spec.Scheduler.JobStore.Type = v1alpha1.JobStoreMemory
	return p
}

func marshalAll(t *testing.T, objs Objects) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i, o := range objs.List() {
		if i > 0 {
			buf.WriteString("---\n")
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatalf("marshal %T: %v", o, err)
		}
		buf.Write(b)
	}
	return buf.Bytes()
}

// TestRenderGolden pins the rendered objects; run `go test ./internal/render -update` to regenerate.
func TestRenderGolden(t *testing.T) {
	tests := map[string]*v1alpha1.ProviderPool{
		"default": defaultPool(),
		"full":    fullPool(),
		"memory":  memoryPool(),
	}
	// The full pool has three tenants, two with key Secrets (given
	// unsorted and with a duplicate: the Roles list each once, sorted).
	tenants := map[string]Tenants{"full": {
		Names:   []string{"tenant-c", "tenant-a", "tenant-b", "tenant-a"},
		Secrets: []string{"tenant-b-key", "tenant-a-key", "tenant-b-key"},
	}}
	for name, pool := range tests {
		t.Run(name, func(t *testing.T) {
			objs, err := RenderWithTenants(pool, testOptions, tenants[name])
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			got := marshalAll(t, objs)
			path := filepath.Join("testdata", name+".golden.yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("reading golden file (run with -update to create it): %v", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("rendered objects differ from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

func TestRenderIsDeterministic(t *testing.T) {
	a, err := Render(fullPool(), testOptions)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Render(fullPool(), testOptions)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(marshalAll(t, a), marshalAll(t, b)); diff != "" {
		t.Errorf("two renders of the same pool differ:\n%s", diff)
	}
}

func TestSettings(t *testing.T) {
	tests := map[string]struct {
		pool *v1alpha1.ProviderPool
		want schedconfig.Settings
	}{
		"defaults when zero": {
			pool: defaultPool(),
			want: schedconfig.Settings{
				APIVersion: schedconfig.APIVersion, PoolName: "demo", Namespace: "fairshare-demo",
				HTTPAddr: ":8080", MetricsAddr: ":9090", HealthAddr: ":8081",
				LeaderElection: false, LeaseName: "demo-scheduler",
				StatusIntervalSeconds: 10, UpstreamConcurrency: 64,
				JobStorePath: "/var/lib/fairshare/jobs.db",
			},
		},
		"from spec, leader election above one replica": {
			pool: fullPool(),
			want: schedconfig.Settings{
				APIVersion: schedconfig.APIVersion, PoolName: "openai-prod", Namespace: "ml-platform",
				HTTPAddr: ":8080", MetricsAddr: ":9090", HealthAddr: ":8081",
				LeaderElection: true, LeaseName: "openai-prod-scheduler",
				StatusIntervalSeconds: 30, UpstreamConcurrency: 256,
				JobStorePath:    "/var/lib/fairshare/jobs.db",
				ProviderKeyFile: "/var/run/fairshare/provider/api-key",
			},
		},
		"memory job store: no path": {
			pool: memoryPool(),
			want: schedconfig.Settings{
				APIVersion: schedconfig.APIVersion, PoolName: "demo", Namespace: "fairshare-demo",
				HTTPAddr: ":8080", MetricsAddr: ":9090", HealthAddr: ":8081",
				LeaderElection: false, LeaseName: "demo-scheduler",
				StatusIntervalSeconds: 10, UpstreamConcurrency: 64,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Settings(tc.pool)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Settings (-want +got):\n%s", diff)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("rendered settings do not validate: %v", err)
			}
			objs, err := Render(tc.pool, testOptions)
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := schedconfig.Parse([]byte(objs.ConfigMap.Data[schedconfig.SettingsKey]))
			if err != nil {
				t.Fatalf("ConfigMap settings do not parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, parsed); diff != "" {
				t.Errorf("ConfigMap settings (-want +got):\n%s", diff)
			}
			if got, want := objs.Deployment.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash], tc.want.Hash(); got != want {
				t.Errorf("settings hash annotation = %q, want %q", got, want)
			}
		})
	}
}

// TestSettingsHash: a scheduler setting change rolls the Deployment; a change
// the scheduler reads live from the pool leaves the pod template untouched.
func TestSettingsHash(t *testing.T) {
	base := fullPool()
	tests := map[string]struct {
		mutate      func(*v1alpha1.ProviderPool)
		wantChanged bool
	}{
		"statusIntervalSeconds":    {func(p *v1alpha1.ProviderPool) { p.Spec.Scheduler.StatusIntervalSeconds = 5 }, true},
		"upstreamConcurrency":      {func(p *v1alpha1.ProviderPool) { p.Spec.Scheduler.UpstreamConcurrency = 8 }, true},
		"replicas 3 to 1":          {func(p *v1alpha1.ProviderPool) { p.Spec.Scheduler.Replicas = ptr.To[int32](1) }, true},
		"replicas 3 to 2":          {func(p *v1alpha1.ProviderPool) { p.Spec.Scheduler.Replicas = ptr.To[int32](2) }, false},
		"models":                   {func(p *v1alpha1.ProviderPool) { p.Spec.Models = append(p.Spec.Models, v1alpha1.ModelSpec{Name: "o3"}) }, false},
		"model hint":               {func(p *v1alpha1.ProviderPool) { p.Spec.Models[0].TokensPerMinute = ptr.To[int64](1) }, false},
		"reserve":                  {func(p *v1alpha1.ProviderPool) { p.Spec.Reserve.InteractivePercent = ptr.To[int32](0) }, false},
		"cost model":               {func(p *v1alpha1.ProviderPool) { p.Spec.CostModel.OutputTokenWeight = 8 }, false},
		"tenant identification":    {func(p *v1alpha1.ProviderPool) { p.Spec.TenantIdentification.Header = "X-Other" }, false},
		"upstream base URL":        {func(p *v1alpha1.ProviderPool) { p.Spec.Upstream.BaseURL = "https://example.com" }, false},
		"quantum and queue bounds": {func(p *v1alpha1.ProviderPool) { p.Spec.Scheduler.QuantumTokens = 1; p.Spec.Scheduler.MaxQueuedJobs = 1 }, false},
		"job store size":           {func(p *v1alpha1.ProviderPool) { p.Spec.Scheduler.JobStore.Size = ptr.To(resource.MustParse("20Gi")) }, false},
		"job store type Memory":    {func(p *v1alpha1.ProviderPool) { p.Spec.Scheduler.JobStore.Type = v1alpha1.JobStoreMemory }, true},
	}
	before, err := Render(base, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := base.DeepCopy()
			tc.mutate(pool)
			after, err := Render(pool, testOptions)
			if err != nil {
				t.Fatal(err)
			}
			oldHash := before.Deployment.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]
			newHash := after.Deployment.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]
			if changed := oldHash != newHash; changed != tc.wantChanged {
				t.Errorf("hash changed = %v, want %v (old %s, new %s)", changed, tc.wantChanged, oldHash, newHash)
			}
			if !tc.wantChanged {
				if diff := cmp.Diff(before.Deployment.Spec.Template, after.Deployment.Spec.Template); diff != "" {
					t.Errorf("pod template changed for a live setting (-before +after):\n%s", diff)
				}
				if diff := cmp.Diff(before.ConfigMap.Data, after.ConfigMap.Data); diff != "" {
					t.Errorf("ConfigMap changed for a live setting (-before +after):\n%s", diff)
				}
			}
		})
	}
}

func TestRenderMetadata(t *testing.T) {
	pool := defaultPool()
	objs, err := Render(pool, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{
		"app.kubernetes.io/name":       "fairshare-scheduler",
		"app.kubernetes.io/instance":   "demo",
		"app.kubernetes.io/managed-by": "fairshare",
		"quota.fairshare.dev/pool":     "demo",
	}
	wantOwners := []metav1.OwnerReference{{
		APIVersion: "quota.fairshare.dev/v1alpha1", Kind: "ProviderPool", Name: "demo",
		UID: pool.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	for _, o := range objs.List() {
		gvk := o.GetObjectKind().GroupVersionKind()
		t.Run(gvk.Kind, func(t *testing.T) {
			if gvk.Version == "" || gvk.Kind == "" {
				t.Errorf("TypeMeta not set: %v", gvk)
			}
			wantName := "demo-scheduler"
			if o == Object(objs.SecretsRole) || o == Object(objs.SecretsRoleBinding) {
				wantName = "demo-scheduler-secrets"
			}
			if o == Object(objs.PoolRole) || o == Object(objs.PoolRoleBinding) {
				wantName = "demo-scheduler-pool"
			}
			if o.GetName() != wantName || o.GetNamespace() != "fairshare-demo" {
				t.Errorf("object %s/%s, want fairshare-demo/%s", o.GetNamespace(), o.GetName(), wantName)
			}
			if diff := cmp.Diff(wantLabels, o.GetLabels()); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantOwners, o.GetOwnerReferences()); diff != "" {
				t.Errorf("owner references (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRenderCredentials: the credentials Secret's key is mounted as the
// file ProviderKeyFile (one item, whatever the key's name; never subPath,
// so that the kubelet updates it when the Secret changes), read-only,
// readable by the non-root container through fsGroup and by no one else;
// the settings name that file, and the key is not in the environment,
// which a rotation could not change.
func TestRenderCredentials(t *testing.T) {
	tests := map[string]struct {
		ref     *v1alpha1.SecretKeyRef
		wantKey string
	}{
		"no secret":         {ref: nil},
		"secret, key unset": {ref: &v1alpha1.SecretKeyRef{Name: "k"}, wantKey: "api-key"},
		"secret and key":    {ref: &v1alpha1.SecretKeyRef{Name: "k", Key: "tok"}, wantKey: "tok"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := memoryPool()
			pool.Spec.Upstream.CredentialsSecretRef = tc.ref
			objs, err := Render(pool, testOptions)
			if err != nil {
				t.Fatal(err)
			}
			ps := objs.Deployment.Spec.Template.Spec
			ctr := ps.Containers[0]
			var names []string
			for _, e := range ctr.Env {
				names = append(names, e.Name)
			}
			if diff := cmp.Diff([]string{"POD_NAMESPACE", "POD_NAME"}, names); diff != "" {
				t.Errorf("env names (-want +got):\n%s", diff)
			}
			s := Settings(pool)
			if tc.ref == nil {
				if len(ps.Volumes) != 1 || len(ctr.VolumeMounts) != 1 || ps.SecurityContext.FSGroup != nil || s.ProviderKeyFile != "" {
					t.Errorf("no Secret: volumes %v, mounts %v, fsGroup %v, providerKeyFile %q; want the settings volume only",
						ps.Volumes, ctr.VolumeMounts, ps.SecurityContext.FSGroup, s.ProviderKeyFile)
				}
				return
			}
			if s.ProviderKeyFile != "/var/run/fairshare/provider/api-key" {
				t.Errorf("providerKeyFile %q", s.ProviderKeyFile)
			}
			if err := s.Validate(); err != nil {
				t.Error(err)
			}
			wantVol := corev1.Volume{Name: "provider-key", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName:  tc.ref.Name,
				Items:       []corev1.KeyToPath{{Key: tc.wantKey, Path: "api-key"}},
				DefaultMode: ptr.To[int32](0o440),
			}}}
			if diff := cmp.Diff([]corev1.Volume{ps.Volumes[0], wantVol}, ps.Volumes); diff != "" {
				t.Errorf("volumes (-want +got):\n%s", diff)
			}
			wantMounts := []corev1.VolumeMount{
				{Name: "settings", MountPath: "/etc/fairshare", ReadOnly: true},
				{Name: "provider-key", MountPath: "/var/run/fairshare/provider", ReadOnly: true},
			}
			if diff := cmp.Diff(wantMounts, ctr.VolumeMounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if filepath.Dir(s.ProviderKeyFile) != wantMounts[1].MountPath {
				t.Errorf("providerKeyFile %q is not in the mount %q", s.ProviderKeyFile, wantMounts[1].MountPath)
			}
			if got := ps.SecurityContext.FSGroup; got == nil || *got != *ctr.SecurityContext.RunAsUser {
				t.Errorf("fsGroup %v, want the container's runAsUser %d (the key file is group-readable only)", got, *ctr.SecurityContext.RunAsUser)
			}
			if ps.SecurityContext.FSGroupChangePolicy != nil {
				t.Errorf("fsGroupChangePolicy %v without a job store volume", *ps.SecurityContext.FSGroupChangePolicy)
			}
		})
	}
}

// TestRenderKeyChangeKeepsHash: the settings, and so the pod template's
// hash, are the same whatever the credentials Secret's key name: the
// key's file path is fixed. (A rotated key changes the Secret's data
// only, which the operator never reads.)
func TestRenderKeyChangeKeepsHash(t *testing.T) {
	a, b := defaultPool(), defaultPool()
	a.Spec.Upstream.CredentialsSecretRef = &v1alpha1.SecretKeyRef{Name: "k"}
	b.Spec.Upstream.CredentialsSecretRef = &v1alpha1.SecretKeyRef{Name: "k", Key: "other"}
	if Settings(a).Hash() != Settings(b).Hash() {
		t.Error("the settings hash follows the credentials key name")
	}
}

// TestRenderImagePullSecrets: the scheduler pods pull their image with the
// pool's spec.scheduler.imagePullSecrets (an image in a registry that needs
// credentials could not be pulled otherwise), and with none when it names
// none.
func TestRenderImagePullSecrets(t *testing.T) {
	pool := defaultPool()
	objs, err := Render(pool, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	if got := objs.Deployment.Spec.Template.Spec.ImagePullSecrets; got != nil {
		t.Errorf("imagePullSecrets of a pool that names none: %v, want none", got)
	}
	pool.Spec.Scheduler.ImagePullSecrets = []v1alpha1.LocalSecretReference{{Name: "regcred"}, {Name: "mirror"}}
	if objs, err = Render(pool, testOptions); err != nil {
		t.Fatal(err)
	}
	want := []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}
	if diff := cmp.Diff(want, objs.Deployment.Spec.Template.Spec.ImagePullSecrets); diff != "" {
		t.Errorf("imagePullSecrets (-want +got):\n%s", diff)
	}
}

// TestRenderSkipRBACCheck: the operator's --skip-rbac-check
// (Options.SkipRBACCheck) adds --skip-rbac-check to the scheduler's
// arguments, after its settings file; without it the arguments are the
// settings file alone.
func TestRenderSkipRBACCheck(t *testing.T) {
	for _, tc := range []struct {
		skip bool
		want []string
	}{
		{false, []string{"--config=/etc/fairshare/scheduler.json"}},
		{true, []string{"--config=/etc/fairshare/scheduler.json", "--skip-rbac-check"}},
	} {
		opts := testOptions
		opts.SkipRBACCheck = tc.skip
		objs, err := Render(defaultPool(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, objs.Deployment.Spec.Template.Spec.Containers[0].Args); diff != "" {
			t.Errorf("SkipRBACCheck %v: args (-want +got):\n%s", tc.skip, diff)
		}
	}
}

func TestRenderErrors(t *testing.T) {
	tests := map[string]struct {
		mutate func(*v1alpha1.ProviderPool, *Options)
	}{
		"name too long": {func(p *v1alpha1.ProviderPool, _ *Options) {
			p.Name = "a23456789012345678901234567890123456789012345678901234"
		}},
		"name starts with digit": {func(p *v1alpha1.ProviderPool, _ *Options) { p.Name = "1pool" }},
		"name with dot":          {func(p *v1alpha1.ProviderPool, _ *Options) { p.Name = "a.b" }},
		"no uid":                 {func(p *v1alpha1.ProviderPool, _ *Options) { p.UID = "" }},
		"no namespace":           {func(p *v1alpha1.ProviderPool, _ *Options) { p.Namespace = "" }},
		"no image":               {func(_ *v1alpha1.ProviderPool, o *Options) { o.DefaultImage = "" }},
		"no cluster role":        {func(_ *v1alpha1.ProviderPool, o *Options) { o.SchedulerClusterRole = "" }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool, opts := defaultPool(), testOptions
			tc.mutate(pool, &opts)
			_, err := Render(pool, opts)
			if !errors.Is(err, ErrInvalidPool) {
				t.Errorf("Render error = %v, want ErrInvalidPool", err)
			}
		})
	}
	t.Run("longest valid name", func(t *testing.T) {
		pool := defaultPool()
		pool.Name = "a2345678901234567890123456789012345678901234567890123"
		if len(pool.Name) != MaxPoolNameLength {
			t.Fatalf("fixture has %d characters, want %d", len(pool.Name), MaxPoolNameLength)
		}
		if _, err := Render(pool, testOptions); err != nil {
			t.Errorf("Render: %v", err)
		}
	})
	t.Run("limit below its request", func(t *testing.T) {
		pool := defaultPool()
		pool.Spec.Scheduler.Resources = &corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("1024Mi")},
		}
		_, err := Render(pool, testOptions)
		want := "pool cannot be rendered: spec.scheduler.resources.limits.cpu (100m) is below spec.scheduler.resources.requests.cpu (200m): a limit must be at least its request"
		if !errors.Is(err, ErrInvalidPool) || err.Error() != want {
			t.Errorf("Render error = %v, want %q", err, want)
		}
		pool.Spec.Scheduler.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("0.2")
		if _, err := Render(pool, testOptions); err != nil {
			t.Errorf("limits equal to requests in other units: %v", err)
		}
	})
	t.Run("negative quantity", func(t *testing.T) {
		pool := defaultPool()
		pool.Spec.Scheduler.Resources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("-1"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		}
		_, err := Render(pool, testOptions)
		want := "pool cannot be rendered: spec.scheduler.resources.requests.cpu (-1) must not be negative"
		if !errors.Is(err, ErrInvalidPool) || err.Error() != want {
			t.Errorf("Render error = %v, want %q", err, want)
		}
	})
	t.Run("resources the API server refuses in a container", func(t *testing.T) {
		for name, tc := range map[string]struct {
			res  corev1.ResourceRequirements
			want string
		}{
			"misspelt name": {
				res:  corev1.ResourceRequirements{Requests: corev1.ResourceList{"memroy": resource.MustParse("1Gi")}},
				want: "spec.scheduler.resources.requests.memroy is not a container resource: use cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource (<domain>/<name>)",
			},
			"not a qualified name": {
				res:  corev1.ResourceRequirements{Limits: corev1.ResourceList{"example.com/Bad Name": resource.MustParse("1")}},
				want: "spec.scheduler.resources.limits.example.com/Bad Name is not a container resource",
			},
			"requests. prefix": {
				res:  corev1.ResourceRequirements{Limits: corev1.ResourceList{"requests.example.com/gpu": resource.MustParse("1")}},
				want: "spec.scheduler.resources.limits.requests.example.com/gpu is not a container resource",
			},
			"extended resource without a limit": {
				res:  corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}},
				want: "spec.scheduler.resources.requests.nvidia.com/gpu (1) needs spec.scheduler.resources.limits.nvidia.com/gpu equal to it: nvidia.com/gpu cannot be overcommitted",
			},
			"hugepages below the limit": {
				res: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{"hugepages-2Mi": resource.MustParse("2Mi"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{"hugepages-2Mi": resource.MustParse("4Mi")},
				},
				want: "spec.scheduler.resources.requests.hugepages-2Mi (2Mi) needs spec.scheduler.resources.limits.hugepages-2Mi equal to it",
			},
			"claims": {
				res:  corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
				want: "spec.scheduler.resources.claims (1) is not supported: the scheduler pod has no resource claims",
			},
		} {
			t.Run(name, func(t *testing.T) {
				pool := defaultPool()
				pool.Spec.Scheduler.Resources = &tc.res
				_, err := Render(pool, testOptions)
				if !errors.Is(err, ErrInvalidPool) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Render error = %v, want ErrInvalidPool containing %q", err, tc.want)
				}
			})
		}
		pool := defaultPool()
		pool.Spec.Scheduler.Resources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"),
				"nvidia.com/gpu": resource.MustParse("1"), "hugepages-2Mi": resource.MustParse("2Mi")},
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "hugepages-2Mi": resource.MustParse("2Mi"), "example.com/foo": resource.MustParse("3"),
				"kubernetes.io/gpu": resource.MustParse("1")},
		}
		if _, err := Render(pool, testOptions); err != nil {
			t.Errorf("resources the API server accepts: %v", err)
		}
	})
	t.Run("spec image without default", func(t *testing.T) {
		pool := defaultPool()
		pool.Spec.Scheduler.Image = "img:1"
		objs, err := Render(pool, Options{SchedulerClusterRole: "r"})
		if err != nil {
			t.Fatal(err)
		}
		if got := objs.Deployment.Spec.Template.Spec.Containers[0].Image; got != "img:1" {
			t.Errorf("image = %q, want img:1", got)
		}
	})
}

func TestJobStorePathIsTheStoreDefault(t *testing.T) {
	if JobStorePath != jobs.DefaultPath {
		t.Errorf("JobStorePath = %q, want jobs.DefaultPath %q", JobStorePath, jobs.DefaultPath)
	}
}

// TestRenderJobStore: a Volume store renders the claim (access mode, size,
// class from the spec, defaults when unset), mounts it read-write at
// JobStoreDir with fsGroup RunAsUser and keeps the root filesystem
// read-only; a Memory store renders none of it.
func TestRenderJobStore(t *testing.T) {
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	tests := map[string]struct {
		pool      *v1alpha1.ProviderPool
		wantModes []corev1.PersistentVolumeAccessMode
		wantSize  string
		wantClass *string
	}{
		"defaults": {pool: defaultPool(), wantModes: rwo, wantSize: "1Gi"},
		"explicit Volume and size": {pool: func() *v1alpha1.ProviderPool {
			p := defaultPool()
			p.Spec.Scheduler.JobStore = v1alpha1.JobStoreSpec{Type: v1alpha1.JobStoreVolume, Size: ptr.To(resource.MustParse("3Gi")), AccessMode: v1alpha1.JobStoreReadWriteOnce}
			return p
		}(), wantModes: rwo, wantSize: "3Gi"},
		"class and ReadWriteMany": {pool: fullPool(), wantModes: rwx, wantSize: "5Gi", wantClass: ptr.To("shared-nfs")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objs, err := Render(tc.pool, testOptions)
			if err != nil {
				t.Fatal(err)
			}
			c := objs.JobStoreClaim
			if c == nil {
				t.Fatal("no claim rendered")
			}
			if c.Name != Name(tc.pool) {
				t.Errorf("claim name %q, want %q", c.Name, Name(tc.pool))
			}
			if diff := cmp.Diff(tc.wantModes, c.Spec.AccessModes); diff != "" {
				t.Errorf("access modes (-want +got):\n%s", diff)
			}
			if got := c.Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != tc.wantSize {
				t.Errorf("storage request %s, want %s", got.String(), tc.wantSize)
			}
			if diff := cmp.Diff(tc.wantClass, c.Spec.StorageClassName); diff != "" {
				t.Errorf("storage class (-want +got):\n%s", diff)
			}
			if got, want := len(objs.List()), 10; got != want {
				t.Errorf("List has %d objects, want %d", got, want)
			}
			ps := objs.Deployment.Spec.Template.Spec
			if got := ps.SecurityContext.FSGroup; got == nil || *got != 65532 {
				t.Errorf("fsGroup = %v, want 65532", got)
			}
			wantVol := corev1.Volume{Name: "jobs", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: Name(tc.pool)}}}
			if diff := cmp.Diff(wantVol, ps.Volumes[len(ps.Volumes)-1]); diff != "" {
				t.Errorf("job store volume (-want +got):\n%s", diff)
			}
			ctr := ps.Containers[0]
			wantMounts := []corev1.VolumeMount{{Name: "settings", MountPath: "/etc/fairshare", ReadOnly: true}}
			if tc.pool.Spec.Upstream.CredentialsSecretRef != nil {
				wantMounts = append(wantMounts, corev1.VolumeMount{Name: "provider-key", MountPath: "/var/run/fairshare/provider", ReadOnly: true})
			}
			wantMounts = append(wantMounts, corev1.VolumeMount{Name: "jobs", MountPath: "/var/lib/fairshare"})
			if diff := cmp.Diff(wantMounts, ctr.VolumeMounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if !ptr.Deref(ctr.SecurityContext.ReadOnlyRootFilesystem, false) {
				t.Error("root filesystem is writable")
			}
		})
	}
	t.Run("Memory", func(t *testing.T) {
		objs, err := Render(memoryPool(), testOptions)
		if err != nil {
			t.Fatal(err)
		}
		if objs.JobStoreClaim != nil {
			t.Errorf("Memory store rendered a claim: %+v", objs.JobStoreClaim)
		}
		if got := len(objs.List()); got != 9 {
			t.Errorf("List has %d objects, want 9", got)
		}
		ps := objs.Deployment.Spec.Template.Spec
		if len(ps.Volumes) != 1 || len(ps.Containers[0].VolumeMounts) != 1 || ps.SecurityContext.FSGroup != nil {
			t.Errorf("Memory store: volumes %v, mounts %v, fsGroup %v; want the settings volume only and no fsGroup",
				ps.Volumes, ps.Containers[0].VolumeMounts, ps.SecurityContext.FSGroup)
		}
		if s := Settings(memoryPool()); s.JobStorePath != "" {
			t.Errorf("jobStorePath = %q, want empty", s.JobStorePath)
		}
	})
}

// TestRenderSecretsRole: the scheduler's account may GET exactly the named
// tenant key Secrets; with none the Role has no rule at all (a rule with no
// resourceNames would grant every Secret of the namespace), and it never
// grants list or watch.
func TestRenderSecretsRole(t *testing.T) {
	tests := map[string]struct {
		names []string
		want  []rbacv1.PolicyRule
	}{
		"none":          {names: nil, want: []rbacv1.PolicyRule{}},
		"only empty":    {names: []string{""}, want: []rbacv1.PolicyRule{}},
		"sorted unique": {names: []string{"b", "a", "b", ""}, want: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{"a", "b"}}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := slices.Clone(tc.names)
			objs, err := RenderWithTenants(defaultPool(), testOptions, Tenants{Secrets: tc.names})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, objs.SecretsRole.Rules); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(in, tc.names); diff != "" {
				t.Errorf("the caller's slice was modified (-before +after):\n%s", diff)
			}
			rb := objs.SecretsRoleBinding
			wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "demo-scheduler-secrets"}
			wantSub := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "demo-scheduler", Namespace: "fairshare-demo"}}
			if diff := cmp.Diff(wantRef, rb.RoleRef); diff != "" {
				t.Errorf("roleRef (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantSub, rb.Subjects); diff != "" {
				t.Errorf("subjects (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTenantSecretNames: only TenantQuotas of this pool, in its namespace,
// not being deleted, with credentials, count; names are sorted and unique.
func TestTenantSecretNames(t *testing.T) {
	pool := defaultPool()
	tq := func(ns, poolName, secret string, deleting bool) v1alpha1.TenantQuota {
		q := v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: ns}}
		q.Spec.PoolRef.Name = poolName
		if secret != "" {
			q.Spec.Credentials = &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: secret}}
		}
		if deleting {
			now := metav1.Now()
			q.DeletionTimestamp = &now
		}
		return q
	}
	got := TenantSecretNames(pool, []v1alpha1.TenantQuota{
		tq("fairshare-demo", "demo", "z-key", false),
		tq("fairshare-demo", "demo", "a-key", false),
		tq("fairshare-demo", "demo", "z-key", false),
		tq("fairshare-demo", "demo", "", false),
		tq("fairshare-demo", "other", "other-pool-key", false),
		tq("elsewhere", "demo", "other-ns-key", false),
		tq("fairshare-demo", "demo", "deleting-key", true),
	})
	if diff := cmp.Diff([]string{"a-key", "z-key"}, got); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
}

// TestRenderPoolRole: the scheduler's account may get and patch the status
// of exactly its pool and the named TenantQuotas, and get and update
// exactly the pool's Lease; with no tenants there is no TenantQuota rule
// (a rule with no resourceNames would grant every TenantQuota of the
// namespace). Nothing else: no update of a status, no delete, no
// wildcard.
func TestRenderPoolRole(t *testing.T) {
	poolRule := rbacv1.PolicyRule{APIGroups: []string{"quota.fairshare.dev"}, Resources: []string{"providerpools/status"}, Verbs: []string{"get", "patch"}, ResourceNames: []string{"demo"}}
	leaseRule := rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "update"}, ResourceNames: []string{"demo-scheduler"}}
	tests := map[string]struct {
		names []string
		want  []rbacv1.PolicyRule
	}{
		"none":       {names: nil, want: []rbacv1.PolicyRule{poolRule, leaseRule}},
		"only empty": {names: []string{""}, want: []rbacv1.PolicyRule{poolRule, leaseRule}},
		"sorted unique": {names: []string{"b", "a", "b", ""}, want: []rbacv1.PolicyRule{poolRule,
			{APIGroups: []string{"quota.fairshare.dev"}, Resources: []string{"tenantquotas/status"}, Verbs: []string{"get", "patch"}, ResourceNames: []string{"a", "b"}},
			leaseRule}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := slices.Clone(tc.names)
			objs, err := RenderWithTenants(defaultPool(), testOptions, Tenants{Names: tc.names})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, objs.PoolRole.Rules); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(in, tc.names); diff != "" {
				t.Errorf("the caller's slice was modified (-before +after):\n%s", diff)
			}
			if got, want := Settings(defaultPool()).LeaseName, leaseRule.ResourceNames[0]; got != want {
				t.Errorf("the scheduler's Lease is %q, the Role grants %q", got, want)
			}
			rb := objs.PoolRoleBinding
			wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "demo-scheduler-pool"}
			wantSub := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "demo-scheduler", Namespace: "fairshare-demo"}}
			if diff := cmp.Diff(wantRef, rb.RoleRef); diff != "" {
				t.Errorf("roleRef (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantSub, rb.Subjects); diff != "" {
				t.Errorf("subjects (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTenantNames: only TenantQuotas of this pool, in its namespace, count,
// with or without credentials and also while being deleted (the scheduler
// may still write its status); names are sorted and unique.
func TestTenantNames(t *testing.T) {
	pool := defaultPool()
	tq := func(ns, name, poolName string, deleting bool) v1alpha1.TenantQuota {
		q := v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		q.Spec.PoolRef.Name = poolName
		if deleting {
			now := metav1.Now()
			q.DeletionTimestamp = &now
		}
		return q
	}
	tenants := []v1alpha1.TenantQuota{
		tq("fairshare-demo", "z", "demo", false),
		tq("fairshare-demo", "a", "demo", false),
		tq("fairshare-demo", "z", "demo", false),
		tq("fairshare-demo", "other-pool", "other", false),
		tq("elsewhere", "other-ns", "demo", false),
		tq("fairshare-demo", "deleting", "demo", true),
	}
	if diff := cmp.Diff([]string{"a", "deleting", "z"}, TenantNames(pool, tenants)); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	if got := PoolTenants(pool, tenants); len(got.Names) != 3 || len(got.Secrets) != 0 {
		t.Errorf("PoolTenants = %+v, want the three names and no Secret", got)
	}
}
