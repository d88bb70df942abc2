package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
)

// BenchmarkChunkFrame is the gateway's own work on one upload chunk, the
// gRPC call aside: its 1.4 MB frame read from a stream, classified, and
// read and decoded by file/upload/chunk's handler (no staging service is
// set, so the handler stops, after decoding, at uploadUnavailable).
func BenchmarkChunkFrame(b *testing.B) {
	data := bytes.Repeat([]byte{0xa5, 0x17, 0x3c, 0x42}, 1<<20/4)
	frame := []byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"file/upload/chunk","params":{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":%q},"id":3}`+"\n",
		base64.StdEncoding.EncodeToString(data)))
	g := &Gateway{}
	local := &connState{id: "conn-local", transport: transportLocal}
	r := bytes.NewReader(nil)
	fr := jsonrpc.NewFrameReader(r, 0, 0)
	b.SetBytes(int64(len(frame)))
	for range b.N {
		r.Reset(frame)
		line, err := fr.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		m := jsonrpc.Classify(line)
		if m.Kind != jsonrpc.KindRequest {
			b.Fatal(m.Problem)
		}
		_, err = methods["file/upload/chunk"].call(g, context.Background(), local, m.Request.Params)
		if !errors.Is(err, uploadUnavailable) {
			b.Fatal(err)
		}
	}
}
