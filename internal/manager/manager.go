// Package manager is the operator's runner: it parses the manager's flags,
// builds a controller-runtime manager (client-go and quota.fairshare.dev
// schemes, a cache restricted to the objects the operator renders, metrics,
// health probes, optional leader election) and runs the ProviderPool and
// TenantQuota reconcilers until the context ends. cmd/manager only calls Run.
package manager

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/distribution/reference"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	rbacmanifests "github.com/fairshare-dev/fairshare/config/rbac"
	"github.com/fairshare-dev/fairshare/controllers"
	"github.com/fairshare-dev/fairshare/internal/rbaccheck"
	"github.com/fairshare-dev/fairshare/internal/render"
	"github.com/fairshare-dev/fairshare/internal/runtimeconfig"
)

// Flag defaults.
const (
	// DefaultSchedulerImage is the --scheduler-image default: the image that
	// holds the scheduler binary (the same image as the operator).
	DefaultSchedulerImage = "ghcr.io/fairshare-dev/fairshare:v0.1.0"
	// LeaderElectionID is the name of the Lease the operator replicas elect a leader with.
	LeaderElectionID = "fairshare-manager.quota.fairshare.dev"
)

// Config is the parsed command line of the manager.
type Config struct {
	// MetricsAddr is the metrics listen address; "0" disables the metrics server.
	MetricsAddr string
	// ProbeAddr is the /healthz and /readyz listen address.
	ProbeAddr string
	// LeaderElect enables leader election through the Lease LeaderElectionID.
	LeaderElect bool
	// LeaderElectionNamespace is the Lease's namespace; empty means the
	// namespace the manager runs in (required when running outside a cluster).
	LeaderElectionNamespace string
	// Render holds the scheduler image and ClusterRole used for every pool,
	// and --skip-rbac-check (Render.SkipRBACCheck): the operator skips its
	// own start-up RBAC check (RequiredPermissions) and renders the flag
	// into every scheduler.
	Render render.Options
	// Zap are the logging options.
	Zap zap.Options
}

// NewScheme returns a scheme with the client-go types and quota.fairshare.dev/v1alpha1.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// ParseFlags parses args (without the program name) into a Config. The
// --kubeconfig flag is controller-runtime's own (registered on the process's
// flag.CommandLine) and is accepted here too. It returns flag.ErrHelp for
// -h/--help and a parse error for anything else invalid.
func ParseFlags(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":8080", `The address the metrics endpoint binds to; "0" disables it.`)
	fs.StringVar(&cfg.ProbeAddr, "health-probe-bind-address", ":8081", "The address the /healthz and /readyz endpoints bind to.")
	fs.BoolVar(&cfg.LeaderElect, "leader-elect", false, "Enable leader election (Lease "+LeaderElectionID+") so that one replica reconciles at a time.")
	fs.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease; defaults to the manager's own namespace.")
	fs.StringVar(&cfg.Render.DefaultImage, "scheduler-image", DefaultSchedulerImage, "Scheduler image for pools that set no spec.scheduler.image.")
	fs.StringVar(&cfg.Render.SchedulerClusterRole, "scheduler-cluster-role", render.DefaultSchedulerClusterRole, "ClusterRole bound to each pool's scheduler ServiceAccount.")
	fs.BoolVar(&cfg.Render.SkipRBACCheck, "skip-rbac-check", false, "Skip the start-up check (SelfSubjectAccessReview) that the operator holds the RBAC permissions of its version, "+
		"and the schedulers' own (rendered into their arguments); for clusters whose authorizer does not answer SelfSubjectAccessReview as it authorizes requests.")
	if f := flag.CommandLine.Lookup("kubeconfig"); f != nil {
		fs.Var(f.Value, f.Name, f.Usage)
	}
	cfg.Zap = zap.Options{Development: false}
	cfg.Zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if cfg.Render.DefaultImage == "" {
		return Config{}, errors.New("--scheduler-image must not be empty")
	}
	if _, err := reference.ParseNormalizedNamed(cfg.Render.DefaultImage); err != nil {
		// As spec.scheduler.image and the chart's operator.schedulerImage
		// are refused: a Deployment with it could never pull.
		return Config{}, fmt.Errorf("--scheduler-image %q is not an image reference (registry/repository:tag or @digest): %w", cfg.Render.DefaultImage, err)
	}
	if cfg.Render.SchedulerClusterRole == "" {
		return Config{}, errors.New("--scheduler-cluster-role must not be empty")
	}
	return cfg, nil
}

// Run parses args (without the program name), checks the operator's RBAC
// permissions (RequiredPermissions, unless --skip-rbac-check), then builds
// and runs the manager until ctx is done. It returns flag.ErrHelp for -h, a
// flag or setup error, a *rbaccheck.MissingError naming every permission
// missing (before any informer starts), or the manager's error.
func Run(ctx context.Context, args []string) error {
	cfg, err := ParseFlags(args)
	if err != nil {
		return err
	}
	log := zap.New(zap.UseFlagOptions(&cfg.Zap))
	ctrl.SetLogger(log)
	runtimeconfig.ApplyMemoryLimit(log)
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	if cfg.Render.SkipRBACCheck {
		ctrl.Log.WithName("setup").Info("Skipping the RBAC check (--skip-rbac-check)")
	} else {
		sets, err := RequiredPermissions(cfg, leaderElectionNamespace(cfg))
		if err != nil {
			return err
		}
		if err := rbaccheck.Run(ctx, restConfig, sets, RBACRemedy); err != nil {
			return err
		}
	}
	scheme := NewScheme()
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: cfg.MetricsAddr},
		HealthProbeBindAddress:  cfg.ProbeAddr,
		LeaderElection:          cfg.LeaderElect,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
		Cache:                   cache.Options{ByObject: controllers.CacheByObject()},
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if err := Setup(mgr, cfg.Render); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding readyz check: %w", err)
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "schedulerImage", cfg.Render.DefaultImage,
		"schedulerClusterRole", cfg.Render.SchedulerClusterRole, "leaderElect", cfg.LeaderElect)
	return mgr.Start(ctx)
}

// RBACRemedy ends the error of a failed RBAC check at start: what to apply.
const RBACRemedy = "Apply the RBAC of this operator's version (helm upgrade with the chart of the same version, " +
	"or kubectl apply -k config/rbac of the same release), then restart the operator; " +
	"--skip-rbac-check skips this check, for clusters whose authorizer does not answer SelfSubjectAccessReview as it authorizes requests"

// Sources of the permission sets, as the RBAC check's error names them.
const (
	ManagerRoleSource    = "the operator's ClusterRole (config/rbac/role.yaml, the chart's <release>-manager)"
	LeaderElectionSource = "the operator's leader election Role (config/rbac/leader_election_role.yaml, the chart's <release>-leader-election)"
)

// inClusterNamespacePath holds the namespace of a pod's ServiceAccount.
const inClusterNamespacePath = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// leaderElectionNamespace is the namespace of the leader election Lease
// with cfg: "" without --leader-elect, else --leader-election-namespace or
// the pod's own namespace, as controller-runtime resolves it ("" when it
// cannot be read: the manager then fails with its own error).
func leaderElectionNamespace(cfg Config) string {
	if !cfg.LeaderElect {
		return ""
	}
	if cfg.LeaderElectionNamespace != "" {
		return cfg.LeaderElectionNamespace
	}
	b, err := os.ReadFile(inClusterNamespacePath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// RequiredPermissions returns the permissions the operator checks at start
// with cfg, read from the RBAC manifests it was built with
// (github.com/fairshare-dev/fairshare/config/rbac): every rule of the
// ClusterRole fairshare-manager, cluster-wide, its bind on the ClusterRole
// render.DefaultSchedulerClusterRole asked on cfg's --scheduler-cluster-role
// instead; then, when leaderNamespace is not "" (--leader-elect), every rule
// of the leader election Role in that namespace. It returns an error only
// for an embedded manifest that does not parse (a build defect).
func RequiredPermissions(cfg Config, leaderNamespace string) ([]rbaccheck.Set, error) {
	perms, err := rbaccheck.FromRole(rbacmanifests.ManagerRole, "")
	if err != nil {
		return nil, fmt.Errorf("config/rbac/role.yaml: %w", err)
	}
	for i, p := range perms {
		if p.Group == rbacv1.GroupName && p.Resource == "clusterroles" && p.Verb == "bind" && p.Name == render.DefaultSchedulerClusterRole {
			perms[i].Name = cfg.Render.SchedulerClusterRole
		}
	}
	sets := []rbaccheck.Set{{Source: ManagerRoleSource, Permissions: perms}}
	if leaderNamespace != "" {
		le, err := rbaccheck.FromRole(rbacmanifests.LeaderElectionRole, leaderNamespace)
		if err != nil {
			return nil, fmt.Errorf("config/rbac/leader_election_role.yaml: %w", err)
		}
		sets = append(sets, rbaccheck.Set{Source: LeaderElectionSource, Permissions: le})
	}
	return sets, nil
}

// Setup registers both reconcilers with mgr, rendering pools with opts.
func Setup(mgr ctrl.Manager, opts render.Options, extra ...controllers.Option) error {
	recorder := mgr.GetEventRecorderFor(controllers.EventSource)
	poolOpts := append([]controllers.Option{controllers.WithRenderOptions(opts), controllers.WithAPIReader(mgr.GetAPIReader())}, extra...)
	if err := controllers.NewProviderPoolReconciler(mgr.GetClient(), mgr.GetScheme(), recorder, poolOpts...).
		SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up ProviderPool controller: %w", err)
	}
	if err := controllers.NewTenantQuotaReconciler(mgr.GetClient(), mgr.GetScheme(), recorder, extra...).
		SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up TenantQuota controller: %w", err)
	}
	return nil
}
