package wasmhost

import (
	"net/netip"
	"testing"
)

func TestDestinationAllowed(t *testing.T) {
	lan := []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"93.184.215.14", true},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", true},
		{"127.0.0.1", false},
		{"::1", false},
		{"::ffff:127.0.0.1", false},
		{"0.0.0.0", false},
		{"0.1.2.3", false},
		{"::", false},
		{"169.254.169.254", false},
		{"fe80::1", false},
		{"fd00:ec2::254", false},
		{"10.1.2.3", false},
		{"172.16.0.1", false},
		{"192.168.0.1", false},
		{"192.168.1.20", true}, // listed
		{"::ffff:192.168.1.20", true},
		{"100.100.100.200", false},
		{"224.0.0.1", false},
		{"255.255.255.255", false},
		{"64:ff9b::a9fe:a9fe", false}, // 169.254.169.254 through NAT64
		{"fec0::1", false},
	} {
		if got := destinationAllowed(netip.MustParseAddr(c.addr), lan); got != c.want {
			t.Errorf("%s: allowed = %v, want %v", c.addr, got, c.want)
		}
	}
}
