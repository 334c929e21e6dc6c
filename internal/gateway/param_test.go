package gateway

import (
	"net/http"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestErrorParam checks the "param" of 400 errors: the request parameter at
// fault, as OpenAI's error format names it, so that a client can tell which
// field to fix without parsing the message; null when the error is about the
// whole body.
func TestErrorParam(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	chat := `{"model":"` + testModel + `","messages":` + chatPrompt + `}`
	for _, tc := range []struct {
		name, method, path, body, code string
		param                          any // string, or nil for JSON null
	}{
		{"model not a string", "POST", endpointChat, `{"model":1,"messages":` + chatPrompt + `}`, codeInvalidRequest, "model"},
		{"model not served", "POST", endpointChat, `{"model":"other","messages":` + chatPrompt + `}`, codeModelNotFound, "model"},
		{"stream not a boolean", "POST", endpointChat, `{"model":"` + testModel + `","stream":"yes","messages":` + chatPrompt + `}`, codeInvalidRequest, "stream"},
		{"stream_options not an object", "POST", endpointChat, `{"model":"` + testModel + `","stream":true,"stream_options":1,"messages":` + chatPrompt + `}`, codeInvalidRequest, "stream_options"},
		{"messages not an array", "POST", endpointChat, `{"model":"` + testModel + `","messages":"hi"}`, codeInvalidRequest, "messages"},
		{"prompt not text", "POST", endpointCompletions, `{"model":"` + testModel + `","prompt":{}}`, codeInvalidRequest, "prompt"},
		{"input not text", "POST", endpointEmbeddings, `{"model":"` + testModel + `","input":{}}`, codeInvalidRequest, "input"},
		{"input missing", "POST", endpointEmbeddings, `{"model":"` + testModel + `"}`, codeInvalidRequest, "input"},
		{"input null", "POST", endpointEmbeddings, `{"model":"` + testModel + `","input":null}`, codeInvalidRequest, "input"},
		{"a null message", "POST", endpointChat, `{"model":"` + testModel + `","messages":[null]}`, codeInvalidRequest, "messages"},
		{"a message not an object", "POST", endpointChat, `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"},"hi"]}`, codeInvalidRequest, "messages"},
		{"stream_options.include_usage not a boolean", "POST", endpointChat, `{"model":"` + testModel + `","stream":true,"stream_options":{"include_usage":"yes"},"messages":` + chatPrompt + `}`, codeInvalidRequest, "stream_options.include_usage"},
		{"max_tokens negative", "POST", endpointChat, `{"model":"` + testModel + `","max_tokens":-1,"messages":` + chatPrompt + `}`, codeInvalidRequest, "max_tokens"},
		{"max_completion_tokens not an integer", "POST", endpointChat, `{"model":"` + testModel + `","max_tokens":5,"max_completion_tokens":1.5,"messages":` + chatPrompt + `}`, codeInvalidRequest, "max_completion_tokens"},
		{"n zero", "POST", endpointChat, `{"model":"` + testModel + `","n":0,"messages":` + chatPrompt + `}`, codeInvalidRequest, "n"},
		{"body not JSON", "POST", endpointChat, `{`, codeInvalidJSON, nil},
		{"job endpoint unknown", "POST", "/v1/jobs", `{"endpoint":"/v1/images","body":` + chat + `}`, codeInvalidEndpoint, "endpoint"},
		{"job deadline a string", "POST", "/v1/jobs", `{"body":` + chat + `,"deadlineSeconds":"1"}`, codeInvalidDeadline, "deadlineSeconds"},
		{"job webhook not https", "POST", "/v1/jobs", `{"body":` + chat + `,"webhookURL":"ftp://example.com/h"}`, codeInvalidRequest, "webhookURL"},
		{"job metadata not an object", "POST", "/v1/jobs", `{"body":` + chat + `,"metadata":[1]}`, codeInvalidRequest, "metadata"},
		{"job without body", "POST", "/v1/jobs", `{"endpoint":"/v1/chat/completions"}`, codeInvalidRequest, "body"},
		{"job streaming", "POST", "/v1/jobs", `{"body":{"model":"` + testModel + `","stream":true,"messages":` + chatPrompt + `}}`, codeStreamNotSupported, "body.stream"},
		{"job body max_tokens negative", "POST", "/v1/jobs", `{"body":{"model":"` + testModel + `","max_tokens":-1,"messages":` + chatPrompt + `}}`, codeInvalidRequest, "body.max_tokens"},
		{"job body model unknown", "POST", "/v1/jobs", `{"body":{"model":"nope","messages":` + chatPrompt + `}}`, codeModelNotFound, "body.model"},
		{"job body messages missing", "POST", "/v1/jobs", `{"body":{"model":"` + testModel + `"}}`, codeInvalidRequest, "body.messages"},
		{"list status unknown", "GET", "/v1/jobs?status=done", "", codeInvalidRequest, "status"},
		{"list limit zero", "GET", "/v1/jobs?limit=0", "", codeInvalidRequest, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.do(tc.method, tc.path, "key-a", tc.body)
			body := decode[map[string]map[string]any](t, resp)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %v", resp.StatusCode, body)
			}
			got := body["error"]
			if got["code"] != tc.code || got["param"] != tc.param {
				t.Errorf("error code %v param %#v, want %s %#v (message %q)", got["code"], got["param"], tc.code, tc.param, got["message"])
			}
			if _, ok := got["param"]; !ok {
				t.Error(`the error has no "param" member`)
			}
		})
	}
}

// TestBulkLineErrorParam: a refused line of a bulk upload names its
// parameter as a single submission's error does.
func TestBulkLineErrorParam(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	chat := `{"model":"` + testModel + `","messages":` + chatPrompt + `}`
	resp := e.bulk("key-a", `{"body":`+chat+`,"deadlineSeconds":"soon"}`+"\n"+`{"body":`+chat+`}`+"\n")
	body := decode[struct {
		Data []struct {
			Line  int            `json:"line"`
			Error map[string]any `json:"error"`
		} `json:"data"`
	}](t, resp)
	if resp.StatusCode != http.StatusOK || len(body.Data) != 2 {
		t.Fatalf("status %d, %d lines", resp.StatusCode, len(body.Data))
	}
	if got := body.Data[0].Error; got["code"] != codeInvalidDeadline || got["param"] != "deadlineSeconds" {
		t.Errorf("line 1 error %v, want code %s param deadlineSeconds", got, codeInvalidDeadline)
	}
	if body.Data[1].Error != nil {
		t.Errorf("line 2 refused: %v", body.Data[1].Error)
	}
}
