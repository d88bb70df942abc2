// Package pdk is the plugin development kit for Clawmesh plugins written in
// Go. A plugin is an ordinary Go program built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o plugin.wasm .
//
// It registers one world implementation from an init function (see the
// packages tool, channel and memory) and leaves main empty. This package
// gives every world the host services: structured logging, the plugin's
// public config, its secrets and, when the manifest grants http_client,
// outbound HTTP. See plugins/ABI.md for the wire underneath.
package pdk
