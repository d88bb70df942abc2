package wasmhost

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// errDestinationRefused: a plugin's request would reach an address that is
// not public (loopback, a private or shared network, link-local with the
// cloud's metadata service, unspecified, multicast) and
// plugins.http.allowed_networks does not list it. The guest sees
// access-denied.
var errDestinationRefused = errors.New("destination not allowed")

// nonPublic are the networks IsGlobalUnicast and IsPrivate leave out:
// "this network" (0.0.0.0/8 reaches the host itself on Linux), the shared
// address space of carrier NAT where some clouds put their metadata
// (100.100.100.200), benchmarking, the deprecated site-local IPv6 and
// NAT64, which would carry any IPv4 address through a translator.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("fec0::/10"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// destinationAllowed reports whether a plugin may connect to ip: a public
// unicast address, or one inside a network the operator listed.
func destinationAllowed(ip netip.Addr, allowed []netip.Prefix) bool {
	ip = ip.Unmap() // ::ffff:127.0.0.1 is 127.0.0.1
	for _, p := range allowed {
		if p.Contains(ip) {
			return true
		}
	}
	if !ip.IsGlobalUnicast() || ip.IsPrivate() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// guardedDialer checks each address after the name is resolved, on every
// connection the transport opens (redirects included), so a name that
// resolves to a private address, or changes to one between two lookups, is
// refused as the address itself would be.
func guardedDialer(allowed []netip.Prefix) *net.Dialer {
	return &net.Dialer{
		Timeout:   30 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", errDestinationRefused, address)
			}
			if !destinationAllowed(ap.Addr(), allowed) {
				return fmt.Errorf("%w: %s is not a public address (plugins.http.allowed_networks may list its network)", errDestinationRefused, ap.Addr())
			}
			return nil
		},
	}
}
