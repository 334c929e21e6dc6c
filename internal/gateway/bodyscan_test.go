package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// bigCompletion is a chat completion of about size bytes whose usage is
// prompt and completion tokens.
func bigCompletion(size int, prompt, completion int64) []byte {
	return []byte(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("x", size) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":` + strconv.FormatInt(prompt, 10) +
		`,"completion_tokens":` + strconv.FormatInt(completion, 10) + `}}`)
}

// TestNonStreamingBodyReadOnce covers the one-pass read of a non-streaming
// 200 (readResponseBody, scanResponseJSON): a body with or without a
// Content-Length is passed through byte for byte and settled from its usage
// before it is written (BC-24); a body that is not JSON is a 502
// upstream_invalid_response and the charge stands (BC-28a); a body above
// the gateway's response limit is passed through whole, its usage unread,
// so the charge stands. Bucket 10000; the request charges prompt + 1000.
func TestNonStreamingBodyReadOnce(t *testing.T) {
	valid := bigCompletion(300<<10, 7, 93)
	for _, tc := range []struct {
		name       string
		body       []byte
		chunked    bool
		maxResp    int64
		wantStatus int
		wantBody   []byte // nil: not checked
		wantUsed   int64  // -1: the charge stands
	}{
		{"content-length", valid, false, 0, 200, valid, 100},
		{"chunked", valid, true, 0, 200, valid, 100},
		{"exactly the limit", valid, false, int64(len(valid)), 200, valid, 100},
		{"not JSON", append(bytes.Clone(valid[:len(valid)-1]), ','), false, 0, 502, nil, -1},
		{"not JSON, chunked", []byte("<html>oops</html>"), true, 0, 502, nil, -1},
		{"above the limit", valid, false, int64(len(valid)) - 1, 200, valid, -1},
		{"above the limit, chunked", valid, true, 1000, 200, valid, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				quotaHeaders(w.Header())
				w.Header().Set("Content-Type", "application/json")
				if tc.chunked {
					w.WriteHeader(200)
					w.(http.Flusher).Flush()
				} else {
					w.Header().Set("Content-Length", strconv.Itoa(len(tc.body)))
				}
				for b := tc.body; len(b) > 0; {
					n := min(len(b), 64<<10)
					_, _ = w.Write(b[:n])
					b = b[n:]
				}
			})
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(10000)})})
			if tc.maxResp > 0 {
				e.gw.maxResp = tc.maxResp
			}
			body := chatBody(1000)
			req, aerr := parseRequest(endpointChat, []byte(body), e.reg.Pool(), promptCounter{})
			if aerr != nil {
				t.Fatal(aerr.message)
			}
			resp := e.do("POST", endpointChat, "key-a", body)
			got := readAll(t, resp)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d: %.200s", resp.StatusCode, tc.wantStatus, got)
			}
			if tc.wantBody != nil && !bytes.Equal(got, tc.wantBody) {
				t.Errorf("body of %d bytes differs from the provider's %d bytes", len(got), len(tc.wantBody))
			}
			if tc.wantStatus == 502 && !bytes.Contains(got, []byte(`"upstream_invalid_response"`)) {
				t.Errorf("502 body %s, want code upstream_invalid_response", got)
			}
			used := tc.wantUsed
			if used < 0 {
				used = req.promptTokens + 1000
			}
			if left := e.tokensLeft("a"); left != 10000-used {
				t.Errorf("bucket after the call = %d, want %d", left, 10000-used)
			}
		})
	}
}

// TestReadResponseBody: readResponseBody returns what
// io.ReadAll(io.LimitReader(body, limit+1)) returns, whatever the announced
// length (right, wrong or unknown).
func TestReadResponseBody(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 1000)
	for _, limit := range []int64{0, 1, 9999, 10000, 10001, 1 << 20} {
		for _, cl := range []int64{-1, 0, 5, 9999, 10000, 10001, 1 << 30} {
			got, err := readResponseBody(bytes.NewReader(body), cl, limit)
			want := body[:min(int64(len(body)), limit+1)]
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("limit %d, length %d: %d bytes, %v; want %d bytes", limit, cl, len(got), err, len(want))
			}
			putRespBuf(got)
		}
	}
}

// TestStreamFramesNotHeldBack: when the provider sends one frame and waits,
// the client receives that frame before the provider sends the next (a
// frame is only left unflushed while the next one is already buffered in
// full).
func TestStreamFramesNotHeldBack(t *testing.T) {
	next := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		quotaHeaders(w.Header())
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for i := range 5 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-time.After(10 * time.Second):
				return // the client never saw the frame: the test fails below
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	resp := e.do("POST", endpointChat, "key-a", `{"model":"`+testModel+`","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":10}`)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for i := range 5 {
		var line string
		for sc.Scan() {
			if line = sc.Text(); strings.HasPrefix(line, "data: ") {
				break
			}
		}
		if want := fmt.Sprintf(`"content":"t%d"`, i); !strings.Contains(line, want) {
			t.Fatalf("frame %d: got %q, want it to carry %s", i, line, want)
		}
		select {
		case next <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatalf("the provider stopped after frame %d", i)
		}
	}
	var rest []string
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			rest = append(rest, d)
		}
	}
	if len(rest) != 1 || rest[0] != "[DONE]" {
		t.Errorf("after the frames: %q, want [DONE]", rest)
	}
}
