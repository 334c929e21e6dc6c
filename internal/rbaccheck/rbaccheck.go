// Package rbaccheck checks at start that a binary holds the RBAC permissions
// of its version, before its informers start: one SelfSubjectAccessReview
// (authorization.k8s.io/v1) per permission, the permissions read from the
// shipped Role and ClusterRole manifests (config/rbac, embedded by package
// github.com/fairshare-dev/fairshare/config/rbac), so that the list cannot
// drift from the RBAC the binary was built with.
//
// Without it, a binary upgraded past its RBAC (an older chart's ClusterRole)
// logs "forbidden" list errors from its informers and exits only when the
// cache sync times out, minutes later, without naming the permission. With
// it, the binary exits at once with a MissingError naming every missing
// permission and the RBAC to apply.
package rbaccheck

import (
	"context"
	"fmt"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// Timeout bounds a whole Run (every review): 1 minute. An API server that
// does not answer by then fails the start with an error, as the binary's
// own first requests would.
const Timeout = time.Minute

// Permission is one verb on one resource, as one SelfSubjectAccessReview
// asks it (ResourceAttributes).
type Permission struct {
	// Verb is the API verb (get, list, watch, create, update, patch,
	// delete, bind, ...).
	Verb string
	// Group is the API group; "" is the core group.
	Group string
	// Resource is the resource's plural name (secrets, deployments).
	Resource string
	// Subresource is the subresource (status, finalizers), or "".
	Subresource string
	// Name is the object name a rule's resourceNames restricts the verb to,
	// or "" for any.
	Name string
	// Namespace is the namespace the permission is needed in; "" is
	// cluster-wide (every namespace).
	Namespace string
}

// String is the permission as the error names it: "verb group/resource",
// the core group's resources without a group ("list secrets"), a
// subresource after a slash ("patch quota.fairshare.dev/providerpools/status"),
// then ` named NAME` for a rule's resourceName and ` in namespace NS` for a
// namespaced permission.
func (p Permission) String() string {
	var b strings.Builder
	b.WriteString(p.Verb)
	b.WriteByte(' ')
	if p.Group != "" {
		b.WriteString(p.Group)
		b.WriteByte('/')
	}
	b.WriteString(p.Resource)
	if p.Subresource != "" {
		b.WriteByte('/')
		b.WriteString(p.Subresource)
	}
	if p.Name != "" {
		b.WriteString(" named ")
		b.WriteString(p.Name)
	}
	if p.Namespace != "" {
		b.WriteString(" in namespace ")
		b.WriteString(p.Namespace)
	}
	return b.String()
}

// Set is the permissions that one shipped Role or ClusterRole grants.
type Set struct {
	// Source names that Role or ClusterRole in the error, for example "the
	// operator's ClusterRole (config/rbac/role.yaml, the chart's
	// <release>-manager)".
	Source string
	// Permissions are checked in this order.
	Permissions []Permission
}

// FromRole returns the permissions the rules of a Role or ClusterRole
// manifest (YAML) grant, one per (apiGroup, resource, verb, resourceName)
// of each rule, in the manifest's order, each needed in namespace ("" for
// cluster-wide). A resource "pods/log" is the resource pods with the
// subresource log. It returns an error for a manifest that does not parse,
// holds no rules, or has a rule with nonResourceURLs (no resource to
// review) or without apiGroups, resources or verbs.
func FromRole(manifest []byte, namespace string) ([]Permission, error) {
	var role struct {
		Kind  string              `json:"kind"`
		Rules []rbacv1.PolicyRule `json:"rules"`
	}
	if err := yaml.Unmarshal(manifest, &role); err != nil {
		return nil, fmt.Errorf("parsing the RBAC manifest: %w", err)
	}
	if len(role.Rules) == 0 {
		return nil, fmt.Errorf("the RBAC manifest (kind %q) has no rules", role.Kind)
	}
	var perms []Permission
	for i, r := range role.Rules {
		if len(r.NonResourceURLs) > 0 {
			return nil, fmt.Errorf("rule %d of the RBAC manifest has nonResourceURLs, which this check cannot review", i)
		}
		if len(r.APIGroups) == 0 || len(r.Resources) == 0 || len(r.Verbs) == 0 {
			return nil, fmt.Errorf("rule %d of the RBAC manifest lacks apiGroups, resources or verbs", i)
		}
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				for _, v := range r.Verbs {
					for _, n := range names {
						perms = append(perms, Permission{Verb: v, Group: g, Resource: resource, Subresource: sub, Name: n, Namespace: namespace})
					}
				}
			}
		}
	}
	return perms, nil
}

// Missing is a permission a review did not allow, with the Source of the
// Set that lists it.
type Missing struct {
	Permission Permission
	Source     string
}

// MissingError is the error of a Check that found permissions missing. Its
// message names every missing permission (Permission.String), grouped by
// the source that grants it, then Remedy:
//
//	missing RBAC permissions: list secrets, watch secrets (granted by SOURCE); ... REMEDY
type MissingError struct {
	// Missing are the permissions not allowed, in the order of the sets and
	// of their permissions.
	Missing []Missing
	// Remedy tells what to do.
	Remedy string
}

func (e *MissingError) Error() string {
	var b strings.Builder
	b.WriteString("missing RBAC permissions: ")
	for i, m := range e.Missing {
		if i > 0 {
			if m.Source == e.Missing[i-1].Source {
				b.WriteString(", ")
			} else {
				fmt.Fprintf(&b, " (granted by %s); ", e.Missing[i-1].Source)
			}
		}
		b.WriteString(m.Permission.String())
	}
	if n := len(e.Missing); n > 0 {
		fmt.Fprintf(&b, " (granted by %s)", e.Missing[n-1].Source)
	}
	b.WriteString(". ")
	b.WriteString(e.Remedy)
	return b.String()
}

// Check asks reviews, with one SelfSubjectAccessReview per permission of
// sets, whether the caller holds each one. It returns nil when every
// review allows its permission, a *MissingError listing those that were
// not allowed (denied, or no authorizer had an opinion) with remedy, or an
// error naming the permission whose review could not be made (API server
// unreachable, ctx done).
func Check(ctx context.Context, reviews authorizationv1client.SelfSubjectAccessReviewInterface, sets []Set, remedy string) error {
	var missing []Missing
	for _, s := range sets {
		for _, p := range s.Permissions {
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: p.Namespace, Verb: p.Verb, Group: p.Group, Resource: p.Resource,
					Subresource: p.Subresource, Name: p.Name,
				},
			}}
			got, err := reviews.Create(ctx, review, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("reviewing the RBAC permission %q: %w", p.String(), err)
			}
			if !got.Status.Allowed {
				missing = append(missing, Missing{Permission: p, Source: s.Source})
			}
		}
	}
	if len(missing) > 0 {
		return &MissingError{Missing: missing, Remedy: remedy}
	}
	return nil
}

// Run is Check with a client of cfg (its identity: the binary's
// ServiceAccount in a cluster), bounded by Timeout. Its reviews are paced
// at 50 per second (burst 100) whatever cfg's own rate limit, so that the
// check of some sixty permissions takes no more than a round trip each.
// Errors: Check's, or the client's construction error.
func Run(ctx context.Context, cfg *rest.Config, sets []Set, remedy string) error {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the RBAC check's client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	return Check(ctx, cs.AuthorizationV1().SelfSubjectAccessReviews(), sets, remedy)
}
