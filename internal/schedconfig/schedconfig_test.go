package schedconfig

import (
	"strings"
	"testing"
)

func valid() Settings {
	return Settings{
		APIVersion: APIVersion, PoolName: "demo", Namespace: "ns", HTTPAddr: ":8080",
		MetricsAddr: ":9090", HealthAddr: ":8081", LeaseName: "demo-scheduler",
		StatusIntervalSeconds: 10, UpstreamConcurrency: 64,
	}
}

func TestParseRoundTrip(t *testing.T) {
	s := valid()
	got, err := Parse(s.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if got != s {
		t.Fatalf("round trip: got %+v, want %+v", got, s)
	}
}

func TestParseRefuses(t *testing.T) {
	cases := map[string]struct {
		data    string
		wantErr string
	}{
		"unknown field":        {`{"apiVersion":"` + APIVersion + `","poolNmae":"x"}`, `unknown field "poolNmae"`},
		"wrong version":        {strings.Replace(string(valid().Marshal()), APIVersion, "v0", 1), "apiVersion"},
		"not JSON":             {"poolName: demo", "decoding scheduler settings"},
		"zero status interval": {strings.Replace(string(valid().Marshal()), `"statusIntervalSeconds": 10`, `"statusIntervalSeconds": 0`, 1), "statusIntervalSeconds: must be >= 1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	s := valid()
	s.JobStorePath = "jobs.db"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), `jobStorePath: must be an absolute path, got "jobs.db"`) {
		t.Fatalf("relative job store path: got %v", err)
	}
	s = valid()
	s.ProviderKeyFile = "provider/api-key"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), `providerKeyFile: must be an absolute path, got "provider/api-key"`) {
		t.Fatalf("relative provider key file: got %v", err)
	}
	s = valid()
	s.LeaderElection, s.LeaseName = true, ""
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "leaseName") {
		t.Fatalf("leader election without a lease: got %v", err)
	}
}

func TestHashFollowsSettings(t *testing.T) {
	a, b := valid(), valid()
	if a.Hash() != b.Hash() {
		t.Fatal("equal settings hash differently")
	}
	b.StatusIntervalSeconds = 20
	if a.Hash() == b.Hash() {
		t.Fatal("a changed setting kept the hash")
	}
	if len(a.Hash()) != 64 {
		t.Fatalf("hash %q is not hex SHA-256", a.Hash())
	}
}

// TestJobStorePathOmitted: settings without a job store path marshal exactly
// as before the field existed (same bytes, so the same hash: no roll of
// existing schedulers); with one, it round-trips and changes the hash.
func TestJobStorePathOmitted(t *testing.T) {
	const want = `{
  "apiVersion": "scheduler.fairshare.dev/v1",
  "poolName": "demo",
  "namespace": "ns",
  "httpAddr": ":8080",
  "metricsAddr": ":9090",
  "healthAddr": ":8081",
  "leaderElection": false,
  "leaseName": "demo-scheduler",
  "statusIntervalSeconds": 10,
  "upstreamConcurrency": 64
}
`
	a := valid()
	if got := string(a.Marshal()); got != want {
		t.Fatalf("Marshal without a job store path:\n%s\nwant\n%s", got, want)
	}
	b := valid()
	b.JobStorePath = "/var/lib/fairshare/jobs.db"
	if !strings.Contains(string(b.Marshal()), `"jobStorePath": "/var/lib/fairshare/jobs.db"`) {
		t.Errorf("Marshal with a job store path: %s", b.Marshal())
	}
	got, err := Parse(b.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if got != b {
		t.Errorf("round trip: got %+v, want %+v", got, b)
	}
	if a.Hash() == b.Hash() {
		t.Error("a job store path kept the hash")
	}
}

// TestProviderKeyFile: settings without a provider key file marshal as
// before the field existed (no roll of existing schedulers when the
// operator is upgraded alone); with one, it round-trips. The file's path
// is all the settings hold: the key itself never reaches them.
func TestProviderKeyFile(t *testing.T) {
	a := valid()
	if strings.Contains(string(a.Marshal()), "providerKeyFile") {
		t.Fatalf("Marshal without a provider key file: %s", a.Marshal())
	}
	b := valid()
	b.ProviderKeyFile = "/var/run/fairshare/provider/api-key"
	if !strings.Contains(string(b.Marshal()), `"providerKeyFile": "/var/run/fairshare/provider/api-key"`) {
		t.Errorf("Marshal with a provider key file: %s", b.Marshal())
	}
	got, err := Parse(b.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if got != b {
		t.Errorf("round trip: got %+v, want %+v", got, b)
	}
}
