package main

import (
	"flag"
	"reflect"
	"strings"
	"testing"
)

func TestParseArgsFlagsAnywhere(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		pos     []string
		token   string
		verbose bool
		err     string
	}{
		{args: []string{"get", "agents", "--token", "T"}, pos: []string{"get", "agents"}, token: "T"},
		{args: []string{"--token", "T", "get", "agents"}, pos: []string{"get", "agents"}, token: "T"},
		{args: []string{"get", "--token=T", "agents", "-v"}, pos: []string{"get", "agents"}, token: "T", verbose: true},
		{args: []string{"set", "--", "--token", "x"}, pos: []string{"set", "--token", "x"}},
		{args: []string{"get", "agents", "--tokn", "T"}, err: "flag provided but not defined: -tokn"},
		{args: []string{"get", "--token"}, err: "flag needs an argument: -token"},
		{args: nil, pos: nil},
	} {
		fs := flag.NewFlagSet("config", flag.ContinueOnError)
		token := fs.String("token", "", "")
		verbose := fs.Bool("v", false, "")
		pos, err := parseArgs(fs, tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(pos, tc.pos) || *token != tc.token || *verbose != tc.verbose {
			t.Errorf("%q: pos %q token %q v %v err %v", tc.args, pos, *token, *verbose, err)
		}
	}
}
