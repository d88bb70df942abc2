package jsonrpc

// socketSource reads a socket's descriptor inside its RawConn.Read
// (readInPlace). After a read that left the socket empty (it returned
// less than asked), the next read is not tried: it would find nothing, as
// a client that waits for each answer has sent nothing yet. It reports
// errWouldBlock instead, and the runtime's poller waits for the socket;
// the read after that wait (ready) is tried. A read that fills the buffer
// may have left bytes behind, which no new readiness would announce, so
// the next one is tried at once.
type socketSource struct {
	fd    int
	empty bool // the last read left the socket empty
	ready bool // the poller reported the socket readable since then
}

func (s *socketSource) Read(p []byte) (int, error) {
	if s.empty && !s.ready {
		return 0, errWouldBlock
	}
	s.ready = false
	n, err := readSocket(s.fd, p)
	if err != nil {
		s.empty = err == errWouldBlock
		return 0, err
	}
	s.empty = n < len(p)
	return n, nil
}
