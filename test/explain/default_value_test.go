package explain

import (
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// TestCheckerComparesStatedDefault: the default a description states
// ("Defaults to V", "Default: V", "V (the default)") must be exactly the
// schema's default; the default's literal appearing elsewhere in the
// description (a range "1..5", a digit of "10") does not count.
func TestCheckerComparesStatedDefault(t *testing.T) {
	tests := []struct {
		typ, def, description string
		want                  []string // problems, "" for none
	}{
		{"integer", `1`, "Replicas of the scheduler. Defaults to 10.", []string{"states the default 10, the schema's is 1"}},
		{"integer", `1`, "Replicas of the scheduler, 1..5. Defaults to 2.", []string{"states the default 2, the schema's is 1"}},
		{"integer", `1`, "Replicas of the scheduler, 1..5.", []string{"default 1 not stated (write \"Defaults to ...\")"}},
		{"integer", `1`, "Replicas of the scheduler. Defaults to 1.", nil},
		{"integer", `1`, "Replicas of the scheduler. Must be > 0; defaults to 1.", nil},
		{"integer", `1`, "Replicas of the scheduler. Default: 1", nil},
		{"integer", `10`, "Interval, in seconds. Defaults to 10 (one status write per interval).", nil},
		{"number", `0.5`, "Ratio, unitless. Defaults to 0.5.", nil},
		{"number", `0.5`, "Ratio, unitless. Defaults to 0.50000001.", []string{"states the default 0.50000001, the schema's is 0.5"}},
		{"string", `"Month"`, "Budget period. Defaults to Month.", nil},
		{"string", `"Month"`, "Budget period. Defaults to Months.", []string{`states the default Months, the schema's is "Month"`}},
		{"string", `"api-key"`, `Key in the Secret. Defaults to "api-key".`, nil},
		{"string", `"api-key"`, `Key in the Secret. Defaults to "api".`, []string{`states the default "api", the schema's is "api-key"`}},
		{"string", `"1"`, `A label. Defaults to 1.`, nil},
		{"string", `"Hard"`, "Hard (default: reject over the limit) or Soft (admit).", nil},
		{"string", `"Hard"`, "Hard or Soft (the default).", []string{`states the default Soft, the schema's is "Hard"`}},
		{"object", `{}`, "Settings. Defaults to {} (each field at its own default).", nil},
		{"object", `{}`, "Settings. Defaults to {\"a\": 1}.", []string{`states the default {"a": 1}, the schema's is {}`}},
		{"object", `{"a":1}`, "Settings. Defaults to {\"a\": 1}.", nil},
		{"object", `{}`, "Settings, empty by default.", []string{"default {} not stated (write \"Defaults to ...\")"}},
	}
	for _, tc := range tests {
		var problems []problem
		checkProperty("spec.x", &apiextensionsv1.JSONSchemaProps{Type: tc.typ, Description: tc.description,
			Default: &apiextensionsv1.JSON{Raw: []byte(tc.def)}}, &problems)
		var got []string
		for _, p := range problems {
			if p.path != "spec.x" || strings.Contains(p.what, "unit") {
				continue // the unit rule is TestCheckerFindsEachProblem's
			}
			got = append(got, p.what)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("default %s described as %q: problems %q, want %q", tc.def, tc.description, got, tc.want)
		}
	}
}
