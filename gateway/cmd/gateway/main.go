// Command gateway runs the edge: the local NDJSON JSON-RPC socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/logging"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		dir, socket, healthListen, natsURL, logLevel string
		cfgAddr, sessAddr, upAddr, durAddr, plugAddr string
		ephemeral                                    bool
		drain                                        time.Duration
	)
	flag.StringVar(&dir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	flag.StringVar(&socket, "socket", "", "client socket (env ZEROCLAW_SOCKET; default <data>/daemon.sock)")
	flag.StringVar(&healthListen, "health-listen", "", "gRPC health socket (default <data>/gateway.sock)")
	flag.StringVar(&natsURL, "nats-url", os.Getenv("NATS_URL"), "NATS URL (env NATS_URL)")
	flag.StringVar(&cfgAddr, "config-addr", os.Getenv("CLAWMESH_CONFIG_ADDR"), "config service address")
	flag.StringVar(&sessAddr, "session-addr", os.Getenv("CLAWMESH_SESSION_ADDR"), "session service address")
	flag.StringVar(&upAddr, "upload-addr", os.Getenv("CLAWMESH_UPLOAD_ADDR"), "upload-staging service address")
	flag.StringVar(&durAddr, "durable-addr", os.Getenv("CLAWMESH_DURABLE_ADDR"), "durable-bridge service address")
	flag.StringVar(&plugAddr, "plugin-addr", os.Getenv("CLAWMESH_PLUGIN_ADDR"), "plugin-sandbox replica addresses, comma-separated")
	flag.BoolVar(&ephemeral, "ephemeral", false, "exit 1 s after the last client disconnects")
	flag.DurationVar(&drain, "drain", 10*time.Second, "longest drain of in-flight requests at shutdown")
	flag.StringVar(&logLevel, "log-level", "", "debug, info, warn or error")
	flag.Parse()

	data, err := datadir.Resolve(dir)
	if err != nil {
		return err
	}
	if socket == "" {
		socket = datadir.Socket(data)
	}
	or := func(v, service string) string {
		if v != "" {
			return v
		}
		return datadir.ServiceSocket(data, service, 0)
	}
	if healthListen == "" {
		healthListen = datadir.ServiceSocket(data, "gateway", 0)
	}
	var plugins []string
	for _, a := range strings.Split(or(plugAddr, "plugin-sandbox"), ",") {
		if a = strings.TrimSpace(a); a != "" {
			plugins = append(plugins, a)
		}
	}
	log, err := logging.New("gateway", logLevel)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck

	g, err := gateway.New(gateway.Config{
		DataDir: data, Socket: socket, HealthListen: healthListen, NATSURL: natsURL,
		ConfigAddr: or(cfgAddr, "config"), SessionAddr: or(sessAddr, "session"),
		UploadAddr: or(upAddr, "upload-staging"), DurableAddr: or(durAddr, "durable-bridge"),
		PluginAddrs: plugins, Ephemeral: ephemeral, Drain: drain, Log: log,
	})
	if err != nil {
		return err
	}
	defer g.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = g.Run(ctx)
	if errors.Is(err, gateway.ErrEphemeralExit) {
		log.Info("ephemeral gateway done")
		return nil
	}
	if err == nil {
		log.Info("stopped")
	}
	if err != nil {
		log.Error("gateway failed", zap.Error(err))
	}
	return err
}
