// Package logging builds the zap logger every Clawmesh process uses: JSON
// lines on stderr, static messages, dynamic values as fields.
package logging

import (
	"fmt"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a production logger named after the process. level is a zap
// level name ("debug", "info", "warn", "error"); empty means info, and the
// CLAWMESH_LOG_LEVEL environment variable is the fallback.
func New(process, level string) (*zap.Logger, error) {
	if level == "" {
		level = os.Getenv("CLAWMESH_LOG_LEVEL")
	}
	lvl := zapcore.InfoLevel
	if level != "" {
		if err := lvl.Set(level); err != nil {
			return nil, fmt.Errorf("log level %q: %w", level, err)
		}
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	log, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return log.With(zap.String("process", process), zap.Int("pid", os.Getpid())), nil
}
