// Package tool implements the tool world of the Clawmesh plugin ABI for Go
// plugins: register one Tool from an init function.
//
// Every call runs in a fresh instance, whose initialisation (the package
// init functions) the host ran when it pre-instantiated it, off the call's
// path. Work that does not depend on the call belongs there: a tool that
// decodes its arguments into its own type should decode once into it in
// its init (see plugins/examples/echo), or its only call pays for building
// encoding/json's cache of that type. The result envelope is written
// without encoding/json (abi.ToolEnvelope.AppendJSON), so it needs no
// such warm-up.
package tool
