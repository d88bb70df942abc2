package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
)

// The chunked-upload methods and file/attach's path mode are served only
// on the local socket: a connection from any other transport gets -32012
// before anything is asked of a service (this gateway has none).
func TestUploadMethodsOnlyOnTheLocalSocket(t *testing.T) {
	g := &Gateway{}
	remote := &connState{id: "conn-remote", transport: "wss"}
	for _, tc := range []struct {
		method string
		params string
		msg    string
	}{
		{"file/upload/begin", `{"session_id":"s1","size_bytes":1}`, "file/upload/begin is served only on the local socket"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":"eA=="}`, "file/upload/chunk is served only on the local socket"},
		{"file/upload/commit", `{"upload_id":"0123456789abcdef0123456789abcdef"}`, "file/upload/commit is served only on the local socket"},
		{"file/attach", `{"session_id":"s1","files":[{"path":"/etc/hostname"}]}`, "`files[0].path` is served only on the local socket"},
	} {
		t.Run(tc.method, func(t *testing.T) {
			_, err := methods[tc.method].call(g, context.Background(), remote, json.RawMessage(tc.params))
			var we *jsonrpc.Error
			if !errors.As(err, &we) || we.Code != jsonrpc.CodeForbidden || we.Message != tc.msg || string(we.Data) != `{"reason":"forbidden"}` {
				t.Fatalf("got %v", err)
			}
		})
	}
	// data_b64 is not the local socket's only: it goes on to the service.
	_, err := methods["file/attach"].call(g, context.Background(), remote, json.RawMessage(`{"session_id":"s1","files":[{"data_b64":"eA=="}]}`))
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != jsonrpc.CodeInternal || we.Message != "upload-staging unavailable" {
		t.Fatalf("attach with data from another transport: %v", err)
	}
	// The local socket's connections are served.
	local := &connState{id: "conn-local", transport: transportLocal}
	_, err = methods["file/upload/begin"].call(g, context.Background(), local, json.RawMessage(`{"session_id":"s1","size_bytes":1}`))
	if !errors.As(err, &we) || we.Code != jsonrpc.CodeInternal {
		t.Fatalf("begin on the local socket: %v", err)
	}
}

// Field checks of the file methods, before any service is asked.
func TestFileMethodParams(t *testing.T) {
	g := &Gateway{}
	local := &connState{id: "conn-local", transport: transportLocal}
	for _, tc := range []struct {
		method, params, msg string
	}{
		{"file/upload/begin", `{"session_id":"s1"}`, "Invalid params: `size_bytes` is required"},
		{"file/upload/begin", `{"session_id":"s1","size_bytes":"big"}`, "Invalid params: `size_bytes` must be a number"},
		{"file/upload/begin", `{"size_bytes":1}`, "Invalid params: `session_id` is required"},
		{"file/upload/chunk", `{"upload_id":"nope","offset":0,"data_b64":"eA=="}`, "Invalid params: `upload_id` must be 32 hexadecimal characters"},
		{"file/upload/chunk", `{"upload_id":"0123456789ABCDEF0123456789abcdef","offset":0,"data_b64":"eA=="}`, "Invalid params: `upload_id` must be 32 hexadecimal characters"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","data_b64":"eA=="}`, "Invalid params: `offset` is required"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","offset":0}`, "Invalid params: `data_b64` is required"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":"%%%"}`, "Invalid params: `data_b64` is not valid base64"},
		{"file/upload/commit", `{}`, "Invalid params: `upload_id` must be 32 hexadecimal characters"},
		{"file/attach", `{"session_id":"s1"}`, "Invalid params: `files` must list at least one file"},
		{"file/attach", `{"session_id":"s1","files":[{}]}`, "Invalid params: `files[0]`: send `path` or `data_b64`"},
		{"file/attach", `{"session_id":"s1","files":[{"path":"/a","data_b64":""}]}`, "Invalid params: `files[0]`: send either `path` or `data_b64`, not both"},
		{"file/attach", `{"session_id":"s1","files":[{"data_b64":"eA=="},{"data_b64":"*"}]}`, "Invalid params: `files[1].data_b64` is not valid base64"},
	} {
		_, err := methods[tc.method].call(g, context.Background(), local, json.RawMessage(tc.params))
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || we.Message != tc.msg {
			t.Errorf("%s %s: got %v, want %q", tc.method, tc.params, err, tc.msg)
		}
	}
}

// chunkBySlowPath decodes chunk params with encoding/json, the reference.
func chunkBySlowPath(params []byte) (chunkFields, error) {
	var slow struct {
		UploadID string  `json:"upload_id"`
		Offset   *int64  `json:"offset"`
		DataB64  *string `json:"data_b64"`
	}
	if err := json.Unmarshal(params, &slow); err != nil {
		return chunkFields{}, err
	}
	f := chunkFields{uploadID: slow.UploadID, offset: slow.Offset}
	if slow.DataB64 != nil {
		f.data = []byte(*slow.DataB64)
	}
	return f, nil
}

func sameChunk(a, b chunkFields) bool {
	return a.uploadID == b.uploadID && (a.offset == nil) == (b.offset == nil) && (a.offset == nil || *a.offset == *b.offset) &&
		(a.data == nil) == (b.data == nil) && string(a.data) == string(b.data)
}

var chunkSeeds = []string{
	`{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":"eA=="}`,
	` { "data_b64" : "eA==" , "offset" : 1048576 , "upload_id" : "x" , "extra" : "y" } `,
	`{"upload_id":"a","offset":-3,"data_b64":""}`,
	`{"upload_id":"a","offset":null,"data_b64":null}`,
	`{"upload_id":"a","offset":1.5,"data_b64":"eA=="}`,
	`{"upload_id":"a","offset":1e3,"data_b64":"eA=="}`,
	`{"upload_id":"a\u0062","offset":1,"data_b64":"e\/A="}`,
	`{"upload_id":"a","offset":1,"data_b64":"eA==","data_b64":"eB=="}`,
	`{"upload_id":"a","nested":{"offset":2},"offset":1}`,
	`{"upload_id":true,"offset":"1","data_b64":3}`,
	`{}`, `[]`, `null`, `"x"`,
}

// The fast reading of chunk params agrees with encoding/json whenever it
// answers, and declines everything unusual.
func TestScanChunkParamsAgreesWithEncodingJSON(t *testing.T) {
	answered := 0
	for _, in := range chunkSeeds {
		fast, ok := scanChunkParams([]byte(in))
		if !ok {
			continue
		}
		answered++
		slow, err := chunkBySlowPath([]byte(in))
		if err != nil || !sameChunk(fast, slow) {
			t.Errorf("%s: fast %+v, encoding/json %+v %v", in, fast, slow, err)
		}
	}
	if answered < 4 {
		t.Fatalf("the fast path answered only %d plain inputs", answered)
	}
}

func FuzzScanChunkParams(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if !json.Valid(in) {
			return // the connection refuses it before any handler runs
		}
		fast, ok := scanChunkParams(in)
		if !ok {
			return
		}
		slow, err := chunkBySlowPath(in)
		if err != nil || !sameChunk(fast, slow) {
			t.Fatalf("%q: fast %+v, encoding/json %+v %v", in, fast, slow, err)
		}
	})
}
