// Package hostclock reads the host's monotonic clock (Linux's
// CLOCK_MONOTONIC), the one clock every process on a host shares, so
// that two processes can order their events by it: what one stamped
// before another stamped later happened before it.
//
// Go's own monotonic readings are the same clock counted from the
// process's start; the package finds the start once, bracketed between
// two readings, and answers from Go's clock after that (no system call
// a reading). The bracket's width is the uncertainty, which the two
// functions resolve in opposite directions: Late is never earlier than
// the moment it is called, Early never later.
package hostclock

import (
	"time"

	"golang.org/x/sys/unix"
)

var (
	base time.Time // a Go clock reading, with its monotonic part
	// lo and hi bound the host clock at base: lo <= host(base) <= hi.
	lo, hi int64
)

func init() {
	width := int64(-1)
	for range 16 {
		t := time.Now()
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			panic("hostclock: CLOCK_MONOTONIC: " + err.Error())
		}
		d := int64(time.Since(t))
		// The host clock was read somewhere in [t, t+d].
		if raw := ts.Nano(); width < 0 || d < width {
			base, lo, hi, width = t, raw-d, raw, d
		}
	}
}

// Late returns the host clock now, rounded up by at most the bracket:
// never earlier than now. Stamp with it what must not be taken for
// older than it is (a request's arrival).
func Late() int64 { return hi + int64(time.Since(base)) }

// Early returns the host clock now, rounded down by at most the
// bracket: never later than now. Stamp with it what must not be taken
// for newer than it is (the start of a read).
func Early() int64 { return lo + int64(time.Since(base)) }

// Uncertainty is the bracket's width: Late()-Early() at any moment.
func Uncertainty() time.Duration { return time.Duration(hi - lo) }
