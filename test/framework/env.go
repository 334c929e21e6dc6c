package framework

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

// Env is a running Fairshare installation: control plane, operator, simulator and one
// pool's scheduler, each a local process.
type Env struct {
	WorkDir   string
	Namespace string
	Pool      string
	CP        *ControlPlane
	Bin       string

	Operator, Simulator, Scheduler *Process
	// SimulatorURL and SchedulerURL are the base URLs on 127.0.0.1.
	SimulatorURL, SchedulerURL, SchedulerMetricsURL string
}

// SimulatorOptions are the provider simulator's quota and behaviour.
type SimulatorOptions struct {
	TokensPerMinute, RequestsPerMinute int64
	Latency                            time.Duration
	OutputTokens                       int64
}

// StartEnv brings up everything for the pool defined in config/samples, in namespace ns.
// logf receives progress lines. On error, whatever was started is stopped.
func StartEnv(ctx context.Context, workDir, ns string, sim SimulatorOptions, logf func(string, ...any)) (_ *Env, err error) {
	e := &Env{WorkDir: workDir, Namespace: ns, Pool: "demo"}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, err
	}
	logf("building the binaries (manager, scheduler, providersim)")
	if e.Bin, err = BuildBinaries(ctx, filepath.Join(workDir, "bin")); err != nil {
		return nil, err
	}
	logf("starting kube-apiserver and etcd (bin/), installing the CRDs")
	if e.CP, err = StartControlPlane(workDir); err != nil {
		return nil, err
	}
	if err := e.CP.EnsureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	kube := "KUBECONFIG=" + e.CP.Kubeconfig

	simPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	e.SimulatorURL = fmt.Sprintf("http://127.0.0.1:%d", simPort)
	logf("starting the provider simulator on %s (%d tokens/min, %d requests/min)", e.SimulatorURL, sim.TokensPerMinute, sim.RequestsPerMinute)
	e.Simulator, err = Start("providersim", workDir, filepath.Join(e.Bin, "providersim"), []string{
		fmt.Sprintf("--addr=127.0.0.1:%d", simPort),
		fmt.Sprintf("--tokens-per-minute=%d", sim.TokensPerMinute),
		fmt.Sprintf("--requests-per-minute=%d", sim.RequestsPerMinute),
		fmt.Sprintf("--latency=%s", sim.Latency),
		fmt.Sprintf("--output-tokens=%d", sim.OutputTokens),
	})
	if err != nil {
		return nil, err
	}
	if err := WaitHTTP(ctx, e.Simulator, e.SimulatorURL+"/healthz"); err != nil {
		return nil, err
	}

	healthPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	logf("starting the operator (cmd/manager)")
	e.Operator, err = Start("manager", workDir, filepath.Join(e.Bin, "manager"), []string{
		"--leader-elect=false", "--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", healthPort),
	}, kube)
	if err != nil {
		return nil, err
	}
	if err := WaitHTTP(ctx, e.Operator, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)); err != nil {
		return nil, err
	}

	logf("applying config/samples (a pool, three tenants) with kubectl")
	if err := e.ApplySamples(ctx); err != nil {
		return nil, err
	}
	if err := e.startScheduler(ctx, logf); err != nil {
		return nil, err
	}
	return e, nil
}

// ApplySamples applies config/samples into the namespace, pointing the pool at the simulator.
func (e *Env) ApplySamples(ctx context.Context) error {
	dir := filepath.Join(RepoRoot(), "config", "samples")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var all bytes.Buffer
	for _, ent := range entries {
		if !strings.HasPrefix(ent.Name(), "quota_") || !strings.HasSuffix(ent.Name(), ".yaml") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err != nil {
			return err
		}
		all.WriteString("---\n")
		all.Write(bytes.ReplaceAll(b, []byte("http://127.0.0.1:8090"), []byte(e.SimulatorURL)))
		all.WriteString("\n")
	}
	cmd := exec.CommandContext(ctx, kubectlBin(), "--kubeconfig", e.CP.Kubeconfig, "apply", "-n", e.Namespace, "-f", "-")
	cmd.Stdin = &all
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply: %w\n%s", err, out)
	}
	return nil
}

func kubectlBin() string {
	bin := filepath.Join(RepoRoot(), "bin", "kubectl")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	return "kubectl"
}

// startScheduler waits for the operator to render the pool's Deployment and ConfigMap,
// then runs the scheduler locally with the Deployment's command-line arguments and
// environment, the ConfigMap's settings written to a local file, and local listen ports.
func (e *Env) startScheduler(ctx context.Context, logf func(string, ...any)) error {
	name := e.Pool + "-scheduler"
	logf("waiting for the operator to render Deployment %s/%s", e.Namespace, name)
	var dep appsv1.Deployment
	var cm corev1.ConfigMap
	deadline := time.Now().Add(60 * time.Second)
	for {
		errD := e.CP.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: name}, &dep)
		errC := e.CP.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: name}, &cm)
		if errD == nil && errC == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the operator did not render %s: %v %v\n%s", name, errD, errC, e.Operator.Tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	settings, err := schedconfig.Parse([]byte(cm.Data[schedconfig.SettingsKey]))
	if err != nil {
		return fmt.Errorf("ConfigMap %s: %w", name, err)
	}
	if settings.ProviderKeyFile, err = LocalProviderKeyFile(ctx, e.CP.Client, e.Namespace, dep.Spec.Template.Spec, settings.ProviderKeyFile, e.WorkDir); err != nil {
		return err
	}
	settingsPath := filepath.Join(e.WorkDir, schedconfig.SettingsKey)
	if err := os.WriteFile(settingsPath, settings.Marshal(), 0o644); err != nil {
		return err
	}
	c := dep.Spec.Template.Spec.Containers[0]
	var args []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + settingsPath
		}
		args = append(args, a)
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return err
		}
	}
	args = append(args,
		fmt.Sprintf("--http-addr=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[2]),
		"--job-store="+filepath.Join(e.WorkDir, "jobs.db"))
	env := []string{"KUBECONFIG=" + e.CP.Kubeconfig}
	for _, v := range c.Env {
		switch {
		case v.ValueFrom == nil:
			env = append(env, v.Name+"="+v.Value)
		case v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env = append(env, v.Name+"="+e.Namespace)
		case v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env = append(env, v.Name+"="+name+"-local")
		case v.ValueFrom.SecretKeyRef != nil:
			var s corev1.Secret
			if err := e.CP.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: v.ValueFrom.SecretKeyRef.Name}, &s); err != nil {
				return fmt.Errorf("env %s: %w", v.Name, err)
			}
			env = append(env, v.Name+"="+string(s.Data[v.ValueFrom.SecretKeyRef.Key]))
		}
	}
	e.SchedulerURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	e.SchedulerMetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	logf("starting the scheduler as the Deployment would: %s %s", strings.Join(c.Command, " "), strings.Join(c.Args, " "))
	e.Scheduler, err = Start("scheduler", e.WorkDir, filepath.Join(e.Bin, "scheduler"), args, env...)
	if err != nil {
		return err
	}
	if err := WaitHTTP(ctx, e.Scheduler, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2])); err != nil {
		return err
	}
	return e.CP.MarkDeploymentAvailable(ctx, e.Namespace, name)
}

// Stop stops every process and the control plane.
func (e *Env) Stop() {
	StopAll(e.Simulator, e.Operator, e.Scheduler)
	if e.CP != nil {
		_ = e.CP.Stop()
	}
}

// LocalProviderKeyFile stands in for the kubelet for the scheduler's
// provider key file (settings providerKeyFile file): it writes the item of
// the Secret volume that the pod ps mounts over file, read with c (as the
// admin), to a file under dir, and returns that file's path for the
// settings of a scheduler run as a local process; "" when file is "". Call
// it again to write the Secret's current key, as the kubelet does after a
// change of the Secret.
func LocalProviderKeyFile(ctx context.Context, c client.Client, ns string, ps corev1.PodSpec, file, dir string) (string, error) {
	if file == "" || len(ps.Containers) == 0 {
		return "", nil
	}
	for _, m := range ps.Containers[0].VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range ps.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Path != rel {
					continue
				}
				var s corev1.Secret
				if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.Secret.SecretName}, &s); err != nil {
					return "", fmt.Errorf("provider key Secret: %w", err)
				}
				local := filepath.Join(dir, "secret-"+v.Name, rel)
				if err := os.MkdirAll(filepath.Dir(local), 0o700); err != nil {
					return "", err
				}
				tmp := local + ".tmp"
				if err := os.WriteFile(tmp, s.Data[it.Key], 0o400); err != nil {
					return "", err
				}
				return local, os.Rename(tmp, local)
			}
		}
	}
	return "", fmt.Errorf("no Secret volume item of the pod is mounted at %s", file)
}
