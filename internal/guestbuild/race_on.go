//go:build race

package guestbuild

// raceEnabled: this binary's wazero compiler is instrumented too.
const raceEnabled = true
