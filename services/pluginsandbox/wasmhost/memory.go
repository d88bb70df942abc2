package wasmhost

import (
	"context"
	"fmt"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// MemoryCapabilities are the memory-capabilities flags a plugin advertises
// from memory_capabilities. Without the count flag, Count answers
// ErrUnsupported and the plugin is not called.
type MemoryCapabilities struct {
	Count bool
}

// MemoryEntry is one stored memory.
type MemoryEntry = abi.MemoryEntry

// Memory is a loaded memory plugin: one resident instance, refuelled before
// each call. The memory world imports only logging: config and secrets
// answer access-denied and outbound HTTP is never bound, whatever the
// grants. An instance stopped by a limit or a trap is never resumed: the
// plugin answers ErrUnavailable until its owner calls Rebuild (its state
// lived in the instance and is gone).
type Memory struct {
	r    *resident
	name string
	caps MemoryCapabilities
}

// LoadMemory compiles a memory plugin, builds its instance and reads its
// name and capability flags once.
func (h *Host) LoadMemory(ctx context.Context, spec PluginSpec) (*Memory, error) {
	spec.World = WorldMemory
	m := &Memory{}
	r, err := h.loadResident(ctx, spec, nil, func(ctx context.Context, r *resident) error {
		if err := r.metadata(ctx, abi.ExportMemoryName, &m.name); err != nil {
			return err
		}
		var flags []string
		if err := r.metadata(ctx, abi.ExportMemoryCapabilities, &flags); err != nil {
			return err
		}
		m.caps = MemoryCapabilities{Count: flagSet(flags)[abi.FlagCount]}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if m.name == "" {
		r.close()
		_ = r.c.mod.Close(ctx)
		return nil, fmt.Errorf("%w: memory_name is empty", ErrABI)
	}
	m.r = r
	return m, nil
}

// Name is the backend's name, read at load.
func (m *Memory) Name() string { return m.name }

// Capabilities are the flags read at load.
func (m *Memory) Capabilities() MemoryCapabilities { return m.caps }

// PluginName is the package name of the plugin.
func (m *Memory) PluginName() string { return m.r.c.spec.Name }

// call calls an export whose ok value is small (store, forget, count)
// with arg, decoding its answer into v as it is read (decodeSmall).
func (m *Memory) call(ctx context.Context, export string, arg any, v any) error {
	var raw []byte
	if arg != nil {
		var err error
		if raw, err = guestJSON(arg); err != nil {
			return fmt.Errorf("%w: %w", ErrABI, err)
		}
	}
	return m.r.callSmall(ctx, export, raw, frameSpan{}, false, v)
}

// Store stores one entry (an existing key is replaced).
func (m *Memory) Store(ctx context.Context, e MemoryEntry) error {
	return m.call(ctx, abi.ExportMemoryStore, e, nil)
}

// Recall returns at most limit entries matching query, best first.
func (m *Memory) Recall(ctx context.Context, query string, limit int) ([]MemoryEntry, error) {
	raw, err := guestJSON(abi.RecallArgs{Query: query, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrABI, err)
	}
	var out []byte
	var failed error
	if err := m.r.callRead(ctx, abi.ExportMemoryRecall, raw, frameSpan{}, false, func(view []byte) {
		if failed, _ = errAnswerCut(view); failed == nil {
			out = append([]byte(nil), view...)
		}
	}); err != nil {
		return nil, err
	}
	if failed != nil {
		return nil, failed
	}
	return decodeRecall(out)
}

// RecallCut is Recall for a caller that is shown room bytes of the answer
// recallanswer.BuildCut writes from the entries: it returns the first
// limit entries as abi.DecodeRecallAnswerCut reads them, keeping only the
// strings' start that answer may write and measuring the rest. The answer
// is read from the guest's memory, not from a copy of it. An answer in
// another shape (not the guest library's) is read whole as Recall reads
// it, then measured.
//
// A recall's answer may be the whole 16 MiB of a guest's result, and the
// session service shows 1 MiB of it: copied out and decoded whole, the
// sandbox held some 32 MB a recall to send that MiB on.
func (m *Memory) RecallCut(ctx context.Context, query string, limit, room int) ([]abi.RecallCutEntry, error) {
	raw, err := guestJSON(abi.RecallArgs{Query: query, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrABI, err)
	}
	var (
		cut    []abi.RecallCutEntry
		whole  []byte
		failed error
	)
	if err := m.r.callRead(ctx, abi.ExportMemoryRecall, raw, frameSpan{}, false, func(view []byte) {
		var ok bool
		if cut, ok = abi.DecodeRecallAnswerCut(view, limit, room); ok {
			return
		}
		// An err's message is kept within errMessageBytes.
		if failed, _ = errAnswerCut(view); failed == nil {
			whole = append([]byte(nil), view...)
		}
	}); err != nil {
		return nil, err
	}
	if failed != nil {
		return nil, failed
	}
	if whole == nil {
		return cut, nil
	}
	return recallCutWhole(whole, limit)
}

// recallCutWhole is RecallCut of an answer in a shape other than the
// guest library's: decoded whole (decodeRecall), then measured.
func recallCutWhole(out []byte, limit int) ([]abi.RecallCutEntry, error) {
	entries, err := decodeRecall(out)
	if err != nil {
		return nil, err
	}
	entries = entries[:min(len(entries), max(limit, 0))]
	cut := make([]abi.RecallCutEntry, 0, len(entries))
	for _, e := range entries {
		cut = append(cut, abi.RecallCutEntry{
			Key: e.Key, Content: e.Content, Category: e.Category,
			KeyJSON: jsonstr.Len(e.Key), ContentJSON: jsonstr.Len(e.Content), CategoryJSON: jsonstr.Len(e.Category),
		})
	}
	return cut, nil
}

// decodeRecall reads a recall answer: the guest library's own shape the
// short way (abi.DecodeRecallAnswer), any other as decodeResult does.
func decodeRecall(out []byte) ([]MemoryEntry, error) {
	if entries, ok := abi.DecodeRecallAnswer(out); ok {
		return entries, nil
	}
	var entries []MemoryEntry
	err := decodeResult(abi.ExportMemoryRecall, out, &entries)
	return entries, err
}

// Forget removes one entry and reports whether it existed.
func (m *Memory) Forget(ctx context.Context, key string) (bool, error) {
	var ok bool
	err := m.call(ctx, abi.ExportMemoryForget, abi.ForgetArgs{Key: key}, &ok)
	return ok, err
}

// Count returns the number of entries; ErrUnsupported without the count
// flag.
func (m *Memory) Count(ctx context.Context) (int, error) {
	if !m.caps.Count {
		return 0, fmt.Errorf("%w: count", ErrUnsupported)
	}
	var n int
	err := m.call(ctx, abi.ExportMemoryCount, nil, &n)
	return n, err
}

// Rebuild replaces the instance with a fresh one (its state starts empty):
// the owner's answer to ErrUnavailable after a failure.
func (m *Memory) Rebuild(ctx context.Context) error { return m.r.rebuild(ctx) }

// Close waits for a running call, closes the instance and releases the
// compiled module.
func (m *Memory) Close(ctx context.Context) error {
	m.r.close()
	return m.r.c.mod.Close(ctx)
}
