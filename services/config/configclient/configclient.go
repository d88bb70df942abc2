// Package configclient is how a service reads the live config: the whole
// document at start (the Live RPC), then every committed change as it is
// published on NATS, in revision order; and how it asks the config
// service for authorization decisions.
//
//	cc, err := configclient.New(ctx, configv1.NewConfigServiceClient(conn), nc, log)
//	limit := cc.Current().Int("plugins.limits.max_instances", 64)
//	cc.OnChange(func(s configclient.Snapshot, props []string) { ... })
//	if err := configclient.Authorize(ctx, rpc, principal, "files:create", sessionID); err != nil { return nil, err }
//
// Documents are masked: a secret reads "***MASKED***". A service that
// needs a secret's value asks the Reveal RPC.
package configclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// Subject is where the config service publishes each commit.
const Subject = "clawmesh.config.changed"

// Change is the payload published on Subject after each commit.
type Change struct {
	Revision int64 `json:"revision"`
	// Props are the properties the commit wrote, in the order given.
	Props []string `json:"props"`
	// Document is the whole effective config, secrets masked.
	Document map[string]any `json:"document"`
}

// Snapshot is one revision of the live config.
type Snapshot struct {
	Revision int64
	Document map[string]any
}

// Value returns the value at a dotted path.
func (s Snapshot) Value(path string) (any, bool) {
	var cur any = s.Document
	for _, seg := range strings.Split(path, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = obj[seg]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// Int returns an integer property, or def when it is absent.
func (s Snapshot) Int(path string, def int64) int64 {
	if v, ok := s.Value(path); ok {
		if n, ok := v.(float64); ok {
			return int64(n)
		}
	}
	return def
}

// String returns a string property, or def when it is absent.
func (s Snapshot) String(path, def string) string {
	if v, ok := s.Value(path); ok {
		if str, ok := v.(string); ok {
			return str
		}
	}
	return def
}

// Client follows the live config.
type Client struct {
	rpc configv1.ConfigServiceClient
	log *zap.Logger
	sub *nats.Subscription

	mu       sync.Mutex
	cur      Snapshot
	ready    bool
	early    []Change
	watchers []func(Snapshot, []string)
}

// New subscribes to changes, then reads the live document (waiting for
// the config service up to ctx's deadline), so no commit falls between
// the two.
func New(ctx context.Context, rpc configv1.ConfigServiceClient, nc *nats.Conn, log *zap.Logger) (*Client, error) {
	if log == nil {
		log = zap.NewNop()
	}
	c := &Client{rpc: rpc, log: log}
	sub, err := nc.Subscribe(Subject, c.receive)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", Subject, err)
	}
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe() //nolint:errcheck
		return nil, fmt.Errorf("subscribe %s: %w", Subject, err)
	}
	c.sub = sub
	snap, err := c.fetch(ctx)
	if err != nil {
		sub.Unsubscribe() //nolint:errcheck
		return nil, err
	}
	c.mu.Lock()
	c.cur, c.ready = snap, true
	early := c.early
	c.early = nil
	c.mu.Unlock()
	for _, ch := range early {
		c.apply(ch)
	}
	return c, nil
}

// Close stops following changes.
func (c *Client) Close() {
	if c.sub != nil {
		c.sub.Unsubscribe() //nolint:errcheck // the connection may be closed already
	}
}

// Current is the newest revision seen.
func (c *Client) Current() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// OnChange registers fn, called with each newer revision and the props it
// changed, in revision order, from one goroutine; fn must not block long.
// A revision reached after a gap (a missed message) reports props nil.
func (c *Client) OnChange(fn func(Snapshot, []string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchers = append(c.watchers, fn)
}

func (c *Client) fetch(ctx context.Context) (Snapshot, error) {
	for {
		live, err := c.rpc.Live(ctx, &configv1.LiveRequest{}, grpc.WaitForReady(true))
		if err == nil {
			return Snapshot{Revision: live.GetRevision(), Document: live.GetDocument().AsMap()}, nil
		}
		select {
		case <-ctx.Done():
			return Snapshot{}, fmt.Errorf("read the live config: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Client) receive(m *nats.Msg) {
	var ch Change
	if err := json.Unmarshal(m.Data, &ch); err != nil {
		c.log.Warn("config change undecodable", zap.Error(err))
		return
	}
	c.mu.Lock()
	if !c.ready {
		c.early = append(c.early, ch)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.apply(ch)
}

// apply installs a change in revision order: older ones are dropped, and
// a gap is filled by reading the live document again.
func (c *Client) apply(ch Change) {
	c.mu.Lock()
	cur := c.cur.Revision
	c.mu.Unlock()
	switch {
	case ch.Revision <= cur:
		return
	case ch.Revision > cur+1:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		snap, err := c.fetch(ctx)
		cancel()
		if err != nil {
			c.log.Warn("config gap not filled", zap.Int64("have", cur), zap.Int64("seen", ch.Revision), zap.Error(err))
			return
		}
		if snap.Revision >= ch.Revision {
			c.install(snap, nil)
			return
		}
	}
	c.install(Snapshot{Revision: ch.Revision, Document: ch.Document}, ch.Props)
}

func (c *Client) install(s Snapshot, props []string) {
	c.mu.Lock()
	if s.Revision <= c.cur.Revision {
		c.mu.Unlock()
		return
	}
	c.cur = s
	watchers := append([]func(Snapshot, []string){}, c.watchers...)
	c.mu.Unlock()
	for _, fn := range watchers {
		fn(s, props)
	}
}

// ErrConfigUnavailable wraps a failure to reach the config service.
var ErrConfigUnavailable = errors.New("config service unavailable")

// Authorize asks the config service whether principal holds permission on
// resource. It returns nil when allowed, a PermissionDenied status with
// the forbidden reason (ready to return to the gateway, which sends
// -32012) when not, and an error wrapping ErrConfigUnavailable when the
// question could not be asked.
func Authorize(ctx context.Context, rpc configv1.ConfigServiceClient, principal *configv1.Principal, permission, resource string) error {
	resp, err := rpc.Authorize(ctx, &configv1.AuthorizeRequest{Principal: principal, Permission: permission, Resource: resource})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfigUnavailable, err)
	}
	if !resp.GetAllowed() {
		return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, resp.GetReason())
	}
	return nil
}

// Authorize is the package-level Authorize on the client's connection.
func (c *Client) Authorize(ctx context.Context, principal *configv1.Principal, permission, resource string) error {
	return Authorize(ctx, c.rpc, principal, permission, resource)
}
