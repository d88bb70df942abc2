package uploads

import (
	"strings"
	"testing"
)

// The messages of docs/spec.md §6, word for word.
func TestMessages(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{UnknownUpload("0123456789abcdef0123456789abcdef"), "Unknown or expired upload `0123456789abcdef0123456789abcdef`"},
		{FileTooLarge(10485761, 10485760), "Upload of 10485761 bytes exceeds the 10 MB file limit"},
		{FileTooLarge(5000, 4096), "Upload of 5000 bytes exceeds the 4096 bytes file limit"},
		{FilenameTooLong(256), "`filename` is 256 bytes; the limit is 255"},
		{BadSHA256, "`sha256` must be 64 hexadecimal characters"},
		{TooManyForConnection(4), "This connection already has 4 uploads in progress; commit them or let them expire before beginning another"},
		{OverBudget, "The daemon is staging too many uploads to accept this one now; retry after in-progress uploads finish"},
		{ChunkSize(1048576), "A chunk must carry between 1 and 1048576 decoded bytes"},
		{ChunkGap(10, 4), "Chunk at offset 10 leaves a gap; the next offset is 4"},
		{ChunkOverlap(2, 4), "Chunk at offset 2 overlaps received data; the next offset is 4"},
		{ChunkPastSize(12, 10), "Chunk ends at byte 12, past the declared size of 10"},
		{Incomplete(4, 10), "Upload has 4 of 10 declared bytes; send the rest before committing"},
		{HashMismatch, "Upload content does not match the SHA-256 declared at begin; begin again"},
	} {
		if tc.got != tc.want {
			t.Errorf("got  %q\nwant %q", tc.got, tc.want)
		}
	}
}

func TestNormalizeSHA256(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "", true},
		{"  " + strings.ToUpper(hex) + "\n", hex, true},
		{hex[:63], "", false},
		{hex + "0", "", false},
		{strings.Repeat("g", 64), "", false},
	} {
		got, ok := NormalizeSHA256(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("NormalizeSHA256(%q) = %q, %v", tc.in, got, ok)
		}
	}
}

func TestCheckFilename(t *testing.T) {
	if msg := CheckFilename(strings.Repeat("é", 127) + "a"); msg != "" { // 255 bytes
		t.Fatalf("255 bytes refused: %s", msg)
	}
	if msg := CheckFilename(strings.Repeat("a", 256)); msg != FilenameTooLong(256) {
		t.Fatalf("256 bytes: %q", msg)
	}
	if CheckFilename("a\nb") == "" || CheckFilename("a\x00") == "" || CheckFilename("\xff") == "" {
		t.Fatal("control characters or bad UTF-8 accepted")
	}
}

func TestRefAndMarker(t *testing.T) {
	// FIPS 180-2's first example: the hash a file of "abc" is stored under,
	// a form ParseRefID takes back.
	if got := Sum([]byte("abc")); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("Sum(abc) = %s", got)
	}
	if _, ok := ParseRefID(RefID(Sum(nil))); !ok {
		t.Fatal("the ref_id of an empty file does not parse")
	}
	sum := strings.Repeat("0f", 32)
	if got, ok := ParseRefID(RefID(sum)); !ok || got != sum {
		t.Fatalf("round trip: %q %v", got, ok)
	}
	for _, bad := range []string{sum, "sha256:" + strings.ToUpper(sum), "sha256:" + sum[:62], "md5:" + sum} {
		if _, ok := ParseRefID(bad); ok {
			t.Errorf("ParseRefID(%q) accepted", bad)
		}
	}
	if got := Marker("image/png", "x.png", "/w/a"); got != "[IMAGE:/w/a]" {
		t.Fatal(got)
	}
	if got := Marker("text/plain", "notes.txt", "/w/b"); got != "[Document: notes.txt] /w/b" {
		t.Fatal(got)
	}
}
