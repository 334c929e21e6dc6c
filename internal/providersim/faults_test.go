package providersim

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseFault(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Fault
	}{
		{"", Fault{}},
		{"status=503,retry-after=7,count=2", Fault{Kind: FaultStatus, Status: 503, RetryAfter: "7", Count: 2}},
		{"status,retry-after-ms=2500", Fault{Kind: FaultStatus, RetryAfterMs: "2500"}},
		{"reset,every=4", Fault{Kind: FaultReset, Every: 4}},
		{"hang=30s", Fault{Kind: FaultHang, Hang: 30 * time.Second}},
		{"cut=3", Fault{Kind: FaultCut, Frames: 3}},
		{"malformed", Fault{Kind: FaultMalformed}},
		{"no-usage,count=1", Fault{Kind: FaultNoUsage, Count: 1}},
		{"throttle", Fault{Kind: FaultThrottle}},
	} {
		got, err := ParseFault(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseFault(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if back, err := ParseFault(got.String()); err != nil || back != got {
			t.Errorf("ParseFault(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
		}
	}
	for _, bad := range []string{"boom", "status=429", "status=abc", "reset=1", "cut=-1", "malformed,count", "throttle,colour=red"} {
		if _, err := ParseFault(bad); err == nil {
			t.Errorf("ParseFault(%q) accepted", bad)
		}
	}
}

// faultPost sends one chat completion and returns the status (0 on a
// transport error) and the error.
func faultPost(url string) (int, http.Header, string, error) {
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("")))
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

func TestFaultCountAndEvery(t *testing.T) {
	s := New(Config{})
	ts := httptest.NewServer(s)
	defer ts.Close()
	if err := s.SetFault(Fault{Kind: FaultStatus, Status: 502, RetryAfter: "3", Count: 2}); err != nil {
		t.Fatal(err)
	}
	var got []int
	for range 3 {
		st, h, _, err := faultPost(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		if st == 502 && h.Get("Retry-After") != "3" {
			t.Errorf("Retry-After %q", h.Get("Retry-After"))
		}
		got = append(got, st)
	}
	if got[0] != 502 || got[1] != 502 || got[2] != 200 {
		t.Errorf("statuses %v, want [502 502 200]", got)
	}
	if st := s.Stats(); st.Requests != 3 || st.Faults != 2 || st.Succeeded != 1 {
		t.Errorf("stats %+v", st)
	}
	// One request in three, over the HTTP control API.
	resp, err := http.Post(ts.URL+"/faults?fault=throttle,every=3", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"fault":"throttle,every=3","injected":0}`+"\n" {
		t.Errorf("POST /faults: %d %s", resp.StatusCode, b)
	}
	got = got[:0]
	for range 6 {
		st, h, _, err := faultPost(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		if st == 429 && (h.Get("Retry-After") != "" || h.Get("x-ratelimit-remaining-requests") != "") {
			t.Errorf("bare 429 carries headers %v", h)
		}
		got = append(got, st)
	}
	if want := []int{429, 200, 200, 429, 200, 200}; !equalInts(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	req, _ := http.NewRequest(http.MethodDelete, ts.URL+"/faults", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if f, n := s.Fault(); f.Kind != "" || n != 0 {
		t.Errorf("after DELETE: %+v %d", f, n)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFaultResetAndBodies(t *testing.T) {
	s := New(Config{OutputTokens: 5})
	ts := httptest.NewServer(s)
	defer ts.Close()

	_ = s.SetFault(Fault{Kind: FaultReset, Count: 1})
	if _, _, _, err := faultPost(ts.URL); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("reset: err %v, want a connection reset", err)
	}

	_ = s.SetFault(Fault{Kind: FaultMalformed, Count: 1})
	st, _, body, err := faultPost(ts.URL)
	if err != nil || st != 200 || body == "" || strings.HasSuffix(body, "}\n") {
		t.Errorf("malformed: %d %q %v", st, body, err)
	}

	_ = s.SetFault(Fault{Kind: FaultNoUsage, Count: 1})
	st, _, body, err = faultPost(ts.URL)
	if err != nil || st != 200 || strings.Contains(body, "usage") {
		t.Errorf("no-usage: %d %q %v", st, body, err)
	}

	_ = s.SetFault(Fault{Kind: FaultCut, Count: 1})
	if _, _, _, err := faultPost(ts.URL); err == nil {
		t.Errorf("cut JSON body read without error")
	}
	if st := s.Stats(); st.Requests != 4 || st.Faults != 4 || st.CompletionTokens != 15 {
		t.Errorf("stats %+v, want 4 requests, 4 faults, 15 completion tokens", st)
	}
}

func TestFaultCutStream(t *testing.T) {
	s := New(Config{OutputTokens: 10, Fault: Fault{Kind: FaultCut, Frames: 3}})
	ts := httptest.NewServer(s)
	defer ts.Close()
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(chatBody(`"stream":true,"stream_options":{"include_usage":true}`)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read error %v, want unexpected EOF or a connection reset", err)
	}
	if n := strings.Count(string(b), "data: "); n != 3 || strings.Contains(string(b), "[DONE]") {
		t.Errorf("got %d frames: %q", n, b)
	}
	if st := s.Stats(); st.CompletionTokens != 3 || st.Succeeded != 0 {
		t.Errorf("stats %+v", st)
	}
}
