package pdk

import (
	"errors"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// Errors returned by host services. They carry no detail on purpose: the
// host reveals nothing about its resolver or schema.
var (
	// ErrAccessDenied: the plugin lacks the grant (config_read, http_client).
	ErrAccessDenied = errors.New("access-denied")
	// ErrNotFound: no such secret property.
	ErrNotFound = errors.New("not-found")
	// ErrUnavailable: outside a service frame, a resolver failure, a network
	// failure or the per-call host-call budget spent.
	ErrUnavailable = errors.New("unavailable")
	// ErrInvalidArgument: the request was malformed.
	ErrInvalidArgument = errors.New("invalid-argument")
	// ErrTooLarge: the response exceeded the host's size cap.
	ErrTooLarge = errors.New("too-large")
)

func codeError(code int64) error {
	switch code {
	case abi.CodeAccessDenied:
		return ErrAccessDenied
	case abi.CodeNotFound:
		return ErrNotFound
	case abi.CodeInvalidArgument:
		return ErrInvalidArgument
	case abi.CodeTooLarge:
		return ErrTooLarge
	default:
		return ErrUnavailable
	}
}
