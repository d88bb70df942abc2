package service

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// EnvStartupSets holds the launcher's --set overrides for the config
// service, a JSON array of "prop=value" strings. They travel in the
// environment, never on the command line, because they may hold secrets
// (api keys).
//
// The JSON is cut into pieces: EnvStartupSets holds the first,
// EnvStartupSets_1, _2, ... the next ones. Linux refuses to start a
// process one of whose environment strings is longer than MAX_ARG_STRLEN
// (32 pages: 131072 bytes), so a --set-file with a system prompt of 140
// KB, one variable, failed the whole start with "fork/exec .../config:
// argument list too long".
const EnvStartupSets = "CLAWMESH_STARTUP_SETS"

// startupSetsPiece is the most bytes of JSON one variable holds, well
// under MAX_ARG_STRLEN with its name.
const startupSetsPiece = 64 << 10

// MaxStartupSetsBytes bounds the JSON of the --set overrides: the
// environment and the arguments of a new process share ARG_MAX (a quarter
// of the stack limit, 2 MiB by default), so past this the config service
// might not start at all. A larger config is set over the socket.
const MaxStartupSetsBytes = 1 << 20

// StartupSetsEnv encodes sets as the environment entries
// ("NAME=value") that StartupSets reads back; none for no sets.
func StartupSetsEnv(sets []string) ([]string, error) {
	if len(sets) == 0 {
		return nil, nil
	}
	raw, err := json.Marshal(sets)
	if err != nil {
		return nil, fmt.Errorf("--set values: %w", err)
	}
	if len(raw) > MaxStartupSetsBytes {
		return nil, fmt.Errorf("--set values: %d bytes of them, more than the %d that can be passed to the config service at start; "+
			"set the larger ones with config/set once the stack is up", len(raw), MaxStartupSetsBytes)
	}
	var env []string
	for i := 0; len(raw) > 0; i++ {
		n := min(len(raw), startupSetsPiece)
		env = append(env, startupSetsName(i)+"="+string(raw[:n]))
		raw = raw[n:]
	}
	return env, nil
}

// IsStartupSets reports whether the environment entry kv is one of
// StartupSetsEnv's: a process that starts the config service passes its
// own, never ones it inherited, which StartupSets would join to them.
func IsStartupSets(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	if name == EnvStartupSets {
		return true
	}
	n, ok := strings.CutPrefix(name, EnvStartupSets+"_")
	_, err := strconv.Atoi(n)
	return ok && err == nil
}

// StartupSets reads the overrides StartupSetsEnv encoded, with getenv
// (os.Getenv); nil when there are none.
func StartupSets(getenv func(string) string) ([]string, error) {
	var b strings.Builder
	for i := 0; ; i++ {
		piece := getenv(startupSetsName(i))
		if piece == "" {
			break
		}
		b.WriteString(piece)
	}
	if b.Len() == 0 {
		return nil, nil
	}
	var sets []string
	if err := json.Unmarshal([]byte(b.String()), &sets); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvStartupSets, err)
	}
	return sets, nil
}

func startupSetsName(i int) string {
	if i == 0 {
		return EnvStartupSets
	}
	return EnvStartupSets + "_" + strconv.Itoa(i)
}
