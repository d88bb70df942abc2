package gateway

import (
	"context"
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/version"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// status answers docs/spec.md §5's status; services come from the health
// monitor. It is deferred (see method.later): concurrent statuses of one
// principal share one Status call, and the goroutine that made it answers
// them all with one result, encoded once.
func (g *Gateway) status(ctx context.Context, wait laterWait, cs *connState, _ json.RawMessage, reply jsonrpc.Reply) {
	p, key := cs.principalKey()
	g.statusReads.Go(ctx, key, wait.deadline, wait.owner, func(ctx context.Context) (sharedRead, error) {
		away := g.monitor.statusOf("session") == "unreachable"
		if away {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, awayStatusWait)
			defer cancel()
		}
		resp, err := g.session.Status(ctx, &sessionv1.StatusRequest{Principal: p})
		if err != nil {
			// The service's own side of the deadline may answer a hair
			// before this side's timer fires: either way it is the
			// short wait that ran out.
			if away && status.Code(err) == codes.DeadlineExceeded {
				return sharedRead{}, status.Error(codes.Unavailable, "unreachable")
			}
			return sharedRead{}, err
		}
		ids := resp.GetSessionIds()
		if ids == nil {
			ids = []string{}
		}
		enc, err := json.Marshal(ids)
		if err != nil {
			return sharedRead{}, err
		}
		return sharedRead{g.statusResult(resp.GetActiveSessions(), enc), g.readAt(resp.GetReadAt())}, nil
	}, func(r sharedRead, err error) {
		if err != nil {
			enc, e := g.statusFailed(err)
			if e != nil {
				reply(nil, e)
				return
			}
			reply(enc, nil)
			return
		}
		reply(r.enc, nil)
	})
}

// awayStatusWait bounds status's call to a session service whose health
// check the monitor found unanswered (a hung process: SIGSTOPped,
// swapped out): with the session service stopped status took the whole
// call deadline (8.7 s of rpc.call_timeout_ms's 10) to say what health
// said within a poll. Long enough for a busy service that still answers.
const awayStatusWait = time.Second

// statusFailed is status's answer when the session service did not give
// the open sessions. A failure of the service (not a refusal of the
// caller) is still a status: the other members as ever, the services as
// the monitor saw them, and sessions_unavailable saying why the counts
// are unknown (active_sessions 0 and session_ids [] then). status is
// what an operator asks when something is wrong, and it failed as a
// whole exactly when the session service or its database was away, so
// that a client polling it showed the whole daemon as down.
func (g *Gateway) statusFailed(err error) (jsonrpc.EncodedJSON, *jsonrpc.Error) {
	e := serviceError("session", err)
	if e.Code != jsonrpc.CodeInternal || e.Data != nil {
		return nil, e
	}
	why, _ := json.Marshal(e.Message)
	r := g.statusResult(0, json.RawMessage(`[]`))
	r = append(r[:len(r)-1], `,"sessions_unavailable":`...)
	r = append(r, why...)
	return append(r, '}'), nil
}

// statusResult is status's result around one shared read: the count and
// the ids (encoded) of the principal's open sessions.
func (g *Gateway) statusResult(active int64, ids json.RawMessage) jsonrpc.EncodedJSON {
	services := g.monitor.servicesJSON()
	b := make([]byte, 0, 64+len(g.statusFixed)+len(services)+len(ids))
	b = append(b, `{"active_sessions":`...)
	b = strconv.AppendInt(b, active, 10)
	b = append(b, g.statusFixed...)
	b = append(b, `,"services":`...)
	b = append(b, services...)
	b = append(b, `,"session_ids":`...)
	b = append(b, ids...)
	b = append(b, '}')
	// Every part is valid JSON of the gateway's own making: no re-check.
	return jsonrpc.EncodedJSON(b)
}

// encodeStatusFixed encodes the members of status's result that do not
// change while the gateway runs, between active_sessions and services
// (the result's members are in the order of their names).
func encodeStatusFixed(serverVersion, configDir, socket string) []byte {
	str := func(v string) string { b, _ := json.Marshal(v); return string(b) }
	return []byte(`,"config_dir":` + str(configDir) +
		`,"local_ipc_endpoint":` + str(socket) +
		`,"protocol_version":` + strconv.Itoa(version.Protocol) +
		`,"server_version":` + str(serverVersion))
}

// health answers docs/spec.md §5's health from the record the monitor
// encodes at each poll (every 500 ms) and restart notice: a client
// polling health costs no /proc reads, no encoding and no allocation.
func (g *Gateway) health(context.Context, *connState, json.RawMessage) (any, error) {
	// The record is valid JSON of the gateway's own making (an
	// EncodedJSON): no re-check.
	return g.monitor.healthAnswer(), nil
}

type processStats struct {
	RSSBytes      int64   `json:"rss_bytes"`
	RAMTotalBytes int64   `json:"system_ram_total_bytes"`
	CPUPercent    float64 `json:"cpu_percent"`
	NumCPUs       int     `json:"num_cpus"`
}

// sampleProcess reads this process's figures from /proc.
func sampleProcess(started time.Time, ramTotal int64) processStats {
	return processStats{
		RSSBytes:      rssBytes(),
		RAMTotalBytes: ramTotal,
		CPUPercent:    cpuPercent(started, time.Now()),
		NumCPUs:       runtime.NumCPU(),
	}
}

// rssBytes reads the resident set from /proc/self/statm (Linux); 0 where
// unavailable.
func rssBytes() int64 {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

func memTotalBytes() int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// cpuPercent is the process's average CPU use since start; 0 where
// /proc is unavailable.
func cpuPercent(started, now time.Time) float64 {
	st, err := procstat.Self()
	elapsed := now.Sub(started)
	if err != nil || elapsed <= 0 {
		return 0
	}
	return st.CPU.Seconds() / elapsed.Seconds() * 100
}
