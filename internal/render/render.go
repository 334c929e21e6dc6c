// Package render turns a ProviderPool into the Kubernetes objects of its
// scheduler: a ConfigMap holding the static scheduler settings
// (internal/schedconfig), a ServiceAccount, a RoleBinding of that account to
// the shipped scheduler ClusterRole, a Role and RoleBinding granting that
// account GET on exactly the tenant key Secrets of the pool's TenantQuotas
// (the shipped ClusterRole grants no Secret access), a Role and RoleBinding
// granting it get and patch on the status of exactly the pool and its
// TenantQuotas and get and update on exactly the pool's Lease (the shipped
// ClusterRole grants neither, so that a scheduler cannot write the status
// or take the Lease of another pool of its namespace), a ClusterIP Service, the
// PersistentVolumeClaim of the durable job store (jobStore type Volume, the
// default) and the Deployment.
//
// Rendering is a pure function of (pool, Options): no client, no clock, no
// environment, so the same inputs always give byte-identical objects and the
// golden files in testdata pin the output. Every object is named
// "<pool>-scheduler" (the Secret Role and its RoleBinding
// "<pool>-scheduler-secrets", the pool Role and its RoleBinding
// "<pool>-scheduler-pool"), carries the standard app.kubernetes.io labels and the
// quota.fairshare.dev/pool label, and has the pool as its controller owner so
// that deleting the pool garbage-collects it. Objects carry their TypeMeta
// because the operator applies them with server-side apply.
//
// The Deployment's pod template is annotated with the SHA-256 of the rendered
// settings (v1alpha1.AnnotationSettingsHash, the input-hash pattern of
// prometheus-operator), so a settings change rolls the scheduler. Everything
// the scheduler reads live from the ProviderPool (models, reserve, cost model,
// tenant identification, upstream URL) is deliberately not part of the
// settings and does not roll it. Nor does the provider key: the pool's
// credentials Secret is mounted as a file, which the kubelet updates when
// the Secret changes and the scheduler reads again (hashing the key into the
// pod template would roll the scheduler on every rotation; the operator
// only checks that the key has a value, and keeps none).
package render

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

// Defaults applied when the corresponding ProviderPool field is zero (the
// API server normally fills them in from the CRD defaults; render applies
// them again so that an object built in Go renders the same).
const (
	// DefaultReplicas is spec.scheduler.replicas when unset.
	DefaultReplicas int32 = 1
	// DefaultStatusIntervalSeconds is spec.scheduler.statusIntervalSeconds when zero, in seconds.
	DefaultStatusIntervalSeconds int32 = 10
	// DefaultUpstreamConcurrency is spec.scheduler.upstreamConcurrency when zero, in calls in flight.
	DefaultUpstreamConcurrency int32 = 64
	// DefaultCredentialsKey is the Secret data key when credentialsSecretRef.key is empty.
	DefaultCredentialsKey = "api-key"
	// DefaultSchedulerClusterRole is the ClusterRole the scheduler's ServiceAccount is bound to.
	DefaultSchedulerClusterRole = "fairshare-scheduler"
)

// Listen addresses and ports of the scheduler container.
const (
	// HTTPAddr is the gateway listen address (OpenAI-compatible API and job API).
	HTTPAddr = ":8080"
	// MetricsAddr is the /metrics listen address.
	MetricsAddr = ":9090"
	// HealthAddr is the /healthz and /readyz listen address.
	HealthAddr = ":8081"
	// HTTPPort is the gateway port, named "http" on the container and the Service.
	HTTPPort int32 = 8080
	// MetricsPort is the metrics port, named "metrics" on the container and the Service.
	MetricsPort int32 = 9090
	// HealthPort is the probe port, named "health" on the container only.
	HealthPort int32 = 8081
)

// Container layout of the scheduler pod.
const (
	// ContainerName is the name of the scheduler container.
	ContainerName = "scheduler"
	// Command is the scheduler binary inside the image.
	Command = "/scheduler"
	// ConfigDir is where the settings ConfigMap is mounted (read-only).
	ConfigDir = "/etc/fairshare"
	// ConfigVolume is the name of the settings volume.
	ConfigVolume = "settings"
	// RunAsUser is the non-root UID the scheduler runs as (distroless "nonroot").
	// It is also the pod's fsGroup when the job store volume or the
	// provider key is mounted, so the volume is group-writable, and the key
	// file group-readable, by the container.
	RunAsUser int64 = 65532
	// JobStoreDir is where the job store claim is mounted (read-write); the
	// only writable path of the container, whose root filesystem is
	// read-only.
	JobStoreDir = "/var/lib/fairshare"
	// JobStorePath is the settings' jobStorePath for a Volume job store: the
	// bbolt file on the claim (jobs.DefaultPath).
	JobStorePath = JobStoreDir + "/jobs.db"
	// JobStoreVolume is the name of the job store volume in the pod.
	JobStoreVolume = "jobs"
	// ProviderKeyDir is where the credentials Secret's key is mounted
	// (read-only, never with subPath: the kubelet then updates the file
	// when the Secret changes).
	ProviderKeyDir = "/var/run/fairshare/provider"
	// ProviderKeyFile is the settings' providerKeyFile of a pool with a
	// credentialsSecretRef: the Secret's key as a file, whatever the key's
	// name, so that the settings do not change with it.
	ProviderKeyFile = ProviderKeyDir + "/api-key"
	// ProviderKeyVolume is the name of the provider key volume in the pod.
	ProviderKeyVolume = "provider-key"
	// ProviderKeyMode is the provider key file's mode: read by owner (root)
	// and group (the pod's fsGroup RunAsUser) only; the kubelet makes the
	// file group-readable for the fsGroup in any case.
	ProviderKeyMode int32 = 0o440
)

// DefaultJobStoreSize is spec.scheduler.jobStore.size when unset: 1 GiB. The
// sizing rule of jobs.BoltStore: (0.6 KiB + body + response) x 2 per
// retained job; the default 100,000 retained finished jobs with 2 KiB bodies
// and 2 KiB responses take about 0.9 GB.
var DefaultJobStoreSize = resource.MustParse("1Gi")

// Standard labels set on every rendered object.
const (
	// LabelName is app.kubernetes.io/name; its value is AppName.
	LabelName = "app.kubernetes.io/name"
	// LabelInstance is app.kubernetes.io/instance; its value is the pool name.
	LabelInstance = "app.kubernetes.io/instance"
	// LabelManagedBy is app.kubernetes.io/managed-by; its value is ManagedBy.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// AppName is the value of LabelName.
	AppName = "fairshare-scheduler"
	// ManagedBy is the value of LabelManagedBy; the operator restricts its
	// cache of owned kinds to objects with this label.
	ManagedBy = "fairshare"
)

// NameSuffix is appended to the pool name to name every rendered object.
const NameSuffix = "-scheduler"

// SecretsNameSuffix is appended to Name(pool) to name the Role granting the
// scheduler GET on its tenants' key Secrets, and that Role's RoleBinding.
const SecretsNameSuffix = "-secrets"

// PoolRoleNameSuffix is appended to Name(pool) to name the Role granting
// the scheduler the pool's own objects (the pool's status, its tenants'
// statuses and its leader election Lease), and that Role's RoleBinding.
const PoolRoleNameSuffix = "-pool"

// MaxPoolNameLength is the longest pool name that can be rendered: the
// Service name "<pool>-scheduler" must be a DNS-1035 label (at most 63
// characters) and the pool name is a label value (at most 63).
const MaxPoolNameLength = validation.DNS1035LabelMaxLength - len(NameSuffix)

// ErrInvalidPool wraps every error Objects returns: the pool's spec or name
// cannot be rendered, and retrying without a change cannot help.
var ErrInvalidPool = errors.New("pool cannot be rendered")

// Options are the operator-wide inputs to rendering.
type Options struct {
	// DefaultImage is the scheduler image used when spec.scheduler.image is
	// empty (the operator's --scheduler-image flag).
	DefaultImage string
	// SchedulerClusterRole is the ClusterRole the RoleBinding grants to the
	// scheduler's ServiceAccount (the operator's --scheduler-cluster-role
	// flag, normally DefaultSchedulerClusterRole).
	SchedulerClusterRole string
	// SkipRBACCheck adds --skip-rbac-check to the scheduler's arguments, so
	// that it skips its start-up RBAC check (the operator's own
	// --skip-rbac-check, for clusters whose authorizer does not answer
	// SelfSubjectAccessReview as it authorizes requests).
	SkipRBACCheck bool
}

// Object is a Kubernetes object with metadata and a type: the shape of
// controller-runtime's client.Object, declared here so render needs no client.
type Object interface {
	metav1.Object
	runtime.Object
}

// Objects are the rendered scheduler objects of one pool, all named Name(pool)
// in the pool's namespace.
type Objects struct {
	// ConfigMap holds the settings under schedconfig.SettingsKey.
	ConfigMap *corev1.ConfigMap
	// ServiceAccount is the scheduler's identity.
	ServiceAccount *corev1.ServiceAccount
	// RoleBinding binds ServiceAccount to Options.SchedulerClusterRole in the pool namespace.
	RoleBinding *rbacv1.RoleBinding
	// SecretsRole grants GET (no list, no watch) on the tenant key Secrets
	// named in resourceNames, and nothing when there are none. Named
	// SecretsName(pool).
	SecretsRole *rbacv1.Role
	// SecretsRoleBinding binds ServiceAccount to SecretsRole. Named
	// SecretsName(pool).
	SecretsRoleBinding *rbacv1.RoleBinding
	// PoolRole grants get and patch on the status of the pool and of the
	// TenantQuotas named in resourceNames (no rule for them when there are
	// none), and get and update on the pool's Lease. Named PoolRoleName(pool).
	PoolRole *rbacv1.Role
	// PoolRoleBinding binds ServiceAccount to PoolRole. Named
	// PoolRoleName(pool).
	PoolRoleBinding *rbacv1.RoleBinding
	// Service exposes the gateway (http, 8080) and metrics (metrics, 9090).
	Service *corev1.Service
	// JobStoreClaim holds the durable job store (jobStore type Volume); nil
	// for type Memory. Its access modes, storage class and size are the
	// claim's spec at creation; the operator only grows the size of an
	// existing claim afterwards.
	JobStoreClaim *corev1.PersistentVolumeClaim
	// Deployment runs the scheduler.
	Deployment *appsv1.Deployment
}

// List returns the objects in apply order: dependencies (ConfigMap,
// ServiceAccount, RoleBinding, SecretsRole, SecretsRoleBinding, PoolRole,
// PoolRoleBinding, Service, JobStoreClaim when not nil) before the
// Deployment that uses them.
func (o Objects) List() []Object {
	l := []Object{o.ConfigMap, o.ServiceAccount, o.RoleBinding, o.SecretsRole, o.SecretsRoleBinding, o.PoolRole, o.PoolRoleBinding, o.Service}
	if o.JobStoreClaim != nil {
		l = append(l, o.JobStoreClaim)
	}
	return append(l, o.Deployment)
}

// Name returns the name of every object rendered for the pool: "<pool>-scheduler".
func Name(pool *v1alpha1.ProviderPool) string {
	return pool.Name + NameSuffix
}

// SecretsName returns the name of the pool's Secret Role and its
// RoleBinding: "<pool>-scheduler-secrets".
func SecretsName(pool *v1alpha1.ProviderPool) string {
	return Name(pool) + SecretsNameSuffix
}

// PoolRoleName returns the name of the pool's Role granting its own objects
// and of its RoleBinding: "<pool>-scheduler-pool".
func PoolRoleName(pool *v1alpha1.ProviderPool) string {
	return Name(pool) + PoolRoleNameSuffix
}

// Tenants are what the per-pool Roles name of the pool's TenantQuotas
// (PoolTenants).
type Tenants struct {
	// Names are the TenantQuotas whose status the scheduler may get and
	// patch (TenantNames).
	Names []string
	// Secrets are the tenant key Secrets the scheduler may get
	// (TenantSecretNames).
	Secrets []string
}

// PoolTenants returns the names of the pool's TenantQuotas and of their key
// Secrets, out of tenants (normally every TenantQuota of the namespace).
func PoolTenants(pool *v1alpha1.ProviderPool, tenants []v1alpha1.TenantQuota) Tenants {
	return Tenants{Names: TenantNames(pool, tenants), Secrets: TenantSecretNames(pool, tenants)}
}

// TenantNames returns the names of the TenantQuotas in the pool's namespace
// whose spec.poolRef names the pool, sorted and without duplicates: the
// only TenantQuotas whose status the scheduler writes. One being deleted is
// kept: it is still the pool's until it is gone.
func TenantNames(pool *v1alpha1.ProviderPool, tenants []v1alpha1.TenantQuota) []string {
	var names []string
	for i := range tenants {
		tq := &tenants[i]
		if tq.Namespace == pool.Namespace && tq.Spec.PoolRef.Name == pool.Name && tq.Name != "" {
			names = append(names, tq.Name)
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(names)))
}

// TenantSecretNames returns the names of the Secrets holding the API keys of
// the pool's tenants: spec.credentials.secretRef.name of every TenantQuota in
// the pool's namespace whose spec.poolRef names the pool and that is not
// being deleted, sorted and without duplicates. They are the only Secrets the
// scheduler reads (internal/kube TenantReconciler); the provider key reaches
// the scheduler through a secretKeyRef environment variable, which the
// kubelet resolves, so the scheduler's account needs no access to it.
func TenantSecretNames(pool *v1alpha1.ProviderPool, tenants []v1alpha1.TenantQuota) []string {
	seen := map[string]bool{}
	var names []string
	for i := range tenants {
		tq := &tenants[i]
		c := tq.Spec.Credentials
		if tq.Namespace != pool.Namespace || tq.Spec.PoolRef.Name != pool.Name || !tq.DeletionTimestamp.IsZero() ||
			c == nil || c.SecretRef.Name == "" || seen[c.SecretRef.Name] {
			continue
		}
		seen[c.SecretRef.Name] = true
		names = append(names, c.SecretRef.Name)
	}
	sort.Strings(names)
	return names
}

// Labels returns the labels set on every rendered object and on the pod template.
func Labels(pool *v1alpha1.ProviderPool) map[string]string {
	return map[string]string{
		LabelName:          AppName,
		LabelInstance:      pool.Name,
		LabelManagedBy:     ManagedBy,
		v1alpha1.LabelPool: pool.Name,
	}
}

// SelectorLabels returns the Deployment's selector and the Service's
// selector: the immutable subset of Labels.
func SelectorLabels(pool *v1alpha1.ProviderPool) map[string]string {
	return map[string]string{
		LabelName:     AppName,
		LabelInstance: pool.Name,
	}
}

// Replicas returns spec.scheduler.replicas, or DefaultReplicas when unset.
func Replicas(pool *v1alpha1.ProviderPool) int32 {
	if r := pool.Spec.Scheduler.Replicas; r != nil {
		return *r
	}
	return DefaultReplicas
}

// VolumeJobStore reports whether the pool keeps its jobs on a claim:
// spec.scheduler.jobStore.type is Volume or unset (the API default).
func VolumeJobStore(pool *v1alpha1.ProviderPool) bool {
	return pool.Spec.Scheduler.JobStore.Type != v1alpha1.JobStoreMemory
}

// JobStoreSize returns spec.scheduler.jobStore.size, or DefaultJobStoreSize
// when unset.
func JobStoreSize(pool *v1alpha1.ProviderPool) resource.Quantity {
	if q := pool.Spec.Scheduler.JobStore.Size; q != nil {
		return q.DeepCopy()
	}
	return DefaultJobStoreSize.DeepCopy()
}

// Settings returns the static scheduler settings of the pool: fixed listen
// addresses, leader election when more than one replica runs (Lease
// "<pool>-scheduler"), statusIntervalSeconds / upstreamConcurrency from
// spec.scheduler with the API defaults (10 s, 64 calls) when zero, and
// jobStorePath JobStorePath when the job store is a Volume (empty for
// Memory).
func Settings(pool *v1alpha1.ProviderPool) schedconfig.Settings {
	s := pool.Spec.Scheduler
	interval := s.StatusIntervalSeconds
	if interval == 0 {
		interval = DefaultStatusIntervalSeconds
	}
	concurrency := s.UpstreamConcurrency
	if concurrency == 0 {
		concurrency = DefaultUpstreamConcurrency
	}
	return schedconfig.Settings{
		APIVersion:            schedconfig.APIVersion,
		PoolName:              pool.Name,
		Namespace:             pool.Namespace,
		HTTPAddr:              HTTPAddr,
		MetricsAddr:           MetricsAddr,
		HealthAddr:            HealthAddr,
		LeaderElection:        Replicas(pool) > 1,
		LeaseName:             Name(pool),
		StatusIntervalSeconds: interval,
		UpstreamConcurrency:   concurrency,
		JobStorePath:          jobStorePath(pool),
		ProviderKeyFile:       providerKeyFile(pool),
	}
}

// providerKeyFile is the settings' providerKeyFile: ProviderKeyFile when
// the pool references a credentials Secret, else empty (no key).
func providerKeyFile(pool *v1alpha1.ProviderPool) string {
	if pool.Spec.Upstream.CredentialsSecretRef != nil {
		return ProviderKeyFile
	}
	return ""
}

func jobStorePath(pool *v1alpha1.ProviderPool) string {
	if VolumeJobStore(pool) {
		return JobStorePath
	}
	return ""
}

// Render renders the pool's scheduler objects for a pool without tenants: no
// tenant Secret readable and no tenant status writable by the scheduler,
// RenderWithTenants(pool, opts, Tenants{}).
func Render(pool *v1alpha1.ProviderPool, opts Options) (Objects, error) {
	return RenderWithTenants(pool, opts, Tenants{})
}

// RenderWithTenants renders the pool's scheduler objects; the SecretsRole
// grants GET on exactly the Secrets named in tenants.Secrets and the
// PoolRole get and patch on the status of exactly the TenantQuotas named
// in tenants.Names (normally PoolTenants of the namespace's TenantQuotas;
// empty names dropped, sorted and deduplicated here again). It returns an error wrapping
// ErrInvalidPool when the pool has no name, namespace or UID, when
// "<pool>-scheduler" is not a valid DNS-1035 label (pool names longer than
// MaxPoolNameLength or not starting with a letter), when no image is set in
// the spec nor in opts.DefaultImage, when opts.SchedulerClusterRole is empty,
// or when the settings do not validate.
func RenderWithTenants(pool *v1alpha1.ProviderPool, opts Options, tenants Tenants) (Objects, error) {
	if err := validate(pool, opts); err != nil {
		return Objects{}, fmt.Errorf("%w: %w", ErrInvalidPool, err)
	}
	settings := Settings(pool)
	if err := settings.Validate(); err != nil {
		return Objects{}, fmt.Errorf("%w: %w", ErrInvalidPool, err)
	}
	objs := Objects{
		ConfigMap:          configMap(pool, settings),
		ServiceAccount:     serviceAccount(pool),
		RoleBinding:        roleBinding(pool, opts),
		SecretsRole:        secretsRole(pool, tenants.Secrets),
		SecretsRoleBinding: secretsRoleBinding(pool),
		PoolRole:           poolRole(pool, settings.LeaseName, tenants.Names),
		PoolRoleBinding:    poolRoleBinding(pool),
		Service:            service(pool),
		Deployment:         deployment(pool, opts, settings),
	}
	if VolumeJobStore(pool) {
		objs.JobStoreClaim = jobStoreClaim(pool)
	}
	return objs, nil
}

func validate(pool *v1alpha1.ProviderPool, opts Options) error {
	var errs []error
	if pool.Name == "" || pool.Namespace == "" || pool.UID == "" {
		errs = append(errs, errors.New("metadata.name, metadata.namespace and metadata.uid are required"))
	}
	if msgs := validation.IsDNS1035Label(Name(pool)); pool.Name != "" && len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("object name %q derived from the pool name is not a DNS-1035 label (the pool name must start with a letter and have at most %d characters): %s",
			Name(pool), MaxPoolNameLength, strings.Join(msgs, "; ")))
	}
	if pool.Spec.Scheduler.Image == "" && opts.DefaultImage == "" {
		errs = append(errs, errors.New("spec.scheduler.image is empty and the operator has no default scheduler image"))
	}
	if opts.SchedulerClusterRole == "" {
		errs = append(errs, errors.New("the operator has no scheduler ClusterRole to bind"))
	}
	if r := pool.Spec.Scheduler.Resources; r != nil {
		// A negative quantity would be refused by the API server when the
		// Deployment is applied, in the Deployment's terms; say it in the
		// pool's.
		for _, l := range []struct {
			name string
			list corev1.ResourceList
		}{{"requests", r.Requests}, {"limits", r.Limits}} {
			for _, k := range slices.Sorted(maps.Keys(l.list)) {
				if q := l.list[k]; q.Sign() < 0 {
					errs = append(errs, fmt.Errorf("spec.scheduler.resources.%s.%s (%s) must not be negative", l.name, k, q.String()))
				}
			}
		}
		// Names the API server refuses in a container's resources (a
		// typo such as "memroy", a name that is not a qualified name), and
		// resources it does not let a container overcommit (extended
		// resources such as nvidia.com/gpu, hugepages-<size>) without a
		// limit equal to the request.
		for _, l := range []struct {
			name string
			list corev1.ResourceList
		}{{"requests", r.Requests}, {"limits", r.Limits}} {
			for _, k := range slices.Sorted(maps.Keys(l.list)) {
				if !containerResourceName(k) {
					errs = append(errs, fmt.Errorf("spec.scheduler.resources.%s.%s is not a container resource: use cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource (<domain>/<name>)", l.name, k))
				}
			}
		}
		for _, k := range slices.Sorted(maps.Keys(r.Requests)) {
			if !containerResourceName(k) || overcommittable(k) {
				continue
			}
			if lim, ok := r.Limits[k]; !ok || lim.Cmp(r.Requests[k]) != 0 {
				req := r.Requests[k]
				errs = append(errs, fmt.Errorf("spec.scheduler.resources.requests.%s (%s) needs spec.scheduler.resources.limits.%s equal to it: %s cannot be overcommitted",
					k, req.String(), k, k))
			}
		}
		if len(r.Claims) > 0 {
			errs = append(errs, fmt.Errorf("spec.scheduler.resources.claims (%d) is not supported: the scheduler pod has no resource claims", len(r.Claims)))
		}
		// The API server refuses such a Pod template (a limit below its
		// request); CEL cannot compare the quantities of an unbounded
		// resource map within its cost budget, so it is checked here.
		for _, k := range slices.Sorted(maps.Keys(r.Requests)) {
			if lim, ok := r.Limits[k]; ok && lim.Cmp(r.Requests[k]) < 0 {
				req := r.Requests[k]
				errs = append(errs, fmt.Errorf("spec.scheduler.resources.limits.%s (%s) is below spec.scheduler.resources.requests.%s (%s): a limit must be at least its request",
					k, lim.String(), k, req.String()))
			}
		}
	}
	return errors.Join(errs...)
}

// containerResourceName reports whether the API server accepts name in a
// container's resources (its validateContainerResourceName): without a
// '/', cpu, memory, ephemeral-storage or hugepages-<size>; with one, a
// qualified name in the kubernetes.io domain, or an extended resource (a
// qualified name in another domain).
func containerResourceName(name corev1.ResourceName) bool {
	switch n := string(name); {
	case name == corev1.ResourceCPU, name == corev1.ResourceMemory, name == corev1.ResourceEphemeralStorage:
		return true
	case strings.HasPrefix(n, corev1.ResourceHugePagesPrefix):
		_, err := resource.ParseQuantity(strings.TrimPrefix(n, corev1.ResourceHugePagesPrefix))
		return err == nil
	case !strings.Contains(n, "/"):
		return false
	case strings.Contains(n, corev1.ResourceDefaultNamespacePrefix):
		return len(validation.IsQualifiedName(n)) == 0
	default:
		return !strings.HasPrefix(n, corev1.DefaultResourceRequestsPrefix) &&
			len(validation.IsQualifiedName(corev1.DefaultResourceRequestsPrefix+n)) == 0
	}
}

// overcommittable reports whether a container's request of name may be
// below its limit (the API server's IsOvercommitAllowed): the native
// resources (no '/', or in the kubernetes.io domain) but hugepages, not
// extended resources.
func overcommittable(name corev1.ResourceName) bool {
	n := string(name)
	native := !strings.Contains(n, "/") || strings.Contains(n, corev1.ResourceDefaultNamespacePrefix)
	return native && !strings.HasPrefix(n, corev1.ResourceHugePagesPrefix)
}

// meta returns the shared object metadata: name, namespace, labels and the
// pool as controller owner (blockOwnerDeletion, so foreground deletion of the
// pool waits for its objects).
func meta(pool *v1alpha1.ProviderPool) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      Name(pool),
		Namespace: pool.Namespace,
		Labels:    Labels(pool),
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion:         v1alpha1.GroupVersion.String(),
			Kind:               "ProviderPool",
			Name:               pool.Name,
			UID:                pool.UID,
			Controller:         ptr.To(true),
			BlockOwnerDeletion: ptr.To(true),
		}},
	}
}

func configMap(pool *v1alpha1.ProviderPool, s schedconfig.Settings) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: meta(pool),
		Data:       map[string]string{schedconfig.SettingsKey: string(s.Marshal())},
	}
}

func serviceAccount(pool *v1alpha1.ProviderPool) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: meta(pool),
	}
}

func roleBinding(pool *v1alpha1.ProviderPool, opts Options) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"},
		ObjectMeta: meta(pool),
		RoleRef: rbacv1.RoleRef{
			APIGroup: rbacv1.GroupName,
			Kind:     "ClusterRole",
			Name:     opts.SchedulerClusterRole,
		},
		Subjects: []rbacv1.Subject{{
			Kind:      rbacv1.ServiceAccountKind,
			Name:      Name(pool),
			Namespace: pool.Namespace,
		}},
	}
}

// secretsRole grants GET on the named Secrets. With no names the Role has no
// rules: a rule with empty resourceNames would match every Secret of the
// namespace. No list or watch: RBAC cannot restrict a list to names (except
// by a metadata.name field selector), and the scheduler reads each Secret
// with a GET.
func secretsRole(pool *v1alpha1.ProviderPool, names []string) *rbacv1.Role {
	m := meta(pool)
	m.Name = SecretsName(pool)
	r := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "Role"},
		ObjectMeta: m,
		Rules:      []rbacv1.PolicyRule{},
	}
	if names := resourceNames(names); len(names) > 0 {
		r.Rules = append(r.Rules, rbacv1.PolicyRule{
			APIGroups:     []string{""},
			Resources:     []string{"secrets"},
			Verbs:         []string{"get"},
			ResourceNames: names,
		})
	}
	return r
}

func secretsRoleBinding(pool *v1alpha1.ProviderPool) *rbacv1.RoleBinding {
	return bindRole(pool, SecretsName(pool))
}

// poolRole grants what RBAC can restrict to the pool's own objects, by
// resourceNames: get and patch on the status of the pool and of the named
// TenantQuotas (the status writer's server-side applies), get and update
// on the Lease lease (client-go's leader election lock). With no tenant
// names there is no TenantQuota rule: a rule with empty resourceNames would
// match every TenantQuota of the namespace. What cannot be restricted by
// name (list and watch, creating the Lease) stays in the shared
// ClusterRole, whose get on providerpools and tenantquotas grants no more
// than its list already does.
func poolRole(pool *v1alpha1.ProviderPool, lease string, tenants []string) *rbacv1.Role {
	m := meta(pool)
	m.Name = PoolRoleName(pool)
	r := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "Role"},
		ObjectMeta: m,
		Rules: []rbacv1.PolicyRule{{
			APIGroups:     []string{v1alpha1.GroupVersion.Group},
			Resources:     []string{"providerpools/status"},
			Verbs:         []string{"get", "patch"},
			ResourceNames: []string{pool.Name},
		}},
	}
	if names := resourceNames(tenants); len(names) > 0 {
		r.Rules = append(r.Rules, rbacv1.PolicyRule{
			APIGroups:     []string{v1alpha1.GroupVersion.Group},
			Resources:     []string{"tenantquotas/status"},
			Verbs:         []string{"get", "patch"},
			ResourceNames: names,
		})
	}
	r.Rules = append(r.Rules, rbacv1.PolicyRule{
		APIGroups:     []string{coordinationv1.GroupName},
		Resources:     []string{"leases"},
		Verbs:         []string{"get", "update"},
		ResourceNames: []string{lease},
	})
	return r
}

func poolRoleBinding(pool *v1alpha1.ProviderPool) *rbacv1.RoleBinding {
	return bindRole(pool, PoolRoleName(pool))
}

// resourceNames returns names without empty ones, sorted and without
// duplicates, in a new slice.
func resourceNames(names []string) []string {
	return slices.Compact(slices.Sorted(slices.Values(slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == "" }))))
}

// bindRole returns the RoleBinding named name of the scheduler's
// ServiceAccount to the Role of the same name.
func bindRole(pool *v1alpha1.ProviderPool, name string) *rbacv1.RoleBinding {
	m := meta(pool)
	m.Name = name
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"},
		ObjectMeta: m,
		RoleRef: rbacv1.RoleRef{
			APIGroup: rbacv1.GroupName,
			Kind:     "Role",
			Name:     name,
		},
		Subjects: []rbacv1.Subject{{
			Kind:      rbacv1.ServiceAccountKind,
			Name:      Name(pool),
			Namespace: pool.Namespace,
		}},
	}
}

func service(pool *v1alpha1.ProviderPool) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta(pool),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: SelectorLabels(pool),
			Ports: []corev1.ServicePort{
				{Name: "http", Port: HTTPPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: MetricsPort, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// jobStoreClaim is the claim of the durable job store: access mode
// (ReadWriteOnce unless ReadWriteMany is asked for), storage request
// JobStoreSize, and the storage class when set (unset: the cluster default).
func jobStoreClaim(pool *v1alpha1.ProviderPool) *corev1.PersistentVolumeClaim {
	js := pool.Spec.Scheduler.JobStore
	mode := corev1.ReadWriteOnce
	if js.AccessMode == v1alpha1.JobStoreReadWriteMany {
		mode = corev1.ReadWriteMany
	}
	var class *string
	if js.StorageClassName != nil {
		class = ptr.To(*js.StorageClassName)
	}
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: meta(pool),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{mode},
			StorageClassName: class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: JobStoreSize(pool),
			}},
		},
	}
}

func deployment(pool *v1alpha1.ProviderPool, opts Options, s schedconfig.Settings) *appsv1.Deployment {
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: meta(pool),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(Replicas(pool)),
			Selector: &metav1.LabelSelector{MatchLabels: SelectorLabels(pool)},
			// Recreate, never RollingUpdate: the scheduler holds the pool's
			// queues and buckets in memory, and two schedulers serving at once
			// during a rollout would each enforce the limits, doubling them
			// (brief: one active scheduler per pool).
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      Labels(pool),
					Annotations: map[string]string{v1alpha1.AnnotationSettingsHash: s.Hash()},
				},
				Spec: podSpec(pool, opts),
			},
		},
	}
}

// podSpec: the image is pulled with spec.scheduler.imagePullSecrets; the
// credentials Secret's key, when the pool names one, is a volume whose one
// file the scheduler reads again periodically (the kubelet updates it
// when the Secret changes, so a rotated key needs no restart); with a
// Volume job store the claim is a volume (its ownership changed only when
// the volume root does not match already, so a large store is not walked
// at every start). With either the pod's fsGroup is RunAsUser, which makes
// the key file readable and the job store writable by the non-root
// container.
func podSpec(pool *v1alpha1.ProviderPool, opts Options) corev1.PodSpec {
	ps := corev1.PodSpec{
		ServiceAccountName: Name(pool),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{container(pool, opts)},
		Volumes: []corev1.Volume{{
			Name: ConfigVolume,
			VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: Name(pool)},
			}},
		}},
	}
	for _, ref := range pool.Spec.Scheduler.ImagePullSecrets {
		ps.ImagePullSecrets = append(ps.ImagePullSecrets, corev1.LocalObjectReference{Name: ref.Name})
	}
	if ref := pool.Spec.Upstream.CredentialsSecretRef; ref != nil {
		key := ref.Key
		if key == "" {
			key = DefaultCredentialsKey
		}
		ps.SecurityContext.FSGroup = ptr.To(RunAsUser)
		ps.Volumes = append(ps.Volumes, corev1.Volume{
			Name: ProviderKeyVolume,
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName:  ref.Name,
				Items:       []corev1.KeyToPath{{Key: key, Path: path.Base(ProviderKeyFile)}},
				DefaultMode: ptr.To(ProviderKeyMode),
			}},
		})
	}
	if VolumeJobStore(pool) {
		ps.SecurityContext.FSGroup = ptr.To(RunAsUser)
		ps.SecurityContext.FSGroupChangePolicy = ptr.To(corev1.FSGroupChangeOnRootMismatch)
		ps.Volumes = append(ps.Volumes, corev1.Volume{
			Name: JobStoreVolume,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
				ClaimName: Name(pool),
			}},
		})
	}
	return ps
}

// args are the scheduler's arguments: its settings file, and
// --skip-rbac-check with opts.SkipRBACCheck.
func args(opts Options) []string {
	a := []string{"--config=" + ConfigDir + "/" + schedconfig.SettingsKey}
	if opts.SkipRBACCheck {
		a = append(a, "--skip-rbac-check")
	}
	return a
}

func container(pool *v1alpha1.ProviderPool, opts Options) corev1.Container {
	image := pool.Spec.Scheduler.Image
	if image == "" {
		image = opts.DefaultImage
	}
	c := corev1.Container{
		Name:    ContainerName,
		Image:   image,
		Command: []string{Command},
		Args:    args(opts),
		Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: HTTPPort, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP},
			{Name: "health", ContainerPort: HealthPort, Protocol: corev1.ProtocolTCP},
		},
		Env:            env(),
		LivenessProbe:  probe("/healthz"),
		ReadinessProbe: probe("/readyz"),
		VolumeMounts:   []corev1.VolumeMount{{Name: ConfigVolume, MountPath: ConfigDir, ReadOnly: true}},
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To(RunAsUser),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	if pool.Spec.Upstream.CredentialsSecretRef != nil {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: ProviderKeyVolume, MountPath: ProviderKeyDir, ReadOnly: true})
	}
	if VolumeJobStore(pool) {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: JobStoreVolume, MountPath: JobStoreDir})
	}
	if r := pool.Spec.Scheduler.Resources; r != nil {
		c.Resources = *r.DeepCopy()
	}
	return c
}

// env returns the pod's own name and namespace from the downward API. The
// provider key is not in the environment, which is fixed at container
// start: it is mounted as a file (podSpec), read again as it changes.
func env() []corev1.EnvVar {
	return []corev1.EnvVar{
		fieldEnv("POD_NAMESPACE", "metadata.namespace"),
		fieldEnv("POD_NAME", "metadata.name"),
	}
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{
		Name: name,
		ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			APIVersion: "v1",
			FieldPath:  path,
		}},
	}
}

func probe(path string) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path,
			Port: intstr.FromString("health"),
		}},
	}
}
