// Package explain checks that `kubectl explain` documents the Fairshare CRDs
// completely (issue 6: "kubectl explain documents every field with units
// and defaults"): every property of the generated schemas in
// config/crd/bases has a description, every integer or number property
// names its unit, and every property with a default states it. It also runs
// the real kubectl explain against a kube-apiserver with the CRDs installed.
package explain

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/fairshare-dev/fairshare/test/framework"
)

// unitWords are the units a description of an integer or number property
// may name (whole words, case-insensitive; "number of" introduces a
// count of the things it names, e.g. "the number of TenantQuotas"). "unitless" is the explicit
// escape for a figure with no unit (a weight, a ratio), and "generation"
// covers metadata.generation sequence numbers.
var unitWords = []string{
	"token", "tokens", "weighted tokens",
	"second", "seconds", "millisecond", "milliseconds", "minute", "minutes",
	"request", "requests", "call", "calls", "job", "jobs",
	"block", "blocks", "byte", "bytes",
	"percent", "replica", "replicas", "count", "number of", "generation",
	"refusals", "rejections",
	"unitless",
}

var unitRE = regexp.MustCompile(`(?i)\b(` + strings.Join(unitWords, "|") + `)\b`)

// problem is one schema property that kubectl explain documents badly.
type problem struct{ path, what string }

func (p problem) String() string { return p.path + ": " + p.what }

// checkSchema walks s (the property at path) and returns its problems. The
// properties of metadata are the API machinery's and are not checked.
func checkSchema(path string, s *apiextensionsv1.JSONSchemaProps, problems *[]problem) {
	if path != "" {
		checkProperty(path, s, problems)
	}
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if path == "" && n == "metadata" {
			continue
		}
		p := s.Properties[n]
		checkSchema(join(path, n), &p, problems)
	}
	if s.Items != nil && s.Items.Schema != nil {
		// An array's items are documented by the array's description;
		// their properties are checked.
		for n, p := range s.Items.Schema.Properties {
			checkSchema(join(path+"[]", n), &p, problems)
		}
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		for n, p := range s.AdditionalProperties.Schema.Properties {
			checkSchema(join(path+"{}", n), &p, problems)
		}
	}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// checkProperty checks one property's own description.
func checkProperty(path string, s *apiextensionsv1.JSONSchemaProps, problems *[]problem) {
	d := strings.TrimSpace(s.Description)
	if d == "" {
		*problems = append(*problems, problem{path, "no description"})
		return
	}
	if (s.Type == "integer" || s.Type == "number") && !unitRE.MatchString(d) {
		*problems = append(*problems, problem{path, s.Type + " without a unit (name one of unitWords, or say unitless)"})
	}
	if s.Default != nil {
		var v any
		if err := json.Unmarshal(s.Default.Raw, &v); err != nil {
			*problems = append(*problems, problem{path, fmt.Sprintf("default %s: %v", s.Default.Raw, err)})
			return
		}
		stated := statedDefaults(d)
		if len(stated) == 0 {
			*problems = append(*problems, problem{path, fmt.Sprintf("default %s not stated (write \"Defaults to ...\")", s.Default.Raw)})
			return
		}
		for _, lit := range stated {
			if !sameValue(lit, v) {
				*problems = append(*problems, problem{path, fmt.Sprintf("states the default %s, the schema's is %s", lit, s.Default.Raw)})
			}
		}
	}
}

// defaultAfterRE finds a default stated before its value: "Defaults to V"
// (a line break may follow "Defaults"),
// "defaults to V" (after "Must be > 0;") and "Default: V" (capitalised: a
// lower-case "(default: ...)" explains the value written before it).
var defaultAfterRE = regexp.MustCompile(`(?:\b[Dd]efaults\s+to|\bDefault:)\s+`)

// defaultBeforeRE finds a default stated after its value, as in
// "Hard (default: reject over the limit)" or "ReadWriteOnce (the default)":
// the value is the word before the parenthesis.
var defaultBeforeRE = regexp.MustCompile("([^\\s(),;]+)\\s+\\((?:the )?default\\b")

// statedDefaults returns the literal of every default stated in the
// description d (see defaultAfterRE, defaultBeforeRE): a JSON object or
// array ("{}"), a double-quoted string, or a word (a number, a bare
// string), without a sentence's closing period or enclosing back quotes.
func statedDefaults(d string) []string {
	var out []string
	for _, m := range defaultAfterRE.FindAllStringIndex(d, -1) {
		out = append(out, literalAt(d[m[1]:]))
	}
	for _, m := range defaultBeforeRE.FindAllStringSubmatch(d, -1) {
		out = append(out, trimWord(m[1]))
	}
	return out
}

// literalAt returns the literal at the start of s (see statedDefaults).
func literalAt(s string) string {
	switch {
	case strings.HasPrefix(s, "{"), strings.HasPrefix(s, "["):
		depth := 0
		for i, r := range s {
			switch r {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			if depth == 0 {
				return s[:i+1]
			}
		}
		return s
	case strings.HasPrefix(s, `"`):
		if i := strings.Index(s[1:], `"`); i >= 0 {
			return s[:i+2]
		}
		return s
	}
	end := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || strings.ContainsRune("(),;", r) })
	if end < 0 {
		end = len(s)
	}
	return trimWord(s[:end])
}

// trimWord drops a closing period and enclosing back quotes from a word.
func trimWord(w string) string {
	w = strings.TrimSuffix(w, ".")
	if len(w) >= 2 && strings.HasPrefix(w, "`") && strings.HasSuffix(w, "`") {
		w = w[1 : len(w)-1]
	}
	return w
}

// sameValue reports whether the stated literal lit is exactly the schema
// default v (decoded from JSON): a number equal to it, the same string
// (quoted in JSON or bare), or the same JSON object or array ("{}").
func sameValue(lit string, v any) bool {
	if s, ok := v.(string); ok && lit == s {
		return true
	}
	var got any
	if err := json.Unmarshal([]byte(lit), &got); err != nil {
		return false
	}
	return reflect.DeepEqual(got, v)
}

// crdFiles are the generated CRDs.
func crdFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(framework.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) != 2 {
		t.Fatalf("CRD files in config/crd/bases: %v (err %v), want the ProviderPool and TenantQuota CRDs", files, err)
	}
	return files
}

func TestSchemasDocumentEveryField(t *testing.T) {
	for _, f := range crdFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			t.Run(crd.Spec.Names.Kind+"/"+v.Name, func(t *testing.T) {
				var problems []problem
				checkSchema("", v.Schema.OpenAPIV3Schema, &problems)
				for _, p := range problems {
					t.Errorf("%s", p)
				}
			})
		}
	}
}

// TestCheckerFindsEachProblem: the checker is not vacuous.
func TestCheckerFindsEachProblem(t *testing.T) {
	raw := func(s string) *apiextensionsv1.JSON { return &apiextensionsv1.JSON{Raw: []byte(s)} }
	root := &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
		"metadata": {Type: "object"},
		"spec": {Type: "object", Description: "Spec.", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"bare":     {Type: "string"},
			"limit":    {Type: "integer", Description: "The limit."},
			"weight":   {Type: "integer", Description: "Share of the pool, unitless."},
			"rate":     {Type: "integer", Description: "Tokens per minute."},
			"mode":     {Type: "string", Description: "The mode.", Default: raw(`"Fast"`)},
			"interval": {Type: "integer", Description: "In seconds. Defaults to 5.", Default: raw(`10`)},
			"ok":       {Type: "integer", Description: "In seconds. Defaults to 10.", Default: raw(`10`)},
			"obj":      {Type: "object", Description: "Settings. Defaults to {} (each field at its own default).", Default: raw(`{}`)},
			"vague":    {Type: "object", Description: "Empty by default.", Default: raw(`{}`)},
			"list":     {Type: "array", Description: "Items.", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"n": {Type: "number"}}}}},
		}},
	}}
	var problems []problem
	checkSchema("", root, &problems)
	var got []string
	for _, p := range problems {
		got = append(got, p.path)
	}
	sort.Strings(got)
	want := []string{"spec.bare", "spec.interval", "spec.limit", "spec.list[].n", "spec.mode", "spec.vague"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("problems at %v, want %v (%v)", got, want, problems)
	}
}
