package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crleaderelection "sigs.k8s.io/controller-runtime/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// Leader election durations, in time: controller-runtime's manager defaults
// (manager.Options LeaseDuration, RenewDeadline, RetryPeriod), which the
// scheduler kept when it used the manager's own election and which the
// failover bounds of test/ha are computed from.
const (
	// LeaseDuration is how long a standby waits, from when it last saw the
	// Lease change, before it may take the Lease over: 15 s.
	LeaseDuration = 15 * time.Second
	// RenewDeadline is how long the leader retries renewing before it
	// considers the Lease lost: 10 s.
	RenewDeadline = 10 * time.Second
	// RetryPeriod is the interval between two attempts to acquire or renew
	// (client-go adds up to 1.2 x jitter when acquiring): 2 s.
	RetryPeriod = 2 * time.Second
)

// ErrLeaseTaken is returned by the elector Runnable (hence by Run) when this
// replica has led, lost its Lease (it could not renew it for RenewDeadline)
// and then reads from the API server that another replica holds the Lease
// with a renewal younger than its duration: this replica stops serving and
// exits, so that its pod restarts as a standby.
var ErrLeaseTaken = errors.New("the Lease is held by another replica")

// timing are the election durations; production uses LeaseDuration,
// RenewDeadline and RetryPeriod, tests shorter ones.
type timing struct {
	lease, renew, retry time.Duration
}

// defaultTiming is the production timing.
var defaultTiming = timing{lease: LeaseDuration, renew: RenewDeadline, retry: RetryPeriod}

// election runs client-go's leader election on the pool's Lease in place of
// controller-runtime's, which makes the process exit as soon as the Lease
// cannot be renewed (the manager's lost-lease handler is not configurable in
// controller-runtime v0.22): with it, an API server outage of more than
// RenewDeadline stopped the gateway, and no standby could take over while
// the API server was down. The data path must keep serving on
// the last known policy when the API server stops (fail-open for
// availability, limits still enforced).
//
// Behaviour:
//   - The leader-only Runnables (gate) start when the Lease is first
//     acquired, never before: a replica that has never led never opens the
//     job store nor serves.
//   - When the Lease cannot be renewed (client-go calls OnStoppedLeading),
//     they keep running and the election is entered again at once (a new
//     LeaderElector.Run). When the API server is back and the Lease is
//     still ours, client-go renews it (tryAcquireOrRenew keeps a Lease whose
//     holder is this identity); when it has expired unheld, it is acquired
//     again.
//   - Once it has led, the replica stops serving (the Runnable returns
//     ErrLeaseTaken, the manager stops, the process exits) only when the
//     API server is reachable and shows another holder: a Get of the Lease
//     with another holderIdentity whose renewTime + leaseDurationSeconds is
//     after now (on this clock), checked every retry period while this
//     replica does not hold the Lease, and at once when client-go reports a
//     new leader (OnNewLeader).
//   - On cancellation (SIGTERM) the Lease is released (ReleaseOnCancel)
//     after the leader-only Runnables have returned (the job store closed),
//     waiting at most releaseWait, so that a standby takes over at once and
//     finds the store's file lock free.
//
// Trade-off: during a network partition in which only the standby reaches
// the API server, the standby acquires the Lease after it expires while the
// old leader keeps serving; both are leaders until the old leader reaches
// the API server and sees the new holder. A shared job store cannot be
// opened twice (its bbolt file lock; a ReadWriteOnce volume is not even
// mounted on a second node), so the new leader waits for it
// (StoreLockTimeout) and is not ready meanwhile; with in-memory jobs both
// serve, and each enforces the limits on its own, so a tenant may be
// admitted up to twice its quota for the length of the partition.
type election struct {
	lock resourcelock.Interface
	// leases reads the Lease for the watch (the lock is not safe for use
	// beside its LeaderElector: LeaseLock.Get stores what it read).
	leases    coordinationv1client.LeaseInterface
	leaseName string
	name      string // the Lease's name, for client-go's metrics and logs
	timing    timing
	clock     clock.PassiveClock
	log       logr.Logger

	// elected is closed when the Lease is first acquired.
	elected     chan struct{}
	electedOnce sync.Once
	// current is the LeaderElector of the running round, nil between.
	current atomic.Pointer[leaderelection.LeaderElector]
	// losses counts the rounds that acquired the Lease and then could not
	// renew it (client-go gave it up after RenewDeadline).
	losses atomic.Int64

	// owner, when set, returns the owner reference (the pool) the Lease is
	// created with (ownLease).
	owner func(context.Context) (*metav1.OwnerReference, error)

	// gates counts the leader-only Runnables that have not returned yet;
	// gatesDone is closed when it drops to zero after being positive.
	gatesMu   sync.Mutex
	gates     int
	gatesDone chan struct{}
}

// releaseWait bounds how long a cancelled election waits for the
// leader-only Runnables to return before it releases the Lease: the
// gateway's graceful shutdown (shutdownTimeout) plus a margin for closing
// the store, inside the manager's GracefulShutdownTimeout (30 s).
const releaseWait = shutdownTimeout + 5*time.Second

var _ manager.LeaderElectionRunnable = (*election)(nil)

// newElection builds the election on the Lease leaseName in namespace, with
// controller-runtime's resource lock: the same Lease and the same identity
// (host name and a random UUID) as the manager's election, a client whose
// request timeout is half the renew deadline, and the Lease events recorded
// through rec.
func newElection(cfg *rest.Config, rec recorder.Provider, namespace, leaseName string, t timing, log logr.Logger) (*election, error) {
	lock, err := crleaderelection.NewResourceLock(rest.CopyConfig(cfg), rec, crleaderelection.Options{
		LeaderElection: true, LeaderElectionResourceLock: resourcelock.LeasesResourceLock,
		LeaderElectionNamespace: namespace, LeaderElectionID: leaseName, RenewDeadline: t.renew,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the Lease lock: %w", err)
	}
	rc := rest.CopyConfig(cfg)
	rc.Timeout = t.renew / 2
	cc, err := coordinationv1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating the Lease client: %w", err)
	}
	return &election{lock: lock, leases: cc.Leases(namespace), leaseName: leaseName, name: leaseName, timing: t, clock: clock.RealClock{}, log: log.WithName("election"),
		elected: make(chan struct{}), gatesDone: make(chan struct{})}, nil
}

// Identity is this replica's holder identity in the Lease.
func (e *election) Identity() string { return e.lock.Identity() }

// Elected is closed once this replica has first acquired the Lease; it stays
// closed when the Lease is lost afterwards (the replica keeps serving).
func (e *election) Elected() <-chan struct{} { return e.elected }

// NeedLeaderElection is false: the election itself runs on every replica
// (the manager's own leader election is off).
func (e *election) NeedLeaderElection() bool { return false }

// Start runs the election until ctx is cancelled (it then returns nil after
// releasing the Lease) or until another replica is seen holding the Lease
// after this one has led (ErrLeaseTaken).
func (e *election) Start(ctx context.Context) error {
	e.ownLease(ctx)
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	taken := make(chan string, 1)
	newLeader := make(chan struct{}, 1)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		e.watch(runCtx, newLeader, taken)
	}()
	defer func() { cancelRun(); <-watchDone }()
	for {
		var acquired atomic.Bool
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: e.lock, Name: e.name,
			LeaseDuration: e.timing.lease, RenewDeadline: e.timing.renew, RetryPeriod: e.timing.retry,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					acquired.Store(true)
					e.electedOnce.Do(func() {
						e.log.Info("acquired the Lease: starting the leader-only components", "identity", e.Identity())
						close(e.elected)
					})
				},
				OnStoppedLeading: func() {},
				OnNewLeader: func(string) {
					select {
					case newLeader <- struct{}{}:
					default:
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		e.current.Store(le)
		runDone := make(chan struct{})
		leCtx, cancelLE := context.WithCancel(runCtx)
		go func() {
			defer close(runDone)
			le.Run(leCtx)
		}()
		select {
		case <-runDone:
			cancelLE()
			if ctx.Err() != nil {
				return nil
			}
			if acquired.Load() {
				e.losses.Add(1)
				e.log.Info("could not renew the Lease: serving on the last known policy and trying again",
					"identity", e.Identity(), "renewDeadline", e.timing.renew.String())
			}
			// Run again at once: a new LeaderElector renews the Lease if it
			// is still ours when the API server answers again.
		case holder := <-taken:
			cancelLE()
			<-runDone
			return fmt.Errorf("%w (%s): stopping the leader-only components", ErrLeaseTaken, holder)
		case <-ctx.Done():
			e.waitGates()
			cancelLE() // ReleaseOnCancel: gives the Lease up if held
			<-runDone
			return nil
		}
	}
}

// ownLease creates the Lease, empty and owned by the pool (e.owner), when
// it does not exist yet, so that deleting the pool deletes it with the
// pool's other objects (garbage collection) instead of leaving it behind:
// client-go's lock creates a Lease without owner, and the scheduler may not
// delete one. The lock then takes the empty Lease like an expired one and
// keeps its metadata on every renewal. The owner reference is not a
// controller's and does not block the pool's deletion (which would need
// the update verb on providerpools/finalizers). Any error is logged and
// left to the lock, which creates an unowned Lease as before.
func (e *election) ownLease(ctx context.Context) {
	if e.owner == nil {
		return
	}
	ref, err := e.owner(ctx)
	if err != nil {
		e.log.Info("could not read the pool to own its Lease: the Lease is created without owner", "lease", e.leaseName, "error", err.Error())
		return
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: e.leaseName, OwnerReferences: []metav1.OwnerReference{*ref}}}
	if _, err := e.leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.log.Info("could not create the Lease owned by the pool: the Lease is created without owner", "lease", e.leaseName, "error", err.Error())
	}
}

// poolOwner returns an election owner function: the owner reference of
// the ProviderPool name in namespace, read with r (past any cache).
func poolOwner(r client.Reader, namespace, name string) func(context.Context) (*metav1.OwnerReference, error) {
	return func(ctx context.Context) (*metav1.OwnerReference, error) {
		pool := &v1alpha1.ProviderPool{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pool); err != nil {
			return nil, err
		}
		return &metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProviderPool", Name: pool.Name, UID: pool.UID}, nil
	}
}

// watch reports on taken the holder of the Lease when, after this replica
// has led, a Get of the Lease shows another holder with a valid renewal. It
// checks while client-go's last observed record is not this replica's, every
// retry period and when client-go has seen a new leader, until ctx ends.
func (e *election) watch(ctx context.Context, newLeader <-chan struct{}, taken chan<- string) {
	t := time.NewTicker(e.timing.retry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-newLeader:
		}
		select {
		case <-e.elected:
		default:
			continue // never led: a standby, client-go alone decides
		}
		if le := e.current.Load(); le != nil && le.IsLeader() {
			continue // client-go last saw this replica holding the Lease
		}
		if holder, ok := e.heldByAnother(ctx); ok {
			taken <- holder
			return
		}
	}
}

// heldByAnother reads the Lease and reports its holder when it is neither
// empty nor this replica and its renewal has not expired. An error (the API
// server unreachable) reports false.
func (e *election) heldByAnother(ctx context.Context) (string, bool) {
	gctx, cancel := context.WithTimeout(ctx, e.timing.renew/2)
	defer cancel()
	l, err := e.leases.Get(gctx, e.leaseName, metav1.GetOptions{})
	if err != nil {
		return "", false
	}
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&l.Spec)
	return rec.HolderIdentity, leaseHeldByAnother(*rec, e.Identity(), e.clock.Now())
}

// leaseHeldByAnother reports whether the Lease record rec, read at now, is
// held by an identity other than self (and not empty) whose renewTime +
// leaseDurationSeconds is after now. The renewal time is written on the
// holder's clock: a skew between the nodes shortens or lengthens the
// validity by as much.
func leaseHeldByAnother(rec resourcelock.LeaderElectionRecord, self string, now time.Time) bool {
	if rec.HolderIdentity == "" || rec.HolderIdentity == self {
		return false
	}
	return rec.RenewTime.Add(time.Duration(rec.LeaseDurationSeconds) * time.Second).After(now)
}

// gate returns r as a Runnable that runs on every replica (the manager's
// own election is off) but calls r.Start only once this replica has first
// acquired the Lease, and keeps it running when the Lease is lost: r stops
// when the manager stops (SIGTERM, or Start returning ErrLeaseTaken).
func (e *election) gate(r manager.Runnable) manager.Runnable {
	e.gatesMu.Lock()
	e.gates++
	e.gatesMu.Unlock()
	return &gated{r: r, e: e}
}

// waitGates waits until every gated Runnable has returned, or releaseWait.
func (e *election) waitGates() {
	e.gatesMu.Lock()
	n := e.gates
	e.gatesMu.Unlock()
	if n == 0 {
		return
	}
	t := time.NewTimer(releaseWait)
	defer t.Stop()
	select {
	case <-e.gatesDone:
	case <-t.C:
		e.log.Info("leader-only components still running: releasing the Lease anyway", "waited", releaseWait.String())
	}
}

func (e *election) gateReturned() {
	e.gatesMu.Lock()
	defer e.gatesMu.Unlock()
	e.gates--
	if e.gates == 0 {
		close(e.gatesDone)
	}
}

// gated is a leader-only Runnable started by the election (election.gate).
type gated struct {
	r    manager.Runnable
	e    *election
	once sync.Once
}

var _ manager.LeaderElectionRunnable = (*gated)(nil)

// NeedLeaderElection is false: the election gates the Runnable itself.
func (g *gated) NeedLeaderElection() bool { return false }

// Start waits for the first election, then runs the Runnable until ctx ends.
func (g *gated) Start(ctx context.Context) error {
	defer g.once.Do(g.e.gateReturned)
	select {
	case <-g.e.elected:
	case <-ctx.Done():
		return nil
	}
	return g.r.Start(ctx)
}
