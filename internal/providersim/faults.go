package providersim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// FaultKind names one upstream failure the simulator can inject
// (Server.SetFault, POST /faults, --fault). Each imitates a failure a real
// provider or the network in front of it produces; the gateway's handling
// of each is the upstream-fault table of docs/reliability.md.
type FaultKind string

const (
	// FaultStatus answers Fault.Status (a 5xx, default 500) with an OpenAI
	// error body, before admission (no quota charged, nothing generated),
	// with Retry-After / retry-after-ms only when Fault.RetryAfter /
	// Fault.RetryAfterMs are set, and no rate-limit headers.
	FaultStatus FaultKind = "status"
	// FaultReset resets the connection before any response byte: the
	// connection is hijacked and closed with SO_LINGER 0, so the client
	// reads a TCP RST (ECONNRESET), not a clean EOF. Nothing is charged.
	FaultReset FaultKind = "reset"
	// FaultHang sends nothing for Fault.Hang (default DefaultFaultHang) or
	// until the client goes away, then resets the connection: set it longer
	// than the client's timeout. Nothing is charged.
	FaultHang FaultKind = "hang"
	// FaultMalformed is admitted and generated as usual, then answered 200
	// with Content-Type application/json and a body that is not valid JSON
	// (the normal body cut in half), streaming requests included. The quota
	// is charged the full usage: the provider did the work.
	FaultMalformed FaultKind = "malformed"
	// FaultCut is admitted as usual; a streaming response sends its first
	// Fault.Frames content frames, then the connection is reset (no finish
	// chunk, no usage chunk, no [DONE]); a non-streaming response sends its
	// headers with the full Content-Length and half the body, then resets.
	// The quota is charged the frames sent (all the output for a
	// non-streaming response).
	FaultCut FaultKind = "cut"
	// FaultNoUsage answers normally but without usage: a JSON body without
	// the "usage" member, a stream without the usage chunk even when
	// stream_options.include_usage asked for it (and without "usage": null
	// in its chunks).
	FaultNoUsage FaultKind = "no-usage"
	// FaultThrottle answers 429 with an OpenAI rate_limit_exceeded body and
	// neither Retry-After nor any rate-limit header (the bare 429 of a proxy
	// or of a provider outage), before admission.
	FaultThrottle FaultKind = "throttle"
)

// FaultKinds lists every FaultKind.
var FaultKinds = []FaultKind{FaultStatus, FaultReset, FaultHang, FaultMalformed, FaultCut, FaultNoUsage, FaultThrottle}

// DefaultFaultHang is how long a FaultHang holds a request when Fault.Hang
// is 0.
const DefaultFaultHang = time.Minute

// Fault is an injected upstream failure of POST /v1/chat/completions. The
// zero Kind injects nothing.
type Fault struct {
	// Kind is the failure.
	Kind FaultKind `json:"kind"`
	// Status is the status of FaultStatus: 500..599; 0 means 500.
	Status int `json:"status,omitempty"`
	// RetryAfter is the Retry-After value sent with FaultStatus, verbatim
	// (delay-seconds or an HTTP-date); "" sends none.
	RetryAfter string `json:"retry_after,omitempty"`
	// RetryAfterMs is the retry-after-ms value sent with FaultStatus,
	// verbatim; "" sends none.
	RetryAfterMs string `json:"retry_after_ms,omitempty"`
	// Frames is the number of content frames FaultCut streams before the
	// reset (0: the reset follows the headers).
	Frames int64 `json:"frames,omitempty"`
	// Hang is how long FaultHang holds the request; 0 means
	// DefaultFaultHang.
	Hang time.Duration `json:"hang,omitempty"`
	// Count is how many requests get the fault, after which it is cleared;
	// 0 means every request until the fault is replaced or cleared.
	Count int64 `json:"count,omitempty"`
	// Every selects which requests get the fault, deterministically: the
	// 1st, (Every+1)-th, (2*Every+1)-th... request since SetFault (a fraction
	// 1/Every); 0 and 1 mean every request. Count counts faulted requests.
	Every int64 `json:"every,omitempty"`
}

// Validate reports a fault that cannot be injected.
func (f Fault) Validate() error {
	known := f.Kind == ""
	for _, k := range FaultKinds {
		known = known || f.Kind == k
	}
	switch {
	case !known:
		return fmt.Errorf("providersim: unknown fault %q (want one of %q)", f.Kind, FaultKinds)
	case f.Kind == FaultStatus && f.Status != 0 && (f.Status < 500 || f.Status > 599):
		return fmt.Errorf("providersim: fault status %d is not a 5xx (use the throttle fault for 429)", f.Status)
	case f.Frames < 0, f.Hang < 0, f.Count < 0, f.Every < 0:
		return errors.New("providersim: fault frames, hang, count and every must be >= 0")
	}
	return nil
}

// String is the fault in ParseFault's form.
func (f Fault) String() string {
	if f.Kind == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString(string(f.Kind))
	switch {
	case f.Kind == FaultStatus && f.Status != 0:
		b.WriteString("=" + strconv.Itoa(f.Status))
	case f.Kind == FaultCut:
		b.WriteString("=" + strconv.FormatInt(f.Frames, 10))
	case f.Kind == FaultHang && f.Hang != 0:
		b.WriteString("=" + f.Hang.String())
	}
	for _, kv := range []struct {
		k, v string
	}{{"retry-after", f.RetryAfter}, {"retry-after-ms", f.RetryAfterMs}} {
		if kv.v != "" {
			b.WriteString("," + kv.k + "=" + kv.v)
		}
	}
	if f.Count != 0 {
		b.WriteString(",count=" + strconv.FormatInt(f.Count, 10))
	}
	if f.Every > 1 {
		b.WriteString(",every=" + strconv.FormatInt(f.Every, 10))
	}
	return b.String()
}

// ParseFault reads a fault from its text form, the form of --fault and of
// POST /faults?fault=: KIND[=ARG][,KEY=VALUE]..., where KIND=ARG is
// status=5xx, cut=FRAMES or hang=DURATION, and the keys are retry-after,
// retry-after-ms, count and every (the Fault fields of those names).
// Examples: "status=503,retry-after=7", "reset,count=2", "cut=3",
// "hang=30s", "malformed", "no-usage,every=4", "throttle,count=1". The
// empty string is no fault.
func ParseFault(s string) (Fault, error) {
	var f Fault
	s = strings.TrimSpace(s)
	if s == "" {
		return f, nil
	}
	parts := strings.Split(s, ",")
	kind, arg, hasArg := strings.Cut(strings.TrimSpace(parts[0]), "=")
	f.Kind = FaultKind(kind)
	if hasArg {
		var err error
		switch f.Kind {
		case FaultStatus:
			f.Status, err = strconv.Atoi(arg)
		case FaultCut:
			f.Frames, err = strconv.ParseInt(arg, 10, 64)
		case FaultHang:
			f.Hang, err = time.ParseDuration(arg)
		default:
			err = errors.New("takes no argument")
		}
		if err != nil {
			return Fault{}, fmt.Errorf("providersim: fault %q: %v", parts[0], err)
		}
	}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return Fault{}, fmt.Errorf("providersim: fault option %q is not key=value", p)
		}
		var err error
		switch k {
		case "retry-after":
			f.RetryAfter = v
		case "retry-after-ms":
			f.RetryAfterMs = v
		case "count":
			f.Count, err = strconv.ParseInt(v, 10, 64)
		case "every":
			f.Every, err = strconv.ParseInt(v, 10, 64)
		default:
			err = errors.New("unknown option")
		}
		if err != nil {
			return Fault{}, fmt.Errorf("providersim: fault option %q: %v", p, err)
		}
	}
	return f, f.Validate()
}

// faultState is the injected fault and its counters; guarded by Server.mu.
type faultState struct {
	f        Fault
	seen     int64 // chat requests since SetFault
	injected int64 // faulted requests since SetFault
}

// SetFault injects f into the chat completion requests from now on (a zero
// Kind clears it), restarting its Count and Every. It returns f.Validate's
// error and changes nothing in that case.
func (s *Server) SetFault(f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = faultState{f: f}
	return nil
}

// Fault returns the injected fault (zero Kind: none) and how many requests
// it has been applied to since SetFault.
func (s *Server) Fault() (Fault, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault.f, s.fault.injected
}

// nextFault decides whether the request being served gets the fault and
// counts it (Stats.Faults); the fault clears itself after Count requests.
func (s *Server) nextFault() Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.fault
	if st.f.Kind == "" {
		return Fault{}
	}
	n := st.seen
	st.seen++
	if st.f.Every > 1 && n%st.f.Every != 0 {
		return Fault{}
	}
	f := st.f
	st.injected++
	s.stats.Faults++
	if f.Count > 0 && st.injected >= f.Count {
		st.f = Fault{}
	}
	return f
}

// handleFaults serves the fault control API: GET /faults answers the
// current fault ({"fault": "<ParseFault form>", "injected": n}); POST
// /faults sets one, from ?fault=<ParseFault form> or a JSON Fault body
// (Hang in nanoseconds); DELETE /faults clears it.
func (s *Server) handleFaults(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodDelete:
		_ = s.SetFault(Fault{})
	case http.MethodPost:
		var f Fault
		var err error
		if q := r.URL.Query().Get("fault"); q != "" {
			f, err = ParseFault(q)
		} else {
			err = json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&f)
		}
		if err == nil {
			err = s.SetFault(f)
		}
		if err != nil {
			writeError(w, DialectOpenAI, http.StatusBadRequest, "invalid_request_error", "invalid_fault", err.Error())
			return
		}
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		writeError(w, DialectOpenAI, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "Use GET, POST or DELETE.")
		return
	}
	f, n := s.Fault()
	writeJSON(w, http.StatusOK, map[string]any{"fault": f.String(), "injected": n})
}

// injectEarly serves the faults decided before admission (status, reset,
// hang, throttle) and reports whether it answered the request.
func (s *Server) injectEarly(ctx context.Context, w http.ResponseWriter, f Fault) bool {
	switch f.Kind {
	case FaultStatus:
		status := f.Status
		if status == 0 {
			status = http.StatusInternalServerError
		}
		if f.RetryAfter != "" {
			// An HTTP-date Retry-After is read against the Date, which is
			// the simulator's clock (see writeQuotaHeaders).
			w.Header().Set("Date", s.clock.Now().UTC().Format(http.TimeFormat))
			w.Header().Set("Retry-After", f.RetryAfter)
		}
		if f.RetryAfterMs != "" {
			w.Header().Set("retry-after-ms", f.RetryAfterMs)
		}
		writeError(w, DialectOpenAI, status, "server_error", "", fmt.Sprintf("The server had an error while processing your request (injected %d).", status))
	case FaultReset:
		resetConn(w)
	case FaultHang:
		d := f.Hang
		if d == 0 {
			d = DefaultFaultHang
		}
		s.sleep(ctx, d)
		resetConn(w)
	case FaultThrottle:
		writeError(w, DialectOpenAI, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
			"Rate limit reached (injected 429 without Retry-After or rate-limit headers).")
	default:
		return false
	}
	return true
}

// resetConn hijacks the response's connection and closes it with SO_LINGER
// 0, so the peer reads a TCP RST. Data already written is flushed first.
// Where the connection cannot be hijacked (HTTP/2), the handler aborts.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// writeMalformed writes a 200 application/json response whose body is the
// first half of the encoding of v: not valid JSON.
func writeMalformed(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b[:len(b)/2])
}

// writeCutBody writes a 200 application/json response announcing the full
// Content-Length of v's encoding, sends half of it and resets the
// connection.
func writeCutBody(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b[:len(b)/2])
	_ = http.NewResponseController(w).Flush()
	resetConn(w)
}

// noUsageBody is the chat completion body without its usage member.
type noUsageBody struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
}

func (c completion) bodyWithoutUsage() noUsageBody {
	b := c.body()
	return noUsageBody{ID: b.ID, Object: b.Object, Created: b.Created, Model: b.Model, Choices: b.Choices}
}
