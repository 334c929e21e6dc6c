// Package schedconfig is the scheduler's static settings file: what the
// operator renders into the pool's ConfigMap (key SettingsKey) and the
// scheduler reads at start with --config. Changing it rolls the scheduler
// Deployment (its hash is on the pod template). Everything that can change
// without a restart (models, reserve, cost model, tenants) is read live from
// the ProviderPool and TenantQuota objects instead.
//
// The package is Kubernetes-free on purpose: it is the versioned contract
// between the operator and the data plane (style: ai-gateway filterapi).
package schedconfig

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// APIVersion is the version of the settings format.
const APIVersion = "scheduler.fairshare.dev/v1"

// SettingsKey is the ConfigMap data key (and file name) of the settings.
const SettingsKey = "scheduler.json"

// ProviderKeyEnv is the environment variable the scheduler reads the
// provider API key from, once at start, when the settings name no
// providerKeyFile (a scheduler run by hand or by the demo). The operator
// mounts the key as a file instead, so that a rotated key is used without a
// restart.
const ProviderKeyEnv = "FAIRSHARE_PROVIDER_API_KEY"

// Settings are the static settings of one pool's scheduler.
type Settings struct {
	// APIVersion must be APIVersion.
	APIVersion string `json:"apiVersion"`
	// PoolName is the ProviderPool this scheduler serves.
	PoolName string `json:"poolName"`
	// Namespace of the pool and its TenantQuotas.
	Namespace string `json:"namespace"`
	// HTTPAddr is the listen address of the gateway (OpenAI-compatible API and job API).
	HTTPAddr string `json:"httpAddr"`
	// MetricsAddr is the listen address of /metrics.
	MetricsAddr string `json:"metricsAddr"`
	// HealthAddr is the listen address of /healthz and /readyz.
	HealthAddr string `json:"healthAddr"`
	// LeaderElection makes replicas elect a leader through a Lease named LeaseName;
	// only the leader serves and writes status.
	LeaderElection bool `json:"leaderElection"`
	// LeaseName is the Lease used for leader election.
	LeaseName string `json:"leaseName"`
	// StatusIntervalSeconds is the period of status writes, in seconds (>= 1).
	StatusIntervalSeconds int32 `json:"statusIntervalSeconds"`
	// UpstreamConcurrency bounds upstream calls in flight (>= 1).
	UpstreamConcurrency int32 `json:"upstreamConcurrency"`
	// JobStorePath is the absolute path of the durable job store file
	// (bbolt, see jobs.BoltStore), opened only by the elected leader; empty
	// keeps batch jobs in memory (lost on restart). The operator renders
	// jobs.DefaultPath on the pool's volume for a jobStore of type Volume.
	// omitempty: settings without it marshal, and hash, as before the field
	// existed, so adding it did not roll existing schedulers.
	JobStorePath string `json:"jobStorePath,omitempty"`
	// ProviderKeyFile is the absolute path of the file holding the provider
	// API key (the pool's credentials Secret mounted by the kubelet), read
	// at start and again periodically, so that a key rotated in the Secret
	// is used without a restart. Empty: the key is read from ProviderKeyEnv
	// at start, if set. The path is fixed for a pool, whatever the key: a
	// new key does not change the settings, nor roll the Deployment.
	ProviderKeyFile string `json:"providerKeyFile,omitempty"`
}

// Marshal returns the settings as indented JSON, deterministic for equal values.
func (s Settings) Marshal() []byte {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil { // cannot happen: the struct holds only strings, bools and ints
		panic(err)
	}
	return append(b, '\n')
}

// Hash returns the hex SHA-256 of Marshal(): the pod-template annotation that
// rolls the Deployment when the settings change.
func (s Settings) Hash() string {
	sum := sha256.Sum256(s.Marshal())
	return hex.EncodeToString(sum[:])
}

// Validate returns an error naming the first invalid field, or nil.
func (s Settings) Validate() error {
	var errs []error
	if s.APIVersion != APIVersion {
		errs = append(errs, fmt.Errorf("apiVersion: got %q, want %q", s.APIVersion, APIVersion))
	}
	if s.PoolName == "" {
		errs = append(errs, errors.New("poolName: required"))
	}
	if s.Namespace == "" {
		errs = append(errs, errors.New("namespace: required"))
	}
	if s.HTTPAddr == "" {
		errs = append(errs, errors.New("httpAddr: required"))
	}
	if s.StatusIntervalSeconds < 1 {
		errs = append(errs, fmt.Errorf("statusIntervalSeconds: must be >= 1, got %d", s.StatusIntervalSeconds))
	}
	if s.UpstreamConcurrency < 1 {
		errs = append(errs, fmt.Errorf("upstreamConcurrency: must be >= 1, got %d", s.UpstreamConcurrency))
	}
	if s.JobStorePath != "" && !filepath.IsAbs(s.JobStorePath) {
		errs = append(errs, fmt.Errorf("jobStorePath: must be an absolute path, got %q", s.JobStorePath))
	}
	if s.ProviderKeyFile != "" && !filepath.IsAbs(s.ProviderKeyFile) {
		errs = append(errs, fmt.Errorf("providerKeyFile: must be an absolute path, got %q", s.ProviderKeyFile))
	}
	if s.LeaderElection && s.LeaseName == "" {
		errs = append(errs, errors.New("leaseName: required when leaderElection is true"))
	}
	return errors.Join(errs...)
}

// Parse decodes and validates settings; unknown fields are an error so that a
// typo is not silently ignored.
func Parse(data []byte) (Settings, error) {
	var s Settings
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Settings{}, fmt.Errorf("decoding scheduler settings: %w", err)
	}
	if err := s.Validate(); err != nil {
		return Settings{}, fmt.Errorf("invalid scheduler settings: %w", err)
	}
	return s, nil
}

// Load reads and parses the settings file at path.
func Load(path string) (Settings, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Settings{}, fmt.Errorf("reading scheduler settings: %w", err)
	}
	return Parse(data)
}
