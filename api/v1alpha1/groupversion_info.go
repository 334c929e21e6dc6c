// Package v1alpha1 holds the quota.fairshare.dev/v1alpha1 API: ProviderPool
// (one upstream LLM provider account shared by many tenants) and TenantQuota
// (one tenant's plan on a pool).
//
// The package imports only k8s.io/apimachinery and k8s.io/api, so that any
// client can vendor it.
//
// +kubebuilder:object:generate=true
// +groupName=quota.fairshare.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API: quota.fairshare.dev/v1alpha1.
	GroupVersion = schema.GroupVersion{Group: "quota.fairshare.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's Go types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's types to a scheme; it returns an error only
	// when a type is registered twice under different names.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&ProviderPool{}, &ProviderPoolList{},
		&TenantQuota{}, &TenantQuotaList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
