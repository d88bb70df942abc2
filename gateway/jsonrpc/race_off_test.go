//go:build !race

package jsonrpc

const raceEnabled = false
