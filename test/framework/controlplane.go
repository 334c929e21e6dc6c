// Package framework runs Fairshare end to end on one machine for the demo and the e2e
// tests: a real kube-apiserver and etcd (controller-runtime envtest with the binaries
// that hack/bin-tools.sh builds into bin/), the operator, a pool's scheduler and the
// provider simulator as local processes, and kubectl against the same API server.
//
// There is no kubelet here, so the pods of the scheduler Deployment never start: the
// scheduler runs as a local process with the arguments and settings of the Deployment
// the operator rendered (only the listen addresses and the settings file path are
// rewritten for the local machine), and the framework stands in for the kubelet by
// marking the Deployment available once that process is ready.
package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	quotav1alpha1 "github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// RepoRoot returns the repository root (the folder holding go.mod), found from this
// source file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// ControlPlane is a running kube-apiserver + etcd with the Fairshare CRDs installed.
type ControlPlane struct {
	env *envtest.Environment
	// Config is an admin REST config.
	Config *rest.Config
	// Client is an admin controller-runtime client with the Fairshare scheme.
	Client client.Client
	// Kubeconfig is the path of an admin kubeconfig file for kubectl, helm and the processes.
	Kubeconfig string
}

// StartControlPlane starts etcd and kube-apiserver from <repo>/bin (or KUBEBUILDER_ASSETS)
// and installs the CRDs from config/crd/bases. workDir receives the kubeconfig file.
// It returns an error naming the missing binary when bin/ is not built (run `make tools`).
func StartControlPlane(workDir string) (*ControlPlane, error) {
	root := RepoRoot()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run `make tools` first: %w", b, assets, err)
		}
	}
	// The processes log for themselves; envtest's own messages are not needed.
	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	cp := &ControlPlane{env: env, Config: cfg}
	scheme := clientgoscheme.Scheme
	if err := quotav1alpha1.AddToScheme(scheme); err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	cp.Client, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	user, err := env.AddUser(envtest.User{Name: "fairshare-admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	cp.Kubeconfig = filepath.Join(workDir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kc, 0o600); err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	return cp, nil
}

// Stop stops kube-apiserver and etcd and removes their data.
func (cp *ControlPlane) Stop() error { return cp.env.Stop() }

// EnsureNamespace creates the namespace if it does not exist.
func (cp *ControlPlane) EnsureNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{}
	ns.Name = name
	err := cp.Client.Create(ctx, ns)
	if client.IgnoreAlreadyExists(err) != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// MarkDeploymentAvailable stands in for the kubelet and the deployment controller, which
// do not run here: it sets the Deployment's status to all replicas available for its
// current generation, as the real controllers would once the pods are ready.
func (cp *ControlPlane) MarkDeploymentAvailable(ctx context.Context, namespace, name string) error {
	var d appsv1.Deployment
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &d); err != nil {
		return err
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	d.Status.ObservedGeneration = d.Generation
	d.Status.Replicas = replicas
	d.Status.UpdatedReplicas = replicas
	d.Status.ReadyReplicas = replicas
	d.Status.AvailableReplicas = replicas
	d.Status.Conditions = []appsv1.DeploymentCondition{{
		Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
		Reason: "MinimumReplicasAvailable", Message: "The local scheduler process is ready.",
	}}
	return cp.Client.Status().Update(ctx, &d)
}
