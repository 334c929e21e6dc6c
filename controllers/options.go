package controllers

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/internal/render"
)

// EventSource is the component name on the events the operator records.
const EventSource = "fairshare-controller"

// Option configures a reconciler built by NewProviderPoolReconciler or
// NewTenantQuotaReconciler.
type Option func(*options)

type options struct {
	clock  clock.PassiveClock
	render render.Options
	// apiReader reads past the cache (nil: no such reads).
	apiReader client.Reader
}

func newOptions(opts []Option) options {
	o := options{
		clock:  clock.RealClock{},
		render: render.Options{SchedulerClusterRole: render.DefaultSchedulerClusterRole},
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithClock sets the clock that stamps conditions' lastTransitionTime
// (default: the real clock). Tests pass a fake clock to prove that an
// unchanged condition keeps its time (BC-42).
func WithClock(c clock.PassiveClock) Option {
	return func(o *options) { o.clock = c }
}

// WithRenderOptions sets the operator-wide rendering inputs (scheduler image
// and ClusterRole) of the ProviderPoolReconciler. Default: no default image
// and render.DefaultSchedulerClusterRole.
func WithRenderOptions(r render.Options) Option {
	return func(o *options) { o.render = r }
}

// WithAPIReader sets the reader the ProviderPoolReconciler uses for the
// objects it reads past the cache: the pool's provider Secret, whose key it
// checks, and the metadata of objects its cache does not hold (pass the
// manager's GetAPIReader()). Without it a provider Secret that is missing
// or lacks the key is not reported.
func WithAPIReader(r client.Reader) Option {
	return func(o *options) { o.apiReader = r }
}

// CacheByObject restricts the manager's cache of the kinds the operator owns
// to the objects it rendered (label app.kubernetes.io/managed-by=fairshare),
// so that the operator does not cache every ConfigMap, Service or Deployment
// of the cluster, and keeps Secrets' data and annotations out of the cache
// (stripSecret). Pass it as cache.Options.ByObject.
func CacheByObject() map[client.Object]cache.ByObject {
	managed := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{render.LabelManagedBy: render.ManagedBy})}
	return map[client.Object]cache.ByObject{
		&appsv1.Deployment{}:            managed,
		&corev1.Service{}:               managed,
		&corev1.ConfigMap{}:             managed,
		&corev1.ServiceAccount{}:        managed,
		&rbacv1.RoleBinding{}:           managed,
		&rbacv1.Role{}:                  managed,
		&corev1.PersistentVolumeClaim{}: managed,
		&corev1.Secret{}:                {Transform: stripSecret},
	}
}

// stripSecret is the cache transform of Secrets. The ProviderPoolReconciler
// watches Secrets by their metadata only, so that a pool follows its
// provider Secret; its cache holds every Secret of the cluster, and keeps
// of each only what the watch needs: name, namespace, uid, resourceVersion,
// labels, owner references. It drops the annotations, which may hold the
// data itself (kubectl apply's last-applied-configuration of a Secret holds
// its whole manifest), and managedFields. A full Secret, should a cached
// read of one ever start a full informer, also loses data and stringData:
// the operator reads a Secret's data only past the cache, with the API
// reader (providerSecretProblem), so it never keeps any.
func stripSecret(in any) (any, error) {
	if obj, err := meta.Accessor(in); err == nil {
		obj.SetAnnotations(nil)
		if obj.GetManagedFields() != nil { // as cache.TransformStripManagedFields
			obj.SetManagedFields(nil)
		}
	}
	if s, ok := in.(*corev1.Secret); ok {
		s.Data, s.StringData = nil, nil
	}
	return in, nil
}
