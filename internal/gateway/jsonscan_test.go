package gateway

import (
	"encoding/json"
	"strings"
	"testing"
)

// jsonScanCases are bodies on which scanResponseJSON must agree with
// json.Valid and parseBodyUsage (BC-28a: an invalid 200 body keeps the
// charge; BC-24: the usage refunds it).
var jsonScanCases = []string{
	``, ` `, `{}`, `[]`, `null`, `true`, `false`, `nul`, `tru`, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `1e`, `1e+`, `1E-7`, `-1.5e10`,
	`"a"`, `"\u00e9"`, `"\u00g9"`, `"\x"`, `"a` + "\x01" + `"`, `"` + "\xff\xfe" + `"`, `"abc`, `"\`, `"\u12"`,
	`{"a":1,}`, `[1,]`, `[1 2]`, `{"a" 1}`, `{"a":1 "b":2}`, `{a:1}`, `{"a":1}}`, `[[]`, ` {"a" : [ 1 , {"b":null} ] } `,
	`{"usage":{"prompt_tokens":3,"total_tokens":9}}`, `{"usage":{"prompt_tokens":3,"TOTAL_TOKENS":9,"total_tokens":null}}`,
	`{"usage":{"prompt_tokens":3,"total_tokens":"9"}}`, `{"usage":{"prompt_tokens":3,"total_tokens":9.0}}`,
	`{"usage":{"prompt_tokens":9,"total_tokens":3}}`, `{"usage":{"prompt_tokens":3,"completion_tokens":null,"total_tokens":4}}`,
	"\t{\"usage\":{\"prompt_tokens\":3}}\r\n", `{"usage":{"prompt_tokens":3}} x`, "\ufeff{}", `{"a":1}` + "\x00",
	`{"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`,
	// The plain usage path (plainUsage) and the shapes it leaves to encoding/json.
	`{"usage":{"PROMPT_TOKENS":3,"prompt_tokens":null,"completion_tokens":2}}`, `{"usage":{"prompt_tokens":1.0}}`,
	`{"usage":{"prompt_tokens":-0,"Completion_Tokens":7}}`, `{"usage":{"prompt_tokens":"3"}}`, `{"usage":{"\u0070rompt_tokens":3}}`,
	`{"usage":{"prompt_to\u212Aens":3}}`, "{\"usage\":{\"prompt_to\u212aens\":3}}", `{"usage":7}`, `{"usage":null}`,
	`{"usage":{"prompt_tokens":12345678901234567890}}`, `{"usage":{"prompt_tokens":4,"details":{"prompt_tokens":9}},"Usage":null}`,
	`{"usage":{ "prompt_tokens" : 5 , "completion_tokens" : null }}`, `{"usage":{"prompt_tokens":123456789012345678}}`,
	`{"id":"x","choices":[{"usage":{"prompt_tokens":99}}],"usage":{"prompt_tokens":12,"completion_tokens":5}}`,
	`{"usage":null}`, `{"usage":5}`, `{"usage":{"prompt_tokens":"5"}}`, `{"usage":{"prompt_tokens":1.5}}`,
	`{"usage":{"prompt_tokens":1e3}}`, `{"usage":{"completion_tokens":5}}`, `{"usage":{"prompt_tokens":99999999999999999999}}`,
	`{"USAGE":{"prompt_tokens":7,"completion_tokens":1}}`, `{"Usage":{"prompt_tokens":7}}`, `{"u\u0073age":{"prompt_tokens":8}}`,
	`{"uſage":{"prompt_tokens":9}}`, `{"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":{"prompt_tokens":3}}`,
	`{"usage":{"prompt_tokens":1},"usage":null}`, `{"usage":{"prompt_tokens":1,"completion_tokens":"x"}}`,
	`{"usage":{"prompt_tokens":1,"completion_tokens":2,"extra":[1,{"a":"b"}]}}`, `[{"usage":{"prompt_tokens":1}}]`,
	`{"a":{"usage":{"prompt_tokens":1}}}`, `{"usage":{"PROMPT_TOKENS":4,"Completion_Tokens":2}}`, `{"usages":{"prompt_tokens":1}}`,
	`{"usage":{"prompt_tokens":-3,"completion_tokens":0}}`, `{"usage":{"prompt_tokens":3}`, `{"x":"` + strings.Repeat("abcdefg\\\"", 9) + `","usage":{"prompt_tokens":2}}`,
}

// TestScanResponseJSONMatchesEncodingJSON checks that the one-pass scan
// accepts exactly the bodies json.Valid accepts and reads the same usage as
// parseBodyUsage.
func TestScanResponseJSONMatchesEncodingJSON(t *testing.T) {
	for _, c := range jsonScanCases {
		checkScanResponseJSON(t, []byte(c))
	}
}

// TestScanResponseJSONDepth checks encoding/json's nesting limit: 10000
// levels are valid, 10001 are not, and a body far deeper is refused without
// recursion.
func TestScanResponseJSONDepth(t *testing.T) {
	for _, d := range []int{1, 9999, 10000, 10001, 1 << 20} {
		for _, open := range []string{"[", `{"a":`} {
			closer := "]"
			if open != "[" {
				closer = "}"
			}
			b := []byte(strings.Repeat(open, d) + "1" + strings.Repeat(closer, d))
			_, ok := scanResponseJSON(b)
			if want := d <= maxJSONDepth; ok != want || json.Valid(b) != want {
				t.Errorf("depth %d %q: scan %v, json.Valid %v, want %v", d, open, ok, json.Valid(b), want)
			}
		}
	}
}

// TestScanResponseJSONStrings checks the 8-byte string skipping at every
// alignment of a quote, a backslash and a control character.
func TestScanResponseJSONStrings(t *testing.T) {
	for pre := range 20 {
		for _, mid := range []string{`"`, `\"`, `\\`, "\x1f", "\x7f", "\x80", `\u0041`, `\u004`, `\q`, "\x00"} {
			for post := range 10 {
				b := []byte(`{"k":"` + strings.Repeat("x", pre) + mid + strings.Repeat("y", post) + `","usage":{"prompt_tokens":4}}`)
				checkScanResponseJSON(t, b)
			}
		}
	}
}

func checkScanResponseJSON(t *testing.T, b []byte) {
	t.Helper()
	u, ok := scanResponseJSON(b)
	if want := json.Valid(b); ok != want {
		t.Fatalf("%q: valid %v, json.Valid %v", b, ok, want)
	}
	if !ok {
		return
	}
	if want := parseBodyUsage(b); u != want {
		t.Fatalf("%q: usage %+v, parseBodyUsage %+v", b, u, want)
	}
}

// FuzzScanResponseJSON compares the scan with json.Valid and parseBodyUsage
// on arbitrary bodies.
func FuzzScanResponseJSON(f *testing.F) {
	for _, c := range jsonScanCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkScanResponseJSON(t, b)
	})
}
