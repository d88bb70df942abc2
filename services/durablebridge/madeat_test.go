package durablebridge

import (
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/bus"
)

// A followed update's item takes its publisher's time, not the
// bridge's receipt of it (late by the bus and the machine's load), unless
// the publisher said nothing or its clock reads ahead of the bridge's.
func TestFollowedItemsTakeTheirPublishersTime(t *testing.T) {
	made := time.Now().Add(-3 * time.Second).Truncate(time.Microsecond)
	if got := madeAt(bus.Update{MadeUnixMicros: made.UnixMicro()}); !got.Equal(made) {
		t.Fatalf("an update made at %s shown at %s", made, got)
	}
	for name, u := range map[string]bus.Update{
		"not said": {},
		"ahead":    {MadeUnixMicros: time.Now().Add(time.Hour).UnixMicro()},
		"negative": {MadeUnixMicros: -5},
	} {
		before := time.Now()
		if got := madeAt(u); got.Before(before) || got.After(time.Now()) {
			t.Fatalf("%s: shown at %s, received at %s", name, got, before)
		}
	}
}
