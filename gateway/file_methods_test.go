package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/testenv"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
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
		{"file/upload/begin", `{"session_id":"s1","size_bytes":"big"}`, "Invalid params: `size_bytes` must be an integer"},
		{"file/upload/begin", `{"session_id":"s1","size_bytes":1.5}`, "Invalid params: `size_bytes` must be an integer"},
		{"file/upload/begin", `{"size_bytes":1}`, "Invalid params: `session_id` is required"},
		{"file/upload/chunk", `{"upload_id":"nope","offset":0,"data_b64":"eA=="}`, "Invalid params: `upload_id` must be 32 lower-case hexadecimal characters"},
		{"file/upload/chunk", `{"upload_id":"0123456789ABCDEF0123456789abcdef","offset":0,"data_b64":"eA=="}`, "Invalid params: `upload_id` must be 32 lower-case hexadecimal characters"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","data_b64":"eA=="}`, "Invalid params: `offset` is required"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","offset":0}`, "Invalid params: `data_b64` is required"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":"%%%"}`, "Invalid params: `data_b64` is not valid base64"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":"eA==","offset":5}`, "Invalid params: `offset` appears twice"},
		{"file/upload/chunk", `{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":"eA==","data_b64":"eB=="}`, "Invalid params: `data_b64` appears twice"},
		{"file/upload/chunk", `{"upload_id":"ffffffffffffffffffffffffffffffff","upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":"eA=="}`, "Invalid params: `upload_id` appears twice"},
		{"file/upload/commit", `{}`, "Invalid params: `upload_id` must be 32 lower-case hexadecimal characters"},
		{"file/attach", `{"session_id":"s1"}`, "Invalid params: `files` must list at least one file"},
		{"file/attach", `{"session_id":"s1","files":[{}]}`, "Invalid params: `files[0]`: send `path` or `data_b64`"},
		{"file/attach", `{"session_id":"s1","files":[{"path":"/a","data_b64":""}]}`, "Invalid params: `files[0]`: send either `path` or `data_b64`, not both"},
		{"file/attach", `{"session_id":"s1","files":[{"data_b64":"eA=="},{"data_b64":"*"}]}`, "Invalid params: `files[1].data_b64` is not valid base64"},
		// Each file is decoded into a struct, whose fields take a key
		// whatever its case: two spellings of one field are refused, not
		// the last one read (a path the client did not see in its log).
		{"file/attach", `{"session_id":"s1","files":[{"data_b64":"eA=="},{"path":"/a","PATH":"/etc/shadow"}]}`, "Invalid params: `files[1].PATH` appears twice"},
		{"file/attach", `{"session_id":"s1","files":[{"data_b64":"eA==","Data_B64":"eB=="}]}`, "Invalid params: `files[0].Data_B64` appears twice"},
		{"file/attach", `{"session_id":"s1","files":"x"}`, "Invalid params: `files` must be an array"},
		{"file/attach", `{"session_id":"s1","files":[]}`, "Invalid params: `files` must list at least one file"},
		{"file/attach", `{"session_id":"s1","files":[7]}`, "Invalid params: `files[0]` must be an object"},
		{"file/attach", `{"session_id":"s1","files":[{"data_b64":"eA=="},{"path":7}]}`, "Invalid params: `files[1].path` must be a string"},
	} {
		_, err := methods[tc.method].call(g, context.Background(), local, json.RawMessage(tc.params))
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || we.Message != tc.msg {
			t.Errorf("%s %s: got %v, want %q", tc.method, tc.params, err, tc.msg)
		}
	}
}

// chunkBySlowPath decodes chunk params as uploadChunk does when the fast
// path declines them, the reference: decodeParams, checks included.
func chunkBySlowPath(params []byte) (chunkFields, error) {
	var slow struct {
		UploadID string  `json:"upload_id"`
		Offset   *int64  `json:"offset"`
		DataB64  *string `json:"data_b64"`
	}
	// The connection hands a handler params from its first byte on.
	if err := decodeParams(bytes.TrimSpace(params), &slow); err != nil {
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
	`{"upload_id":"a","offset":0,"data_b64":"eA==","offset":5}`,
	`{"upload_id":"b","upload_id":"a","offset":0,"data_b64":"eA=="}`,
	`{"upload_id":"a","offset":null,"offset":0,"data_b64":"eA=="}`,
	`{"upload_id":"a","extra":1,"offset":0,"extra":2,"data_b64":"eA=="}`,
	`{"upload_id":"a","extra":1,"offset":0,"EXTRA":2,"data_b64":"eA=="}`,
	"{\"upload_id\":\"a\",\"\u017fize\":1,\"offset\":0,\"SIZE\":2,\"data_b64\":\"eA==\"}",
	`{"upload_id":"a","OFFSET":1,"offset":0,"data_b64":"eA=="}`,
	`{"upload_id":"a","nested":{"offset":2},"offset":1}`,
	`{"upload_id":true,"offset":"1","data_b64":3}`,
	`{}`, `[]`, `null`, `"x"`,
	// An escaped quote in data_b64: the scan's string ends there, and what
	// it reads after it is not the params.
	`{"upload_id":"0123456789abcdef0123456789abcdef","data_b64":"eA\"}","offset":1}`,
	`{"upload_id":"0123456789abcdef0123456789abcdef","offset":1,"data_b64":"eA==\"}"}`,
	`{"upload_id":"0123456789abcdef0123456789abcdef","offset":1,"data_b64":"eA\",\"offset\":2}"}`,
	`{"upload_id":"0123456789abcdef0123456789abcdef","offset":1,"data_b64":"e\/A="}`,
	`{"upload_id":"0123456789abcdef0123456789abcdef","offset":1,"data_b64":"e\u0041=="}`,
	"{\"upload_id\":\"0123456789abcdef0123456789abcdef\",\"offset\":1,\"data_b64\":\"eA\xff=\"}",
	`{"upload_id":"0123456789abcdef0123456789abcdef","offset":1,"data_b64":"eA=\\"}`,
	// data_b64 not last, a string of base64's alphabet after it: the
	// guess of its end (the last quote) is wrong, and must not decode.
	`{"data_b64":"eA==","offset":0,"upload_id":"0123456789abcdef0123456789abcdef"}`,
	`{"upload_id":"0123456789abcdef0123456789abcdef","data_b64":"eA==","offset":1,"x":"eA=="}`,
	`{"upload_id":"0123456789abcdef0123456789abcdef","offset":1,"data_b64":"eA==","x":"",  "y" : "QUJD" }`,
	"{\"upload_id\":\"0123456789abcdef0123456789abcdef\",\"offset\":1,\"data_b64\":\"QUJD\" \r\n}\n",
}

// plainData is the condition on which scanChunkParams's answer holds:
// data_b64's bytes, as it took them, hold no backslash and are valid
// UTF-8 (readChunk's decoding proves both).
func plainData(f chunkFields) bool {
	return bytes.IndexByte(f.data, '\\') < 0 && utf8.Valid(f.data)
}

// The fast reading of chunk params agrees with the ordinary one
// (decodeParams) whenever it answers, refusals included, and declines
// everything unusual.
func TestScanChunkParamsAgreesWithDecodeParams(t *testing.T) {
	answered, guessed := 0, 0
	for _, in := range chunkSeeds {
		for _, guess := range []bool{false, true} {
			fast, ok := scanChunkParams([]byte(in), guess)
			if !ok || !plainData(fast) || !provedGuess(fast) {
				continue
			}
			answered++
			if fast.guessed {
				guessed++
			}
			slow, err := chunkBySlowPath([]byte(in))
			if err != nil || !sameChunk(fast, slow) {
				t.Errorf("%s (guess %v): fast %+v, decodeParams %+v %v", in, guess, fast, slow, err)
			}
		}
	}
	if answered < 8 || guessed < 3 {
		t.Fatalf("the fast path answered only %d plain inputs, %d of them by a guess", answered, guessed)
	}
}

// provedGuess is the condition on which a guessed end of data_b64
// holds: its bytes decode (readChunk scans again when they do not).
func provedGuess(f chunkFields) bool {
	if !f.guessed {
		return true
	}
	_, err := base64.StdEncoding.DecodeString(string(f.data))
	return err == nil
}

// A guessed end of data_b64 that is wrong (another member after it)
// never decodes, so readChunk does not keep it: its bytes run over the
// next member's quotes.
func TestScanChunkParamsWrongGuessDoesNotDecode(t *testing.T) {
	in := []byte(`{"upload_id":"0123456789abcdef0123456789abcdef","data_b64":"eA==","offset":1,"x":"eA=="}`)
	f, ok := scanChunkParams(in, true)
	if !ok || !f.guessed {
		t.Fatalf("scan: ok %v, guessed %v; want a guess", ok, f.guessed)
	}
	if string(f.data) == "eA==" || provedGuess(f) {
		t.Fatalf("the wrong guess %q was proved", f.data)
	}
	id, off, buf, data, err := readChunk(in, nil)
	defer putChunkBuffer(buf)
	if err != nil || id != "0123456789abcdef0123456789abcdef" || off != 1 || string(data) != "x" {
		t.Fatalf("readChunk: %s@%d %q %v; want the upload's offset 1, \"x\"", id, off, data, err)
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
		for _, guess := range []bool{false, true} {
			fast, ok := scanChunkParams(in, guess)
			if !ok || !plainData(fast) || !provedGuess(fast) {
				continue
			}
			slow, err := chunkBySlowPath(in)
			if err != nil || !sameChunk(fast, slow) {
				t.Fatalf("%q (guess %v): fast %+v, decodeParams %+v %v", in, guess, fast, slow, err)
			}
		}
	})
}

// chunkReference reads and checks chunk params the ordinary way, and
// decodes data_b64 with encoding/base64: what readChunk must answer.
func chunkReference(params []byte) (id string, offset int64, data []byte, err error) {
	f, err := chunkBySlowPath(params)
	if err != nil {
		return "", 0, nil, err
	}
	if id, err = uploadID(f.uploadID); err != nil {
		return "", 0, nil, err
	}
	if f.offset == nil {
		return "", 0, nil, invalidParams("`offset` is required")
	}
	if f.data == nil {
		return "", 0, nil, invalidParams("`data_b64` is required")
	}
	if data, err = base64.StdEncoding.DecodeString(string(f.data)); err != nil {
		return "", 0, nil, invalidParams("`data_b64` is not valid base64")
	}
	return id, *f.offset, data, nil
}

// sameReading compares readChunk's answer for params with the reference.
func sameReading(t *testing.T, params []byte) {
	t.Helper()
	id, off, buf, data, err := readChunk(bytes.TrimSpace(params), nil)
	defer putChunkBuffer(buf)
	wid, woff, wdata, werr := chunkReference(params)
	var got, want *jsonrpc.Error
	switch {
	case (err == nil) != (werr == nil):
		t.Errorf("%.120q: readChunk error %v, the reference's %v", params, err, werr)
	case err != nil && (!errors.As(err, &got) || !errors.As(werr, &want) || got.Message != want.Message):
		t.Errorf("%.120q: readChunk refused %v, the reference %v", params, err, werr)
	case err == nil && (id != wid || off != woff || !bytes.Equal(data, wdata)):
		t.Errorf("%.120q: readChunk read %s@%d (%d bytes), the reference %s@%d (%d bytes)", params, id, off, len(data), wid, woff, len(wdata))
	}
}

// readChunk, which leaves data_b64's bytes to its decoding to check,
// answers as the ordinary reading and encoding/base64 do: escapes and an
// escaped quote in data_b64 (the scan's string ends early), bad base64
// anywhere in a chunk, invalid UTF-8, sizes about the pooled buffer's.
func TestReadChunkAgreesWithReference(t *testing.T) {
	for _, in := range chunkSeeds {
		sameReading(t, []byte(in))
	}
	const id = "0123456789abcdef0123456789abcdef"
	frame := func(b64 string) []byte {
		return []byte(fmt.Sprintf(`{"upload_id":%q,"offset":7,"data_b64":"%s"}`, id, b64))
	}
	for _, n := range []int{0, 1, 2, 3, 4, 1<<20 - 1, 1 << 20, 1<<20 + 1, 1<<20 + 2, 1<<20 + 3} {
		raw := make([]byte, n)
		_, _ = rand.Read(raw)
		enc := base64.StdEncoding.EncodeToString(raw)
		sameReading(t, frame(enc))
		if n == 0 {
			continue
		}
		for _, pos := range []int{0, len(enc) / 2, len(enc) - 33, len(enc) - 5, len(enc) - 1} {
			if pos < 0 {
				continue
			}
			for _, bad := range []string{"*", `\/`, `\"`, "\xff", "=", `\u0041`} {
				sameReading(t, frame(enc[:pos]+bad+enc[pos+1:]))
			}
		}
		sameReading(t, frame(strings.TrimRight(enc, "="))) // padding left off
		sameReading(t, frame(enc+"A"))
	}
}

func FuzzReadChunk(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if !json.Valid(in) {
			return // the connection refuses it before any handler runs
		}
		sameReading(t, in)
	})
}

// chunkSink is an upload-staging server that keeps the hash of every
// chunk it receives.
type chunkSink struct {
	uploadv1.UnimplementedUploadServiceServer
	mu  sync.Mutex
	got map[string][32]byte // upload id and offset -> SHA-256 of the bytes
}

func (s *chunkSink) Chunk(_ context.Context, req *uploadv1.ChunkRequest) (*uploadv1.ChunkResponse, error) {
	sum := sha256.Sum256(req.GetData())
	s.mu.Lock()
	s.got[fmt.Sprint(req.GetUploadId(), "@", req.GetOffset())] = sum
	s.mu.Unlock()
	return &uploadv1.ChunkResponse{ReceivedBytes: req.GetOffset() + int64(len(req.GetData()))}, nil
}

// serveStaging serves srv as the upload-staging service on a Unix socket
// for the test's length and returns a real gRPC client of it, dialled
// with opts.
func serveStaging(t *testing.T, srv uploadv1.UploadServiceServer, opts ...grpc.DialOption) uploadv1.UploadServiceClient {
	t.Helper()
	gs := grpc.NewServer()
	uploadv1.RegisterUploadServiceServer(gs, srv)
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "up.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient("unix:"+lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return uploadv1.NewUploadServiceClient(cc)
}

// Chunks decoded at once on several connections each reach the staging
// service, over a real gRPC connection, as they were sent: the pooled
// buffer a chunk is decoded into is not reused while its call still
// needs it (the race detector watches the same buffers), whether grpc's
// codec copies the bytes or the gateway's codec sends them from the
// buffer itself (lent, as New sets it up: none of them then goes through
// a kept buffer).
func TestChunksDecodedConcurrentlyArriveIntact(t *testing.T) {
	t.Run("copied", func(t *testing.T) {
		sink := &chunkSink{got: map[string][32]byte{}}
		chunksArriveIntact(t, &Gateway{upload: serveStaging(t, sink)}, sink)
	})
	t.Run("lent", func(t *testing.T) {
		sink := &chunkSink{got: map[string][32]byte{}}
		codec := bulkcodec.New(0, (&uploadv1.ChunkRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"))
		g := &Gateway{upload: serveStaging(t, sink, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec))), chunks: codec}
		chunksArriveIntact(t, g, sink)
		if codec.Kept() != 0 {
			t.Fatal("chunks were copied into kept buffers, not sent from where they were decoded")
		}
	})
}

func chunksArriveIntact(t *testing.T, g *Gateway, sink *chunkSink) {

	const conns, chunks = 6, 8
	sizes := []int{1 << 20, 1<<20 - 1, 700 << 10, 1<<20 + 10} // the last is decoded outside the pool
	want := make(map[string][32]byte)
	params := make([][]json.RawMessage, conns)
	for c := range conns {
		for i := range chunks {
			data := make([]byte, sizes[(c+i)%len(sizes)])
			_, _ = rand.Read(data)
			id := fmt.Sprintf("%032x", c+1)
			off := int64(i) << 21
			want[fmt.Sprint(id, "@", off)] = sha256.Sum256(data)
			raw, _ := json.Marshal(map[string]any{"upload_id": id, "offset": off, "data_b64": base64.StdEncoding.EncodeToString(data)})
			params[c] = append(params[c], raw)
		}
	}
	local := &connState{id: "conn-local", transport: transportLocal}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for c := range conns {
		wg.Go(func() {
			for _, p := range params[c] {
				if _, err := methods["file/upload/chunk"].call(g, context.Background(), local, p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(sink.got) != len(want) {
		t.Fatalf("%d chunks arrived, %d sent", len(sink.got), len(want))
	}
	for k, sum := range want {
		if sink.got[k] != sum {
			t.Errorf("chunk %s arrived changed", k)
		}
	}
}

// A method marked paramsDone has its frame's memory reused by a later
// frame once its handler returns (jsonrpc.Options.ParamsDone): each of
// file/upload/chunk's chunks reaches the staging service as sent though
// its params are written over the moment the call returns, as the next
// frame writes over them; and no other method is marked without a case
// here that shows its handler keeps nothing of its params.
func TestParamsDoneMethodsKeepNothing(t *testing.T) {
	for name, m := range methods {
		if m.paramsDone && name != "file/upload/chunk" {
			t.Errorf("%s is marked paramsDone, with no test here that its handler keeps nothing of its params", name)
		}
	}
	sink := &chunkSink{got: map[string][32]byte{}}
	g := &Gateway{upload: serveStaging(t, sink)}
	local := &connState{id: "conn-local", transport: transportLocal}
	want := make(map[string][32]byte)
	for i := range 4 {
		data := make([]byte, 1<<20)
		_, _ = rand.Read(data)
		id, off := fmt.Sprintf("%032x", 7), int64(i)<<20
		want[fmt.Sprint(id, "@", off)] = sha256.Sum256(data)
		params, _ := json.Marshal(map[string]any{"upload_id": id, "offset": off, "data_b64": base64.StdEncoding.EncodeToString(data)})
		if _, err := methods["file/upload/chunk"].call(g, context.Background(), local, params); err != nil {
			t.Fatal(err)
		}
		for j := range params {
			params[j] = 'A'
		}
	}
	for k, sum := range want {
		sink.mu.Lock()
		got, ok := sink.got[k]
		sink.mu.Unlock()
		if !ok || got != sum {
			t.Errorf("chunk %s: arrived %v, as sent %v", k, ok, got == sum)
		}
	}
}

// stagingCalls counts the calls the gateway makes on its own, outside a
// file method: lease renewals and closed connections.
type stagingCalls struct {
	uploadv1.UnimplementedUploadServiceServer
	renews, discards atomic.Int32
}

func (s *stagingCalls) Renew(context.Context, *uploadv1.RenewRequest) (*uploadv1.RenewResponse, error) {
	s.renews.Add(1)
	return &uploadv1.RenewResponse{LeaseMs: 60_000}, nil
}

func (s *stagingCalls) DiscardConnection(context.Context, *uploadv1.DiscardConnectionRequest) (*uploadv1.DiscardConnectionResponse, error) {
	s.discards.Add(1)
	return &uploadv1.DiscardConnectionResponse{}, nil
}

func (s *stagingCalls) Begin(context.Context, *uploadv1.BeginRequest) (*uploadv1.BeginResponse, error) {
	return &uploadv1.BeginResponse{UploadId: fmt.Sprintf("%032x", 1), ChunkBytes: 1 << 20, MaxBytes: 10 << 20}, nil
}

// A gateway calls the staging service only once a client uses a file
// method (the launcher starts it on its first connection): no lease is
// renewed and no closed connection told of until then; from an upload
// on, the lease is renewed, and the close of the connection that began
// it is told, while that of one that did not is still not.
func TestStagingCalledOnlyOnceUploadsAreUsed(t *testing.T) {
	calls := &stagingCalls{}
	g := &Gateway{upload: serveStaging(t, calls), uploadsUsed: make(chan struct{}), log: zap.NewNop()}
	ctx, cancel := context.WithCancel(context.Background())
	renewing := make(chan struct{})
	go func() { defer close(renewing); g.renewUploads(ctx) }()
	defer func() { cancel(); <-renewing }()

	idle := &connState{id: "conn-idle", transport: transportLocal}
	g.discardUploads(context.Background(), idle)
	time.Sleep(300 * time.Millisecond) // time enough for a renewal at once
	if r, d := calls.renews.Load(), calls.discards.Load(); r != 0 || d != 0 {
		t.Fatalf("before any upload: %d renewals, %d discards; want none", r, d)
	}

	up := &connState{id: "conn-up", transport: transportLocal}
	if _, err := methods["file/upload/begin"].call(g, context.Background(), up, json.RawMessage(`{"session_id":"s1","size_bytes":5}`)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
		if calls.renews.Load() == 0 {
			return errors.New("no lease renewal after an upload began")
		}
		return nil
	})
	g.discardUploads(context.Background(), idle)
	if d := calls.discards.Load(); d != 0 {
		t.Fatalf("a connection that began no upload was told of: %d discards", d)
	}
	g.discardUploads(context.Background(), up)
	if d := calls.discards.Load(); d != 1 {
		t.Fatalf("the uploading connection's close: %d discards, want 1", d)
	}
}
