package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
)

// socketFlags are the flags of the commands that talk to the running
// stack over its client socket.
type socketFlags struct {
	dir, socket, token string
	tokenSet           bool // --token given, if only empty
	// withoutConfig is initialize's config_unavailable once dial has
	// run: why the gateway bound the operator without the config
	// service ("" when config bound the caller).
	withoutConfig string
}

func (f *socketFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fs.StringVar(&f.socket, "socket", "", "client socket (env ZEROCLAW_SOCKET; default <data>/daemon.sock)")
	// Not the flag's default: -h prints defaults, and the token is a
	// credential. dialWith reads the environment unless --token is given
	// (--token= is the operator's, whatever the environment holds).
	fs.Func("token", "paired auth_token to initialize with (env ZEROCLAW_TOKEN); none for the operator", func(v string) error {
		f.token, f.tokenSet = v, true
		return nil
	})
}

// dial connects to the stack's socket and initializes.
func (f *socketFlags) dial() (*rpcclient.Client, error) { return f.dialWith(nil) }

// dialWith connects and initializes, advertising capabilities (nil for
// none).
func (f *socketFlags) dialWith(capabilities map[string]any) (*rpcclient.Client, error) {
	path := f.socket
	if path == "" {
		dir, err := datadir.Resolve(f.dir)
		if err != nil {
			return nil, err
		}
		path = datadir.Socket(dir)
	}
	c, err := rpcclient.Dial(path)
	if err != nil {
		return nil, fmt.Errorf("is the stack running? %w", err)
	}
	c.Timeout = 60 * time.Second
	params := map[string]any{"protocol_version": 1}
	token := f.token
	if !f.tokenSet {
		token = os.Getenv("ZEROCLAW_TOKEN")
	}
	if token != "" {
		params["auth_token"] = token
	}
	if capabilities != nil {
		params["client_capabilities"] = capabilities
	}
	raw, err := c.Call("initialize", params)
	if err != nil {
		c.Close()
		return nil, cliError(err)
	}
	var init struct {
		ConfigUnavailable string `json:"config_unavailable"`
	}
	// Only this member is read; a result it does not fit leaves it "".
	_ = json.Unmarshal(raw, &init)
	f.withoutConfig = init.ConfigUnavailable
	return c, nil
}

// cliError shows a daemon's error object as a person reads it.
func cliError(err error) error {
	var re *rpcclient.RPCError
	if errors.As(err, &re) {
		return errors.New(re.Describe())
	}
	return err
}
