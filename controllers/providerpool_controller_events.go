package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// shortHashLen is how many leading hex digits of a settings hash an event
// message shows (32 bits: enough to tell two settings apart at a glance).
const shortHashLen = 8

// schedulerTemplate is the scheduler Deployment's pod template as the
// operator compares it to announce a roll with a SchedulerRolled event
// (docs/api.md, Events: any change of the pod template of the existing
// Deployment rolls its pods): a hash of the whole template, and the two
// parts an event message names, the settings hash annotation
// (v1alpha1.AnnotationSettingsHash) and the image of the scheduler
// container (render.ContainerName).
type schedulerTemplate struct {
	settingsHash string
	image        string
	// podHash is the hex SHA-256 of the JSON encoding of the whole pod
	// template (podTemplateHash). Two rendered templates are equal exactly
	// when their podHash is; a template read back from the API server
	// carries server-set defaults, so its podHash never equals the
	// rendered one (see rollAnnouncer.message).
	podHash string
	// pod is a copy of the template read back from the API server, kept
	// only for a comparison with the cluster's Deployment when no applied
	// template is remembered (see rollAnnouncer.message); nil in a
	// remembered template.
	pod *corev1.PodTemplateSpec
}

// podTemplateHash returns the hex SHA-256 of the JSON encoding of t (map
// keys sorted by encoding/json, so the hash is the same for equal templates).
func podTemplateHash(t *corev1.PodTemplateSpec) string {
	b, err := json.Marshal(t)
	if err != nil {
		// A PodTemplateSpec always encodes; an unencodable one is
		// different from every other.
		return "unencodable: " + err.Error()
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// templateOf returns d's schedulerTemplate, computed now (applying d with
// server-side apply overwrites it with the server's answer).
func templateOf(d *appsv1.Deployment) schedulerTemplate {
	t := schedulerTemplate{
		settingsHash: d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash],
		podHash:      podTemplateHash(&d.Spec.Template),
		pod:          d.Spec.Template.DeepCopy(),
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == render.ContainerName {
			t.image = c.Image
		}
	}
	return t
}

// appliedIn reports whether the pod template desired, as server-side apply
// sends it (its JSON encoding, which omits unset fields), is contained in
// cluster, a template read back from the API server: every field desired
// sets has the same value in cluster, and every list has as many items,
// each contained in the item at the same index. Fields only cluster has
// are the API server's defaults (probe periods, a volume's defaultMode,
// ...) or another field manager's. Quantities compare in their canonical
// form ("100m"), as both sides encode them.
func appliedIn(desired, cluster *corev1.PodTemplateSpec) bool {
	var d, c any
	for _, x := range []struct {
		t   *corev1.PodTemplateSpec
		out *any
	}{{desired, &d}, {cluster, &c}} {
		b, err := json.Marshal(x.t)
		if err != nil {
			return false
		}
		if err := json.Unmarshal(b, x.out); err != nil {
			return false
		}
	}
	return containedIn(d, c)
}

// containedIn reports whether the decoded JSON value d is contained in c
// (see appliedIn).
func containedIn(d, c any) bool {
	switch d := d.(type) {
	case map[string]any:
		cm, ok := c.(map[string]any)
		if !ok {
			return false
		}
		for k, dv := range d {
			cv, ok := cm[k]
			if !ok || !containedIn(dv, cv) {
				return false
			}
		}
		return true
	case []any:
		cl, ok := c.([]any)
		if !ok || len(cl) != len(d) {
			return false
		}
		for i := range d {
			if !containedIn(d[i], cl[i]) {
				return false
			}
		}
		return true
	}
	return d == c
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
// Deployment named name whose pod template goes from old to desired, given
// whether the pod template changed at all (podChanged). It names the
// settings hash and the image when they changed, e.g.
// "Deployment demo-scheduler rolled: settings hash 1a2b3c4d -> 5e6f7a8b; image a:v1 -> a:v2",
// and says "pod template changed" when neither did (resources, volumes, any
// other field of the template), e.g.
// "Deployment demo-scheduler rolled: pod template changed".
// It returns "" when nothing changed (no roll, no event).
func rollMessage(name string, old, desired schedulerTemplate, podChanged bool) string {
	var parts []string
	if old.settingsHash != desired.settingsHash {
		parts = append(parts, fmt.Sprintf("settings hash %s -> %s", shortHash(old.settingsHash), shortHash(desired.settingsHash)))
	}
	if old.image != desired.image {
		parts = append(parts, fmt.Sprintf("image %s -> %s", old.image, desired.image))
	}
	if len(parts) == 0 && podChanged {
		parts = append(parts, "pod template changed")
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("Deployment %s rolled: %s", name, strings.Join(parts, "; "))
}

// rollAnnouncer remembers, per pool (namespace and name), the scheduler pod
// template the operator last applied, and announces a roll by comparing the
// template about to be applied with it, not with the cached Deployment: a
// cache that has not yet seen the operator's own apply of B still shows A,
// which would announce A -> B twice, and would announce nothing for a quick
// revert to A although the pods roll back.
type rollAnnouncer struct {
	mu   sync.Mutex
	last map[types.NamespacedName]schedulerTemplate
}

// message returns the event message for a roll of the Deployment name of
// pool from its current template to desired (rendered, see templateOf), or
// "" when the template does not change. With a template remembered for pool
// (remember), the roll is from it (cached is ignored) and the comparison is
// of the whole template's hash. Otherwise (first reconcile since the
// operator started) the roll is from cached, the existing Deployment as
// read from the cluster: it changes when the settings hash or the image
// differ, or when desired is not contained in cached (appliedIn; fields
// cached has and desired lacks are the API server's defaults, so the
// removal of a field, e.g. of resources, is not seen then).
func (a *rollAnnouncer) message(pool types.NamespacedName, name string, cached, desired schedulerTemplate) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.last[pool]; ok {
		return rollMessage(name, last, desired, last.podHash != desired.podHash)
	}
	podChanged := cached.podHash != desired.podHash
	if cached.pod != nil && desired.pod != nil {
		podChanged = !appliedIn(desired.pod, cached.pod)
	}
	return rollMessage(name, cached, desired, podChanged)
}

// remember records desired as the pod template pool's Deployment was last
// applied with (announced, created, or found unchanged).
func (a *rollAnnouncer) remember(pool types.NamespacedName, desired schedulerTemplate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[types.NamespacedName]schedulerTemplate{}
	}
	desired.pod = nil // the hash is what a later message compares
	a.last[pool] = desired
}

// forget drops pool (it is gone).
func (a *rollAnnouncer) forget(pool types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.last, pool)
}
