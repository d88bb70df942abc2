package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/steptrace"
	"github.com/clawmesh/clawmesh/internal/uploads"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// The file methods (docs/spec.md §5, §6): file/attach, and file/upload/begin,
// chunk and commit, served by the upload-staging service. An upload
// belongs to the connection that began it: every call names this
// gateway process (g.id) and the connection (cs.id), both random, and
// the connection's teardown discards its uploads (discardUploads). While
// the gateway lives it renews a lease on its uploads (renewUploads), so
// if it dies the staging service discards them once the lease lapses.
//
// The launcher starts upload-staging only when a client first connects to
// its socket (docs/design.md, "Dormant processes"), so the gateway calls
// it only for the file methods themselves: it renews its lease once one
// of its connections has begun an upload or attached a file, and tells
// it of a closed connection only when that connection did.

// transportLocal marks a connection accepted on the local Unix socket.
// The chunked-upload methods and file/attach's path mode are served only
// there; a connection from any other transport (a future WSS listener)
// carries another value and is refused with -32012.
const transportLocal = "local"

// local reports whether cs came over the local socket.
func (cs *connState) local() bool { return cs.transport == transportLocal }

// onlyLocal refuses what is served only on the local socket.
func onlyLocal(what string) *jsonrpc.Error {
	return jsonrpc.NewError(jsonrpc.CodeForbidden, what+" is served only on the local socket", map[string]any{"reason": rpcerr.ReasonForbidden})
}

// uploadUnavailable answers when the gateway was started without an
// upload-staging address.
var uploadUnavailable = jsonrpc.NewError(jsonrpc.CodeInternal, "upload-staging unavailable", nil)

// fileEntry is a file entry result as the socket shows it.
func fileEntry(f *sessionv1.FileEntry) map[string]any {
	return map[string]any{
		"ref_id":         f.GetRefId(),
		"marker":         f.GetMarker(),
		"workspace_path": f.GetWorkspacePath(),
		"size_bytes":     f.GetSizeBytes(),
		"deduplicated":   f.GetDeduplicated(),
	}
}

// decodeB64 reads a data_b64 field.
func decodeB64(s, field string) ([]byte, error) {
	b := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
	n, err := decodeBase64(b, []byte(s))
	if err != nil {
		return nil, invalidParams(fmt.Sprintf("`%s` is not valid base64", field))
	}
	return b[:n], nil
}

// uploadID reads an upload_id: 32 lower-case hexadecimal characters, as
// upload-staging makes them.
func uploadID(id string) (string, error) {
	if !ids.LowerHex(id, uploads.IDHexLen) {
		return "", invalidParams(uploads.BadUploadID)
	}
	return id, nil
}

type attachParams struct {
	sessionRef
	FilesRaw json.RawMessage `json:"files"`
}

type attachFile struct {
	Path     *string `json:"path"`
	DataB64  *string `json:"data_b64"`
	Filename string  `json:"filename"`
	MimeType string  `json:"mime_type"`
}

// fileAttach is file/attach {session_id, files:[{path?|data_b64?,
// filename?, mime_type?}]} -> {files:[file entry]}: whole files, stored
// through the same step as a committed upload. A path is read by the
// daemon, and is accepted only on the local socket.
func (g *Gateway) fileAttach(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p attachParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	id, err := p.id()
	if err != nil {
		return nil, err
	}
	if err := checkStructs(p.FilesRaw, "files", 2); err != nil {
		return nil, err
	}
	var raws []json.RawMessage
	if !isAbsent(p.FilesRaw) && json.Unmarshal(p.FilesRaw, &raws) != nil {
		return nil, invalidParams("`files` must be an array")
	}
	if len(raws) == 0 {
		return nil, invalidParams("`files` must list at least one file")
	}
	files := make([]*uploadv1.AttachFile, len(raws))
	for i, raw := range raws {
		var f attachFile
		if err := json.Unmarshal(raw, &f); err != nil {
			var typeErr *json.UnmarshalTypeError
			if errors.As(err, &typeErr) && typeErr.Field != "" {
				return nil, invalidParams(fmt.Sprintf("`files[%d].%s` must be %s", i, typeErr.Field, article(typeErr.Type.Kind())))
			}
			return nil, invalidParams(fmt.Sprintf("`files[%d]` must be an object", i))
		}
		af := &uploadv1.AttachFile{Filename: f.Filename, MimeType: f.MimeType}
		switch {
		case f.Path != nil && f.DataB64 != nil:
			return nil, invalidParams(fmt.Sprintf("`files[%d]`: send either `path` or `data_b64`, not both", i))
		case f.Path != nil:
			if !cs.local() {
				return nil, onlyLocal(fmt.Sprintf("`files[%d].path`", i))
			}
			if *f.Path == "" {
				return nil, invalidParams(fmt.Sprintf("`files[%d].path` must be an absolute path", i))
			}
			af.Path = *f.Path
		case f.DataB64 != nil:
			if af.Data, err = decodeB64(*f.DataB64, fmt.Sprintf("files[%d].data_b64", i)); err != nil {
				return nil, err
			}
		default:
			return nil, invalidParams(fmt.Sprintf("`files[%d]`: send `path` or `data_b64`", i))
		}
		files[i] = af
	}
	if g.upload == nil {
		return nil, uploadUnavailable
	}
	g.usingUploads(cs)
	resp, err := g.upload.Attach(ctx, &uploadv1.AttachRequest{Principal: cs.principalOf(), ConnectionId: cs.id, SessionId: id, Files: files})
	if err != nil {
		return nil, serviceError("upload-staging", err)
	}
	out := make([]map[string]any, 0, len(resp.GetFiles()))
	for _, f := range resp.GetFiles() {
		out = append(out, fileEntry(f))
	}
	return map[string]any{"files": out}, nil
}

// uploadBegin is file/upload/begin {session_id, size_bytes, filename?,
// sha256?} -> {upload_id, chunk_bytes, max_bytes}.
func (g *Gateway) uploadBegin(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	if !cs.local() {
		return nil, onlyLocal("file/upload/begin")
	}
	var p struct {
		sessionRef
		SizeBytes *int64 `json:"size_bytes"`
		Filename  string `json:"filename"`
		SHA256    string `json:"sha256"`
		MimeType  string `json:"mime_type"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	id, err := p.id()
	if err != nil {
		return nil, err
	}
	if p.SizeBytes == nil {
		return nil, invalidParams("`size_bytes` is required")
	}
	if g.upload == nil {
		return nil, uploadUnavailable
	}
	g.usingUploads(cs)
	defer steptrace.Since("gateway", "begin.call", time.Now())
	resp, err := g.upload.Begin(ctx, &uploadv1.BeginRequest{
		Principal: cs.principalOf(), GatewayId: g.id, ConnectionId: cs.id, SessionId: id,
		SizeBytes: *p.SizeBytes, Filename: p.Filename, Sha256: p.SHA256, MimeType: p.MimeType,
	})
	if err != nil {
		return nil, serviceError("upload-staging", err)
	}
	return map[string]any{"upload_id": resp.GetUploadId(), "chunk_bytes": resp.GetChunkBytes(), "max_bytes": resp.GetMaxBytes()}, nil
}

// uploadChunk is file/upload/chunk {upload_id, offset, data_b64} ->
// {received_bytes}. The chunk is decoded into the connection's scratch
// memfd when it has one free (scratch.go), which the Chunk call names
// instead of carrying the bytes; else into a pooled buffer sent in the
// message.
func (g *Gateway) uploadChunk(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	if !cs.local() {
		return nil, onlyLocal("file/upload/chunk")
	}
	var sc *scratch
	var into []byte
	if g.upload != nil {
		if sc = g.takeScratch(ctx, cs); sc != nil {
			into = sc.mem.Bytes()
		}
	}
	start := time.Now()
	id, offset, buf, data, err := readChunk(params, into)
	steptrace.Since("gateway", "chunk.read", start)
	if err != nil {
		cs.scratch.release(sc, false)
		return nil, err
	}
	if g.upload == nil {
		putChunkBuffer(buf)
		return nil, uploadUnavailable
	}
	if sc != nil {
		inScratch := len(data) > 0 && &data[0] == &into[0]
		if inScratch && len(data) <= filepass.ScratchBytes {
			return g.chunkByScratch(ctx, cs, sc, id, offset, data)
		}
		if inScratch {
			// Past what a scratch may carry (uploads.chunk_bytes set
			// above 1 MiB): sent in the message, from a buffer of its own.
			buf = bytes.Clone(data)
			data = buf
		}
		cs.scratch.release(sc, false)
	}
	return g.chunkByBytes(ctx, cs, id, offset, buf, data)
}

// chunkByScratch sends a chunk decoded into sc, naming it. The scratch is
// written again only after a call that answered; after any failure
// (upload-staging may still be reading it, the call cancelled) it is
// retired and the connection's next chunk takes a new one. A scratch
// upload-staging does not hold (it restarted, or dropped it) is answered
// by sending the bytes in the message.
func (g *Gateway) chunkByScratch(ctx context.Context, cs *connState, sc *scratch, id string, offset int64, data []byte) (any, error) {
	start := time.Now()
	resp, err := g.upload.Chunk(ctx, &uploadv1.ChunkRequest{
		Principal: cs.principalOf(), GatewayId: g.id, ConnectionId: cs.id, UploadId: id, Offset: offset,
		ScratchToken: sc.token, ScratchLength: int64(len(data)),
	})
	steptrace.Since("gateway", "chunk.call", start)
	if err == nil {
		cs.scratch.release(sc, false)
		return map[string]any{"received_bytes": resp.GetReceivedBytes()}, nil
	}
	if !scratchUnknown(err) {
		cs.scratch.release(sc, true)
		return nil, serviceError("upload-staging", err)
	}
	g.log.Debug("upload scratch unknown to upload-staging, the chunk's bytes are sent", zap.String("conn", cs.id))
	buf := chunkBuffer(len(data))
	copy(buf, data)
	cs.scratch.release(sc, true)
	return g.chunkByBytes(ctx, cs, id, offset, buf, buf[:len(data)])
}

// scratchUnknown reports whether err is upload-staging's refusal of a
// scratch it does not hold for the caller: the chunk was not read.
func scratchUnknown(err error) bool {
	st, ok := status.FromError(err)
	return ok && err != nil && st.Code() == codes.FailedPrecondition && st.Message() == uploads.ScratchUnknown
}

// chunkByBytes sends a chunk's bytes, data, in the message; buf is the
// pooled buffer they are in, given back once grpc no longer holds them.
func (g *Gateway) chunkByBytes(ctx context.Context, cs *connState, id string, offset int64, buf, data []byte) (any, error) {
	// The call sends the bytes from buf; buf is reused only once grpc no
	// longer holds them (a call that failed before it wrote them may).
	loan := g.chunks.Lend(data)
	start := time.Now()
	resp, err := g.upload.Chunk(ctx, &uploadv1.ChunkRequest{
		Principal: cs.principalOf(), GatewayId: g.id, ConnectionId: cs.id, UploadId: id, Offset: offset, Data: data,
	})
	steptrace.Since("gateway", "chunk.call", start)
	if loan.Return() {
		putChunkBuffer(buf)
	}
	if err != nil {
		return nil, serviceError("upload-staging", err)
	}
	return map[string]any{"received_bytes": resp.GetReceivedBytes()}, nil
}

// readChunk reads file/upload/chunk's params, checks them and decodes
// data_b64 into buf, a buffer from chunkBuffer that the caller gives back
// (putChunkBuffer) once nothing uses data, buf's first bytes; or into
// into, when the decoding fits it (a scratch memfd's mapping, whose
// capacity is no pool's, so that putChunkBuffer leaves it be). Refusals
// come in one order whichever way the params were read: the ordinary
// decoding's, then upload_id, offset, data_b64 absent, data_b64 not base64.
//
// Every byte of data_b64 is checked once, by the decoding: the scan
// (scanChunkParams) ends the string at its first quote without looking
// for a backslash or invalid UTF-8 before it. Decoded, the string is
// base64's alphabet alone, so it held neither and the scan read the
// params as encoding/json does. Not decoded, the string is looked at
// again: with a backslash (an escape, the first quote perhaps an escaped
// one) or invalid UTF-8 the params are read the ordinary way, whose
// reading and refusals stand.
func readChunk(params []byte, into []byte) (id string, offset int64, buf, data []byte, err error) {
	dst := func(n int) []byte {
		if n <= len(into) {
			return into[:n]
		}
		return chunkBuffer(n)
	}
	p, ok := scanChunkParams(params, true)
	decoded := -1 // the length decoded into buf; -1 while data_b64 is not decoded
	if ok && p.data != nil {
		buf = dst(base64.StdEncoding.DecodedLen(len(p.data)))
		n, derr := decodeBase64(buf, p.data)
		if derr != nil && p.guessed {
			// The guess of data_b64's end is unproved: scanned again,
			// searching for its closing quote.
			putChunkBuffer(buf)
			buf = nil
			if p, ok = scanChunkParams(params, false); ok && p.data != nil {
				buf = dst(base64.StdEncoding.DecodedLen(len(p.data)))
				n, derr = decodeBase64(buf, p.data)
			}
		}
		switch {
		case !ok || p.data == nil:
		case derr == nil:
			decoded = n
		case bytes.IndexByte(p.data, '\\') >= 0 || !utf8.Valid(p.data):
			putChunkBuffer(buf)
			buf, ok = nil, false
		}
	}
	if !ok {
		var slow struct {
			UploadID string  `json:"upload_id"`
			Offset   *int64  `json:"offset"`
			DataB64  *string `json:"data_b64"`
		}
		if err := decodeParams(params, &slow); err != nil {
			return "", 0, nil, nil, err
		}
		p = chunkFields{uploadID: slow.UploadID, offset: slow.Offset}
		if slow.DataB64 != nil {
			p.data = []byte(*slow.DataB64)
			buf = dst(base64.StdEncoding.DecodedLen(len(p.data)))
			if n, derr := decodeBase64(buf, p.data); derr == nil {
				decoded = n
			}
		}
	}
	fail := func(err error) (string, int64, []byte, []byte, error) {
		putChunkBuffer(buf)
		return "", 0, nil, nil, err
	}
	if id, err = uploadID(p.uploadID); err != nil {
		return fail(err)
	}
	if p.offset == nil {
		return fail(invalidParams("`offset` is required"))
	}
	if p.data == nil {
		return fail(invalidParams("`data_b64` is required"))
	}
	if decoded < 0 {
		return fail(invalidParams("`data_b64` is not valid base64"))
	}
	return id, *p.offset, buf, buf[:decoded], nil
}

// chunkBufBytes is the size of the pooled buffers chunks are decoded
// into: docs/spec.md §6's default chunk, 1 MiB, with room for the two
// bytes base64's padding adds to DecodedLen.
const chunkBufBytes = 1<<20 + 2

// chunkBufs keeps decoded chunks' buffers from one chunk to the next:
// an upload would otherwise leave a megabyte of garbage per chunk. A
// buffer is needed until the staging service's Chunk call returns and
// grpc has given back the loan of its bytes (uploadChunk).
var chunkBufs = sync.Pool{New: func() any { return new([chunkBufBytes]byte) }}

// chunkBuffer returns n bytes to decode a chunk into: pooled when the
// chunk is no larger than the default.
func chunkBuffer(n int) []byte {
	if n > chunkBufBytes {
		return make([]byte, n)
	}
	return chunkBufs.Get().(*[chunkBufBytes]byte)[:n]
}

// putChunkBuffer gives back a buffer from chunkBuffer once nothing uses it.
func putChunkBuffer(b []byte) {
	if cap(b) == chunkBufBytes {
		chunkBufs.Put((*[chunkBufBytes]byte)(b[:chunkBufBytes]))
	}
}

// uploadCommit is file/upload/commit {upload_id} -> file entry.
func (g *Gateway) uploadCommit(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	if !cs.local() {
		return nil, onlyLocal("file/upload/commit")
	}
	var p struct {
		UploadID string `json:"upload_id"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	id, err := uploadID(p.UploadID)
	if err != nil {
		return nil, err
	}
	if g.upload == nil {
		return nil, uploadUnavailable
	}
	defer steptrace.Since("gateway", "commit.call", time.Now())
	resp, err := g.upload.Commit(ctx, &uploadv1.CommitRequest{Principal: cs.principalOf(), GatewayId: g.id, ConnectionId: cs.id, UploadId: id})
	if err != nil {
		return nil, serviceError("upload-staging", err)
	}
	return fileEntry(resp.GetFile()), nil
}

// discardUploads tells the staging service a connection closed, so its
// uploads are discarded at once. If the call fails they are not lost
// track of: they expire when idle.
func (g *Gateway) discardUploads(ctx context.Context, cs *connState) {
	if g.upload == nil || !cs.uploads.Load() {
		return
	}
	if _, err := g.upload.DiscardConnection(ctx, &uploadv1.DiscardConnectionRequest{GatewayId: g.id, ConnectionId: cs.id}); err != nil {
		g.log.Warn("uploads of a closed connection not discarded", zap.String("conn", cs.id), zap.Error(err))
	}
}

// renewRetry is how soon a failed lease renewal is tried again.
const renewRetry = time.Second

// usingUploads marks cs, and this gateway, as having called the staging
// service for uploads: from then on the connection's close is told to it
// and the gateway's lease is renewed. It comes before the call, so that a
// connection closing while its first call is in flight is told too.
func (g *Gateway) usingUploads(cs *connState) {
	cs.uploads.Store(true)
	g.uploadsOnce.Do(func() { close(g.uploadsUsed) })
}

// renewUploads renews this gateway's lease on its connections' uploads
// until ctx ends, from the first upload call on (usingUploads): at once,
// then three times per lease as the staging service states it. Run owns
// it and waits for it.
func (g *Gateway) renewUploads(ctx context.Context) {
	if g.upload == nil {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-g.uploadsUsed:
	}
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		callCtx, cancel := context.WithTimeout(ctx, renewRetry)
		resp, err := g.upload.Renew(callCtx, &uploadv1.RenewRequest{GatewayId: g.id})
		cancel()
		if err != nil || resp.GetLeaseMs() <= 0 {
			if ctx.Err() == nil {
				g.log.Debug("upload lease not renewed", zap.Error(err))
			}
			wait = renewRetry
			continue
		}
		wait = max(time.Duration(resp.GetLeaseMs())*time.Millisecond/3, 10*time.Millisecond)
	}
}

// chunkFields are file/upload/chunk's params; data is data_b64 still
// encoded, nil when absent. From scanChunkParams, data is unchecked: the
// bytes up to the string's first quote (see readChunk).
type chunkFields struct {
	uploadID string
	offset   *int64
	data     []byte
	// guessed: data ends where guessLastQuote put it, not at a quote
	// searched for; it holds only if data decodes.
	guessed bool
}

// guessLastQuote returns the index of the quote that closes params' last
// member when that member's value is a string, found from the end
// (params is one valid JSON object, its closing brace last but for
// spaces); -1 otherwise.
//
// A client sends data_b64 last (docs/spec.md's example, every client
// here): its closing quote is then this one, and the chunk reader skips
// the search of its 1.4 MB for it (about 0.1 ms of the gateway's CPU a
// chunk). A guess is proved by the decoding of what it bounds: decoded,
// those bytes are base64's alphabet alone (encoding/base64 skips '\r'
// and '\n' too, which a valid string cannot hold raw), so they hold no
// quote and the string that starts where data_b64's does ends here; the
// bytes of a wrong guess always hold a quote (another member's) and do
// not decode, and readChunk then scans without guessing.
func guessLastQuote(params []byte) int {
	i := len(params) - 1
	for i >= 0 && (params[i] == ' ' || params[i] == '\t' || params[i] == '\r' || params[i] == '\n') {
		i--
	}
	if i < 0 || params[i] != '}' {
		return -1
	}
	i--
	for i >= 0 && (params[i] == ' ' || params[i] == '\t' || params[i] == '\r' || params[i] == '\n') {
		i--
	}
	if i < 0 || params[i] != '"' {
		return -1
	}
	return i
}

// scanChunkParams reads file/upload/chunk's params straight from the
// frame's bytes: a chunk frame is mostly one long base64 string, which
// encoding/json would scan byte by byte and copy twice. The frame is
// valid JSON already (the connection checked it), so members are found by
// skipping strings with a byte search. Anything but the plain shape
// (an escape in a string, a nested value, a non-integer offset, a key
// that appears twice, more than a few unknown keys) reports !ok, and the
// caller decodes the params the ordinary way, with its ordinary messages
// and refusals. data_b64's string alone is not looked into: its reading,
// and so the whole answer, holds only if data has no backslash and is
// valid UTF-8, which readChunk's decoding of it proves.
func scanChunkParams(params []byte, guess bool) (chunkFields, bool) {
	var f chunkFields
	lastQuote := -1
	if guess {
		lastQuote = guessLastQuote(params)
	}
	// The keys seen so far: a repeated one is refused by the ordinary
	// path (CheckParams), so it must not be read here, last one winning.
	var seen struct{ uploadID, offset, data bool }
	var others [4][]byte
	nothers := 0
	i := skipWS(params, 0)
	if i >= len(params) || params[i] != '{' {
		return f, false
	}
	i++
	for {
		i = skipWS(params, i)
		if i < len(params) && params[i] == '}' {
			return f, true
		}
		if i >= len(params) || params[i] != '"' {
			return f, false
		}
		key, next, ok := plainString(params, i)
		if !ok {
			return f, false
		}
		i = skipWS(params, next)
		if i >= len(params) || params[i] != ':' {
			return f, false
		}
		i = skipWS(params, i+1)
		if i >= len(params) {
			return f, false
		}
		var val []byte
		isString := params[i] == '"'
		// data_b64's string is taken up to its first quote as it is:
		// readChunk's decoding checks its bytes (see there).
		bulk := isString && string(key) == "data_b64"
		switch {
		case bulk && guess && lastQuote > i:
			// Taken to be the last member: its string is guessed to end
			// at the last quote, found from params' end without a search
			// of the 1.4 MB between. readChunk's decoding proves the
			// guess (see guessLastQuote) or scans again without it.
			val, next = params[i+1:lastQuote], lastQuote+1
			f.guessed = true
		case bulk:
			end := bytes.IndexByte(params[i+1:], '"')
			if end < 0 {
				return f, false
			}
			val, next = params[i+1:i+1+end], i+end+2
		case isString:
			if val, next, ok = plainString(params, i); !ok {
				return f, false
			}
		default:
			next = i
			for next < len(params) && !strings.ContainsRune(",} \t\r\n", rune(params[next])) {
				next++
			}
			val = params[i:next]
			if len(val) == 0 || val[0] == '{' || val[0] == '[' {
				return f, false
			}
		}
		k := string(key)
		if k != "upload_id" && k != "offset" && k != "data_b64" &&
			(strings.EqualFold(k, "upload_id") || strings.EqualFold(k, "offset") || strings.EqualFold(k, "data_b64")) {
			return f, false // encoding/json matches keys case-insensitively
		}
		if isString && !bulk && !utf8.Valid(val) {
			return f, false // encoding/json would replace the bad bytes
		}
		switch k {
		case "upload_id":
			if !isString || seen.uploadID {
				return f, false
			}
			seen.uploadID = true
			f.uploadID = string(val)
		case "offset":
			if isString || seen.offset {
				return f, false
			}
			seen.offset = true
			if string(val) == "null" {
				f.offset = nil
				break
			}
			n, err := strconv.ParseInt(string(val), 10, 64)
			if err != nil {
				return f, false
			}
			f.offset = &n
		case "data_b64":
			if !isString || seen.data {
				return f, false
			}
			seen.data = true
			f.data = val
		default:
			// Unknown keys are ignored, but a repeated one is refused all
			// the same, in any case as CheckParams compares them; a client
			// sending many is left to the ordinary path.
			for _, o := range others[:nothers] {
				if bytes.EqualFold(o, key) {
					return f, false
				}
			}
			if nothers == len(others) {
				return f, false
			}
			others[nothers] = key
			nothers++
		}
		i = skipWS(params, next)
		if i < len(params) && params[i] == ',' {
			i++
		}
	}
}

// plainString returns the contents of the JSON string at b[i] == '"' and
// the index past it; ok is false when it holds an escape.
func plainString(b []byte, i int) (s []byte, next int, ok bool) {
	end := bytes.IndexByte(b[i+1:], '"')
	if end < 0 {
		return nil, 0, false
	}
	s = b[i+1 : i+1+end]
	if bytes.IndexByte(s, '\\') >= 0 {
		return nil, 0, false
	}
	return s, i + end + 2, true
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}
