package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// credentialsPool returns a pool of namespace ns whose provider key is key
// of Secret secret.
func credentialsPool(ns, name, secret, key string) *v1alpha1.ProviderPool {
	pool := makePool(ns, name)
	pool.Spec.Upstream.CredentialsSecretRef = &v1alpha1.SecretKeyRef{Name: secret, Key: key}
	return pool
}

// TestProviderSecretProblem: the provider Secret's check names the Secret
// and the key, tells a missing Secret from a missing key and from an empty
// value, and never quotes a value.
func TestProviderSecretProblem(t *testing.T) {
	const value = "sk-provider-value-never-shown"
	secret := func(data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "provider-key"}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	tests := map[string]struct {
		secret      *corev1.Secret
		key         string
		wantProblem secretProblem
	}{
		"no Secret": {
			key: "api-key",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretNotFound,
				message: `Secret ns/provider-key (spec.upstream.credentialsSecretRef) does not exist: the scheduler's pods cannot start until it is created with the provider key under key "api-key"`},
		},
		"no such key": {
			secret: secret(map[string]string{"token": value}), key: "api-key",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has no key "api-key" (spec.upstream.credentialsSecretRef.key; the Secret's keys: "token"): the scheduler's pods cannot start until the provider key is added under it`},
		},
		"empty value": {
			secret: secret(map[string]string{"api-key": ""}), key: "api-key",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has an empty value under key "api-key" (spec.upstream.credentialsSecretRef.key): the scheduler has no provider key until it is set`},
		},
		"whitespace only (the scheduler trims it)": {
			secret: secret(map[string]string{"api-key": " \n"}), key: "api-key",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has an empty value under key "api-key" (spec.upstream.credentialsSecretRef.key): the scheduler has no provider key until it is set`},
		},
		"no keys at all": {
			secret: secret(nil), key: "api-key",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has no key "api-key" (spec.upstream.credentialsSecretRef.key; the Secret has no keys): the scheduler's pods cannot start until the provider key is added under it`},
		},
		"ten keys: eight listed": {
			secret: secret(map[string]string{"k0": "", "k1": "", "k2": "", "k3": "", "k4": "", "k5": "", "k6": "", "k7": "", "k8": "", "k9": ""}), key: "api-key",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has no key "api-key" (spec.upstream.credentialsSecretRef.key; the Secret's keys: "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7" and 2 more): the scheduler's pods cannot start until the provider key is added under it`},
		},
		"the key": {secret: secret(map[string]string{"api-key": value}), key: "api-key"},
		"another key named by the pool": {
			secret: secret(map[string]string{"api-key": value}), key: "openai",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has no key "openai" (spec.upstream.credentialsSecretRef.key; the Secret's keys: "api-key"): the scheduler's pods cannot start until the provider key is added under it`},
		},
		"key left empty in a stored pool: the default api-key": {
			secret: secret(map[string]string{"token": value}), key: "",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has no key "api-key" (spec.upstream.credentialsSecretRef.key; the Secret's keys: "token"): the scheduler's pods cannot start until the provider key is added under it`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := fake.NewClientBuilder()
			if tc.secret != nil {
				b = b.WithObjects(tc.secret)
			}
			r := NewProviderPoolReconciler(nil, nil, nil, WithAPIReader(b.Build()))
			got, err := r.providerSecretProblem(context.Background(), credentialsPool("ns", "p", "provider-key", tc.key))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantProblem, got, cmp.AllowUnexported(secretProblem{})); diff != "" {
				t.Errorf("problem (-want +got):\n%s", diff)
			}
			if strings.Contains(got.message, value) {
				t.Errorf("message %q quotes the Secret's value", got.message)
			}
		})
	}

	t.Run("no credentialsSecretRef, or no API reader: nothing to check", func(t *testing.T) {
		r := NewProviderPoolReconciler(nil, nil, nil, WithAPIReader(fake.NewClientBuilder().Build()))
		if got, err := r.providerSecretProblem(context.Background(), makePool("ns", "p")); err != nil || got != (secretProblem{}) {
			t.Errorf("pool without a Secret: %+v, %v; want no problem", got, err)
		}
		r = NewProviderPoolReconciler(nil, nil, nil)
		if got, err := r.providerSecretProblem(context.Background(), credentialsPool("ns", "p", "provider-key", "api-key")); err != nil || got != (secretProblem{}) {
			t.Errorf("without an API reader: %+v, %v; want no problem", got, err)
		}
	})

	t.Run("a failed read is an error, not a problem", func(t *testing.T) {
		forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "provider-key", fmt.Errorf("no"))
		c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return forbidden
			},
		}).Build()
		r := NewProviderPoolReconciler(nil, nil, nil, WithAPIReader(c))
		got, err := r.providerSecretProblem(context.Background(), credentialsPool("ns", "p", "provider-key", "api-key"))
		if !apierrors.IsForbidden(err) || got != (secretProblem{}) {
			t.Errorf("got %+v, %v; want no problem and the Forbidden error", got, err)
		}
	})
}

// TestStripSecret: the cache keeps no Secret data: a watched Secret's
// metadata loses its annotations (kubectl apply's last-applied-configuration
// holds the data) and managedFields, a full Secret also its data.
func TestStripSecret(t *testing.T) {
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Namespace: "ns", Name: "provider-key", ResourceVersion: "7", Labels: map[string]string{"team": "a"},
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"api-key":"c2stc2VjcmV0"}}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		}
	}
	wantMeta := metav1.ObjectMeta{Namespace: "ns", Name: "provider-key", ResourceVersion: "7", Labels: map[string]string{"team": "a"}}

	partial := &metav1.PartialObjectMetadata{ObjectMeta: meta()}
	if _, err := stripSecret(partial); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantMeta, partial.ObjectMeta); diff != "" {
		t.Errorf("metadata (-want +got):\n%s", diff)
	}

	full := &corev1.Secret{ObjectMeta: meta(), Data: map[string][]byte{"api-key": []byte("sk-secret")}, StringData: map[string]string{"x": "y"}}
	if _, err := stripSecret(full); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&corev1.Secret{ObjectMeta: wantMeta}, full); diff != "" {
		t.Errorf("Secret (-want +got):\n%s", diff)
	}
}

// TestRecordTransitionsProviderSecret: a provider Secret problem is one
// Warning event with its reason and message when Ready starts to report it,
// False or (a replica still running) True; not again while it stays, again
// when it changes; a pool that loses Ready for it gets that one event, and
// one that loses Ready after the problem was reported (its last replica
// stopped) gets the usual Warning of a lost Ready, with the same reason.
func TestRecordTransitionsProviderSecret(t *testing.T) {
	noSecret := secretProblem{reason: v1alpha1.ReasonProviderSecretNotFound, message: "Secret ns/k does not exist"}
	noKey := secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing, message: `Secret ns/k has no key "api-key"`}
	ready := func(status metav1.ConditionStatus, reason, msg string) []metav1.Condition {
		return []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg}}
	}
	progressing := ready(metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing, "Waiting for Deployment p-scheduler")
	available := "Deployment p-scheduler has 1 of 1 required replicas available"
	tests := map[string]struct {
		old, new   []metav1.Condition
		secret     secretProblem
		wantEvents []string
	}{
		"new pool, Secret missing": {
			new: ready(metav1.ConditionFalse, noSecret.reason, noSecret.message), secret: noSecret,
			wantEvents: []string{"Warning ProviderSecretNotFound Secret ns/k does not exist"},
		},
		"Secret created without the key": {
			old: ready(metav1.ConditionFalse, noSecret.reason, noSecret.message), new: ready(metav1.ConditionFalse, noKey.reason, noKey.message), secret: noKey,
			wantEvents: []string{`Warning ProviderSecretKeyMissing Secret ns/k has no key "api-key"`},
		},
		"same problem, another status write": {
			old: ready(metav1.ConditionFalse, noKey.reason, noKey.message), new: ready(metav1.ConditionFalse, noKey.reason, noKey.message), secret: noKey,
		},
		"key added: no Warning": {
			old: ready(metav1.ConditionFalse, noKey.reason, noKey.message), new: progressing,
		},
		"Ready lost for the Secret: one Warning": {
			old: ready(metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable, available), new: ready(metav1.ConditionFalse, noSecret.reason, noSecret.message), secret: noSecret,
			wantEvents: []string{"Warning ProviderSecretNotFound Secret ns/k does not exist"},
		},
		"key removed while a replica runs": {
			old: ready(metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable, available),
			new: ready(metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable, available+"; "+noKey.message), secret: noKey,
			wantEvents: []string{`Warning ProviderSecretKeyMissing Secret ns/k has no key "api-key"`},
		},
		"the running replica then stops: Ready lost is announced": {
			old: ready(metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable, available+"; "+noKey.message),
			new: ready(metav1.ConditionFalse, noKey.reason, noKey.message), secret: noKey,
			wantEvents: []string{`Warning ProviderSecretKeyMissing Secret ns/k has no key "api-key"`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := record.NewFakeRecorder(8)
			r := NewProviderPoolReconciler(nil, nil, rec)
			r.recordTransitions(&v1alpha1.ProviderPool{}, tc.old, tc.new, tc.secret)
			close(rec.Events)
			var got []string
			for e := range rec.Events {
				got = append(got, e)
			}
			if diff := cmp.Diff(tc.wantEvents, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// wantReadyExactly returns a check that obj's Ready condition has exactly
// status, reason and message.
func wantReadyExactly(obj client.Object, status metav1.ConditionStatus, reason, message string) func() error {
	return func() error {
		if err := wantCondition(obj, v1alpha1.ConditionReady, status, reason)(); err != nil {
			return err
		}
		var conds []metav1.Condition
		switch o := obj.(type) {
		case *v1alpha1.ProviderPool:
			conds = o.Status.Conditions
		case *v1alpha1.TenantQuota:
			conds = o.Status.Conditions
		}
		if msg := apimeta.FindStatusCondition(conds, v1alpha1.ConditionReady).Message; msg != message {
			return fmt.Errorf("Ready message %q, want %q", msg, message)
		}
		return nil
	}
}

// TestProviderSecretFollowedByWatch: a pool whose provider Secret is
// missing, then created without the key, then given the key, has Ready
// False ProviderSecretNotFound, then False ProviderSecretKeyMissing naming
// the key, then SchedulerProgressing, each with a Warning event for the
// problems, and its tenant's PoolNotReady message names each reason. Each
// step follows the Secret alone: the pool is not changed (same generation)
// and the operator does not poll, so only the watch of the Secret can
// trigger them (each change is made once the pool's reconciles have
// settled). The Deployment is rendered all along, mounting the key.
func TestProviderSecretFollowedByWatch(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	ns := newNamespace(t)
	pool := credentialsPool(ns, "creds", "provider-key", "openai")
	create(t, pool)
	tq := makeTenant(ns, "acme", "creds", "")
	create(t, tq)
	generation := pool.Generation

	notFound := fmt.Sprintf(`Secret %s/provider-key (spec.upstream.credentialsSecretRef) does not exist: the scheduler's pods cannot start until it is created with the provider key under key "openai"`, ns)
	eventually(t, "Ready=False ProviderSecretNotFound", wantReadyExactly(pool, metav1.ConditionFalse, v1alpha1.ReasonProviderSecretNotFound, notFound))
	waitEvent(t, ns, "creds", v1alpha1.ReasonProviderSecretNotFound, notFound)
	eventually(t, "tenant names ProviderSecretNotFound", wantReadyExactly(tq, metav1.ConditionFalse, v1alpha1.ReasonPoolNotReady,
		`ProviderPool "creds" is not Ready (ProviderSecretNotFound); see kubectl describe providerpool creds`))
	eventually(t, "the Deployment, mounting the key, although the Secret is missing", func() error {
		d := &appsv1.Deployment{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "creds-scheduler"}, d); err != nil {
			return err
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if s := v.Secret; s != nil && s.SecretName == "provider-key" && len(s.Items) == 1 && s.Items[0].Key == "openai" {
				return nil
			}
		}
		return fmt.Errorf("volumes %+v: none mounts key openai of Secret provider-key", d.Spec.Template.Spec.Volumes)
	})

	waitPoolQuiet(t, ns, "creds")
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "provider-key"}, StringData: map[string]string{"api-key": "sk-wrong-key-name"}}
	create(t, secret)
	keyMissing := fmt.Sprintf(`Secret %s/provider-key has no key "openai" (spec.upstream.credentialsSecretRef.key; the Secret's keys: "api-key"): the scheduler's pods cannot start until the provider key is added under it`, ns)
	eventually(t, "Ready=False ProviderSecretKeyMissing", wantReadyExactly(pool, metav1.ConditionFalse, v1alpha1.ReasonProviderSecretKeyMissing, keyMissing))
	waitEvent(t, ns, "creds", v1alpha1.ReasonProviderSecretKeyMissing, keyMissing)
	eventually(t, "tenant names ProviderSecretKeyMissing", wantReadyExactly(tq, metav1.ConditionFalse, v1alpha1.ReasonPoolNotReady,
		`ProviderPool "creds" is not Ready (ProviderSecretKeyMissing); see kubectl describe providerpool creds`))

	waitPoolQuiet(t, ns, "creds")
	updateWithRetry(t, secret, func() { secret.Data["openai"] = []byte("sk-provider") })
	eventually(t, "Ready=False SchedulerProgressing once the key is there", wantReadyExactly(pool, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing,
		"Deployment creds-scheduler has not yet observed generation 1")) // envtest runs no Deployment controller
	eventually(t, "tenant names SchedulerProgressing", wantReadyExactly(tq, metav1.ConditionFalse, v1alpha1.ReasonPoolNotReady,
		`ProviderPool "creds" is not Ready (SchedulerProgressing); see kubectl describe providerpool creds`))
	setDeploymentAvailable(t, ns, "creds-scheduler", 1)
	eventually(t, "Ready=True", wantReadyExactly(pool, metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable,
		"Deployment creds-scheduler has 1 of 1 required replicas available"))

	// The key removed while the replica runs: Ready stays True and says so.
	waitPoolQuiet(t, ns, "creds")
	updateWithRetry(t, secret, func() { delete(secret.Data, "openai") })
	eventually(t, "Ready=True naming the missing key", wantReadyExactly(pool, metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable,
		"Deployment creds-scheduler has 1 of 1 required replicas available; "+keyMissing))
	// The same message twice: the recorder counts it on one Event.
	eventually(t, "ProviderSecretKeyMissing recorded twice (the key missing, then removed)", func() error {
		events, err := poolEvents(ns, "creds", v1alpha1.ReasonProviderSecretKeyMissing)
		if err != nil {
			return err
		}
		n := int32(0)
		for _, e := range events {
			if e.Type != corev1.EventTypeWarning || e.Message != keyMissing {
				return fmt.Errorf("event %s %q, want Warning %q", e.Type, e.Message, keyMissing)
			}
			n += max(e.Count, 1)
		}
		if n != 2 {
			return fmt.Errorf("recorded %d times, want 2", n)
		}
		return nil
	})
	eventually(t, "tenant still Ready", wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPoolReady))

	get(t, ns, "creds", pool)
	if pool.Generation != generation {
		t.Errorf("pool generation %d, want %d: the test must not change the pool", pool.Generation, generation)
	}
}

// waitPoolQuiet waits until the operator has not reconciled the pool
// (every reconcile applies its Deployment) for a second, so that a change
// made next is seen only by the reconciles it triggers.
func waitPoolQuiet(t *testing.T, ns, pool string) {
	t.Helper()
	last, since := -1, time.Now()
	eventually(t, "no reconcile of "+pool+" for 1s", func() error {
		n := counter.Applies("Deployment", ns, pool+"-scheduler")
		if n != last {
			last, since = n, time.Now()
		}
		if n == 0 || time.Since(since) < time.Second {
			return fmt.Errorf("%d Deployment applies, the last %v ago", n, time.Since(since))
		}
		return nil
	})
}
