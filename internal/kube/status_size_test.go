package kube

import (
	"context"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// fillMax sets every nil pointer, zero integer and empty string field of
// the struct v points to (recursively; slices are left to the caller) to
// its widest value: integers math.MaxInt64 (19 digits), times a full
// RFC 3339 second, strings 32 bytes.
func fillMax(v reflect.Value) {
	for i := range v.NumField() {
		f := v.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.Pointer:
			if f.Type() == reflect.TypeOf(&metav1.Time{}) {
				t := metav1.NewTime(time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC))
				f.Set(reflect.ValueOf(&t))
				continue
			}
			p := reflect.New(f.Type().Elem())
			if p.Elem().Kind() == reflect.Struct {
				fillMax(p.Elem())
			} else {
				setMax(p.Elem())
			}
			f.Set(p)
		case reflect.Struct:
			fillMax(f)
		default:
			setMax(f)
		}
	}
}

func setMax(f reflect.Value) {
	switch f.Kind() {
	case reflect.Int64, reflect.Int32, reflect.Int:
		f.SetInt(math.MaxInt64 >> (64 - f.Type().Bits()))
	case reflect.Bool:
		f.SetBool(true)
	case reflect.String:
		if f.Len() == 0 {
			f.SetString(strings.Repeat("x", 32))
		}
	}
}

// fullCond is a condition with every field at its widest: generation
// MaxInt64 and a message of maxMessageBytes.
func fullCond(typ, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionFalse, ObservedGeneration: math.MaxInt64, Reason: reason,
		Message: strings.Repeat("m", maxMessageBytes), LastTransitionTime: metav1.NewTime(time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC))}
}

// statusSizes writes a status with every field filled on the API server
// (figures and the scheduler's conditions under fairshare-scheduler, the
// operator's conditions and observedGeneration under fairshare-controller,
// as in production) and returns the JSON size of the status and of the
// whole object as the API server returns it (managedFields included).
func statusSizes(t testing.TB, c client.Client, kind, ns, name string, sched, operator any) (status, object int) {
	t.Helper()
	ctx := context.Background()
	for _, a := range []struct {
		owner string
		st    any
	}{{v1alpha1.FieldManagerScheduler, sched}, {v1alpha1.FieldManagerController, operator}} {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(a.st)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: map[string]any{"status": m}}
		u.SetAPIVersion(v1alpha1.GroupVersion.String())
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName(name)
		if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(a.owner), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
	}
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	sb, _ := json.Marshal(u.Object["status"])
	ob, _ := json.Marshal(u.Object)
	return len(sb), len(ob)
}

// maxStatusBytes is the status size bound of issue 6.
const maxStatusBytes = 4096

// TestStatusSize: a TenantQuota and a ProviderPool with 3 models, with
// every status field filled at its widest, have a status under 4 KB
// (issue 6).
//
// Reasoning: the status is the figures (every integer at 19 digits, every
// time a full RFC 3339 second), the conditions (the scheduler's with
// messages capped at maxMessageBytes by truncateMessage, the operator's
// Accepted and Ready given messages of the same length, observedGeneration
// at 19 digits) and, for the pool, 3 models named with 63 bytes (a
// provider's model names are well under that; the CRD allows 256) and
// every quota figure set. String fields the scheduler fills from a closed
// set (reasons, dialect) are set to 32 bytes, more than any value used.
// The whole object adds the spec and metadata (managedFields lists every
// status field path once per manager), so its size is reported, not bound.
func TestStatusSize(t *testing.T) {
	c := newClient(t)
	ns, _, _ := fixture(t, c)

	var tst v1alpha1.TenantQuotaStatus
	fillMax(reflect.ValueOf(&tst).Elem())
	tst.ObservedGeneration = 0
	tst.Conditions = []metav1.Condition{fullCond(v1alpha1.ConditionServing, v1alpha1.ReasonInvalidSpec),
		fullCond(v1alpha1.ConditionThrottled, v1alpha1.ReasonTenantLimited),
		fullCond(v1alpha1.ConditionUsageOutlier, v1alpha1.ReasonLimitViolations)}
	top := v1alpha1.TenantQuotaStatus{ObservedGeneration: math.MaxInt64, Conditions: []metav1.Condition{
		fullCond("Accepted", "InvalidSpec"), fullCond("Ready", "PoolNotReady")}}
	ts, to := statusSizes(t, c, "TenantQuota", ns, "tq-a", &tst, &top)

	var pst v1alpha1.ProviderPoolStatus
	fillMax(reflect.ValueOf(&pst).Elem())
	pst.ObservedGeneration = 0
	pst.Conditions = []metav1.Condition{fullCond(v1alpha1.ConditionServing, v1alpha1.ReasonSchedulerProgressing),
		fullCond(v1alpha1.ConditionThrottled, v1alpha1.ReasonUpstreamPaused)}
	for _, name := range []string{"a", "b", "c"} {
		var m v1alpha1.ModelQuotaStatus
		fillMax(reflect.ValueOf(&m).Elem())
		m.Name = strings.Repeat(name, 63)
		pst.Models = append(pst.Models, m)
	}
	pop := v1alpha1.ProviderPoolStatus{ObservedGeneration: math.MaxInt64, Conditions: []metav1.Condition{
		fullCond("Accepted", "InvalidSpec"), fullCond("Ready", "SchedulerProgressing")}}
	ps, po := statusSizes(t, c, "ProviderPool", ns, "pool", &pst, &pop)

	t.Logf("TenantQuota: status %d B, object %d B; ProviderPool (3 models): status %d B, object %d B", ts, to, ps, po)
	if ts >= maxStatusBytes || ps >= maxStatusBytes {
		t.Errorf("status sizes: TenantQuota %d B, ProviderPool %d B; want < %d", ts, ps, maxStatusBytes)
	}
}

// TestTruncateMessage: a long message is cut to maxMessageBytes on a rune
// boundary with "..."; a short one is kept.
func TestTruncateMessage(t *testing.T) {
	if got := truncateMessage("short"); got != "short" {
		t.Errorf("short = %q", got)
	}
	long := strings.Repeat("é", maxMessageBytes) // 2 bytes each
	got := truncateMessage(long)
	if len(got) != maxMessageBytes-1 || !strings.HasSuffix(got, "é...") {
		t.Errorf("long: %d bytes, suffix %q; want %d bytes ending in é...", len(got), got[len(got)-6:], maxMessageBytes-1)
	}
}
