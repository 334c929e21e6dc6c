// Package scheduler wires the data plane of one ProviderPool: settings and
// flags, a controller-runtime manager scoped to the pool's namespace as the
// lifecycle host (informers, health probes), the sync reconcilers feeding
// the registry, the leader election (election.go), the gateway HTTP server
// and dispatcher and the status writer (both leader-only), and the metrics
// server on an injected Prometheus registry.
//
// With settings leaderElection (ProviderPool spec.scheduler.replicas > 1)
// the replicas elect a leader on the Lease settings leaseName with
// client-go's leader election, run as a Runnable in place of the manager's
// own: the leader-only components start when the Lease is first acquired,
// and keep serving on the last known policy when the Lease cannot be
// renewed (API server outage); the process stops only when the API
// server shows another replica holding the Lease (see election).
//
// The durable job store (settings jobStorePath, or --job-store) is opened
// by the leader-only gateway Runnable, after the election is won and before
// the gateway is built and serves, and closed when it stops: a standby
// replica never holds the store's file lock, so it can take over when the
// leader goes away.
//
// Readiness (/readyz) is true only on a replica that has been elected, once
// the job store is open, the pool and its tenants are loaded and the stored
// jobs are queued again: the queues and buckets live in memory, so replicas
// run active/passive (style 2.5). A leader that loses its Lease renewal
// stays ready while it serves. /healthz is always served. The tokenizer's
// vocabulary is loaded before the manager starts, so no request pays it.
package scheduler

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	rbacmanifests "github.com/fairshare-dev/fairshare/config/rbac"
	"github.com/fairshare-dev/fairshare/internal/gateway"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/kube"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/providerkey"
	"github.com/fairshare-dev/fairshare/internal/rbaccheck"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/runtimeconfig"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// shutdownTimeout bounds the graceful shutdown of an HTTP server (streams
// in flight are cut after it).
const shutdownTimeout = 10 * time.Second

// StoreLockTimeout bounds how long a newly elected leader waits for the job
// store's file lock (jobs.OpenBolt's lockTimeout): 60 s. The previous leader
// may still hold it for a while after the new one is elected: on a clean
// stop it releases its Lease only after its leader-only Runnables returned
// and the store was closed (election, ReleaseOnCancel); when it stalled (no
// renewal, as after a SIGSTOP) the Lease expires LeaseDuration (15 s) after
// its last renewal, and once it runs again it reads the new holder within a
// RetryPeriod (2 s) and stops its Runnables within the manager's
// GracefulShutdownTimeout (30 s). A leader cut from the API server keeps
// serving, and the store, until it reaches the API server again (election's
// trade-off): beyond StoreLockTimeout the new leader's Runnable fails, its
// process exits and its pod is restarted, then tries again.
const StoreLockTimeout = 60 * time.Second

// Flags are the command-line flags of the scheduler binary.
type Flags struct {
	// Config is the path of the settings file (schedconfig), required.
	Config string
	// Kubeconfig is a kubeconfig path; empty uses KUBECONFIG, ~/.kube/config
	// or the in-cluster config (controller-runtime's rules).
	Kubeconfig string
	// HTTPAddr, MetricsAddr and HealthAddr override the settings' listen
	// addresses when not empty (several processes on one machine).
	HTTPAddr, MetricsAddr, HealthAddr string
	// JobStore, when not nil (--job-store given), replaces the settings'
	// jobStorePath: the path of the durable job store (a bbolt file, see
	// jobs.BoltStore), or "" (--job-store=) to keep jobs in memory (lost on
	// restart) whatever the settings say. The operator renders
	// jobs.DefaultPath on the pool's volume in the settings; tests and local
	// runs pass their own file. With neither, jobs are kept in memory.
	JobStore *string
	// SkipRBACCheck skips the start-up check of the scheduler's permissions
	// (Permissions), for clusters whose authorizer does not answer
	// SelfSubjectAccessReview as it authorizes requests. The operator
	// renders it into the Deployments when it runs with --skip-rbac-check
	// itself (render.Options.SkipRBACCheck).
	SkipRBACCheck bool
	// Zap are the logging flags (--zap-log-level, --zap-devel, ...).
	Zap zap.Options
}

// ParseFlags parses args (without the program name).
func ParseFlags(args []string) (Flags, error) {
	var f Flags
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	fs.StringVar(&f.Config, "config", "", "Path of the scheduler settings file (JSON, "+schedconfig.APIVersion+"). Required.")
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "Path of a kubeconfig. Empty: KUBECONFIG, ~/.kube/config or in-cluster.")
	fs.StringVar(&f.HTTPAddr, "http-addr", "", "Listen address of the gateway (overrides the settings' httpAddr).")
	fs.StringVar(&f.MetricsAddr, "metrics-addr", "", "Listen address of /metrics (overrides the settings' metricsAddr; \"0\" disables).")
	fs.StringVar(&f.HealthAddr, "health-addr", "", "Listen address of /healthz and /readyz (overrides the settings' healthAddr; \"0\" disables).")
	jobStore := fs.String("job-store", "", "Path of the durable job store file (bbolt), for example "+jobs.DefaultPath+
		" (replaces the settings' jobStorePath; --job-store= keeps jobs in memory). Empty in both: jobs are kept in memory and lost on restart.")
	fs.BoolVar(&f.SkipRBACCheck, "skip-rbac-check", false, "Skip the start-up check (SelfSubjectAccessReview) that the scheduler holds the RBAC permissions "+
		"of its version in its pool's namespace; for clusters whose authorizer does not answer SelfSubjectAccessReview as it authorizes requests.")
	f.Zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return Flags{}, err
	}
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "job-store" {
			f.JobStore = jobStore
		}
	})
	if f.Config == "" {
		return Flags{}, errors.New("--config is required")
	}
	return f, nil
}

// Run runs the scheduler with the command-line args until ctx is
// cancelled, then stops every server (releasing its port) and returns.
// Before anything else talks to the API server it checks the scheduler's
// RBAC permissions (Permissions, unless --skip-rbac-check) and returns a
// *rbaccheck.MissingError naming every permission missing.
// The provider API key is read from the settings' providerKeyFile, again
// every providerkey.DefaultInterval (a key rotated in the mounted Secret
// is used without a restart), or without one from the environment
// variable schedconfig.ProviderKeyEnv at start; it is never logged.
func Run(ctx context.Context, args []string) error {
	f, err := ParseFlags(args)
	if err != nil {
		return err
	}
	s, err := schedconfig.Load(f.Config)
	if err != nil {
		return err
	}
	s = applyFlags(s, f)
	log := zap.New(zap.UseFlagOptions(&f.Zap)).WithValues("pool", s.PoolName, "namespace", s.Namespace)
	ctrl.SetLogger(log)
	runtimeconfig.ApplyMemoryLimit(log)
	cfg, err := restConfig(f.Kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	if f.SkipRBACCheck {
		log.Info("Skipping the RBAC check (--skip-rbac-check)")
	} else {
		sets, err := Permissions(s.Namespace)
		if err != nil {
			return err
		}
		if err := rbaccheck.Run(ctx, cfg, sets, RBACRemedy); err != nil {
			return err
		}
	}
	return run(ctx, s, cfg, os.Getenv(schedconfig.ProviderKeyEnv), log)
}

// RBACRemedy ends the error of a failed RBAC check at start: what to apply.
const RBACRemedy = "Apply the ClusterRole fairshare-scheduler of this scheduler's version (helm upgrade with the chart of the same version, " +
	"or kubectl apply -f config/rbac/scheduler/role.yaml of the same release; with the operator's --scheduler-cluster-role, that ClusterRole), " +
	"then restart the scheduler; the operator's --skip-rbac-check renders --skip-rbac-check, which skips this check, " +
	"for clusters whose authorizer does not answer SelfSubjectAccessReview as it authorizes requests"

// RBACSource names the scheduler's ClusterRole in the RBAC check's error.
const RBACSource = "the scheduler's ClusterRole (config/rbac/scheduler/role.yaml, the chart's fairshare-scheduler), bound in the pool's namespace by the RoleBinding the operator renders"

// Permissions returns the permissions the scheduler of a pool of namespace
// checks at start: every rule of the ClusterRole fairshare-scheduler it was
// built with (github.com/fairshare-dev/fairshare/config/rbac), in
// namespace, where the operator's RoleBinding grants it. The per-pool Roles
// (status, Lease and Secrets by name) are not checked: the operator renders
// them from the pool and its tenants, and may not have written a new
// tenant's yet. It returns an error only for an embedded manifest that does
// not parse (a build defect).
func Permissions(namespace string) ([]rbaccheck.Set, error) {
	perms, err := rbaccheck.FromRole(rbacmanifests.SchedulerRole, namespace)
	if err != nil {
		return nil, fmt.Errorf("config/rbac/scheduler/role.yaml: %w", err)
	}
	return []rbaccheck.Set{{Source: RBACSource, Permissions: perms}}, nil
}

// providerKey returns the provider key of the settings: read from
// s.ProviderKeyFile, with the Runnable that keeps it current, or envKey for
// good when the settings name no file. A key file that cannot be read at
// start is logged and read again like any other: the scheduler starts
// without a key (the provider refuses its calls) rather than exit, and the
// kubelet's next write of the file is picked up.
func providerKey(s schedconfig.Settings, envKey string, log logr.Logger) (*providerkey.Key, *providerkey.File) {
	if s.ProviderKeyFile == "" {
		return providerkey.New(envKey), nil
	}
	f := &providerkey.File{Path: s.ProviderKeyFile, Key: providerkey.New(""), Log: log.WithName("provider-key")}
	_ = f.Load()
	return f.Key, f
}

// applyFlags returns s with the listen addresses replaced by the flags
// that are not empty, and the job store path by --job-store when it was
// given, even empty (jobs in memory).
func applyFlags(s schedconfig.Settings, f Flags) schedconfig.Settings {
	for _, o := range []struct {
		dst *string
		v   string
	}{{&s.HTTPAddr, f.HTTPAddr}, {&s.MetricsAddr, f.MetricsAddr}, {&s.HealthAddr, f.HealthAddr}} {
		if o.v != "" {
			*o.dst = o.v
		}
	}
	if f.JobStore != nil {
		s.JobStorePath = *f.JobStore
	}
	return s
}

func restConfig(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return ctrl.GetConfig()
}

func run(ctx context.Context, s schedconfig.Settings, cfg *rest.Config, envKey string, log logr.Logger) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	health := s.HealthAddr
	if health == "" {
		health = "0"
	}
	skipNameValidation := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{s.Namespace: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: health,
		// The manager's own election is off: it makes the process exit when
		// the Lease cannot be renewed; the election Runnable below keeps
		// serving instead (election.go).
		LeaderElection: false,
		// Several schedulers may run in one process (tests).
		Controller: ctrlconfig.Controller{SkipNameValidation: &skipNameValidation},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	// leaderOnly wraps a leader-only Runnable: started once the Lease is
	// first acquired, or at once without leader election (one replica).
	leaderOnly := func(r manager.Runnable) manager.Runnable { return r }
	elected := make(chan struct{})
	close(elected)
	if s.LeaderElection {
		e, err := newElection(cfg, mgr, s.Namespace, s.LeaseName, defaultTiming, log)
		if err != nil {
			return err
		}
		e.owner = poolOwner(mgr.GetAPIReader(), s.Namespace, s.PoolName)
		if err := mgr.Add(e); err != nil {
			return err
		}
		leaderOnly, elected = e.gate, e.elected
		log = log.WithValues("identity", e.Identity())
	}

	key, keyFile := providerKey(s, envKey, log)
	if keyFile != nil {
		if err := mgr.Add(keyFile); err != nil {
			return err
		}
	}

	clk := clock.RealClock{}
	reg := registry.New(clk)
	prom := prometheus.NewRegistry()
	prom.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(prom, func() registry.Snapshot { return reg.Snapshot(clk.Now()) })
	state := &kube.State{}
	if err := kube.SetupWithManager(mgr, reg, state, s.Namespace, s.PoolName); err != nil {
		return err
	}
	gw := &leaderGateway{storePath: s.JobStorePath, lockTimeout: StoreLockTimeout, addr: s.HTTPAddr, log: log,
		opts: gateway.Options{Registry: reg, Clock: clk, Metrics: m, LiveProviderKey: key,
			UpstreamConcurrency: int(s.UpstreamConcurrency), Log: log.WithName("gateway")}}
	if err := mgr.Add(leaderOnly(gw)); err != nil {
		return err
	}
	if s.MetricsAddr != "" && s.MetricsAddr != "0" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(prom, promhttp.HandlerOpts{Registry: prom}))
		if err := mgr.Add(&server{name: "metrics", addr: s.MetricsAddr, handler: mux, log: log}); err != nil {
			return err
		}
	}
	if err := mgr.Add(leaderOnly(&kube.StatusWriter{Client: mgr.GetClient(), Registry: reg, State: state, Namespace: s.Namespace,
		PoolName: s.PoolName, Interval: time.Duration(s.StatusIntervalSeconds) * time.Second, Clock: clk,
		Recorder: mgr.GetEventRecorderFor(v1alpha1.FieldManagerScheduler),
		Log:      log.WithName("status")})); err != nil {
		return err
	}
	if health != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("leader-and-loaded", func(*http.Request) error {
			select {
			case <-elected:
			default:
				return errors.New("not the leader")
			}
			if !gw.started.Load() {
				return errors.New("job store not open yet")
			}
			if !reg.Ready() {
				return errors.New("pool and tenants not loaded yet")
			}
			if !gw.recovered() {
				return errors.New("recovering the job store's jobs")
			}
			return nil
		}); err != nil {
			return err
		}
	}
	// The tokenizer's vocabulary is loaded before the replica can be
	// ready, so that no tenant's first request pays it.
	if err := tokencount.Load(); err != nil {
		return fmt.Errorf("loading the tokenizer: %w", err)
	}
	log.Info("starting scheduler", "httpAddr", s.HTTPAddr, "metricsAddr", s.MetricsAddr, "healthAddr", health,
		"leaderElection", s.LeaderElection, "providerKey", key.Present(), "providerKeyFile", s.ProviderKeyFile, "jobStore", storeDescription(s.JobStorePath))
	return mgr.Start(ctx)
}

// storeDescription is the job store as logged at start: its path, or
// "memory" when jobs are kept in memory.
func storeDescription(path string) string {
	if path == "" {
		return "memory"
	}
	return path
}

// leaderGateway is the leader-only Runnable of the data plane: once the
// election is won it opens the durable job store (when storePath is set,
// waiting up to lockTimeout for the previous leader's file lock), builds
// the gateway on it (which lists the jobs to recover), serves it on addr
// with its dispatcher, and on stop closes the store after the dispatcher
// and the server have returned.
type leaderGateway struct {
	opts        gateway.Options // without Store
	storePath   string          // empty: jobs in memory
	lockTimeout time.Duration
	addr        string
	log         logr.Logger
	// started is set once the store is open and the gateway built (readiness).
	started atomic.Bool
	// gw is the gateway being served, nil before and after.
	gw atomic.Pointer[gateway.Gateway]
}

var _ manager.LeaderElectionRunnable = (*leaderGateway)(nil)

// NeedLeaderElection: only the leader opens the store and serves (the
// election gates it: election.gate; without leader election it runs at once).
func (l *leaderGateway) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (l *leaderGateway) Start(ctx context.Context) error {
	opts := l.opts
	if l.storePath != "" {
		bs, err := l.openStore(ctx)
		if err != nil || bs == nil {
			return err
		}
		defer func() {
			if err := bs.Close(); err != nil {
				l.log.Error(err, "closing the job store", "path", l.storePath)
			}
		}()
		opts.Store = bs
	}
	gw := gateway.New(opts)
	l.gw.Store(gw)
	l.started.Store(true)
	defer func() {
		l.started.Store(false)
		l.gw.Store(nil)
	}()
	srv := &server{name: "gateway", addr: l.addr, handler: gw, leader: true, run: gw.Run, log: l.log}
	err := srv.Start(ctx)
	// The handlers have drained and Run has returned: the store writes
	// they kept for a retry get their last chance before the store closes.
	gw.FlushStoreWrites()
	return err
}

// recovered reports whether the gateway being served has re-queued the
// jobs left in its store (gateway.Gateway.Recovered).
func (l *leaderGateway) recovered() bool {
	gw := l.gw.Load()
	if gw == nil {
		return false
	}
	select {
	case <-gw.Recovered():
		return true
	default:
		return false
	}
}

// openStore opens the job store, or returns (nil, nil) when ctx is
// cancelled first (a store opened after that is closed at once). It logs
// each record the open quarantined (jobs.OpenBolt: key, reason, size) and
// sets the metric job_store_quarantined_records to the records the file's
// quarantine bucket holds.
func (l *leaderGateway) openStore(ctx context.Context) (*jobs.BoltStore, error) {
	type result struct {
		s   *jobs.BoltStore
		err error
	}
	start := time.Now()
	done := make(chan result, 1)
	go func() {
		s, err := jobs.OpenBolt(l.storePath, l.opts.Clock, 0, 0, l.lockTimeout)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		// Records that could not be loaded as jobs were moved to the
		// file's quarantine bucket: each is named (never its content,
		// which holds a tenant's request body).
		for _, q := range r.s.Quarantined() {
			l.log.Info("job store record not loaded: moved to the file's quarantine bucket", "path", l.storePath,
				"key", q.Key, "quarantineKey", q.QuarantineKey, "reason", q.Reason, "bytes", q.Size)
		}
		if m := l.opts.Metrics; m != nil {
			m.JobStoreQuarantined.Set(float64(r.s.QuarantinedHeld()))
		}
		l.log.Info("opened the job store", "path", l.storePath, "waited", time.Since(start).Round(time.Millisecond).String(),
			"quarantinedRecords", r.s.QuarantinedHeld())
		return r.s, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.s != nil {
				_ = r.s.Close()
			}
		}()
		return nil, nil
	}
}

// server is an HTTP server Runnable: it listens when started, and on
// cancellation shuts down gracefully (bounded by shutdownTimeout), releasing
// its port. run, when set, runs beside it (the gateway's dispatcher).
type server struct {
	name    string
	addr    string
	handler http.Handler
	leader  bool
	run     func(ctx context.Context) error
	log     logr.Logger
}

var _ manager.LeaderElectionRunnable = (*server)(nil)

// NeedLeaderElection: the gateway serves only on the leader; metrics on all.
func (s *server) NeedLeaderElection() bool { return s.leader }

// Start implements manager.Runnable.
func (s *server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("%s: listening on %s: %w", s.name, s.addr, err)
	}
	// Header, idle and header-size limits: docs/operations.md "Client
	// timeouts and limits".
	srv := gateway.NewServer(s.handler, gateway.ServerOptions{})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	runDone := make(chan error, 1)
	if s.run != nil {
		go func() { runDone <- s.run(runCtx) }()
	} else {
		runDone <- nil
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ln) }()
	s.log.Info("serving", "server", s.name, "addr", ln.Addr().String())
	select {
	case <-ctx.Done():
	case err := <-serveDone:
		cancel()
		<-runDone
		return fmt.Errorf("%s: %w", s.name, err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	cancel()
	<-serveDone
	return <-runDone
}
