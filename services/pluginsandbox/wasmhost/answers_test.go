package wasmhost_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/plugins/abi"
	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// bigAnswer is what a hostile plugin's export answers: prefix, then n
// bytes of fill, then suffix.
type bigAnswer struct {
	prefix string
	n      int
	fill   byte
	suffix string
}

func (a bigAnswer) String() string {
	return fmt.Sprintf("%s<%d x %q>%s", a.prefix, a.n, a.fill, a.suffix)
}

// whole is the answer as one string (for the small ones a test compares).
func (a bigAnswer) whole() string {
	return a.prefix + strings.Repeat(string(a.fill), a.n) + a.suffix
}

// handPlugin encodes a hand-assembled plugin of world: its metadata
// exports answer meta's JSON, and every other export of the world answers
// answer, which it builds in its memory at each call (memory.fill), so
// that the module stays small whatever the answer's size. alloc hands out
// one fixed buffer of 64 KiB for the arguments.
func handPlugin(world abi.World, meta map[string]string, answer bigAnswer) []byte {
	var b wb.Builder
	i32, i64 := []byte{wb.I32}, []byte{wb.I64}
	const (
		argBuf   = 1 << 16
		constBuf = 2 << 16 // the constant strings
		ansBuf   = 1 << 20 // the answer
	)
	pages := uint32((ansBuf + len(answer.prefix) + answer.n + len(answer.suffix) + 1<<16 - 1) >> 16)
	b.Memory(pages, pages, true)
	off := int32(constBuf)
	put := func(s string) int32 {
		at := off
		b.Data(at, []byte(s))
		off += int32(len(s))
		return at
	}
	i32c := func(dst []byte, v int) []byte { return wb.S64(append(dst, 0x41), int64(v)) }
	constI64 := func(v int64) []byte { return append(wb.S64([]byte{0x42}, v), 0x0b) }

	version := b.Func(b.Type(nil, i32), nil, []byte{0x41, 0x01, 0x0b})
	alloc := b.Func(b.Type(i32, i32), nil, append(i32c(nil, argBuf), 0x0b))
	dealloc := b.Func(b.Type([]byte{wb.I32, wb.I32}, nil), nil, []byte{0x0b})
	noArg, withArg := b.Type(nil, i64), b.Type([]byte{wb.I32, wb.I32}, i64)

	prefix, suffix := put(answer.prefix), put(answer.suffix)
	var body []byte
	at := ansBuf
	body = i32c(body, at) // memory.copy dst, src, n
	body = i32c(body, int(prefix))
	body = i32c(body, len(answer.prefix))
	body = append(body, 0xfc, 10, 0, 0)
	at += len(answer.prefix)
	body = i32c(body, at) // memory.fill dst, value, n
	body = i32c(body, int(answer.fill))
	body = i32c(body, answer.n)
	body = append(body, 0xfc, 11, 0)
	at += answer.n
	body = i32c(body, at)
	body = i32c(body, int(suffix))
	body = i32c(body, len(answer.suffix))
	body = append(body, 0xfc, 10, 0, 0)
	body = append(body, constI64(int64(ansBuf)<<32|int64(at+len(answer.suffix)-ansBuf))...)
	answerNoArg := b.Func(noArg, nil, body)
	answerWithArg := b.Func(withArg, nil, body)

	b.ExportFunc(abi.ExportABIVersion, version)
	b.ExportFunc(abi.ExportAlloc, alloc)
	b.ExportFunc(abi.ExportDealloc, dealloc)
	for _, export := range abi.WorldExports[world] {
		if v, ok := meta[export]; ok {
			at := put(v)
			b.ExportFunc(export, b.Func(noArg, nil, constI64(int64(at)<<32|int64(len(v)))))
			continue
		}
		if takesArgument[export] {
			b.ExportFunc(export, answerWithArg)
		} else {
			b.ExportFunc(export, answerNoArg)
		}
	}
	return b.Bytes()
}

// takesArgument are the exports called with an argument.
var takesArgument = map[string]bool{
	abi.ExportChannelSend: true, abi.ExportChannelStartTyping: true, abi.ExportChannelStopTyping: true,
	abi.ExportMemoryStore: true, abi.ExportMemoryRecall: true, abi.ExportMemoryForget: true,
	abi.ExportObserverRecordEvent: true,
}

// answerCall is one operational call of a loaded hand plugin.
type answerCall struct {
	export string
	call   func(ctx context.Context) error
}

// handCalls loads answer's plugin in each world and returns a call of
// every operational export it answers.
func handCalls(tb testing.TB, h *wasmhost.Host, answer bigAnswer) []answerCall {
	tb.Helper()
	ctx := context.Background()
	spec := func(world abi.World, meta map[string]string) wasmhost.PluginSpec {
		return wasmhost.PluginSpec{Name: "hostile", Version: "0.1.0", Wasm: handPlugin(world, meta, answer)}
	}
	ch, err := h.LoadChannel(ctx, spec(abi.WorldChannel, map[string]string{
		abi.ExportChannelName: `"hostile"`, abi.ExportChannelCapabilities: `["health","typing"]`,
	}), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ch.Close(context.Background()) })
	mem, err := h.LoadMemory(ctx, spec(abi.WorldMemory, map[string]string{
		abi.ExportMemoryName: `"hostile"`, abi.ExportMemoryCapabilities: `["count"]`,
	}))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = mem.Close(context.Background()) })
	obs, err := h.LoadObserver(ctx, spec(abi.WorldObserver, map[string]string{abi.ExportObserverName: `"hostile"`}))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = obs.Close(context.Background()) })
	info := wasmhost.CallInfo{CallID: "c1", Principal: "p"}
	return []answerCall{
		{abi.ExportChannelConfigure, func(ctx context.Context) error { return ch.Configure(ctx, info) }},
		{abi.ExportChannelSend, func(ctx context.Context) error {
			return ch.Send(ctx, info, wasmhost.SendMessage{Recipient: "r", Content: "hi"})
		}},
		{abi.ExportChannelPollMessage, func(ctx context.Context) error { _, err := ch.PollMessage(ctx, info); return err }},
		{abi.ExportChannelHealth, func(ctx context.Context) error { _, err := ch.Health(ctx); return err }},
		{abi.ExportChannelStartTyping, func(ctx context.Context) error { return ch.StartTyping(ctx, "r") }},
		{abi.ExportChannelStopTyping, func(ctx context.Context) error { return ch.StopTyping(ctx, "r") }},
		{abi.ExportMemoryStore, func(ctx context.Context) error {
			return mem.Store(ctx, wasmhost.MemoryEntry{Key: "k", Content: "c"})
		}},
		{abi.ExportMemoryRecall, func(ctx context.Context) error { _, err := mem.RecallCut(ctx, "q", 10, 1<<20); return err }},
		{abi.ExportMemoryForget, func(ctx context.Context) error { _, err := mem.Forget(ctx, "k"); return err }},
		{abi.ExportMemoryCount, func(ctx context.Context) error { _, err := mem.Count(ctx); return err }},
		{abi.ExportObserverRecordEvent, func(ctx context.Context) error {
			return obs.RecordEvent(ctx, wasmhost.ObserverEvent{Kind: abi.ObserverToolCall, Timestamp: 1})
		}},
		{abi.ExportObserverFlush, func(ctx context.Context) error { return obs.Flush(ctx) }},
	}
}

// answerHost is a host whose calls have the fuel to fill 16 MiB.
func answerHost(tb testing.TB) *wasmhost.Host {
	return newHost(tb, wasmhost.Limits{CallFuel: 1 << 40})
}

// bigErrBytes is the size of the hostile plugins' err message: their
// whole answer just under the host's 16 MiB result.
const bigErrBytes = 16<<20 - 64

// perCallBound is what one call answered 16 MiB may allocate: the
// sandbox's own work of a call (its frame, the argument, the error) and
// what it keeps of the answer, some KiB; 1 MiB leaves the collector's
// and the runtime's noise room, and is a sixteenth of the answer.
const perCallBound = 1 << 20

// An err answer of every export but a tool's (a channel's configure,
// send, poll, health, typing; a memory's store, recall, forget, count; an
// observer's event and flush) was copied out of the guest whole and
// decoded by encoding/json, and its message was kept whole in the error
// its caller got: a hostile plugin answering a 16 MiB message made the
// sandbox allocate some 48 MB a call, and put 16 MiB into a log line or a
// gRPC status. The message is now read from the guest's memory keeping
// its first 4 KiB, with a mark saying how much it had.
func TestErrAnswersCutAsTheyAreRead(t *testing.T) {
	h := answerHost(t)
	answer := bigAnswer{prefix: `{"err":"`, n: bigErrBytes, fill: 'e', suffix: `"}`}
	for _, c := range handCalls(t, h, answer) {
		var err error
		// A channel's send runs on one of three instances, each built
		// at its first send: built before the measure.
		for range 3 {
			err = c.call(context.Background())
		}
		perCall := testenv.AllocatedBytes(func() { err = c.call(context.Background()) })
		if c.export == abi.ExportChannelHealth {
			// A bare bool: an err envelope is malformed.
			if !errors.Is(err, wasmhost.ErrABI) {
				t.Errorf("%s: %v, want ErrABI", c.export, err)
			}
		} else {
			if !errors.Is(err, wasmhost.ErrPluginFailed) {
				t.Errorf("%s: %.200v, want ErrPluginFailed", c.export, err)
				continue
			}
			msg := err.Error()
			mark := fmt.Sprintf("[plugin error cut: 4096 of %d bytes shown]", bigErrBytes)
			if len(msg) > 5<<10 || !strings.Contains(msg, strings.Repeat("e", 4096)+" "+mark) {
				t.Errorf("%s: an error of %d bytes (%.100q...%q), want the message's first 4096 bytes and %q",
					c.export, len(msg), msg, msg[max(len(msg)-100, 0):], mark)
			}
		}
		t.Logf("%s: %d bytes allocated by a call answered %d bytes", c.export, perCall, bigErrBytes+10)
		if perCall > perCallBound {
			t.Errorf("%s: a call answered a %d-byte err allocated %d bytes, more than %d", c.export, bigErrBytes, perCall, perCallBound)
		}
	}
}

// An ok answer of a store, forget, count, configure, send, typing,
// health or observer call is null, a bool or a number; one padded to 16
// MiB with JSON's whitespace was copied out whole and accepted. An answer
// of these exports past 4 KiB that is not an err is now refused, unread,
// naming its size.
func TestSmallAnswersRefusedPastTheirBound(t *testing.T) {
	h := answerHost(t)
	for _, answer := range []bigAnswer{
		{prefix: `{"ok":`, n: 16<<20 - 16, fill: ' ', suffix: `null}`},
		{prefix: `{"ok":`, n: 4 << 10, fill: ' ', suffix: `null}`},
	} {
		for _, c := range handCalls(t, h, answer) {
			if c.export == abi.ExportChannelPollMessage || c.export == abi.ExportMemoryRecall {
				continue // TestPollAnswerBounded; a recall's answer is cut
			}
			var err error
			for range 3 {
				err = c.call(context.Background())
			}
			perCall := testenv.AllocatedBytes(func() { err = c.call(context.Background()) })
			size := len(answer.prefix) + answer.n + len(answer.suffix)
			want := fmt.Sprintf("%s answered %d bytes", c.export, size)
			if !errors.Is(err, wasmhost.ErrABI) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s answered %d bytes: %.300v; want ErrABI saying %q", c.export, size, err, want)
			}
			t.Logf("%s answered %d bytes: %d bytes allocated", c.export, size, perCall)
			if perCall > perCallBound {
				t.Errorf("%s: a call answered %d bytes allocated %d bytes, more than %d", c.export, size, perCall, perCallBound)
			}
		}
	}
}

// The same answers within the bound are read as before.
func TestSmallAnswersWithinTheirBound(t *testing.T) {
	h := answerHost(t)
	for _, tc := range []struct {
		answer bigAnswer
		health bool
	}{
		{answer: bigAnswer{prefix: `{"ok":`, n: 4000, fill: ' ', suffix: `true}`}},
		{answer: bigAnswer{prefix: ` `, n: 4000, fill: ' ', suffix: `true`}, health: true},
	} {
		for _, c := range handCalls(t, h, tc.answer) {
			if (c.export == abi.ExportChannelHealth) != tc.health || c.export == abi.ExportChannelPollMessage ||
				c.export == abi.ExportMemoryRecall || c.export == abi.ExportMemoryCount {
				continue
			}
			if err := c.call(context.Background()); err != nil {
				t.Errorf("%s answered %d bytes: %v", c.export, len(tc.answer.whole()), err)
			}
		}
	}
	// An err within the bound is kept whole.
	answer := bigAnswer{prefix: ` { "err" : "`, n: 4000, fill: 'e', suffix: `" } `}
	for _, c := range handCalls(t, h, answer) {
		err := c.call(context.Background())
		if c.export == abi.ExportChannelHealth {
			continue
		}
		if !errors.Is(err, wasmhost.ErrPluginFailed) || !strings.HasSuffix(err.Error(), ": "+strings.Repeat("e", 4000)) {
			t.Errorf("%s answered %d bytes: %.200v", c.export, len(answer.whole()), err)
		}
	}
}

// pollCall loads answer's channel and returns its poll.
func pollCall(tb testing.TB, h *wasmhost.Host, answer bigAnswer) func() (*wasmhost.ChannelMessage, error) {
	tb.Helper()
	ch := pollChannel(tb, h, answer)
	return func() (*wasmhost.ChannelMessage, error) {
		return ch.PollMessage(context.Background(), wasmhost.CallInfo{Principal: "p"})
	}
}

// pollChannel loads a channel whose polls answer answer.
func pollChannel(tb testing.TB, h *wasmhost.Host, answer bigAnswer) *wasmhost.Channel {
	tb.Helper()
	ch, err := h.LoadChannel(context.Background(), wasmhost.PluginSpec{Name: "hostile", Version: "0.1.0", Wasm: handPlugin(abi.WorldChannel, map[string]string{
		abi.ExportChannelName: `"hostile"`, abi.ExportChannelCapabilities: `[]`,
	}, answer)}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ch.Close(context.Background()) })
	return ch
}

// A polled message was copied out and decoded whole, up to 16 MiB of
// content (some 48 MB allocated a poll), and handed on to a session as a
// prompt. A message's content is now at most 1 MiB and its id, sender,
// reply target and thread 16 KiB each; past that the poll fails, naming
// the field and its size, having kept at most the bound of it.
func TestPollAnswerBounded(t *testing.T) {
	h := answerHost(t)
	for _, tc := range []struct {
		answer bigAnswer
		want   string
	}{
		{bigAnswer{prefix: `{"ok":{"id":"m1","sender":"s","content":"`, n: 16<<20 - 64, fill: 'c', suffix: `"}}`},
			fmt.Sprintf("channel_poll_message answered a message whose content is %d bytes; a polled message's content is at most 1048576", 16<<20-64)},
		{bigAnswer{prefix: `{"ok":{"id":"m1","sender":"`, n: 16<<20 - 64, fill: 's', suffix: `","content":"hi"}}`},
			fmt.Sprintf("channel_poll_message answered a message whose sender is %d bytes; a polled message's sender is at most 16384", 16<<20-64)},
		{bigAnswer{prefix: `{"ok":{"content":"hi","thread_id":"`, n: 1 << 20, fill: 't', suffix: `", "id":"m1","sender":"s"}}`},
			fmt.Sprintf("channel_poll_message answered a message whose thread_id is %d bytes; a polled message's thread_id is at most 16384", 1<<20)},
		{bigAnswer{prefix: `{"ok":{"id":"m1","sender":"s","content":"hi","extra":"`, n: 16<<20 - 64, fill: 'x', suffix: `"}}`},
			fmt.Sprintf("channel_poll_message answered %d bytes", 16<<20-64+len(`{"ok":{"id":"m1","sender":"s","content":"hi","extra":""}}`))},
	} {
		poll := pollCall(t, h, tc.answer)
		var err error
		perCall := testenv.AllocatedBytes(func() { _, err = poll() })
		if !errors.Is(err, wasmhost.ErrABI) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("poll answered %v: %.300v; want ErrABI saying %q", tc.answer, err, tc.want)
		}
		t.Logf("poll answered %v: %d bytes allocated", tc.answer, perCall)
		if perCall > 2*(1<<20)+perCallBound {
			t.Errorf("poll answered %v: %d bytes allocated", tc.answer, perCall)
		}
	}
}

// A message refused for its size was an error and nothing else: the
// sandbox could not tell its sender, whose fields it had not read (or
// had read and dropped), so the message was lost without a word. The
// refusal now holds the message's id, sender, reply target, thread and
// timestamp as far as each is within its own bound (never the content),
// read past the field refused; a content after a refused field is
// measured, not kept. This guest answers the same message at every
// poll, as a plugin that moves past a message only once the host took
// it would: each poll is refused alike (the binding tells the sender
// once, pollRefused).
func TestPollRefusalHoldsItsSender(t *testing.T) {
	h := answerHost(t)
	for _, tc := range []struct {
		answer bigAnswer
		field  string
		size   int
		want   wasmhost.ChannelMessage
	}{
		{bigAnswer{prefix: `{"ok":{"id":"m1","sender":"s","reply_target":"r","content":"`, n: 16<<20 - 128, fill: 'c', suffix: `","thread_id":"t","timestamp":7}}`},
			"content", 16<<20 - 128, wasmhost.ChannelMessage{ID: "m1", Sender: "s", ReplyTarget: "r", ThreadID: "t", Timestamp: 7}},
		{bigAnswer{prefix: `{"ok":{"thread_id":"t","content":"`, n: 16<<20 - 128, fill: 'c', suffix: `","sender":"s","id":"m1"}}`},
			"content", 16<<20 - 128, wasmhost.ChannelMessage{ID: "m1", Sender: "s", ThreadID: "t"}},
		{bigAnswer{prefix: `{"ok":{"id":"m1","thread_id":"`, n: 1 << 20, fill: 't', suffix: `","content":"hi","sender":"s"}}`},
			"thread_id", 1 << 20, wasmhost.ChannelMessage{ID: "m1", Sender: "s"}},
	} {
		poll := pollCall(t, h, tc.answer)
		for i := range 2 {
			var err error
			perCall := testenv.AllocatedBytes(func() { _, err = poll() })
			var refused *wasmhost.PollRefusedError
			if !errors.As(err, &refused) || !errors.Is(err, wasmhost.ErrABI) {
				t.Fatalf("poll %d answered %v: %.300v, want a PollRefusedError", i, tc.answer, err)
			}
			if refused.Field != tc.field || refused.Size != tc.size || refused.Msg == nil || *refused.Msg != tc.want {
				t.Fatalf("poll %d answered %v: refused %s of %d holding %+v, want %s of %d holding %+v",
					i, tc.answer, refused.Field, refused.Size, refused.Msg, tc.field, tc.size, tc.want)
			}
			t.Logf("poll %d answered %v: %d bytes allocated", i, tc.answer, perCall)
			if perCall > 2*(1<<20)+perCallBound {
				t.Errorf("poll answered %v: %d bytes allocated", tc.answer, perCall)
			}
		}
	}
}

// The bound of a polled message's content is the channel's
// (SetPollContentBytes, from channels.plugin.<alias>.max_content_kb),
// within MaxPolledContentBytes; it was a constant 1 MiB.
func TestPollContentBoundIsTheChannels(t *testing.T) {
	h := answerHost(t)
	ch := pollChannel(t, h, bigAnswer{prefix: `{"ok":{"id":"m1","sender":"s","content":"`, n: 3 << 20, fill: 'c', suffix: `"}}`})
	poll := func() (*wasmhost.ChannelMessage, error) {
		return ch.PollMessage(context.Background(), wasmhost.CallInfo{Principal: "p"})
	}
	var refused *wasmhost.PollRefusedError
	if _, err := poll(); !errors.As(err, &refused) || refused.Bound != wasmhost.DefaultPolledContentBytes {
		t.Fatalf("3 MiB of content at the default bound: %v", err)
	}
	ch.SetPollContentBytes(3 << 20)
	if msg, err := poll(); err != nil || msg == nil || len(msg.Content) != 3<<20 {
		t.Fatalf("3 MiB of content at a bound of 3 MiB: %.100v, %v", msg, err)
	}
	ch.SetPollContentBytes(3<<20 - 1)
	if _, err := poll(); !errors.As(err, &refused) || refused.Size != 3<<20 || refused.Bound != 3<<20-1 {
		t.Fatalf("3 MiB of content at a bound of 3 MiB less a byte: %v", err)
	}
	for set, want := range map[int]int{64 << 20: wasmhost.MaxPolledContentBytes, 0: wasmhost.DefaultPolledContentBytes, -1: wasmhost.DefaultPolledContentBytes} {
		ch.SetPollContentBytes(set)
		if got := ch.PollContentBytes(); got != want {
			t.Errorf("SetPollContentBytes(%d): the bound is %d, want %d", set, got, want)
		}
	}
}

// A message at the bounds is delivered whole, in the guest library's
// shape and in others encoding/json reads (fields in another order,
// whitespace, escapes, nulls).
func TestPollAnswerWithinBounds(t *testing.T) {
	h := answerHost(t)
	content := strings.Repeat("c", 1<<20)
	for _, tc := range []struct {
		answer bigAnswer
		want   *wasmhost.ChannelMessage
	}{
		{bigAnswer{prefix: `{"ok":{"id":"m1","sender":"s","reply_target":"r","content":"`, n: 1 << 20, fill: 'c', suffix: `","thread_id":"t","timestamp":7}}`},
			&wasmhost.ChannelMessage{ID: "m1", Sender: "s", ReplyTarget: "r", Content: content, ThreadID: "t", Timestamp: 7}},
		{bigAnswer{prefix: ` { "ok" : { "thread_id" : null , "content" : "\u003c`, n: 1<<20 - 1, fill: 'c', suffix: `" , "sender":"s\n", "id" : "m1" } } `},
			&wasmhost.ChannelMessage{ID: "m1", Sender: "s\n", Content: "<" + content[1:]}},
		{bigAnswer{prefix: `{"ok":`, n: 100, fill: ' ', suffix: `null}`}, nil},
		{bigAnswer{prefix: `{"ok":{"id":"m1","sender":"`, n: 16 << 10, fill: 's', suffix: `","content":"","Timestamp":3,"unknown":[1,{"a":null}]}}`},
			&wasmhost.ChannelMessage{ID: "m1", Sender: strings.Repeat("s", 16<<10), Timestamp: 3}},
	} {
		got, err := pollCall(t, h, tc.answer)()
		if err != nil {
			t.Errorf("poll answered %v: %v", tc.answer, err)
			continue
		}
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("poll answered %v: %.200v, want %.200v", tc.answer, got, tc.want)
		}
	}
}

// BenchmarkHostileAnswer is one call answered just under 16 MiB: a memory
// store's err (store-err) and a poll's message content (poll-content).
// B/op is what the sandbox allocates a call.
func BenchmarkHostileAnswer(b *testing.B) {
	h := answerHost(b)
	for _, c := range []struct {
		name, export string
		answer       bigAnswer
	}{
		{"store-err", abi.ExportMemoryStore, bigAnswer{prefix: `{"err":"`, n: bigErrBytes, fill: 'e', suffix: `"}`}},
		{"poll-content", abi.ExportChannelPollMessage, bigAnswer{prefix: `{"ok":{"id":"m1","sender":"s","content":"`, n: 16<<20 - 64, fill: 'c', suffix: `"}}`}},
	} {
		for _, call := range handCalls(b, h, c.answer) {
			if call.export != c.export {
				continue
			}
			b.Run(c.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = call.call(context.Background())
				}
			})
		}
	}
}
