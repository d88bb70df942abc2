package natsutil_test

import (
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

func TestEmbeddedRoundTrip(t *testing.T) {
	log := testenv.Logger(t)
	e, err := natsutil.RunEmbedded(log)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	nc, err := natsutil.Connect(e.URL(), "test", log)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("a.b")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("a.b", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(msg.Data) != "hi" {
		t.Fatalf("got %v %v", msg, err)
	}
}
