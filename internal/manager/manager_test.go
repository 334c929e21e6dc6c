package manager

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fairshare-dev/fairshare/internal/render"
)

func TestParseFlags(t *testing.T) {
	tests := map[string]struct {
		args    []string
		want    Config
		wantErr bool
	}{
		"defaults": {
			args: nil,
			want: Config{
				MetricsAddr: ":8080", ProbeAddr: ":8081",
				Render: render.Options{DefaultImage: "ghcr.io/fairshare-dev/fairshare:v0.1.0", SchedulerClusterRole: "fairshare-scheduler"},
			},
		},
		"every flag": {
			args: []string{"--metrics-bind-address=0", "--health-probe-bind-address=:9443", "--leader-elect",
				"--leader-election-namespace=ops", "--scheduler-image=img:2", "--scheduler-cluster-role=custom", "--skip-rbac-check"},
			want: Config{
				MetricsAddr: "0", ProbeAddr: ":9443", LeaderElect: true, LeaderElectionNamespace: "ops",
				Render: render.Options{DefaultImage: "img:2", SchedulerClusterRole: "custom", SkipRBACCheck: true},
			},
		},
		"empty image":        {args: []string{"--scheduler-image="}, wantErr: true},
		"image with a space": {args: []string{"--scheduler-image=bad image"}, wantErr: true},
		"upper-case image":   {args: []string{"--scheduler-image=Registry.example.com/Fairshare:v1"}, wantErr: true},
		"image by digest": {args: []string{"--scheduler-image=registry.example.com:5000/team/fairshare@sha256:" + strings.Repeat("a", 64)},
			want: Config{MetricsAddr: ":8080", ProbeAddr: ":8081",
				Render: render.Options{DefaultImage: "registry.example.com:5000/team/fairshare@sha256:" + strings.Repeat("a", 64), SchedulerClusterRole: "fairshare-scheduler"}}},
		"empty cluster role": {args: []string{"--scheduler-cluster-role="}, wantErr: true},
		"unknown flag":       {args: []string{"--nope"}, wantErr: true},
		"positional":         {args: []string{"extra"}, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseFlags(tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseFlags error = %v, wantErr %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreTypes(zap.Options{})); !tc.wantErr && diff != "" {
				t.Errorf("Config (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := ParseFlags([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: got %v, want flag.ErrHelp", err)
	}
}
