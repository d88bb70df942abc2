package bus

import (
	"errors"
	"testing"
)

// A session's update subject names its id and its incarnation, each one
// way only; anything else is not a session update subject.
func TestSessionUpdateSubjects(t *testing.T) {
	subject, err := SessionUpdateSubject("sess_1", 42)
	if err != nil || subject != "clawmesh.session.sess_1.42.update" {
		t.Fatalf("subject %q, %v", subject, err)
	}
	if id, n, err := SessionOfSubject(subject); err != nil || id != "sess_1" || n != 42 {
		t.Fatalf("parsed %q %d %v", id, n, err)
	}
	for _, bad := range []struct {
		id string
		n  int64
	}{{"a.b", 1}, {"*", 1}, {"", 1}, {"sess_1", 0}, {"sess_1", -1}} {
		if s, err := SessionUpdateSubject(bad.id, bad.n); !errors.Is(err, ErrBadToken) {
			t.Errorf("SessionUpdateSubject(%q, %d) = %q, %v", bad.id, bad.n, s, err)
		}
	}
	for _, s := range []string{
		"clawmesh.session.sess_1.update", // before incarnations
		"clawmesh.session.sess_1.0.update",
		"clawmesh.session.sess_1.042.update",
		"clawmesh.session.sess_1.+42.update",
		"clawmesh.session.sess_1.-42.update",
		"clawmesh.session.sess_1.4.2.update",
		"clawmesh.session.sess_1.x.update",
		"clawmesh.session.sess_1.99999999999999999999.update",
		"clawmesh.session.*.1.update",
		"clawmesh.session..1.update",
		"clawmesh.session.sess_1.1.ask",
		"clawmesh.config.changed",
	} {
		if id, n, err := SessionOfSubject(s); !errors.Is(err, ErrBadSubject) {
			t.Errorf("SessionOfSubject(%q) = %q %d %v", s, id, n, err)
		}
	}
}
