package main

// Rows is the performance picture: every benchmark with a target, next to
// its baseline from the same run. docs/performance.md explains each row and
// where its target comes from (issues 17 and 11).
var Rows = []row{
	{Work: "health in the gateway, 64 clients (req/s)",
		Subject: sel{"BenchmarkSocket/health/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Target: 0.8},
	{Work: "status: one gRPC call, 64 clients (req/s)",
		Subject: sel{"BenchmarkSocket/status/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Target: 0.25},
	{Work: "session/state: one gRPC hop, 64 clients (req/s)",
		Subject: sel{"BenchmarkSocket/session_state/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Target: 0.25},
	{Work: "session/state, 64 clients each on its own session: nothing shared (req/s)",
		Subject: sel{"BenchmarkSocket/session_state_apart/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Scale: true},
	{Work: "turn stream p50, 100 sessions (µs)",
		Subject: sel{"BenchmarkTurnStream/socket/sessions=100", "p50_us"}, Baseline: sel{"BenchmarkTurnStream/nats/sessions=100", "p50_us"}, Target: 2, AtMost: true},
	{Work: "turn stream p99, 100 sessions (µs)",
		Subject: sel{"BenchmarkTurnStream/socket/sessions=100", "p99_us"}, Baseline: sel{"BenchmarkTurnStream/nats/sessions=100", "p99_us"}, Target: 3, AtMost: true},
	{Work: "turn stream p50, 1 session (µs)",
		Subject: sel{"BenchmarkTurnStream/socket/sessions=1", "p50_us"}, Baseline: sel{"BenchmarkTurnStream/nats/sessions=1", "p50_us"}, Target: 2, AtMost: true},
	{Work: "10 MB upload in 1 MiB chunks over the socket, stored (MB/s)",
		Subject: sel{"BenchmarkUpload", "upload_MB/s"}, Baseline: sel{"BenchmarkUpload", "baseline_MB/s"}, Target: 0.5},
	{Work: "durable snapshot poll answered 304, 256 panes, 1 client (polls/s)",
		Subject: sel{"BenchmarkSnapshotPoll/304/clients=1", "polls/s"}, Baseline: sel{"BenchmarkSnapshotPoll/baseline-static-304/clients=1", "polls/s"}, Target: 0.5},
	{Work: "durable snapshot poll answered 304, 256 panes, 8 clients (polls/s)",
		Subject: sel{"BenchmarkSnapshotPoll/304/clients=8", "polls/s"}, Baseline: sel{"BenchmarkSnapshotPoll/baseline-static-304/clients=8", "polls/s"}, Target: 0.5},
	{Work: "fuel metering on a CPU loop, Go guest (metered/unmetered)",
		Subject: sel{"BenchmarkFuelOverhead", "ratio"}, Target: 1.5, AtMost: true},
	{Work: "Go plugin tool call, fresh instance, p50 (µs)",
		Subject: sel{"BenchmarkEchoCall/paced", "p50-us"}, Target: 300, AtMost: true},
	{Work: "hand-assembled (WAT-level) plugin tool call, fresh instance, p50 (µs)",
		Subject: sel{"BenchmarkMinimalCall", "p50-us"}, Target: 100, AtMost: true},
	{Work: "idle footprint: launcher, gateway, five services (MB RSS)",
		Subject: sel{"BenchmarkIdleFootprint", "stack_MB"}, Baseline: sel{"BenchmarkIdleFootprint", "baseline_MB"}, Target: 100, AtMost: true, Absolute: true},
	{Work: "clawmesh up on an existing data dir -> first initialize (ms)",
		Subject: sel{"BenchmarkStartup", "startup_ms"}, Baseline: sel{"BenchmarkStartup", "pg_start_ms"}, Target: 1000, AtMost: true, Absolute: true},
	{Work: "clawmesh up, first run, initdb included (ms)",
		Subject: sel{"BenchmarkStartup", "first_run_ms"}, Target: 2000, AtMost: true},
}
