package gateway

import (
	"context"
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/version"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// status answers docs/spec.md §5's status; services come from the health monitor.
func (g *Gateway) status(ctx context.Context, cs *connState, _ json.RawMessage) (any, error) {
	st, err := g.session.Status(ctx, &sessionv1.StatusRequest{Principal: cs.principalOf()})
	if err != nil {
		return nil, serviceError("session", err)
	}
	ids := st.GetSessionIds()
	if ids == nil {
		ids = []string{}
	}
	return map[string]any{
		"server_version":     g.version,
		"protocol_version":   version.Protocol,
		"active_sessions":    st.GetActiveSessions(),
		"session_ids":        ids,
		"config_dir":         g.cfg.DataDir,
		"local_ipc_endpoint": g.cfg.Socket,
		"services":           g.monitor.statuses(),
	}, nil
}

// health answers docs/spec.md §5's health: the gateway process and every service.
// The components and process figures come encoded from the monitor's last
// poll, and the reply is assembled from them as bytes: a client polling
// health costs no /proc reads and no re-encoding.
func (g *Gateway) health(context.Context, *connState, json.RawMessage) (any, error) {
	now := time.Now().UTC()
	b := make([]byte, 0, 1024)
	b = append(b, `{"pid":`...)
	b = strconv.AppendInt(b, int64(os.Getpid()), 10)
	b = append(b, `,"updated_at":"`...)
	b = now.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","uptime_seconds":`...)
	b = strconv.AppendInt(b, int64(now.Sub(g.started).Seconds()), 10)
	b = append(b, `,"components":`...)
	b = append(b, g.monitor.componentsJSON()...)
	b = append(b, `,"process":`...)
	b = append(b, g.monitor.processJSON()...)
	b = append(b, '}')
	// Every part is valid JSON of the gateway's own making: no re-check.
	return jsonrpc.EncodedJSON(b), nil
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

// cpuPercent is the process's average CPU use since start, from
// /proc/self/stat (utime+stime in clock ticks of 1/100 s).
func cpuPercent(started, now time.Time) float64 {
	raw, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(raw)
	// Fields after the command name, which is in parentheses.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	elapsed := now.Sub(started).Seconds()
	if elapsed <= 0 {
		return 0
	}
	return (utime + stime) / 100 / elapsed * 100
}
