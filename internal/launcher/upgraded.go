package launcher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/clawmesh/clawmesh/internal/pg"
)

// A newer clawmesh started on an older data directory upgrades its
// database: each service applies its pending migrations at its start
// (pg.Migrate), after which an older clawmesh refuses the schema
// (pg.ErrNewerSchema). That was said only in the services' own logs; the
// terminal showed the usual "is up", so a user who went back to the
// older binary learnt it from its refusal.
//
// How the launcher learns it: the services report it. Migrate writes one
// pg.Upgraded line per schema it upgraded (from and to), and the launcher
// copies every line of its children's output into their logs already
// (copyLog): an upgradeWatch there picks those lines out. Rather than
// the launcher reading each schema's schema_migrations before the
// services start and again once up: the read before would be a
// connection and a query the services' start waits for, on the start's
// critical path (BenchmarkStartup), for what is nearly always a restart
// with nothing to say. Picking lines out costs a search of each chunk
// already in hand, and no clock is needed: a line is what a run of this
// stack wrote. The lines are told after the "is up" line (upgradeNotices):
// those seen before it at once, a later one (a dormant process woken,
// or a line still in the pipe when the stack came up) when it comes; on
// a start that fails before "is up", once its processes have stopped.

// upgradeMarker is what a chunk of output holds when it may hold an
// upgrade line: the message as zap's JSON encoder writes it.
var upgradeMarker = []byte(`"` + pg.Upgraded + `"`)

// maxWatchedLine bounds the part of a line kept between two reads of a
// run's output; a longer line is no upgrade line and is not kept.
const maxWatchedLine = 4 << 10

// upgradeWatch finds the upgrade lines in one run's output, read in
// chunks that may end anywhere in a line.
type upgradeWatch struct {
	tail []byte // the start of a line the last chunk did not finish
	// skipping: the line under way grew past maxWatchedLine; the rest of
	// it, up to its end, is no line start.
	skipping bool
	seen     func(schema, from, to string)
}

// write looks at the next chunk of the run's output.
func (w *upgradeWatch) write(p []byte) {
	if w == nil {
		return
	}
	if w.skipping {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return
		}
		w.skipping, p = false, p[i+1:]
	}
	end := bytes.LastIndexByte(p, '\n')
	if end < 0 {
		if len(w.tail)+len(p) <= maxWatchedLine {
			w.tail = append(w.tail, p...)
		} else {
			w.tail, w.skipping = w.tail[:0], true
		}
		return
	}
	lines := p[:end+1]
	if len(w.tail) > 0 {
		lines = append(w.tail, lines...)
	}
	if bytes.Contains(lines, upgradeMarker) {
		for _, line := range bytes.Split(lines, []byte{'\n'}) {
			if bytes.Contains(line, upgradeMarker) {
				w.parse(line)
			}
		}
	}
	w.tail = w.tail[:0]
	if rest := p[end+1:]; len(rest) <= maxWatchedLine {
		w.tail = append(w.tail, rest...)
	} else {
		w.skipping = true
	}
}

func (w *upgradeWatch) parse(line []byte) {
	var rec struct {
		Msg, Schema, From, To string
	}
	if json.Unmarshal(line, &rec) != nil || rec.Msg != pg.Upgraded || rec.Schema == "" || rec.To == "" {
		return
	}
	w.seen(rec.Schema, rec.From, rec.To)
}

// upgradeNotices tells the user of each schema upgraded, once, after
// the stack is up.
type upgradeNotices struct {
	mu      sync.Mutex
	out     io.Writer
	up      bool
	pending []string
	told    map[string]bool
}

func newUpgradeNotices(out io.Writer) *upgradeNotices {
	return &upgradeNotices{out: out, told: map[string]bool{}}
}

// seen is told of an upgrade line; a replica's or a later run's repeat
// of one already told is not told again.
func (u *upgradeNotices) seen(schema, from, to string) {
	line := fmt.Sprintf("database upgraded: %s %s → %s (a clawmesh older than this one can no longer open it)\n",
		schema, strings.TrimSuffix(from, ".sql"), strings.TrimSuffix(to, ".sql"))
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.told[line] {
		return
	}
	u.told[line] = true
	if !u.up {
		u.pending = append(u.pending, line)
		return
	}
	fmt.Fprint(u.out, line)
}

// stackUp tells what was seen so far, and from now on each line when it
// is seen; called after the "is up" line, and again when Run returns: a
// start that failed before "is up" tells then what it upgraded (it said
// nothing of it, and the operator learnt it from an older clawmesh's
// refusal).
func (u *upgradeNotices) stackUp() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.up = true
	for _, line := range u.pending {
		fmt.Fprint(u.out, line)
	}
	u.pending = nil
}
