// Package abi is the guest half of the Clawmesh plugin ABI (plugins/ABI.md):
// the alloc/dealloc and version exports, buffer ownership and the raw host
// imports. Plugin authors use package pdk and its world packages instead.
package abi
