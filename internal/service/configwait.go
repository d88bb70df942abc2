package service

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/configclient"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// StartingConfig is what health says a start waits for while the config
// service gives no answer (AwaitConfig).
const StartingConfig = "waiting for the config service"

// answerEarlyAfter is how long AwaitConfig waits for config before a
// socket the launcher handed over answers (grpcserver.AnswerEarly):
// config answers a start in milliseconds, and the gateway gives a hung
// config as long (awayStatusWait).
var answerEarlyAfter = time.Second

// configAttempt bounds one attempt of AwaitConfig to read the live
// config: past it the wait is logged and goes on.
var configAttempt = 10 * time.Second

// AwaitConfig reads the live config for the process's start (a Register),
// waiting for the config service as long as ctx lasts: down or hung
// (SIGSTOPped: connections wait in its backlog), it is asked again, the
// wait logged every configAttempt, and meanwhile health answers
// NOT_SERVING "starting: waiting for the config service" and every other
// call Unavailable with the same reason (ServeEarly).
//
// A start that gave config a minute and then exited was restarted by the
// launcher and did the same, in a loop, for as long as config was hung:
// the service stayed down after config came back until its next attempt,
// and restarting it mended nothing. Waiting keeps the trust fail-closed:
// nothing of the service is served before config has answered, so no
// decision is made on settings config did not give (the session,
// plugin-sandbox, durable-bridge and upload-staging settings decide what
// is kept, loaded, listened on and accepted: none is started on the
// schema's defaults), and every authorization is still config's to give
// at each call. Only the gateway starts without config (gateway.New),
// the operator bound by its uid alone.
//
// An error other than config's silence (the bus refusing the
// subscription) ends the start as before, and so does ctx's end.
func (e *Env) AwaitConfig(ctx context.Context, rpc configv1.ConfigServiceClient) (*configclient.Client, error) {
	// Alive while it waits (grpcserver.SetWaitingOn): a pod's startup
	// probe would restart it every 120 s for as long as config hangs.
	e.setStarting(StartingConfig, true)
	defer e.setStarting("setting up its services", false)
	// A socket the launcher handed over (grpcserver.HoldEarly) answered
	// nothing meanwhile: the call that woke a dormant upload-staging
	// with config hung waited in its backlog, its client told nothing
	// of why. Past a moment the process answers, saying what it waits
	// for; a config that answers at once keeps the call waiting for
	// the process to serve it.
	early := time.AfterFunc(answerEarlyAfter, e.Server.AnswerEarly)
	defer early.Stop()
	start := time.Now()
	for {
		attempt, cancel := context.WithTimeout(ctx, configAttempt)
		live, err := configclient.New(attempt, rpc, e.NATS, e.Log)
		unanswered := attempt.Err() != nil
		cancel()
		switch {
		case err == nil:
			if waited := time.Since(start); waited >= configAttempt {
				e.Log.Info("config service answered", zap.Duration("waited", waited.Round(time.Millisecond)))
			}
			return live, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("config service: stopped while waiting for it (%w): %w", context.Cause(ctx), err)
		case !unanswered:
			return nil, fmt.Errorf("config service: %w", err)
		}
		e.Log.Warn("config service unanswered: still waiting for it, health says so",
			zap.Duration("waited", time.Since(start).Round(time.Millisecond)), zap.Error(err))
	}
}
