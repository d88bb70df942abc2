package bus

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"time"

	"github.com/nats-io/nkeys"
)

// Server limits: the embedded server of a local stack and an external
// one configured with ServerConfig enforce the same.
const (
	// MaxPayload bounds one message.
	MaxPayload = 8 << 20
	// MaxPending bounds what the server buffers for one slow client.
	MaxPending = 64 << 20
	// WriteDeadline is how long the server waits on one client write.
	WriteDeadline = 10 * time.Second
	// ResponseMaxMsgs and ResponseExpires bound the replies a role with
	// Permissions.Responses may send to one request it received.
	ResponseMaxMsgs = 1
	ResponseExpires = 15 * time.Minute
)

// ErrServerConfig: the server configuration cannot be rendered from what
// was given (a bad key, address or subject).
var ErrServerConfig = errors.New("bus: nats-server config")

// ServerAddrs are the addresses of an external nats-server.
type ServerAddrs struct {
	// Listen is the client address, host:port.
	Listen string
	// Monitor is the HTTP monitoring address, host:port, whose /healthz
	// answers health checks; empty disables monitoring. Keep it on
	// loopback unless the probe comes from elsewhere: /connz lists every
	// connection.
	Monitor string
}

// Check validates the addresses: host:port each, with a host that
// needs no quoting.
func (a ServerAddrs) Check() error {
	if err := checkHostPort(a.Listen, "listen"); err != nil {
		return err
	}
	if a.Monitor != "" {
		return checkHostPort(a.Monitor, "monitor")
	}
	return nil
}

// subjectPattern is what a subject of the permission table may hold;
// anything else would need quoting rules nobody should have to trust.
var subjectPattern = regexp.MustCompile(`^[A-Za-z0-9_.*>-]+$`)

// ServerConfig renders a nats-server configuration file for a stack's
// bus: the addresses, the limits above, and an authorization block that
// admits the roles whose public keys are given, each with exactly its
// Permissions, and no one else (no anonymous user). It is the file form
// of what the embedded server of a local stack is given, rendered from
// the same table; keys of roles the table does not list are refused.
func ServerConfig(keys map[Role]string, addrs ServerAddrs) ([]byte, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no identities: the server would admit nobody", ErrServerConfig)
	}
	known := map[Role]bool{}
	for _, r := range Roles {
		known[r] = true
	}
	for r, pub := range keys {
		if !known[r] {
			return nil, fmt.Errorf("%w: unknown role %q", ErrServerConfig, r)
		}
		if !nkeys.IsValidPublicUserKey(pub) {
			return nil, fmt.Errorf("%w: role %s: not a public user nkey", ErrServerConfig, r)
		}
	}
	if err := addrs.Check(); err != nil {
		return nil, err
	}

	var b bytes.Buffer
	b.WriteString("# nats-server configuration of a Clawmesh bus, rendered by `clawmesh bus init`\n")
	b.WriteString("# from the role table (internal/bus/roles.go). Render it again rather than\n")
	b.WriteString("# editing it: the permissions here must match the processes' own.\n")
	fmt.Fprintf(&b, "listen: %s\n", strconv.Quote(addrs.Listen))
	if addrs.Monitor != "" {
		fmt.Fprintf(&b, "http: %s\n", strconv.Quote(addrs.Monitor))
	}
	fmt.Fprintf(&b, "max_payload: %d\n", MaxPayload)
	fmt.Fprintf(&b, "max_pending: %d\n", MaxPending)
	fmt.Fprintf(&b, "write_deadline: %s\n", strconv.Quote(WriteDeadline.String()))
	b.WriteString("authorization {\n  users = [\n")
	for _, r := range Roles {
		pub, ok := keys[r]
		if !ok {
			continue
		}
		p := r.Permissions()
		pubList, err := subjectList(p.Publish)
		if err != nil {
			return nil, fmt.Errorf("%w: role %s: %w", ErrServerConfig, r, err)
		}
		subList, err := subjectList(p.Subscribe)
		if err != nil {
			return nil, fmt.Errorf("%w: role %s: %w", ErrServerConfig, r, err)
		}
		fmt.Fprintf(&b, "    # %s\n", r)
		fmt.Fprintf(&b, "    {\n      nkey: %s\n      permissions: {\n", strconv.Quote(pub))
		fmt.Fprintf(&b, "        publish: %s\n", pubList)
		fmt.Fprintf(&b, "        subscribe: %s\n", subList)
		if p.Responses {
			fmt.Fprintf(&b, "        allow_responses: { max: %d, expires: %s }\n", ResponseMaxMsgs, strconv.Quote(ResponseExpires.String()))
		}
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.Bytes(), nil
}

// subjectList renders one direction of a role's permissions. An empty
// allow list is rendered as deny-all: a missing list would mean
// "everything".
func subjectList(allow []string) (string, error) {
	if len(allow) == 0 {
		return `{ deny: [">"] }`, nil
	}
	var b bytes.Buffer
	b.WriteString("{ allow: [")
	for i, s := range allow {
		if !subjectPattern.MatchString(s) {
			return "", fmt.Errorf("subject %q has characters outside [A-Za-z0-9_.*>-]", s)
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(s))
	}
	b.WriteString("] }")
	return b.String(), nil
}

// hostPattern is a host name or an IP address (IPv6 without brackets).
var hostPattern = regexp.MustCompile(`^[A-Za-z0-9.:-]*$`)

func checkHostPort(addr, what string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: %s address %q: %w", ErrServerConfig, what, addr, err)
	}
	if !hostPattern.MatchString(host) {
		return fmt.Errorf("%w: %s address %q: bad host", ErrServerConfig, what, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%w: %s address %q: bad port", ErrServerConfig, what, addr)
	}
	return nil
}
