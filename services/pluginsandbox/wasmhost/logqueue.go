package wasmhost

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// Logging limits of seed 003.
const (
	// MaxLogRecordBytes: a record with more guest bytes is dropped, not
	// truncated.
	MaxLogRecordBytes = abi.MaxLogRecordBytes
	// LogBudgetBytes: the aggregate guest bytes queued; freed only after a
	// record is written.
	LogBudgetBytes = abi.LogBudgetBytes
	// logQueueRecords bounds the number of queued records.
	logQueueRecords = 4096
)

// Closed taxonomies of plugin log events (mirroring Action / EventOutcome).
// There is deliberately no escape variant.
var (
	logActions  = setOf(abi.LogActions)
	logOutcomes = setOf(abi.LogOutcomes)
	logLevels   = abi.LevelNames
)

// LogRecord is one plugin log event, with the span it was emitted in.
type LogRecord struct {
	Plugin    string
	World     string
	Export    string
	CallID    string
	Principal string
	Level     string
	Action    string
	Outcome   string
	Message   string
	Fields    map[string]string
}

// LogSink writes plugin log records. It is called from the drain goroutine
// only, one record at a time; it may block without holding up any guest.
type LogSink interface {
	WritePluginLog(LogRecord)
}

// LogStats are the logging queue's counters.
type LogStats struct {
	Written   uint64 // records handed to the sink
	Dropped   uint64 // records dropped: too large, budget spent, queue full, host-call budget spent, malformed
	HighWater int64  // most guest bytes queued at once
}

type queuedLog struct {
	span  frameSpan
	level uint32
	raw   []byte
}

// logQueue is the bounded queue between the log_record import and the sink.
type logQueue struct {
	ch        chan queuedLog
	inUse     atomic.Int64 // guest bytes queued
	highWater atomic.Int64
	dropped   atomic.Uint64
	written   atomic.Uint64
	sink      LogSink
	logger    *zap.Logger
	idle      time.Duration
	stop      chan struct{}
	done      sync.WaitGroup
}

func newLogQueue(sink LogSink, logger *zap.Logger, idle time.Duration) *logQueue {
	q := &logQueue{
		ch:     make(chan queuedLog, logQueueRecords),
		sink:   sink,
		logger: logger,
		idle:   idle,
		stop:   make(chan struct{}),
	}
	q.done.Add(1)
	go q.drain()
	return q
}

// reserve takes n bytes of the budget, or reports that it cannot.
func (q *logQueue) reserve(n int64) bool {
	for {
		cur := q.inUse.Load()
		if cur+n > LogBudgetBytes {
			return false
		}
		if q.inUse.CompareAndSwap(cur, cur+n) {
			for {
				hw := q.highWater.Load()
				if cur+n <= hw || q.highWater.CompareAndSwap(hw, cur+n) {
					return true
				}
			}
		}
	}
}

// offer queues a record without blocking; copy is called only once the
// record is admitted, to copy the guest bytes. It never fails the caller:
// whatever cannot be queued is dropped and counted.
func (q *logQueue) offer(span frameSpan, level uint32, size uint32, copyBytes func() ([]byte, bool)) {
	if size > MaxLogRecordBytes || !q.reserve(int64(size)) {
		q.dropped.Add(1)
		return
	}
	raw, ok := copyBytes()
	if !ok {
		q.inUse.Add(-int64(size))
		q.dropped.Add(1)
		return
	}
	select {
	case q.ch <- queuedLog{span: span, level: level, raw: raw}:
	default:
		q.inUse.Add(-int64(size))
		q.dropped.Add(1)
	}
}

func (q *logQueue) drain() {
	defer q.done.Done()
	t := time.NewTicker(q.idle)
	defer t.Stop()
	var reported uint64
	report := func() {
		if d := q.dropped.Load(); d != reported {
			reported = d
			q.logger.Warn("plugin log records dropped", zap.Uint64("dropped_total", d))
		}
	}
	for {
		select {
		case r := <-q.ch:
			q.write(r)
			report()
		case <-t.C:
			report()
		case <-q.stop:
			for {
				select {
				case r := <-q.ch:
					q.write(r)
				default:
					report()
					return
				}
			}
		}
	}
}

func (q *logQueue) write(r queuedLog) {
	defer q.inUse.Add(-int64(len(r.raw)))
	var ev struct {
		Action  string            `json:"action"`
		Outcome string            `json:"outcome"`
		Message string            `json:"message"`
		Fields  map[string]string `json:"fields"`
	}
	if err := json.Unmarshal(r.raw, &ev); err != nil || !logActions[ev.Action] || !logOutcomes[ev.Outcome] || int(r.level) >= len(logLevels) {
		q.dropped.Add(1)
		return
	}
	rec := LogRecord{
		Plugin: r.span.plugin, World: r.span.world, Export: r.span.export,
		CallID: r.span.callID, Principal: r.span.principal,
		Level: logLevels[r.level], Action: ev.Action, Outcome: ev.Outcome,
		Message: ev.Message, Fields: ev.Fields,
	}
	q.sink.WritePluginLog(rec)
	q.written.Add(1)
}

func (q *logQueue) stats() LogStats {
	return LogStats{Written: q.written.Load(), Dropped: q.dropped.Load(), HighWater: q.highWater.Load()}
}

// close stops the drain after writing what is queued. Safe to call twice.
func (q *logQueue) close() {
	select {
	case <-q.stop:
	default:
		close(q.stop)
	}
	q.done.Wait()
}

// zapSink writes plugin records to a zap logger.
type zapSink struct{ l *zap.Logger }

func (s zapSink) WritePluginLog(r LogRecord) {
	fields := []zap.Field{
		zap.String("plugin", r.Plugin), zap.String("world", r.World), zap.String("export", r.Export),
		zap.String("action", r.Action), zap.String("outcome", r.Outcome),
		zap.String("plugin_message", r.Message),
	}
	if r.CallID != "" {
		fields = append(fields, zap.String("call_id", r.CallID))
	}
	if r.Principal != "" {
		fields = append(fields, zap.String("principal", r.Principal))
	}
	if len(r.Fields) > 0 {
		fields = append(fields, zap.Any("plugin_fields", r.Fields))
	}
	switch r.Level {
	case "trace", "debug":
		s.l.Debug("plugin log", fields...)
	case "warn":
		s.l.Warn("plugin log", fields...)
	case "error":
		s.l.Error("plugin log", fields...)
	default:
		s.l.Info("plugin log", fields...)
	}
}

func setOf(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}
