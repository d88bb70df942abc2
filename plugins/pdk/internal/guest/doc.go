// Package guest is the guest half of the Clawmesh plugin ABI's machinery
// (plugins/ABI.md): the alloc/dealloc and version exports, buffer
// ownership and the raw host imports. The wire types and constants are in
// plugins/abi. Plugin authors use package pdk and its world packages.
package guest
