package jsonrpc

import "sync/atomic"

// socketSource reads a socket's descriptor inside its RawConn.Read
// (readInPlace). After a read that left the socket empty (it returned
// less than asked), the next read is skipped when it could only find
// nothing or an end of stream that something else will announce: it
// reports errWouldBlock instead, and the runtime's poller waits for the
// socket; the read after that wait (ready) is tried.
//
// The poller reports a socket readable once for all that came since it
// last looked: bytes and an end of stream that came together are one
// wake-up, and the read after it returns the bytes, short, with the end
// still unread. The skip is therefore taken only when every frame of
// that read is answered on the read loop itself (an inline request) and
// no frame is half read (partial): the peer reading an answer frees
// room in the socket, which wakes the poller again, and that wake-up reports an end of stream with it (the
// twenty-ninth round skipped the read whatever the frames were, and lost
// the end after a notification: docs/performance.md, thirtieth round).
// Output still unread by the peer is not needed: an answer written after
// the read is read after it. A read that fills the buffer may have left
// bytes behind, which no new readiness would announce, so the next one
// is tried at once.
type socketSource struct {
	fd    int
	empty bool // the last read left the socket empty
	ready bool // the poller reported the socket readable since then
	// unanswered says a frame of the last read gets no answer (a
	// notification, a response, a dropped frame), or none from the read
	// loop (a request handled on another goroutine, which may be
	// answered much later): nothing the peer does with our output would
	// wake the poller for it soon.
	unanswered bool
	// partial says the reader holds the start of a frame: its end, or the
	// end of stream instead, may have come with the last read.
	partial bool
	// skips, when set, counts the reads skipped (tests and diagnostics).
	skips *atomic.Int64
}

func (s *socketSource) Read(p []byte) (int, error) {
	if s.empty && !s.ready && !s.unanswered && !s.partial {
		if s.skips != nil {
			s.skips.Add(1)
		}
		return 0, errWouldBlock
	}
	s.ready, s.unanswered = false, false
	n, err := readSocket(s.fd, p)
	if err != nil {
		s.empty = err == errWouldBlock
		return 0, err
	}
	s.empty = n < len(p)
	return n, nil
}
