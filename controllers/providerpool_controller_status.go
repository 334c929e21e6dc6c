package controllers

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// computePoolStatus returns a copy of pool with the operator-owned status
// it should have after the objects phase returned objs: the Accepted and
// Ready conditions (setAcceptedCondition, setReadyCondition, stamped now) and
// status.observedGeneration = metadata.generation. It makes no API call.
func computePoolStatus(pool *v1alpha1.ProviderPool, objs objectsResult, now metav1.Time) *v1alpha1.ProviderPool {
	desired := pool.DeepCopy()
	setAcceptedCondition(desired, objs.renderErr, now)
	setReadyCondition(desired, objs.deployment, errors.Join(objs.renderErr, objs.applyErr), objs.providerSecret, now)
	desired.Status.ObservedGeneration = pool.Generation
	return desired
}

// setAcceptedCondition sets the pool's Accepted condition: False with reason
// InvalidSpec and the render error as message when renderErr wraps
// render.ErrInvalidPool (the spec or name cannot be rendered), True with
// reason Accepted otherwise.
func setAcceptedCondition(pool *v1alpha1.ProviderPool, renderErr error, now metav1.Time) {
	cond := metav1.Condition{
		Type:               v1alpha1.ConditionAccepted,
		Status:             metav1.ConditionTrue,
		Reason:             v1alpha1.ReasonAccepted,
		Message:            "ProviderPool accepted",
		ObservedGeneration: pool.Generation,
	}
	if errors.Is(renderErr, render.ErrInvalidPool) {
		cond.Status = metav1.ConditionFalse
		cond.Reason = v1alpha1.ReasonInvalidSpec
		cond.Message = oneLine(renderErr)
	}
	setCondition(&pool.Status.Conditions, cond, now)
}

// oneLine is err's message on one line: the errors that errors.Join put on
// separate lines (a spec with several faults) separated by "; ", so that
// kubectl describe and kubectl get -o wide show a condition message
// whole, indented with its condition.
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// setReadyCondition sets the pool's Ready condition from the applied
// Deployment:
//   - False RenderFailed when err (render or apply) is non-nil;
//   - False SchedulerProgressing while the Deployment is unknown;
//   - True SchedulerAvailable when status.availableReplicas reaches
//     requiredAvailable(deployment), also while the Deployment's
//     controller has not observed its current generation (the message
//     says so): its replicas serve until it does;
//   - False SchedulerProgressing while that generation is not observed and
//     too few replicas are available;
//   - else False with secret's reason and message (ProviderSecretNotFound,
//     ProviderSecretKeyMissing) when secret has one: the pods cannot start
//     without the provider key, which is why none is available;
//   - else False SchedulerProgressing, the message completed with what the
//     Deployment's ReplicaFailure and Progressing conditions say keeps its
//     pods from becoming available (deploymentProblem).
//
// A pool that is True while secret has a problem (its running replicas
// mounted the key before the Secret was deleted or changed) stays True, its
// replicas serve, but the message ends with secret's message: a pod started
// now (a restart, a roll, a node drain) would not get the key.
func setReadyCondition(pool *v1alpha1.ProviderPool, deployment *appsv1.Deployment, err error, secret secretProblem, now metav1.Time) {
	cond := metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             metav1.ConditionFalse,
		Reason:             v1alpha1.ReasonSchedulerProgressing,
		ObservedGeneration: pool.Generation,
	}
	switch {
	case err != nil:
		cond.Reason = v1alpha1.ReasonRenderFailed
		cond.Message = oneLine(err)
	case deployment == nil:
		cond.Message = fmt.Sprintf("Waiting for Deployment %s", render.Name(pool))
	case deployment.Status.ObservedGeneration < deployment.Generation:
		cond.Message = fmt.Sprintf("Deployment %s has not yet observed generation %d", deployment.Name, deployment.Generation)
		if want, have := requiredAvailable(deployment), deployment.Status.AvailableReplicas; have >= want {
			// Its replicas still serve until the Deployment controller acts
			// on the change (a pod template change then recreates them:
			// Recreate strategy): Ready stays True through the lag, so that
			// a change such as spec.scheduler.replicas does not flip the
			// pool and every tenant of it to not Ready and back.
			cond.Status, cond.Reason = metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable
			cond.Message += fmt.Sprintf("; %d of %d required replicas available", have, want)
		}
	default:
		want, have := requiredAvailable(deployment), deployment.Status.AvailableReplicas
		cond.Message = fmt.Sprintf("Deployment %s has %d of %d required replicas available", deployment.Name, have, want)
		if have >= want {
			cond.Status = metav1.ConditionTrue
			cond.Reason = v1alpha1.ReasonSchedulerAvailable
		} else if why := deploymentProblem(deployment); why != "" {
			cond.Message += ": " + why
		}
	}
	switch {
	case secret.reason == "" || err != nil:
	case cond.Status == metav1.ConditionFalse:
		cond.Reason, cond.Message = secret.reason, secret.message
	default:
		cond.Message += "; " + secret.message
	}
	setCondition(&pool.Status.Conditions, cond, now)
}

// deploymentProblem returns what the Deployment's own conditions say
// keeps its pods from becoming available, "" when they say nothing: its
// ReplicaFailure condition when True (pods the API server refuses to
// create: a ResourceQuota that wants limits, a Pod Security level, a
// missing ServiceAccount), and its Progressing condition when False (the
// rollout passed its progress deadline).
func deploymentProblem(d *appsv1.Deployment) string {
	var why []string
	for _, c := range d.Status.Conditions {
		switch {
		case c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue:
			why = append(why, fmt.Sprintf("its pods cannot be created (%s %s: %s)", c.Type, c.Reason, clip(c.Message)))
		case c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse:
			why = append(why, fmt.Sprintf("its rollout is stalled (%s %s: %s)", c.Type, c.Reason, clip(c.Message)))
		}
	}
	return strings.Join(why, "; ")
}

// maxQuotedMessage bounds the bytes of another object's condition message
// quoted in a pool condition (whose message may hold 32768).
const maxQuotedMessage = 1024

// clip cuts msg to maxQuotedMessage bytes on a UTF-8 boundary, ending it
// with "..." when cut.
func clip(msg string) string {
	if len(msg) <= maxQuotedMessage {
		return msg
	}
	cut := maxQuotedMessage - len("...")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "..."
}

// requiredAvailable is the number of available scheduler replicas that makes
// a pool Ready: one, whatever spec.replicas says. With one replica that is
// all of them; with more, the replicas elect a leader and only the leader
// passes its readiness probe and serves (the followers are deliberately
// unready, brief "control flow" 4), so requiring all replicas would keep
// the pool from ever becoming Ready.
func requiredAvailable(d *appsv1.Deployment) int32 {
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	return min(replicas, 1)
}
