package scheduler

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"

	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

// TestProviderKeySource: settings naming a provider key file read the key
// from it (and keep it current, so the environment variable is ignored);
// settings without one take the environment variable's key for good; a
// key file not readable at start leaves the scheduler without a key until
// it is.
func TestProviderKeySource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api-key")
	if err := os.WriteFile(path, []byte("sk-from-file\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	key, f := providerKey(schedconfig.Settings{ProviderKeyFile: path}, "sk-from-env", logr.Discard())
	if f == nil || key.Authorization() != "Bearer sk-from-file" {
		t.Errorf("with a key file: authorization %q, reloader %v", key.Authorization(), f)
	}
	key, f = providerKey(schedconfig.Settings{}, "sk-from-env", logr.Discard())
	if f != nil || key.Authorization() != "Bearer sk-from-env" {
		t.Errorf("without a key file: authorization %q, reloader %v", key.Authorization(), f)
	}
	key, f = providerKey(schedconfig.Settings{ProviderKeyFile: path + ".missing"}, "sk-from-env", logr.Discard())
	if f == nil || key.Present() {
		t.Errorf("with a missing key file: present %v, reloader %v", key.Present(), f)
	}
}
