package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

func TestRollMessage(t *testing.T) {
	a := schedulerTemplate{settingsHash: "0123456789abcdef", image: "img:v1"}
	tests := map[string]struct {
		old, desired schedulerTemplate
		podChanged   bool
		want         string
	}{
		"unchanged": {old: a, desired: a, want: ""},
		"settings hash": {
			old: a, desired: schedulerTemplate{settingsHash: "fedcba9876543210", image: "img:v1"}, podChanged: true,
			want: "Deployment p-scheduler rolled: settings hash 01234567 -> fedcba98",
		},
		"image": {
			old: a, desired: schedulerTemplate{settingsHash: a.settingsHash, image: "img:v2"}, podChanged: true,
			want: "Deployment p-scheduler rolled: image img:v1 -> img:v2",
		},
		"both": {
			old: a, desired: schedulerTemplate{settingsHash: "fedcba9876543210", image: "img:v2"}, podChanged: true,
			want: "Deployment p-scheduler rolled: settings hash 01234567 -> fedcba98; image img:v1 -> img:v2",
		},
		"hash annotation removed by hand": {
			old: schedulerTemplate{image: "img:v1"}, desired: a, podChanged: true,
			want: "Deployment p-scheduler rolled: settings hash none -> 01234567",
		},
		"other field of the pod template": {
			old: a, desired: a, podChanged: true,
			want: "Deployment p-scheduler rolled: pod template changed",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := rollMessage("p-scheduler", tc.old, tc.desired, tc.podChanged); got != tc.want {
				t.Errorf("rollMessage = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRollAnnouncerOncePerRoll: a reconcile that still reads the old template
// from a cache behind the operator's own apply does not announce the roll
// again; a later roll (even back to an earlier template) is announced.
func TestRollAnnouncerOncePerRoll(t *testing.T) {
	var a rollAnnouncer
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	v1 := schedulerTemplate{settingsHash: "aaaaaaaa11", image: "img:v1"}
	v2 := schedulerTemplate{settingsHash: "bbbbbbbb22", image: "img:v1"}
	steps := []struct {
		old, desired schedulerTemplate
		want         string
	}{
		{old: v1, desired: v1, want: ""},
		{old: v1, desired: v2, want: "Deployment p-scheduler rolled: settings hash aaaaaaaa -> bbbbbbbb"},
		{old: v1, desired: v2, want: ""}, // stale cache: already announced
		{old: v2, desired: v2, want: ""},
		{old: v2, desired: v1, want: "Deployment p-scheduler rolled: settings hash bbbbbbbb -> aaaaaaaa"},
	}
	for i, s := range steps {
		got := a.message(pool, "p-scheduler", s.old, s.desired)
		if got != s.want {
			t.Errorf("step %d: message = %q, want %q", i, got, s.want)
		}
		a.remember(pool, s.desired)
	}
	a.forget(pool)
	if got := a.message(pool, "p-scheduler", v2, v1); got == "" {
		t.Error("after forget: roll not announced")
	}
}

func TestTemplateOf(t *testing.T) {
	d := &appsv1.Deployment{}
	d.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationSettingsHash: "h"}
	d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "sidecar", Image: "other"}, {Name: render.ContainerName, Image: "img"}}
	got := templateOf(d)
	if got.settingsHash != "h" || got.image != "img" {
		t.Errorf("templateOf: settings hash %q, image %q; want h, img", got.settingsHash, got.image)
	}
	if got.podHash != podTemplateHash(&d.Spec.Template) || len(got.podHash) != 64 {
		t.Errorf("templateOf: podHash %q, want the 64 hex digits %q", got.podHash, podTemplateHash(&d.Spec.Template))
	}
	if got.pod == nil || got.pod == &d.Spec.Template || !cmp.Equal(*got.pod, d.Spec.Template) {
		t.Errorf("templateOf: pod %p, want a copy of %p", got.pod, &d.Spec.Template)
	}
	// The template is taken when templateOf is called: the server-side
	// apply that follows overwrites d.
	d.Spec.Template.Spec.Containers[1].Image = "img:v2"
	if got.image != "img" || got.pod.Spec.Containers[1].Image != "img" {
		t.Errorf("templateOf result follows a later change of d: image %q, pod image %q", got.image, got.pod.Spec.Containers[1].Image)
	}
}

// TestComputePoolStatus: the status phase's input is the objects phase's
// result only; observedGeneration follows metadata.generation.
func TestComputePoolStatus(t *testing.T) {
	pool := &v1alpha1.ProviderPool{}
	pool.Name, pool.Generation = "p", 7
	pool.Status.ObservedGeneration = 6
	got := computePoolStatus(pool, objectsResult{applyErr: errors.New("forbidden")}, t0)
	want := []metav1.Condition{
		{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted, Message: "ProviderPool accepted", ObservedGeneration: 7, LastTransitionTime: t0},
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonRenderFailed, Message: "forbidden", ObservedGeneration: 7, LastTransitionTime: t0},
	}
	if diff := cmp.Diff(want, got.Status.Conditions); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	if got.Status.ObservedGeneration != 7 {
		t.Errorf("observedGeneration = %d, want 7", got.Status.ObservedGeneration)
	}
	if pool.Status.ObservedGeneration != 6 || len(pool.Status.Conditions) != 0 {
		t.Error("computePoolStatus modified its input")
	}
}

func TestComputeTenantStatus(t *testing.T) {
	tq := &v1alpha1.TenantQuota{}
	tq.Name, tq.Namespace, tq.Generation, tq.Spec.PoolRef.Name = "a", "ns", 3, "p"
	got := computeTenantStatus(tq, nil, nil, t0)
	want := []metav1.Condition{
		{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotFound, ObservedGeneration: 3, LastTransitionTime: t0},
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNotAccepted, ObservedGeneration: 3, LastTransitionTime: t0},
		{Type: v1alpha1.ConditionServing, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPoolNotFound, ObservedGeneration: 3, LastTransitionTime: t0},
	}
	if diff := cmp.Diff(want, got.Status.Conditions, cmpopts.IgnoreFields(metav1.Condition{}, "Message")); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	if got.Status.ObservedGeneration != 3 || len(tq.Status.Conditions) != 0 {
		t.Errorf("observedGeneration = %d (want 3); input conditions %v (want none)", got.Status.ObservedGeneration, tq.Status.Conditions)
	}
}

// poolEvents returns the events recorded on the pool with reason, oldest first.
func poolEvents(ns, pool, reason string) ([]corev1.Event, error) {
	var list corev1.EventList
	if err := k8sClient.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "ProviderPool" && e.InvolvedObject.Name == pool && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out, nil
}

// waitEvent waits for an event on the pool with reason and message and
// returns it.
func waitEvent(t *testing.T, ns, pool, reason, message string) corev1.Event {
	t.Helper()
	var found corev1.Event
	eventually(t, reason+" event "+message, func() error {
		events, err := poolEvents(ns, pool, reason)
		if err != nil {
			return err
		}
		var msgs []string
		for _, e := range events {
			if e.Message == message {
				found = e
				return nil
			}
			msgs = append(msgs, e.Message)
		}
		return fmt.Errorf("events %s: %q", reason, msgs)
	})
	return found
}

// TestProviderPoolSchedulerRolledEvent: a settings change and then an image
// change of an existing pool each record one Normal SchedulerRolled event
// naming what changed; creating the Deployment records none.
func TestProviderPoolSchedulerRolledEvent(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "evt")
	create(t, pool)
	d := &appsv1.Deployment{}
	eventually(t, "Deployment", func() error {
		return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "evt-scheduler"}, d)
	})
	hash1 := d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.StatusIntervalSeconds = 20 })
	hash2 := render.Settings(pool).Hash()
	if hash2 == hash1 {
		t.Fatal("fixture: the new settings hash equals the old one")
	}
	e := waitEvent(t, ns, "evt", v1alpha1.ReasonSchedulerRolled,
		fmt.Sprintf("Deployment evt-scheduler rolled: settings hash %s -> %s", hash1[:8], hash2[:8]))
	if e.Type != corev1.EventTypeNormal || e.Source.Component != EventSource {
		t.Errorf("event type %s from %q, want Normal from %q", e.Type, e.Source.Component, EventSource)
	}

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.Image = "registry.example/fairshare:v0.2.0" })
	if got := render.Settings(pool).Hash(); got != hash2 {
		t.Fatalf("fixture: the image changed the settings hash %s -> %s", hash2, got)
	}
	waitEvent(t, ns, "evt", v1alpha1.ReasonSchedulerRolled,
		"Deployment evt-scheduler rolled: image "+testRenderOptions.DefaultImage+" -> registry.example/fairshare:v0.2.0")

	// Two rolls, two events, each recorded once (count 1: the recorder
	// folds a repeated event into its count).
	events, err := poolEvents(ns, "evt", v1alpha1.ReasonSchedulerRolled)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%d %s", e.Count, strings.TrimPrefix(e.Message, "Deployment evt-scheduler rolled: ")))
	}
	want := []string{
		fmt.Sprintf("1 settings hash %s -> %s", hash1[:8], hash2[:8]),
		"1 image " + testRenderOptions.DefaultImage + " -> registry.example/fairshare:v0.2.0",
	}
	if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("SchedulerRolled events (-want +got):\n%s", diff)
	}
}
