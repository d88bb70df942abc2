package wasmhost

import (
	"bytes"
	"runtime"
	"testing"
)

// A guest's stderr write was appended whole to the host's tail buffer
// before it was cut to 4 KiB, and the cut kept the grown array: 100 MiB
// written took 100 MiB of the host's heap for the instance's life. The
// buffer keeps the last 4 KiB of whatever comes, in at most twice that.
func TestTailBufferKeepsOnlyItsTail(t *testing.T) {
	var tb tailBuffer
	big := bytes.Repeat([]byte("x"), 100<<20)
	copy(big[len(big)-5:], "tail!")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if n, _ := tb.Write(big); n != len(big) {
		t.Fatalf("wrote %d", n)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Fatalf("a 100 MiB write allocated %d bytes", grew)
	}
	if got := tb.bytes(); len(got) != tailBytes || !bytes.HasSuffix(got, []byte("tail!")) {
		t.Fatalf("kept %d bytes ending %q", len(got), got[max(len(got)-5, 0):])
	}
	// Small writes: the last 4 KiB of them, in order, within the bound.
	var want []byte
	for i := range 3000 {
		w := []byte{byte('a' + i%26), byte('0' + i%10), '\n'}
		tb.Write(w)
		want = append(want, w...)
		if cap(tb.b) > 4*tailBytes {
			t.Fatalf("the buffer grew to %d", cap(tb.b))
		}
	}
	if got := tb.bytes(); !bytes.Equal(got, want[len(want)-tailBytes:]) {
		t.Fatal("the tail of small writes is not the last 4 KiB")
	}
}
