//go:build wasip1

package guest

import "unsafe"

// Raw host imports of module "clawmesh". None of them calls back into the
// guest; those that return bytes write into a guest buffer and return the
// length they need.

//go:wasmimport clawmesh log_record
func LogRecord(level uint32, event unsafe.Pointer, eventLen uint32)

//go:wasmimport clawmesh secrets_get
func SecretsGet(name unsafe.Pointer, nameLen uint32, buf unsafe.Pointer, bufCap uint32) int64

//go:wasmimport clawmesh config_get
func ConfigGet(buf unsafe.Pointer, bufCap uint32) int64

//go:wasmimport clawmesh inbound_poll
func InboundPoll(buf unsafe.Pointer, bufCap uint32) int64

//go:wasmimport clawmesh inbound_pending
func InboundPending() uint32

//go:wasmimport clawmesh http_request
func HTTPRequest(req unsafe.Pointer, reqLen uint32) int64

//go:wasmimport clawmesh http_response
func HTTPResponse(buf unsafe.Pointer, bufCap uint32) int64

//go:wasmimport clawmesh fuel_left
func FuelLeft() int64
