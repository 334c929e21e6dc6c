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
