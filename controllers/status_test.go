package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

var (
	t0 = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 = metav1.NewTime(t0.Add(time.Hour))
)

// TestBC42_SetConditionKeepsTransitionTime: lastTransitionTime moves only
// when the status flips, not when the reason, message or generation change.
func TestBC42_SetConditionKeepsTransitionTime(t *testing.T) {
	existing := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "A", Message: "a", ObservedGeneration: 1, LastTransitionTime: t0}
	tests := map[string]struct {
		cond     metav1.Condition
		wantTime metav1.Time
	}{
		"identical":          {metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "A", Message: "a", ObservedGeneration: 1}, t0},
		"new message":        {metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "A", Message: "b", ObservedGeneration: 1}, t0},
		"new reason and gen": {metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "B", Message: "a", ObservedGeneration: 2}, t0},
		"status flips":       {metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "A", Message: "a", ObservedGeneration: 1}, t1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			conds := []metav1.Condition{existing}
			setCondition(&conds, tc.cond, t1)
			want := tc.cond
			want.LastTransitionTime = tc.wantTime
			if diff := cmp.Diff([]metav1.Condition{want}, conds); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStatusChanged(t *testing.T) {
	accepted := metav1.Condition{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: "Accepted", Message: "m", LastTransitionTime: t0}
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "R", Message: "m", LastTransitionTime: t0}
	serving := metav1.Condition{Type: v1alpha1.ConditionServing, Status: metav1.ConditionTrue, Reason: "Loaded", Message: "m", LastTransitionTime: t0}
	base := []metav1.Condition{accepted, ready, serving}
	with := func(f func(*metav1.Condition), i int) []metav1.Condition {
		c := append([]metav1.Condition(nil), base...)
		f(&c[i])
		return c
	}
	tests := map[string]struct {
		newConds    []metav1.Condition
		newGen      int64
		wantChanged bool
	}{
		"same":                          {base, 1, false},
		"same, other order":             {[]metav1.Condition{serving, ready, accepted}, 1, false},
		"same instant, other location":  {with(func(c *metav1.Condition) { c.LastTransitionTime = metav1.NewTime(t0.In(time.FixedZone("X", 3600))) }, 1), 1, false},
		"scheduler condition differs":   {with(func(c *metav1.Condition) { c.Status = metav1.ConditionFalse }, 2), 1, false},
		"generation":                    {base, 2, true},
		"ready message":                 {with(func(c *metav1.Condition) { c.Message = "other" }, 1), 1, true},
		"accepted condition generation": {with(func(c *metav1.Condition) { c.ObservedGeneration = 2 }, 0), 1, true},
		"ready missing":                 {[]metav1.Condition{accepted, serving}, 1, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := statusChanged(base, tc.newConds, 1, tc.newGen, controllerConditionTypes); got != tc.wantChanged {
				t.Errorf("statusChanged = %v, want %v", got, tc.wantChanged)
			}
		})
	}
}

func deploymentWith(replicas, generation, observed, available int32) *appsv1.Deployment {
	d := &appsv1.Deployment{}
	d.Name = "p-scheduler"
	d.Generation = int64(generation)
	d.Spec.Replicas = ptr.To(replicas)
	d.Status.ObservedGeneration = int64(observed)
	d.Status.AvailableReplicas = available
	return d
}

// withDeploymentConditions returns d with the given status conditions.
func withDeploymentConditions(d *appsv1.Deployment, conds ...appsv1.DeploymentCondition) *appsv1.Deployment {
	d.Status.Conditions = conds
	return d
}

func TestSetReadyCondition(t *testing.T) {
	noSecret := secretProblem{reason: v1alpha1.ReasonProviderSecretNotFound, message: "Secret ns/k does not exist"}
	noKey := secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing, message: `Secret ns/k has no key "api-key"`}
	tests := map[string]struct {
		deployment *appsv1.Deployment
		err        error
		secret     secretProblem
		want       metav1.Condition
	}{
		"Secret missing, no Deployment yet": {
			secret: noSecret,
			want:   metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProviderSecretNotFound, Message: "Secret ns/k does not exist"},
		},
		"key missing, no replica available": {
			deployment: deploymentWith(1, 1, 1, 0), secret: noKey,
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProviderSecretKeyMissing, Message: `Secret ns/k has no key "api-key"`},
		},
		"key missing wins over the Deployment's own conditions": {
			deployment: withDeploymentConditions(deploymentWith(1, 1, 1, 0), appsv1.DeploymentCondition{
				Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: "timed out",
			}), secret: noKey,
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProviderSecretKeyMissing, Message: `Secret ns/k has no key "api-key"`},
		},
		"key missing, generation not observed, none available": {
			deployment: deploymentWith(1, 2, 1, 0), secret: noKey,
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProviderSecretKeyMissing, Message: `Secret ns/k has no key "api-key"`},
		},
		"key missing while a replica runs: True, the message says so": {
			deployment: deploymentWith(1, 1, 1, 1), secret: noKey,
			want: metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonSchedulerAvailable,
				Message: `Deployment p-scheduler has 1 of 1 required replicas available; Secret ns/k has no key "api-key"`},
		},
		"render failed wins over the Secret": {
			err: errors.New("boom"), secret: noSecret,
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonRenderFailed, Message: "boom"},
		},
		"two render errors on one line": {
			err:  errors.Join(errors.New("spec.scheduler.resources.requests.memroy is not a resource"), errors.New("spec.scheduler.resources.requests.cpu (-1) is negative")),
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonRenderFailed, Message: "spec.scheduler.resources.requests.memroy is not a resource; spec.scheduler.resources.requests.cpu (-1) is negative"},
		},
		"render failed": {
			err:  errors.New("boom"),
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonRenderFailed, Message: "boom"},
		},
		"apply failed wins over a Deployment": {
			deployment: deploymentWith(1, 1, 1, 1), err: errors.New("forbidden"),
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonRenderFailed, Message: "forbidden"},
		},
		"no Deployment": {
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing, Message: "Waiting for Deployment p-scheduler"},
		},
		"generation not observed, a replica available": {
			deployment: deploymentWith(1, 2, 1, 1),
			want:       metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonSchedulerAvailable, Message: "Deployment p-scheduler has not yet observed generation 2; 1 of 1 required replicas available"},
		},
		"generation not observed, none available": {
			deployment: deploymentWith(1, 2, 1, 0),
			want:       metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing, Message: "Deployment p-scheduler has not yet observed generation 2"},
		},
		"not available": {
			deployment: deploymentWith(1, 1, 1, 0),
			want:       metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing, Message: "Deployment p-scheduler has 0 of 1 required replicas available"},
		},
		"pods refused": {
			deployment: withDeploymentConditions(deploymentWith(1, 1, 1, 0), appsv1.DeploymentCondition{
				Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate",
				Message: `pods "p-scheduler-5d8f9" is forbidden: failed quota: compute: must specify limits.cpu for: scheduler`,
			}, appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated"}),
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing,
				Message: `Deployment p-scheduler has 0 of 1 required replicas available: its pods cannot be created (ReplicaFailure FailedCreate: pods "p-scheduler-5d8f9" is forbidden: failed quota: compute: must specify limits.cpu for: scheduler)`},
		},
		"rollout stalled": {
			deployment: withDeploymentConditions(deploymentWith(1, 1, 1, 0), appsv1.DeploymentCondition{
				Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded",
				Message: `ReplicaSet "p-scheduler-5d8f9" has timed out progressing.`,
			}),
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing,
				Message: `Deployment p-scheduler has 0 of 1 required replicas available: its rollout is stalled (Progressing ProgressDeadlineExceeded: ReplicaSet "p-scheduler-5d8f9" has timed out progressing.)`},
		},
		"long Deployment message clipped": {
			deployment: withDeploymentConditions(deploymentWith(1, 1, 1, 0), appsv1.DeploymentCondition{
				Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: strings.Repeat("é", 2000),
			}),
			want: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing,
				Message: "Deployment p-scheduler has 0 of 1 required replicas available: its pods cannot be created (ReplicaFailure FailedCreate: " + strings.Repeat("é", 510) + "...)"},
		},
		"available": {
			deployment: deploymentWith(1, 3, 3, 1),
			want:       metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonSchedulerAvailable, Message: "Deployment p-scheduler has 1 of 1 required replicas available"},
		},
		"leader election: the leader alone is enough": {
			deployment: deploymentWith(3, 1, 1, 1),
			want:       metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonSchedulerAvailable, Message: "Deployment p-scheduler has 1 of 1 required replicas available"},
		},
		"leader election: no leader": {
			deployment: deploymentWith(3, 1, 1, 0),
			want:       metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing, Message: "Deployment p-scheduler has 0 of 1 required replicas available"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := &v1alpha1.ProviderPool{}
			pool.Name, pool.Generation = "p", 4
			setReadyCondition(pool, tc.deployment, tc.err, tc.secret, t0)
			want := tc.want
			want.Type, want.ObservedGeneration, want.LastTransitionTime = v1alpha1.ConditionReady, 4, t0
			if diff := cmp.Diff([]metav1.Condition{want}, pool.Status.Conditions); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSetAcceptedCondition(t *testing.T) {
	invalid := fmt.Errorf("%w: name too long", render.ErrInvalidPool)
	tests := map[string]struct {
		err        error
		wantStatus metav1.ConditionStatus
		wantReason string
		wantMsg    string
	}{
		"renders":           {nil, metav1.ConditionTrue, v1alpha1.ReasonAccepted, "ProviderPool accepted"},
		"invalid":           {invalid, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, invalid.Error()},
		"apply error":       {errors.New("forbidden"), metav1.ConditionTrue, v1alpha1.ReasonAccepted, "ProviderPool accepted"},
		"invalid and apply": {errors.Join(invalid, errors.New("x")), metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, "pool cannot be rendered: name too long; x"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := &v1alpha1.ProviderPool{}
			pool.Generation = 2
			setAcceptedCondition(pool, tc.err, t0)
			want := []metav1.Condition{{Type: v1alpha1.ConditionAccepted, Status: tc.wantStatus, Reason: tc.wantReason, Message: tc.wantMsg, ObservedGeneration: 2, LastTransitionTime: t0}}
			if diff := cmp.Diff(want, pool.Status.Conditions); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

func tenant(name, tenantID string, created metav1.Time) v1alpha1.TenantQuota {
	tq := v1alpha1.TenantQuota{}
	tq.Name, tq.Namespace, tq.CreationTimestamp = name, "ns", created
	tq.UID = types.UID("uid-" + name)
	tq.Spec.PoolRef.Name = "pool"
	tq.Spec.TenantID = tenantID
	return tq
}

func TestTenantIDHolder(t *testing.T) {
	deleting := tenant("a-old", "x", t0)
	deleting.DeletionTimestamp = &t1
	tests := map[string]struct {
		candidates []v1alpha1.TenantQuota
		want       string
	}{
		"none":                     {nil, ""},
		"one":                      {[]v1alpha1.TenantQuota{tenant("b", "x", t1)}, "b"},
		"oldest wins":              {[]v1alpha1.TenantQuota{tenant("a", "x", t1), tenant("z", "x", t0)}, "z"},
		"same second: name breaks": {[]v1alpha1.TenantQuota{tenant("b", "x", t0), tenant("a", "x", t0)}, "a"},
		"deleting is skipped":      {[]v1alpha1.TenantQuota{deleting, tenant("b", "x", t1)}, "b"},
		"only deleting":            {[]v1alpha1.TenantQuota{deleting}, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tenantIDHolder(tc.candidates)
			gotName := ""
			if got != nil {
				gotName = got.Name
			}
			if gotName != tc.want {
				t.Errorf("holder = %q, want %q", gotName, tc.want)
			}
		})
	}
}

func TestTenantKey(t *testing.T) {
	named := tenant("acme", "", t0)
	withID := tenant("acme-quota", "acme", t0)
	if tenantKey(&named) != "pool/acme" || tenantKey(&named) != tenantKey(&withID) {
		t.Errorf("tenantKey = %q and %q, want both pool/acme", tenantKey(&named), tenantKey(&withID))
	}
}

func TestSetTenantConditions(t *testing.T) {
	readyPool := &v1alpha1.ProviderPool{}
	readyPool.Name = "pool"
	readyPool.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue}}
	notReadyPool := &v1alpha1.ProviderPool{}
	notReadyPool.Name = "pool"
	holder := tenant("first", "x", t0)
	invalidPool := notReadyPool.DeepCopy()
	invalidPool.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonInvalidSpec, Message: "spec.models: ..."},
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonRenderFailed},
	}
	progressingPool := notReadyPool.DeepCopy()
	progressingPool.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted},
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSchedulerProgressing, Message: "0 of 1 replicas available"},
	}
	tests := map[string]struct {
		pool         *v1alpha1.ProviderPool
		holder       *v1alpha1.TenantQuota
		wantAccepted metav1.Condition
		wantReady    metav1.Condition
	}{
		"pool missing": {
			pool:         nil,
			wantAccepted: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotFound, Message: `ProviderPool "pool" not found in namespace "ns"; create it, or delete and recreate this TenantQuota with the right spec.poolRef.name (poolRef is immutable)`},
			wantReady:    metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNotAccepted, Message: "TenantQuota is not Accepted"},
		},
		"pool missing wins over a duplicate": {
			pool: nil, holder: &holder,
			wantAccepted: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotFound, Message: `ProviderPool "pool" not found in namespace "ns"; create it, or delete and recreate this TenantQuota with the right spec.poolRef.name (poolRef is immutable)`},
			wantReady:    metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNotAccepted, Message: "TenantQuota is not Accepted"},
		},
		"duplicate": {
			pool: readyPool, holder: &holder,
			wantAccepted: metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonDuplicateTenantID, Message: `Tenant id "x" is already used by TenantQuota "first" of ProviderPool "pool"`},
			wantReady:    metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNotAccepted, Message: "TenantQuota is not Accepted"},
		},
		"pool not ready": {
			pool:         notReadyPool,
			wantAccepted: metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted, Message: `Tenant "x" accepted on ProviderPool "pool"`},
			wantReady:    metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotReady, Message: `ProviderPool "pool" is not Ready`},
		},
		"pool invalid": {
			pool:         invalidPool,
			wantAccepted: metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted, Message: `Tenant "x" accepted on ProviderPool "pool"`},
			wantReady:    metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotReady, Message: `ProviderPool "pool" is not Ready: its Accepted condition is False (InvalidSpec); see kubectl describe providerpool pool`},
		},
		"pool progressing": {
			pool:         progressingPool,
			wantAccepted: metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted, Message: `Tenant "x" accepted on ProviderPool "pool"`},
			wantReady:    metav1.Condition{Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotReady, Message: `ProviderPool "pool" is not Ready (SchedulerProgressing); see kubectl describe providerpool pool`},
		},
		"ready": {
			pool:         readyPool,
			wantAccepted: metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted, Message: `Tenant "x" accepted on ProviderPool "pool"`},
			wantReady:    metav1.Condition{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPoolReady, Message: `ProviderPool "pool" is Ready`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tq := tenant("second", "x", t1)
			tq.Generation = 5
			setTenantAcceptedCondition(&tq, tc.pool, tc.holder, t0)
			setTenantReadyCondition(&tq, tc.pool, t0)
			tc.wantAccepted.Type, tc.wantReady.Type = v1alpha1.ConditionAccepted, v1alpha1.ConditionReady
			want := []metav1.Condition{tc.wantAccepted, tc.wantReady}
			for i := range want {
				want[i].ObservedGeneration, want[i].LastTransitionTime = 5, t0
			}
			if diff := cmp.Diff(want, tq.Status.Conditions, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

// A status write refused because the object changed is retried after
// conflictRetry; one refused because the object is gone ends quietly; any
// other error is the caller's.
func TestRetryOnConflict(t *testing.T) {
	gr := schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "providerpools"}
	cases := []struct {
		name string
		err  error
		want ctrl.Result
		ok   bool
	}{
		{"conflict", apierrors.NewConflict(gr, "p", errors.New("modified")), ctrl.Result{RequeueAfter: 250 * time.Millisecond}, true},
		{"not found", apierrors.NewNotFound(gr, "p"), ctrl.Result{}, true},
		{"forbidden", apierrors.NewForbidden(gr, "p", errors.New("no")), ctrl.Result{}, false},
		{"other", errors.New("connection refused"), ctrl.Result{}, false},
	}
	for _, c := range cases {
		got, ok := retryOnConflict(context.Background(), c.err)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: retryOnConflict = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestSchedulerOwnsStatus: only status fields of the scheduler's field
// manager on the status subresource other than status.budget and the
// cumulative counters count.
func TestSchedulerOwnsStatus(t *testing.T) {
	entry := func(manager, sub, raw string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Subresource: sub, FieldsV1: &metav1.FieldsV1{Raw: []byte(raw)}}
	}
	tests := map[string]struct {
		managed []metav1.ManagedFieldsEntry
		want    bool
	}{
		"none": {nil, false},
		"conditions and backlog": {[]metav1.ManagedFieldsEntry{entry(v1alpha1.FieldManagerScheduler, "status",
			`{"f:status":{"f:backlog":{},"f:conditions":{"k:{\"type\":\"Serving\"}":{}}}}`)}, true},
		"budget only": {[]metav1.ManagedFieldsEntry{entry(v1alpha1.FieldManagerScheduler, "status",
			`{"f:status":{".":{},"f:budget":{"f:used":{}}}}`)}, false},
		"budget and counters": {[]metav1.ManagedFieldsEntry{entry(v1alpha1.FieldManagerScheduler, "status",
			`{"f:status":{".":{},"f:budget":{"f:used":{}},"f:completedJobs":{},"f:expiredJobs":{},"f:rejections":{},"f:tokensUsed":{},"f:dryRunRejections":{}}}`)}, false},
		"counters and backlog": {[]metav1.ManagedFieldsEntry{entry(v1alpha1.FieldManagerScheduler, "status",
			`{"f:status":{"f:completedJobs":{},"f:backlog":{}}}`)}, true},
		"the operator's fields": {[]metav1.ManagedFieldsEntry{entry(v1alpha1.FieldManagerController, "status",
			`{"f:status":{"f:conditions":{}}}`)}, false},
		"the scheduler's, not on status": {[]metav1.ManagedFieldsEntry{entry(v1alpha1.FieldManagerScheduler, "",
			`{"f:status":{"f:backlog":{}}}`)}, false},
		"unreadable": {[]metav1.ManagedFieldsEntry{entry(v1alpha1.FieldManagerScheduler, "status", `{`)}, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := schedulerOwnsStatus(tc.managed); got != tc.want {
				t.Errorf("schedulerOwnsStatus = %v, want %v", got, tc.want)
			}
		})
	}
}
