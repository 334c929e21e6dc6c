// Package controllers holds the operator's two reconcilers, one per kind:
//
//   - ProviderPoolReconciler renders each ProviderPool into its scheduler
//     objects (internal/render) and applies them with server-side apply under
//     the field manager "fairshare-controller"; it then sets the pool's
//     Accepted and Ready conditions from the Deployment's availability.
//   - TenantQuotaReconciler checks that a TenantQuota's pool exists and that
//     its effective tenant id is unique within the pool, and sets its Accepted
//     and Ready conditions.
//
// Both write status the same way (see applyStatus): server-side apply on the
// status subresource, sending only the operator's conditions (Accepted,
// Ready) and status.observedGeneration, and only when they changed
// semantically. The scheduler's conditions (Serving, Throttled) and live
// figures, applied under "fairshare-scheduler", are never touched, and an
// unchanged object is never written (regression case BC-42: an unconditional
// status write with a fresh lastTransitionTime re-triggers the reconciler and
// becomes a hot loop).
//
// Each Reconcile runs the phases get, reconcile (objects, or lookups),
// compute (computePoolStatus, computeTenantStatus: pure, built from the
// set*Condition functions taking the object, its inputs and the time, and
// table-tested) and patch (one status apply, only on change); the envtest suite in
// suite_test.go runs both reconcilers against a real kube-apiserver and etcd.
package controllers
