package durablebridge

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/unixsock"
)

// BenchmarkSnapshotPoll measures snapshot polls per second over the
// private socket with 256 panes: answered 304 (nothing changed), and with
// a change before each poll (the whole snapshot rendered and sent); the
// baseline, measured in the same run, is a static 304 from Go's net/http
// on a Unix socket. The target for the 304 poll is at least 0.5× the
// baseline (reported as x-baseline).
func BenchmarkSnapshotPoll(b *testing.B) {
	w := newWireBridge(b, false)
	w.b.layout.SetReady()
	for i := range maxPanes {
		id := fmt.Sprintf("sess_%024d", i)
		var asks []*ask
		if i%4 == 0 {
			asks = append(asks, testAsk(id, fmt.Sprintf("tc_%d", i)))
		}
		w.addPane(id, fmt.Sprintf("agent%d", i%8), 3, asks...)
	}
	baseline := startStatic304(b)
	rates := map[string]float64{}
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("baseline-static-304/clients=%d", clients), func(b *testing.B) {
			rates[fmt.Sprint("base", clients)] = poll(b, baseline, clients, `"static"`, http.StatusNotModified, nil)
		})
		b.Run(fmt.Sprintf("304/clients=%d", clients), func(b *testing.B) {
			r := poll(b, w.socket, clients, w.b.layout.ETag(), http.StatusNotModified, nil)
			if base := rates[fmt.Sprint("base", clients)]; base > 0 {
				b.ReportMetric(r/base, "x-baseline")
			}
		})
		b.Run(fmt.Sprintf("changed/clients=%d", clients), func(b *testing.B) {
			var mu sync.Mutex
			n := 0
			r := poll(b, w.socket, clients, w.b.layout.ETag(), http.StatusOK, func() {
				mu.Lock()
				n++
				w.b.layout.setTitle(workspaceKey(), fmt.Sprintf("title %d", n))
				mu.Unlock()
			})
			if base := rates[fmt.Sprint("base", clients)]; base > 0 {
				b.ReportMetric(r/base, "x-baseline")
			}
		})
	}
}

// poll runs b.N snapshot polls spread over clients connections, each
// with If-None-Match: tag, first calling change when set; it reports
// polls/s and returns the rate.
func poll(b *testing.B, socket string, clients int, tag string, want int, change func()) float64 {
	b.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: clients, DisableCompression: true,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	req := func() error {
		r, err := http.NewRequest(http.MethodGet, "http://durable/session/v1/snapshot", nil)
		if err != nil {
			return err
		}
		r.Header.Set("X-Collie-Session", "1")
		r.Header.Set("If-None-Match", tag)
		resp, err := hc.Do(r)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("status %d, want %d", resp.StatusCode, want)
		}
		return err
	}
	// Warm every connection.
	for range clients {
		if change != nil {
			change()
		}
		if err := req(); err != nil {
			b.Fatal(err)
		}
	}
	var next sync.Mutex
	left := b.N
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				if left == 0 {
					next.Unlock()
					return
				}
				left--
				next.Unlock()
				if change != nil {
					change()
				}
				if err := req(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "polls/s")
	return rate
}

// startStatic304 serves a static 304 with an ETag from net/http on a Unix
// socket: what an HTTP poll costs with nothing behind it.
func startStatic304(b *testing.B) string {
	path := filepath.Join(b.TempDir(), "static", "s.sock")
	ln, err := unixsock.Listen(path)
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Etag"] = []string{`"static"`}
		w.WriteHeader(http.StatusNotModified)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close(); <-done })
	return path
}
