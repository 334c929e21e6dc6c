package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
				message: `Secret ns/provider-key has no key "api-key" (spec.upstream.credentialsSecretRef.key): the scheduler's pods cannot start until the provider key is added under it`},
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
		"the key": {secret: secret(map[string]string{"api-key": value}), key: "api-key"},
		"another key named by the pool": {
			secret: secret(map[string]string{"api-key": value}), key: "openai",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has no key "openai" (spec.upstream.credentialsSecretRef.key): the scheduler's pods cannot start until the provider key is added under it`},
		},
		"key left empty in a stored pool: the default api-key": {
			secret: secret(map[string]string{"token": value}), key: "",
			wantProblem: secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing,
				message: `Secret ns/provider-key has no key "api-key" (spec.upstream.credentialsSecretRef.key): the scheduler's pods cannot start until the provider key is added under it`},
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
