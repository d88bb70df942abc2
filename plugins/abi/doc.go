// Package abi is the one definition of the Clawmesh plugin ABI's wire
// contract (plugins/ABI.md): the version, the import module and import
// names, the export names of each world, the result codes of host imports,
// the per-frame host-call budget, the closed log taxonomies and the JSON
// shapes that cross the boundary.
//
// It is plain Go with no build tags, so that both sides import the same
// declarations: the guest library (plugins/pdk, built for wasip1) and the
// host (services/pluginsandbox/wasmhost). Changing anything here changes
// the ABI: bump Version when a change is incompatible.
package abi
