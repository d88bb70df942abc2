package wasmhost_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/plugins/abi"
	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// refusedContent is what the hand-assembled channel's polls answer: a
// message whose content is one byte past the bound its tests set.
const refusedContent = "xxxxxxxxxxxxxxxxx"

// refusalGuest is a hand-assembled channel with the poll_refused flag:
// every poll answers the same message of refusedContent, and
// channel_poll_refused is what tell builds: the body of a function of
// the type params -> results, given the module's builder, the indices of
// its inbound_poll and inbound_pending imports and what puts a string in
// its memory (a ptr<<32|len constant). Memory holds 17 MiB past
// fillBuf, for answers built there at the call (memory.fill), so that
// the module stays small whatever it answers.
type refusalGuest struct {
	params, results []byte
	tell            func(b *wb.Builder, poll, pending uint32, put func(string) []byte) []byte
}

const fillBuf = 1 << 20

func (g refusalGuest) wasm() []byte {
	var b wb.Builder
	i32, i64 := []byte{wb.I32}, []byte{wb.I64}
	poll := b.ImportFunc(abi.HostModule, abi.ImportInboundPoll, b.Type([]byte{wb.I32, wb.I32}, i64))
	pending := b.ImportFunc(abi.HostModule, abi.ImportInboundPending, b.Type(nil, i32))
	pages := uint32((fillBuf + 17<<20) >> 16)
	b.Memory(pages, pages, true)
	off := int32(2 << 16) // the first 64 KiB page past the arguments'
	put := func(s string) []byte {
		at := off
		b.Data(at, []byte(s))
		off += int32(len(s))
		return append(wb.S64([]byte{0x42}, int64(at)<<32|int64(len(s))), 0x0b)
	}
	noArg, withArg := b.Type(nil, i64), b.Type([]byte{wb.I32, wb.I32}, i64)
	b.ExportFunc(abi.ExportABIVersion, b.Func(b.Type(nil, i32), nil, []byte{0x41, 0x01, 0x0b}))
	b.ExportFunc(abi.ExportAlloc, b.Func(b.Type(i32, i32), nil, []byte{0x41, 0x80, 0x80, 0x04, 0x0b})) // 65536
	b.ExportFunc(abi.ExportDealloc, b.Func(b.Type([]byte{wb.I32, wb.I32}, nil), nil, []byte{0x0b}))
	meta := map[string]string{
		abi.ExportChannelName:         `"hostile"`,
		abi.ExportChannelCapabilities: `["` + abi.FlagPollRefused + `"]`,
		abi.ExportChannelPollMessage:  `{"ok":{"id":"m1","sender":"s","reply_target":"r","content":"` + refusedContent + `"}}`,
	}
	for _, export := range abi.WorldExports[abi.WorldChannel] {
		v, ok := meta[export]
		if !ok {
			v = `{"ok":null}`
		}
		typ := noArg
		if takesArgument[export] {
			typ = withArg
		}
		b.ExportFunc(export, b.Func(typ, nil, put(v)))
	}
	b.ExportFunc(abi.ExportChannelPollRefused, b.Func(b.Type(g.params, g.results), nil, g.tell(&b, poll, pending, put)))
	return b.Bytes()
}

// answerTell is a channel_poll_refused of the ABI's signature answering
// s.
func answerTell(s string) refusalGuest {
	return refusalGuest{params: []byte{wb.I32, wb.I32}, results: []byte{wb.I64},
		tell: func(_ *wb.Builder, _, _ uint32, put func(string) []byte) []byte { return put(s) }}
}

// bodyTell is a channel_poll_refused of the ABI's signature whose body
// is body.
func bodyTell(body []byte) refusalGuest {
	return refusalGuest{params: []byte{wb.I32, wb.I32}, results: []byte{wb.I64},
		tell: func(*wb.Builder, uint32, uint32, func(string) []byte) []byte { return body }}
}

// fillTell answers prefix, n bytes of fill and suffix, built in memory
// at each call.
func fillTell(prefix string, n int, fill byte, suffix string) refusalGuest {
	return refusalGuest{params: []byte{wb.I32, wb.I32}, results: []byte{wb.I64},
		tell: func(b *wb.Builder, _, _ uint32, put func(string) []byte) []byte {
			i32c := func(dst []byte, v int) []byte { return wb.S64(append(dst, 0x41), int64(v)) }
			pre, suf := ptrOf(put(prefix)), ptrOf(put(suffix))
			at := fillBuf
			var body []byte
			body = i32c(body, at)
			body = i32c(body, pre)
			body = i32c(body, len(prefix))
			body = append(body, 0xfc, 10, 0, 0) // memory.copy
			at += len(prefix)
			body = i32c(body, at)
			body = i32c(body, int(fill))
			body = i32c(body, n)
			body = append(body, 0xfc, 11, 0) // memory.fill
			at += n
			body = i32c(body, at)
			body = i32c(body, suf)
			body = i32c(body, len(suffix))
			body = append(body, 0xfc, 10, 0, 0)
			body = wb.S64(append(body, 0x42), int64(fillBuf)<<32|int64(at+len(suffix)-fillBuf))
			return append(body, 0x0b)
		}}
}

// ptrOf reads the string's address back from the constant put made of
// it (an i64.const of ptr<<32|len, a positive LEB128).
func ptrOf(c []byte) int {
	var v int64
	for i, shift := 1, 0; ; i, shift = i+1, shift+7 {
		v |= int64(c[i]&0x7f) << shift
		if c[i]&0x80 == 0 {
			break
		}
	}
	return int(v >> 32)
}

// loadRefusalGuest loads g on h, its polls' content bound 16 bytes.
func loadRefusalGuest(tb testing.TB, h *wasmhost.Host, g refusalGuest) (*wasmhost.Channel, error) {
	tb.Helper()
	ch, err := h.LoadChannel(context.Background(), wasmhost.PluginSpec{Name: "hostile", Version: "0.1.0", Wasm: g.wasm()}, nil)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = ch.Close(context.Background()) })
	ch.SetPollContentBytes(len(refusedContent) - 1)
	return ch, nil
}

// refusedPoll polls ch once and returns the refusal it must answer.
func refusedPoll(t *testing.T, ch *wasmhost.Channel, what string) *wasmhost.PollRefusedError {
	t.Helper()
	_, err := ch.PollMessage(context.Background(), wasmhost.CallInfo{CallID: "c1", Principal: "p"})
	var refused *wasmhost.PollRefusedError
	if !errors.As(err, &refused) || refused.Field != "content" || refused.Size != len(refusedContent) ||
		refused.Msg == nil || refused.Msg.ID != "m1" || refused.Msg.ReplyTarget != "r" {
		t.Fatalf("%s: %.300v, want the refusal of m1's content of %d bytes", what, err, len(refusedContent))
	}
	return refused
}

// channel_poll_refused is a plugin's code run by the host, as every
// other export: whatever it answers or does, the refused poll returns
// its refusal (which the binding logs and tells the sender of) with
// Told false and TellErr saying why, having allocated what a call of a
// small answer does; a trapped instance is replaced at the next poll,
// which is refused and told again. Each case polls three times in a
// row, as a plugin that fails every word is polled at each interval.
func TestHostileRefusalWordIsBounded(t *testing.T) {
	i32c := func(v int) []byte { return wb.S64([]byte{0x41}, int64(v)) }
	for _, tc := range []struct {
		name  string
		guest refusalGuest
		lim   wasmhost.Limits
		want  error
		says  string
		// broken: the call failed in the guest, or at its answer's
		// address, and the instance is dropped (rebuilt at the next
		// poll); an answer read and refused leaves it.
		broken bool
	}{
		{name: "ok padded past the answer bound", guest: fillTell(`{"ok":`, 16<<20-16, ' ', `null}`),
			want: wasmhost.ErrABI, says: "channel_poll_refused answered 16777211 bytes"},
		{name: "err of 16 MiB", guest: fillTell(`{"err":"`, bigErrBytes, 'e', `"}`),
			want: wasmhost.ErrPluginFailed, says: "[plugin error cut: 4096 of 16777152 bytes shown]"},
		{name: "err of invalid UTF-8 past the bound", guest: fillTell(`{"err":"`, 1<<20, 0xff, `"}`),
			want: wasmhost.ErrPluginFailed, says: "plugin error cut"},
		{name: "err of invalid UTF-8", guest: answerTell("{\"err\":\"\xff\xfe bad\"}"), want: wasmhost.ErrPluginFailed},
		{name: "invalid JSON", guest: answerTell(`{"ok":nul`), want: wasmhost.ErrABI, says: "invalid JSON"},
		{name: "neither ok nor err", guest: answerTell(`{"yes":1}`), want: wasmhost.ErrABI},
		{name: "pointer outside memory", guest: bodyTell(append(wb.S64([]byte{0x42}, int64(0x7fff_0000)<<32|64), 0x0b)),
			want: wasmhost.ErrABI, says: "out-of-bounds", broken: true},
		{name: "length past the result bound", guest: bodyTell(append(wb.S64([]byte{0x42}, int64(fillBuf)<<32|int64(0x7fff_ffff)), 0x0b)),
			want: wasmhost.ErrABI, says: "limit", broken: true},
		{name: "trap", guest: bodyTell([]byte{0x00, 0x0b}), want: wasmhost.ErrTrap, broken: true},
		{name: "infinite loop, fuel", guest: bodyTell([]byte{0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b}), want: wasmhost.ErrFuelExhausted, broken: true},
		{name: "infinite loop, deadline", guest: bodyTell([]byte{0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b}),
			lim: wasmhost.Limits{CallFuel: 1 << 62, CallTimeoutMS: 300}, want: wasmhost.ErrCallTimeout, broken: true},
		{name: "takes a message from the inbound queue", want: wasmhost.ErrTrap, guest: refusalGuest{
			params: []byte{wb.I32, wb.I32}, results: []byte{wb.I64},
			tell: func(_ *wb.Builder, poll, pending uint32, put func(string) []byte) []byte {
				// inbound_pending, then inbound_poll into the arguments'
				// page: either one not empty traps, so Told says the
				// queue read empty.
				body := wb.U32([]byte{0x10}, pending)
				body = append(body, 0x04, 0x40, 0x00, 0x0b) // if; unreachable; end
				body = append(append(body, i32c(0x10000)...), i32c(0x10000)...)
				body = wb.U32(append(body, 0x10), poll)
				body = append(body, 0x50, 0x45, 0x04, 0x40, 0x00, 0x0b) // i64.eqz; i32.eqz; if; unreachable; end
				return append(body, put(`{"ok":null}`)...)
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := tc.lim
			if lim.CallFuel == 0 {
				lim.CallFuel = 1 << 40 // the fuel to fill 16 MiB
			}
			if tc.name == "infinite loop, fuel" {
				lim.CallFuel = 10_000_000
			}
			h := newHost(t, lim)
			ch, err := loadRefusalGuest(t, h, tc.guest)
			if err != nil {
				t.Fatal(err)
			}
			// A message queued: the word's frame has no queue, and the
			// message is there after it.
			if err := ch.Inbound().Push(map[string]string{"id": "queued"}); err != nil {
				t.Fatal(err)
			}
			inUse := h.InstancesInUse()
			for i := range 3 {
				var refused *wasmhost.PollRefusedError
				perCall := testenv.AllocatedBytes(func() { refused = refusedPoll(t, ch, tc.name) })
				if tc.name == "takes a message from the inbound queue" {
					// The guest traps only if the queue did not read empty.
					if !refused.Told || refused.TellErr != nil {
						t.Fatalf("poll %d: the word read a queue that is not its own: told %v, %v", i, refused.Told, refused.TellErr)
					}
				} else if refused.Told || !errors.Is(refused.TellErr, tc.want) || !strings.Contains(refused.TellErr.Error(), tc.says) {
					t.Fatalf("poll %d: told %v, %.300v; want %v saying %q", i, refused.Told, refused.TellErr, tc.want, tc.says)
				}
				if refused.TellErr != nil {
					if msg := refused.TellErr.Error(); !utf8.ValidString(msg) || len(msg) > 5<<10 {
						t.Errorf("poll %d: the word's error is %d bytes, valid UTF-8 %v", i, len(msg), utf8.ValidString(msg))
					}
				}
				t.Logf("poll %d: %d bytes allocated; %.200v", i, perCall, refused.TellErr)
				if perCall > perCallBound {
					t.Errorf("poll %d: a refused poll and its word allocated %d bytes, more than %d", i, perCall, perCallBound)
				}
				if n := ch.Inbound().Pending(); n != 1 {
					t.Fatalf("poll %d: %d messages queued after the word, want the one", i, n)
				}
			}
			// A failed instance was replaced at the next poll, and the
			// one failed last is closed off the call path, its slot
			// freed: none is kept.
			if tc.broken {
				inUse--
			}
			waitInstances(t, h, inUse)
		})
	}
}

// channel_poll_refused is called with (ptr, len) and answers an i64, as
// send does; a module with the flag whose export is of another type is
// refused at load, like one without it.
func TestRefusalWordOfAnotherSignatureIsRefused(t *testing.T) {
	h := newHost(t, wasmhost.Limits{})
	okAnswer := func(_ *wb.Builder, _, _ uint32, put func(string) []byte) []byte { return put(`{"ok":null}`) }
	for name, g := range map[string]refusalGuest{
		"no parameters": {results: []byte{wb.I64}, tell: okAnswer},
		"one parameter": {params: []byte{wb.I32}, results: []byte{wb.I64}, tell: okAnswer},
		"no result":     {params: []byte{wb.I32, wb.I32}, tell: func(*wb.Builder, uint32, uint32, func(string) []byte) []byte { return []byte{0x0b} }},
		"an i32 result": {params: []byte{wb.I32, wb.I32}, results: []byte{wb.I32}, tell: func(*wb.Builder, uint32, uint32, func(string) []byte) []byte { return []byte{0x41, 0x00, 0x0b} }},
		"two results": {params: []byte{wb.I32, wb.I32}, results: []byte{wb.I64, wb.I64}, tell: func(*wb.Builder, uint32, uint32, func(string) []byte) []byte {
			return []byte{0x42, 0x00, 0x42, 0x00, 0x0b}
		}},
		"i64 parameters": {params: []byte{wb.I64, wb.I64}, results: []byte{wb.I64}, tell: okAnswer},
	} {
		t.Run(name, func(t *testing.T) {
			ch, err := loadRefusalGuest(t, h, g)
			if err == nil {
				// What the host did with it before the check at load.
				refused := refusedPoll(t, ch, name)
				t.Fatalf("loaded; its word: told %v, %v", refused.Told, refused.TellErr)
			}
			if !errors.Is(err, wasmhost.ErrABI) || !strings.Contains(err.Error(), abi.ExportChannelPollRefused) {
				t.Fatalf("load: %v, want ErrABI naming %s", err, abi.ExportChannelPollRefused)
			}
			t.Logf("load: %v", err)
		})
	}
	// The ABI's signature loads.
	if _, err := loadRefusalGuest(t, h, answerTell(`{"ok":null}`)); err != nil {
		t.Fatal(err)
	}
}
