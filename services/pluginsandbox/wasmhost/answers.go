package wasmhost

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/tooloutput"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// Bounds on the answers read as the guest wrote them (decodeSmall,
// errAnswerCut). A guest's answer may be 16 MiB (maxResultBytes): copied
// out and decoded whole, an err answer of that size cost the sandbox some
// 84 MB a call and put its 16 MiB message into the caller's error (a log
// line, a gRPC status), and an ok answer padded with whitespace some 17
// MB, whatever the export.
const (
	// smallAnswerBytes bounds the answer of an export whose ok value is
	// null, a bool or a number (a channel's configure, send, typing and
	// health, a memory's store, forget and count, an observer's event
	// and flush): past it only an err answer is read, its message cut.
	smallAnswerBytes = 4 << 10
	// errMessageBytes is what an error keeps of a plugin's err message.
	errMessageBytes = 4 << 10
)

// tooBig is the error of an answer past the bound its export allows.
func tooBig(export string, size, bound int) error {
	return fmt.Errorf("%w: %s answered %d bytes; its answer is at most %d bytes, or an err whose message is cut to %d",
		ErrABI, export, size, bound, errMessageBytes)
}

// decodeSmall is decodeResult of an export whose ok value is small: an
// answer past smallAnswerBytes is read only as an err (errAnswerCut), and
// refused otherwise, unread.
func decodeSmall(export string, view []byte, v any) error {
	if len(view) <= smallAnswerBytes {
		return decodeResult(export, view, v)
	}
	if err, ok := errAnswerCut(view); ok {
		return err
	}
	return tooBig(export, len(view), smallAnswerBytes)
}

// decodeHealth reads channel_health's bare bool, within smallAnswerBytes.
func decodeHealth(view []byte) (bool, error) {
	if len(view) > smallAnswerBytes {
		return false, tooBig(abi.ExportChannelHealth, len(view), smallAnswerBytes)
	}
	var ok bool
	if err := json.Unmarshal(view, &ok); err != nil {
		return false, fmt.Errorf("%w: %s returned a non-boolean", ErrABI, abi.ExportChannelHealth)
	}
	return ok, nil
}

// errAnswerCut reads {"err":S} (JSON's whitespace allowed between its
// tokens) keeping errMessageBytes of S and measuring the rest, and gives
// the error its caller gets (pluginFailed); ok is false for any other
// answer.
func errAnswerCut(b []byte) (err error, ok bool) {
	for _, tok := range []string{"{", `"err"`, ":"} {
		if b, ok = cutPrefix(skipSpace(b), tok); !ok {
			return nil, false
		}
	}
	// One byte past the bound: where the cut looks for a character's
	// start (tooloutput.Start).
	msg, total, rest, ok := jsonstr.UnquoteStart(skipSpace(b), errMessageBytes+1)
	if !ok {
		return nil, false
	}
	if rest, ok = cutPrefix(skipSpace(rest), "}"); !ok || len(skipSpace(rest)) != 0 {
		return nil, false
	}
	return pluginFailed(msg, total), true
}

// pluginFailed is the error of a plugin's err message of total bytes, of
// which msg is the start (at least errMessageBytes+1 of it when longer):
// cut to errMessageBytes at a character, with a mark saying so.
func pluginFailed(msg string, total int) error {
	if total <= errMessageBytes {
		return fmt.Errorf("%w: %s", ErrPluginFailed, msg)
	}
	cut := tooloutput.Start(msg, errMessageBytes)
	return fmt.Errorf("%w: %s [plugin error cut: %d of %d bytes shown]", ErrPluginFailed, cut, len(cut), total)
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// skipSpace drops JSON's whitespace from b's start.
func skipSpace(b []byte) []byte {
	return bytes.TrimLeft(b, " \t\r\n")
}
