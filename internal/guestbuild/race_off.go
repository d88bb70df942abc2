//go:build !race

package guestbuild

const raceEnabled = false
