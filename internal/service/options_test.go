package service

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/stack"
)

// Only a process that runs several replicas bounds its connections' age:
// the others have one address and nothing to rediscover.
func TestReplicaConnectionsAge(t *testing.T) {
	for _, p := range stack.Processes {
		if got := len(serverOptions(p.Name)); (got > 0) != p.Scalable {
			t.Errorf("%s (scalable %v): %d server options", p.Name, p.Scalable, got)
		}
	}
}

// -h printed NATS_URL as --nats-url's default, and the URL may hold a
// password; the variable is still what the flag falls back to.
func TestHelpDoesNotPrintTheNATSURL(t *testing.T) {
	const url = "nats://clawmesh:s3cret-pass@bus:4222"
	t.Setenv(EnvNATSURL, url)
	t.Setenv("ZEROCLAW_DATA_DIR", t.TempDir())
	var out bytes.Buffer
	defer func(w io.Writer) { usageOutput = w }(usageOutput)
	usageOutput = &out
	if _, err := parseFlags(Spec{Name: "config"}, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if strings.Contains(out.String(), "s3cret") || !strings.Contains(out.String(), "-nats-url") {
		t.Fatalf("-h printed:\n%s", out.String())
	}
	o, err := parseFlags(Spec{Name: "config"}, nil)
	if err != nil || o.natsURL != url {
		t.Fatalf("without --nats-url: %q, %v; want NATS_URL", o.natsURL, err)
	}
	o, err = parseFlags(Spec{Name: "config"}, []string{"--nats-url", "nats://other:4222"})
	if err != nil || o.natsURL != "nats://other:4222" {
		t.Fatalf("--nats-url: %q, %v", o.natsURL, err)
	}
}
