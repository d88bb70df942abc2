package durablebridge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// requestMemory makes every POST run at most once per request id within
// an epoch: the first answer (200 or 409) is stored in PostgreSQL and
// replayed with "replayed": true; the same id with another route or body
// is refused; an id still running is joined.
type requestMemory struct {
	store *store
	epoch string
	log   *zap.Logger
	count atomic.Int64

	mu       sync.Mutex
	inflight map[string]*flight
	// unstored holds the answers that ran but could not be written to
	// the database (oldest first in unstoredOrder, at most
	// keptRequestIDs): the work was done, so a retry is answered from
	// here rather than running it again.
	unstored      map[string]storedResponse
	unstoredOrder []string
}

type flight struct {
	fingerprint [32]byte
	done        chan struct{}
	status      int
	body        []byte
	// refused is set when the id was stored with another body.
	refused bool
	// joined counts the sends waiting for this one.
	joined atomic.Int32
}

// maxInflight bounds the request ids running at once; past it a POST is
// refused before it runs (503, so the phone may retry the same id).
const maxInflight = 256

func newRequestMemory(st *store, epoch string, log *zap.Logger) *requestMemory {
	return &requestMemory{store: st, epoch: epoch, log: log, inflight: map[string]*flight{}, unstored: map[string]storedResponse{}}
}

// fingerprint is the SHA-256 of the route and the body as canonical JSON,
// requestId left out.
func fingerprint(method, path string, body map[string]any) [32]byte {
	cp := make(map[string]any, len(body))
	for k, v := range body {
		if k != "requestId" {
			cp[k] = v
		}
	}
	canon, _ := json.Marshal(cp) // maps marshal with sorted keys
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(canon)
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Why a POST could not be answered; the phone may send the id again.
var (
	// errBusy: too many POSTs in flight.
	errBusy = errors.New("too many requests in flight")
	// errJoinedFailed: the request this one joined got no answer.
	errJoinedFailed = errors.New("the first request with this id got no answer")
)

// do answers the POST with request id id: from memory when the id was
// seen, else by running run (once, whoever else sends the id meanwhile).
func (m *requestMemory) do(ctx context.Context, id string, fp [32]byte, run func() (int, []byte)) (int, []byte, error) {
	m.mu.Lock()
	if f := m.inflight[id]; f != nil {
		m.mu.Unlock()
		if f.fingerprint != fp {
			return reused()
		}
		f.joined.Add(1)
		select {
		case <-f.done:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
		switch {
		case f.refused:
			return reused()
		case f.status == 0:
			return 0, nil, errJoinedFailed
		}
		return f.status, replayed(f.body), nil
	}
	if kept, ok := m.unstored[id]; ok {
		m.mu.Unlock()
		if !bytes.Equal(kept.fingerprint, fp[:]) {
			return reused()
		}
		return kept.status, replayed(kept.body), nil
	}
	if len(m.inflight) >= maxInflight {
		m.mu.Unlock()
		return 0, nil, errBusy
	}
	f := &flight{fingerprint: fp, done: make(chan struct{})}
	m.inflight[id] = f
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.inflight, id)
		m.mu.Unlock()
		close(f.done)
	}()

	stored, err := m.store.response(ctx, m.epoch, id)
	switch {
	case err == nil:
		if !bytes.Equal(stored.fingerprint, fp[:]) {
			f.refused = true
			return reused()
		}
		f.status, f.body = stored.status, stored.body
		return f.status, replayed(f.body), nil
	case !errors.Is(err, errNoRow):
		return 0, nil, err
	}
	status, body := run()
	if status == http.StatusOK || status == http.StatusConflict {
		prune := m.count.Add(1)%pruneEvery == 0
		// Stored even when the phone left: its retry must find the answer.
		r := storedResponse{fingerprint: fp[:], status: status, body: body}
		if err := m.store.remember(context.WithoutCancel(ctx), m.epoch, id, r, prune); err != nil {
			// The work ran: its answer is said, and kept for a retry.
			m.log.Warn("request id kept in memory only", zap.String("request_id", id), zap.Error(err))
			m.keepUnstored(id, r)
		}
	}
	f.status, f.body = status, body
	return status, body, nil
}

// keepUnstored keeps an answer the database did not take, dropping the
// oldest beyond keptRequestIDs.
func (m *requestMemory) keepUnstored(id string, r storedResponse) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.unstored[id]; !ok {
		m.unstoredOrder = append(m.unstoredOrder, id)
	}
	m.unstored[id] = r
	if over := len(m.unstoredOrder) - keptRequestIDs; over > 0 {
		for _, old := range m.unstoredOrder[:over] {
			delete(m.unstored, old)
		}
		m.unstoredOrder = slices.Delete(m.unstoredOrder, 0, over)
	}
}

func reused() (int, []byte, error) {
	body, _ := json.Marshal(wireError{Code: codeRequestIDReused, Message: "this request id was sent before with another route or body"})
	return http.StatusConflict, body, nil
}

// replayed marks a stored JSON object answer as a replay.
func replayed(body []byte) []byte {
	if len(body) < 2 || body[0] != '{' {
		return body
	}
	out := make([]byte, 0, len(body)+18)
	out = append(out, `{"replayed":true`...)
	if rest := bytes.TrimSpace(body[1:]); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[1:]...)
}

// joined is how many sends wait for the one running id (-1 when it is
// not running).
func (m *requestMemory) joined(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.inflight[id]; f != nil {
		return int(f.joined.Load())
	}
	return -1
}
