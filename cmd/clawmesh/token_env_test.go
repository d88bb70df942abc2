package main

import (
	"strings"
	"testing"
)

// ZEROCLAW_TOKEN is a credential: -h printed it as --token's default
// ("(default \"<the token>\")") on every command that talks to the stack,
// onto a terminal, a pasted bug report or a CI log. It is still the token
// used when --token is not given.
func TestHelpDoesNotPrintTheToken(t *testing.T) {
	const secret = "refused-token"
	t.Setenv("ZEROCLAW_TOKEN", secret)
	for _, args := range [][]string{{"call", "-h"}, {"chat", "-h"}, {"doctor", "-h"}, {"config", "get", "-h"}, {"plugin", "list", "-h"}} {
		stdout, stderr, _ := runCLI(t, args...)
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("clawmesh %s printed the token:\n%s", strings.Join(args, " "), stdout)
		}
	}
	var out strings.Builder
	err := callCmd([]string{"--socket", fakeStack(t), "status"}, &out)
	if err == nil || !strings.Contains(err.Error(), "auth_token is not paired") {
		t.Fatalf("call with ZEROCLAW_TOKEN set did not send it: %v", err)
	}
	// --token= is the operator's, the environment notwithstanding.
	err = callCmd([]string{"--socket", fakeStack(t), "--token=", "status"}, &out)
	if err == nil || strings.Contains(err.Error(), "not paired") {
		t.Fatalf("call --token= sent ZEROCLAW_TOKEN: %v", err)
	}
}
