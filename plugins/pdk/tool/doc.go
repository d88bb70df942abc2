// Package tool implements the tool world of the Clawmesh plugin ABI for Go
// plugins: register one Tool from an init function.
package tool
