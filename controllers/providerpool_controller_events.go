package controllers

import (
	"fmt"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// shortHashLen is how many leading hex digits of a settings hash an event
// message shows (32 bits: enough to tell two settings apart at a glance).
const shortHashLen = 8

// schedulerTemplate is the part of the scheduler Deployment's pod template
// whose change the operator announces with a SchedulerRolled event: the
// settings hash annotation (v1alpha1.AnnotationSettingsHash) and the image
// of the scheduler container (render.ContainerName).
type schedulerTemplate struct {
	settingsHash string
	image        string
}

// templateOf returns d's schedulerTemplate.
func templateOf(d *appsv1.Deployment) schedulerTemplate {
	t := schedulerTemplate{settingsHash: d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == render.ContainerName {
			t.image = c.Image
		}
	}
	return t
}

// shortHash returns the first shortHashLen characters of h, or "none" when h is empty.
func shortHash(h string) string {
	switch {
	case h == "":
		return "none"
	case len(h) > shortHashLen:
		return h[:shortHashLen]
	}
	return h
}

// rollMessage returns the message of a SchedulerRolled event for a
// Deployment named name whose pod template goes from old to desired, naming
// each part that changed, e.g.
// "Deployment demo-scheduler rolled: settings hash 1a2b3c4d -> 5e6f7a8b; image a:v1 -> a:v2".
// It returns "" when nothing changed (no roll, no event).
func rollMessage(name string, old, desired schedulerTemplate) string {
	var parts []string
	if old.settingsHash != desired.settingsHash {
		parts = append(parts, fmt.Sprintf("settings hash %s -> %s", shortHash(old.settingsHash), shortHash(desired.settingsHash)))
	}
	if old.image != desired.image {
		parts = append(parts, fmt.Sprintf("image %s -> %s", old.image, desired.image))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("Deployment %s rolled: %s", name, strings.Join(parts, "; "))
}

// rollAnnouncer remembers, per pool (namespace and name), the scheduler pod template last
// announced by a SchedulerRolled event, so that a reconcile reading a
// Deployment from a cache that has not yet seen the operator's own apply
// does not announce the same roll twice.
type rollAnnouncer struct {
	mu   sync.Mutex
	last map[types.NamespacedName]schedulerTemplate
}

// message returns the event message for a roll of the Deployment name of
// pool from old to desired, or "" when nothing changed or a roll to desired
// was already announced (remember) for pool.
func (a *rollAnnouncer) message(pool types.NamespacedName, name string, old, desired schedulerTemplate) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.last[pool]; ok && last == desired {
		return ""
	}
	return rollMessage(name, old, desired)
}

// remember records desired as the pod template pool's Deployment was last
// applied with (announced, created, or found unchanged).
func (a *rollAnnouncer) remember(pool types.NamespacedName, desired schedulerTemplate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[types.NamespacedName]schedulerTemplate{}
	}
	a.last[pool] = desired
}

// forget drops pool (it is gone).
func (a *rollAnnouncer) forget(pool types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.last, pool)
}
