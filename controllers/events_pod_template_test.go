package controllers

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// TestSchedulerRolledEventOnResourcesChange: docs/api.md says a
// SchedulerRolled event is recorded when "the operator changed the pod
// template of the existing scheduler Deployment, which rolls its pods".
// Changing spec.scheduler.resources changes the pod template (the pods
// roll) but neither the settings hash nor the image: the event says "pod
// template changed". A later image change (announced too) orders the
// events: once it is seen, the resources roll's event has been recorded.
func TestSchedulerRolledEventOnResourcesChange(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "res")
	create(t, pool)
	key := types.NamespacedName{Namespace: ns, Name: "res-scheduler"}
	d := &appsv1.Deployment{}
	eventually(t, "Deployment", func() error { return k8sClient.Get(context.Background(), key, d) })
	hash := d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]

	updateWithRetry(t, pool, func() {
		pool.Spec.Scheduler.Resources = &corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("321Mi")}}
	})
	eventually(t, "resources in the pod template", func() error {
		if err := k8sClient.Get(context.Background(), key, d); err != nil {
			return err
		}
		q := d.Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
		if q.String() != "321Mi" {
			return fmt.Errorf("memory limit %q", q.String())
		}
		return nil
	})
	if got := d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]; got != hash {
		t.Fatalf("fixture: the resources changed the settings hash %s -> %s", hash, got)
	}

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.Image = "registry.example/fairshare:v0.3.0" })
	waitEvent(t, ns, "res", v1alpha1.ReasonSchedulerRolled,
		"Deployment res-scheduler rolled: image "+testRenderOptions.DefaultImage+" -> registry.example/fairshare:v0.3.0")

	events, err := poolEvents(ns, "res", v1alpha1.ReasonSchedulerRolled)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int32{}
	for _, e := range events {
		got[e.Message] += e.Count
	}
	want := map[string]int32{
		"Deployment res-scheduler rolled: pod template changed":                                                              1,
		"Deployment res-scheduler rolled: image " + testRenderOptions.DefaultImage + " -> registry.example/fairshare:v0.3.0": 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SchedulerRolled events, message -> count (-want +got):\n%s", diff)
	}
}

// TestRollAnnouncerRevertWhileCacheStale: after a roll A -> B, a revert to
// A reconciled while the cache still shows A (it has not yet seen the
// apply of B) rolls the pods back and is announced as B -> A: the roll is
// from the template last applied, not from the cache.
func TestRollAnnouncerRevertWhileCacheStale(t *testing.T) {
	var an rollAnnouncer
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	a := schedulerTemplate{settingsHash: "aaaaaaaa11", image: "img:v1", podHash: "pa"}
	b := schedulerTemplate{settingsHash: "bbbbbbbb22", image: "img:v1", podHash: "pb"}
	an.remember(pool, a)
	if got, want := an.message(pool, "p-scheduler", a, b), "Deployment p-scheduler rolled: settings hash aaaaaaaa -> bbbbbbbb"; got != want {
		t.Errorf("A -> B: message %q, want %q", got, want)
	}
	an.remember(pool, b)
	if got, want := an.message(pool, "p-scheduler", a, a), "Deployment p-scheduler rolled: settings hash bbbbbbbb -> aaaaaaaa"; got != want {
		t.Errorf("B -> A with the cache showing A: message %q, want %q", got, want)
	}
	// A change of the template alone (resources), same cache lag.
	an.remember(pool, a)
	c := a
	c.podHash = "pc"
	if got, want := an.message(pool, "p-scheduler", a, c), "Deployment p-scheduler rolled: pod template changed"; got != want {
		t.Errorf("A -> C (template only): message %q, want %q", got, want)
	}
	an.remember(pool, c)
	if got := an.message(pool, "p-scheduler", a, c); got != "" {
		t.Errorf("C again with the cache showing A: message %q, want none", got)
	}
}

// TestRollAnnouncerFirstReconcileComparesWithCluster: with no template
// remembered (the operator just started), the rendered template is
// compared with the Deployment in the cluster, which carries the API
// server's defaults: an unchanged pool announces nothing, a resources
// change announces "pod template changed".
func TestRollAnnouncerFirstReconcileComparesWithCluster(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "first")
	pool.Spec.Scheduler.Resources = &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
	create(t, pool)
	key := types.NamespacedName{Namespace: ns, Name: "first-scheduler"}
	cur := &appsv1.Deployment{}
	eventually(t, "Deployment", func() error { return k8sClient.Get(context.Background(), key, cur) })
	get(t, ns, "first", pool)

	rendered := func() *appsv1.Deployment {
		objs, err := render.Render(pool, testRenderOptions)
		if err != nil {
			t.Fatal(err)
		}
		return objs.Deployment
	}
	poolKey := types.NamespacedName{Namespace: ns, Name: "first"}
	var an rollAnnouncer
	if templateOf(cur).podHash == templateOf(rendered()).podHash {
		t.Fatal("fixture: the API server added no default to the pod template")
	}
	if got := an.message(poolKey, key.Name, templateOf(cur), templateOf(rendered())); got != "" {
		t.Errorf("unchanged pool: message %q, want none", got)
	}
	pool.Spec.Scheduler.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("200m")
	if got, want := an.message(poolKey, key.Name, templateOf(cur), templateOf(rendered())), "Deployment first-scheduler rolled: pod template changed"; got != want {
		t.Errorf("cpu request 100m -> 200m: message %q, want %q", got, want)
	}
	pool.Spec.Scheduler.Image = "registry.example/fairshare:v0.4.0"
	if got, want := an.message(poolKey, key.Name, templateOf(cur), templateOf(rendered())),
		"Deployment first-scheduler rolled: image "+testRenderOptions.DefaultImage+" -> registry.example/fairshare:v0.4.0"; got != want {
		t.Errorf("image change: message %q, want %q", got, want)
	}
}

// TestAppliedIn: a rendered template is contained in the cluster's copy
// that adds defaults; a changed value, a list item the template dropped or
// a field the cluster lacks is a change.
func TestAppliedIn(t *testing.T) {
	desired := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "scheduler", Image: "img:v1",
		Env:       []corev1.EnvVar{{Name: "A", Value: "1"}},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.1")}},
	}}}}
	cluster := desired.DeepCopy()
	cluster.Spec.DNSPolicy = corev1.DNSClusterFirst
	cluster.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	cluster.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("100m")
	if !appliedIn(desired, cluster) {
		t.Error("cluster copy with defaults and 0.1 CPU written 100m: not contained")
	}

	changed := desired.DeepCopy()
	changed.Spec.Containers[0].Env[0].Value = "2"
	extra := desired.DeepCopy()
	extra.Spec.ServiceAccountName = "other"
	clusterWithB := cluster.DeepCopy()
	clusterWithB.Spec.Containers[0].Env = append(clusterWithB.Spec.Containers[0].Env, corev1.EnvVar{Name: "B", Value: "2"})
	for name, tc := range map[string]struct{ desired, cluster *corev1.PodTemplateSpec }{
		"changed env value":              {changed, cluster},
		"field the cluster lacks":        {extra, cluster},
		"env var B dropped from desired": {desired, clusterWithB},
	} {
		if appliedIn(tc.desired, tc.cluster) {
			t.Errorf("%s: contained, want a change", name)
		}
	}
}
