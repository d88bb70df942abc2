//go:build race

package jsonrpc

// raceEnabled: under the race detector, sync.Pool drops a quarter of what
// is put back, so pooled buffers are made anew that often.
const raceEnabled = true
