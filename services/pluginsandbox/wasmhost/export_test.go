package wasmhost

// HoldCall registers a call as running guest code, as invoke does, until
// release is called: Close must then wait for it, or give up at its
// context's end, without a guest that ignores cancellation.
func (h *Host) HoldCall() (release func(), ok bool) {
	if !h.beginCall() {
		return nil, false
	}
	return h.endCall, true
}
