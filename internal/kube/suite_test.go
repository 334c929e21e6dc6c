package kube

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// cfg is the envtest API server's config; nil when KUBEBUILDER_ASSETS is
// unset (the envtest tests skip).
var (
	cfg    *rest.Config
	scheme = runtime.NewScheme()
)

func TestMain(m *testing.M) {
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	flag.Parse()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" || fuzzing() {
		os.Exit(m.Run())
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	if cfg, err = env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping envtest:", err)
	}
	os.Exit(code)
}

// fuzzing reports whether the binary runs a fuzz target (as the
// coordinator, -test.fuzz, or as one of its workers, -test.fuzzworker):
// the fuzz targets need no API server, and every worker process would
// otherwise start its own etcd and kube-apiserver.
func fuzzing() bool {
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		return true
	}
	f := flag.Lookup("test.fuzzworker")
	return f != nil && f.Value.String() == "true"
}

// newClient returns a direct (uncached) client, skipping the test without
// an API server.
func newClient(t *testing.T) client.Client {
	t.Helper()
	if cfg == nil {
		t.Skip("KUBEBUILDER_ASSETS is not set: no API server for envtest")
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
