package pluginsandbox

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/recallanswer"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/plugins/abi"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Bounds on what a memory call carries: a key, and each of an entry's
// labels (category, session id), at most maxMemoryKey bytes.
const (
	maxMemoryKey     = 512
	maxMemoryContent = 1 << 20
	maxRecallLimit   = 100
)

// memoryFor picks the memory plugin a request names (or the only one),
// holding a call reference on it. A plugin being unloaded was replaced
// in the catalog before: it is picked again there, so a request racing
// an upgrade reaches the new load.
func (s *Server) memoryFor(plugin string) (*entry, error) {
	for attempt := 1; ; attempt++ {
		e, err := s.pickMemory(plugin)
		if err != nil {
			return nil, err
		}
		if e != nil && e.acquire() {
			return e, nil
		}
		if e == nil || attempt == maxLoadAttempts {
			return nil, rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, "no such memory plugin is loaded")
		}
	}
}

// pickMemory is the memory plugin a request names (or the only one) in
// the current catalog, or nil.
func (s *Server) pickMemory(plugin string) (*entry, error) {
	c := s.current()
	var e *entry
	if plugin != "" {
		e = c.memories[plugin]
	} else if len(c.memories) == 1 {
		for _, only := range c.memories {
			e = only
		}
	} else if len(c.memories) > 1 {
		names := make([]string, 0, len(c.memories))
		for n := range c.memories {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, fmt.Sprintf("several memory plugins are loaded (%v): name one in `plugin`", names))
	}
	return e, nil
}

// withMemory runs fn on the plugin's backend, holding the plugin's ledger
// (fn records in it what the plugin answered success to). The sandbox owns
// the instance: after a limit or a trap it is unavailable, so the sandbox
// rebuilds it, gives it its entries back from the ledger and runs fn once
// more.
func (s *Server) withMemory(ctx context.Context, plugin string, fn func(*wasmhost.Memory, *ledger) error) error {
	for {
		e, err := s.memoryFor(plugin)
		if err != nil {
			return err
		}
		moved, err := s.withLedger(ctx, e, fn)
		if !moved {
			return err
		}
		// A rescan handed the entries to a new load of the plugin.
	}
}

// withLedger is withMemory on one load of the plugin; moved reports that
// its entries went to a newer load before fn could run.
func (s *Server) withLedger(ctx context.Context, e *entry, fn func(*wasmhost.Memory, *ledger) error) (moved bool, err error) {
	defer e.release()
	l := e.ledger
	if err := l.acquire(ctx); err != nil {
		return false, status.FromContextError(err).Err()
	}
	defer l.release()
	if l.moved {
		return true, nil
	}
	// Replicas share the journal: one that serves memory calls after
	// another did (the other stopped, or a client called it directly)
	// takes what the other recorded, and its instance is given it.
	if l.journal != nil && l.journal.changed() {
		ops, exact, err := l.journal.update(l)
		if err != nil {
			s.logger.Warn("read the memory journal", zap.String("plugin", e.name()), zap.Error(err))
			return false, memoryError(fmt.Errorf("%w: %w", errJournal, err))
		}
		// A rebuild makes a fresh instance, about as dear as four stores
		// (BenchmarkMemoryRebuild, a tool call's fresh instance), and
		// stores every entry once: past that many changes it is cheaper.
		if !exact || len(ops) > len(l.entries)+4 {
			l.partial = true
		} else if !l.partial {
			if err := l.catchUp(ctx, e.memory, ops); err != nil {
				s.logger.Warn("memory plugin's instance not given another replica's changes", zap.String("plugin", e.name()), zap.Error(err))
			}
		}
	}
	if memoryCallHook != nil {
		memoryCallHook()
	}
	if l.partial {
		err = wasmhost.ErrUnavailable // the last restore did not finish
	} else {
		err = fn(e.memory, l)
	}
	if errors.Is(err, wasmhost.ErrUnavailable) {
		s.logger.Warn("rebuilding the memory plugin's instance with its entries",
			zap.String("plugin", e.name()), zap.Int("entries", len(l.entries)), zap.Int("bytes", l.bytes))
		if err = s.restoreLedger(ctx, e, l); err == nil {
			err = fn(e.memory, l)
		} else {
			s.logger.Warn("rebuild memory plugin", zap.String("plugin", e.name()), zap.Error(err))
		}
	}
	return false, memoryError(err)
}

// restoreLedger rebuilds the plugin's instance with the ledger's entries,
// and records and reports those the plugin refused.
func (s *Server) restoreLedger(ctx context.Context, e *entry, l *ledger) error {
	refused, err := l.restore(ctx, e.memory)
	if len(refused) == 0 {
		return err
	}
	forgets := make([]journalRecord, 0, len(refused))
	keys := make([]string, 0, min(len(refused), 10))
	for _, r := range refused {
		forgets = append(forgets, journalRecord{Op: opForget, Key: []byte(r.key)})
		if len(keys) < cap(keys) {
			keys = append(keys, r.key)
		}
	}
	s.logger.Warn("memory plugin refused entries it was given back; they are dropped",
		zap.String("plugin", e.name()), zap.Int("refused", len(refused)), zap.Strings("keys", keys),
		zap.Error(refused[0].err))
	if rerr := l.record(forgets...); rerr != nil {
		s.logger.Warn("the entries dropped are still in the memory journal", zap.String("plugin", e.name()), zap.Error(rerr))
	}
	return err
}

// memoryCallHook, when set (by tests), is called in a memory call once
// the replica caught up on the journal, before the call's own work.
var memoryCallHook func()

func memoryError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errJournal):
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex, err.Error())
	case errors.Is(err, errNotRecorded):
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex,
			"the memory plugin made the change, but the sandbox could not write it to disk, so it would not outlive a restart; retry: "+err.Error())
	case errors.Is(err, errMemoryFull):
		return rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonCapacity, rpcerr.NoIndex, err.Error())
	case errors.Is(err, wasmhost.ErrPluginFailed):
		return rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex, err.Error())
	case errors.Is(err, wasmhost.ErrInstanceLimit):
		return rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonCapacity, rpcerr.NoIndex, "the plugin sandbox is running its maximum number of instances; retry later")
	case errors.Is(err, wasmhost.ErrMemoryBudget):
		return rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonCapacity, rpcerr.NoIndex, "the plugin sandbox's instances hold all the memory it may give them; retry later: "+err.Error())
	case errors.Is(err, wasmhost.ErrFuelExhausted), errors.Is(err, wasmhost.ErrCallTimeout),
		errors.Is(err, wasmhost.ErrMemoryLimit), errors.Is(err, wasmhost.ErrTrap), errors.Is(err, wasmhost.ErrABI):
		return rpcerr.Error(codes.Aborted, rpcerr.ReasonInvalid, rpcerr.NoIndex, "memory plugin stopped: "+err.Error())
	}
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex, "memory plugin unavailable")
}

func invalid(msg string) error {
	return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, msg)
}

// MemoryStore stores one entry in a memory plugin.
func (s *Server) MemoryStore(ctx context.Context, req *pluginv1.MemoryStoreRequest) (*pluginv1.MemoryStoreResponse, error) {
	in := req.GetEntry()
	switch {
	case in.GetKey() == "" || len(in.GetKey()) > maxMemoryKey:
		return nil, invalid(fmt.Sprintf("`entry.key` must be 1 to %d bytes", maxMemoryKey))
	case len(in.GetContent()) > maxMemoryContent:
		return nil, invalid(fmt.Sprintf("`entry.content` exceeds %d bytes", maxMemoryContent))
	case len(in.GetCategory()) > maxMemoryKey:
		return nil, invalid(fmt.Sprintf("`entry.category` exceeds %d bytes", maxMemoryKey))
	case len(in.GetSessionId()) > maxMemoryKey:
		return nil, invalid(fmt.Sprintf("`entry.session_id` exceeds %d bytes", maxMemoryKey))
	}
	e := wasmhost.MemoryEntry{Key: in.GetKey(), Content: in.GetContent(), Category: in.GetCategory(),
		SessionID: in.GetSessionId(), Timestamp: in.GetTimestamp()}
	err := s.withMemory(ctx, req.GetPlugin(), func(m *wasmhost.Memory, l *ledger) error {
		if err := l.admit(e); err != nil {
			return err
		}
		if err := m.Store(ctx, e); err != nil {
			return err
		}
		prev, had := l.entries[e.Key]
		l.stored(e)
		err := l.recordStore(e, prev, had)
		if errors.Is(err, errMemoryFull) {
			// Another replica's stores took the room: the entry goes
			// from the ledger, and the instance, which holds it, is
			// rebuilt at the next call.
			l.forgot(e.Key)
			if had {
				l.entries[e.Key], l.bytes = prev, l.bytes+prev.size
			}
			l.partial = true
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &pluginv1.MemoryStoreResponse{}, nil
}

// MemoryRecall returns at most limit entries matching query.
func (s *Server) MemoryRecall(ctx context.Context, req *pluginv1.MemoryRecallRequest) (*pluginv1.MemoryRecallResponse, error) {
	limit := int(req.GetLimit())
	if limit <= 0 || limit > maxRecallLimit {
		limit = maxRecallLimit
	}
	if room := int(req.GetAnswerLimit()); room > 0 {
		// The caller shows room bytes of the answer: only they are sent,
		// with the whole's size. Sent as entries, a plugin's answer of up
		// to the 16 MiB message crossed the socket whole to be cut to the
		// 1 MiB the client sees; and the answer is read from the guest
		// keeping only what the room shows (RecallCut), where it was
		// copied out and decoded whole to be cut here.
		var cut []abi.RecallCutEntry
		err := s.withMemory(ctx, req.GetPlugin(), func(m *wasmhost.Memory, _ *ledger) error {
			var err error
			cut, err = m.RecallCut(ctx, req.GetQuery(), limit, room)
			return err
		})
		if err != nil {
			return nil, err
		}
		text, total, err := recallanswer.BuildCut(ctx, cut, room)
		if err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return &pluginv1.MemoryRecallResponse{Answer: text, AnswerBytes: int64(total)}, nil
	}
	var got []wasmhost.MemoryEntry
	err := s.withMemory(ctx, req.GetPlugin(), func(m *wasmhost.Memory, _ *ledger) error {
		var err error
		got, err = m.Recall(ctx, req.GetQuery(), limit)
		return err
	})
	if err != nil {
		return nil, err
	}
	resp := &pluginv1.MemoryRecallResponse{}
	for i, e := range got {
		if i == limit {
			break
		}
		resp.Entries = append(resp.Entries, &pluginv1.MemoryEntry{Key: e.Key, Content: e.Content, Category: e.Category,
			SessionId: e.SessionID, Timestamp: e.Timestamp, Score: e.Score})
	}
	return resp, nil
}

// MemoryForget removes one entry.
func (s *Server) MemoryForget(ctx context.Context, req *pluginv1.MemoryForgetRequest) (*pluginv1.MemoryForgetResponse, error) {
	if req.GetKey() == "" || len(req.GetKey()) > maxMemoryKey {
		return nil, invalid(fmt.Sprintf("`key` must be 1 to %d bytes", maxMemoryKey))
	}
	var existed bool
	err := s.withMemory(ctx, req.GetPlugin(), func(m *wasmhost.Memory, l *ledger) error {
		var err error
		if existed, err = m.Forget(ctx, req.GetKey()); err != nil {
			return err
		}
		if old, held := l.entries[req.GetKey()]; held || existed {
			l.forgot(req.GetKey())
			if err := l.record(journalRecord{Op: opForget, Key: []byte(req.GetKey())}); err != nil {
				// The journal still holds the entry, and so does the
				// ledger, where it was: the retry the answer asks for
				// writes the forget. Before, the retry found the entry
				// nowhere, wrote nothing and answered success, and a
				// restart brought it back.
				if held {
					l.entries[old.e.Key], l.bytes = old, l.bytes+old.size
				}
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pluginv1.MemoryForgetResponse{Existed: existed}, nil
}
