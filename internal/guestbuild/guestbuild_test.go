package guestbuild

import (
	"bytes"
	"os"
	"testing"
)

// WasmWith compiles the extra file into the example (the module differs
// from the plain build), builds each file and content once, and refuses a
// path where a file name belongs and a file the example already has.
func TestWasmWithAddsAFile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two guests")
	}
	defer Cleanup()
	plain, err := Wasm("echo")
	if err != nil {
		t.Fatal(err)
	}
	src := "//go:build wasip1\n\npackage main\n\nvar extraSink int\n\nfunc init() { extraSink = len(\"added by the overlay\") }\n"
	with, err := WasmWith("echo", "aa_extra.go", src)
	if err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(plain)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(with)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, b) {
		t.Fatal("the module built with the extra file is the plain one")
	}
	if again, err := WasmWith("echo", "aa_extra.go", src); err != nil || again != with {
		t.Fatalf("the same file again: %q, %v; want %q built once", again, err, with)
	}
	if _, err := WasmWith("echo", "../aa_extra.go", src); err == nil {
		t.Fatal("a path outside the example's folder was taken")
	}
	if _, err := WasmWith("echo", "main.go", src); err == nil {
		t.Fatal("an existing file of the example was replaced")
	}
	if _, err := os.Stat("../../plugins/examples/echo/aa_extra.go"); !os.IsNotExist(err) {
		t.Fatalf("the example's folder was written to: %v", err)
	}
}
