package pluginsandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// DefaultMaxSessions is channels.plugin.<alias>.max_sessions' default:
// the conversations of one channel kept open in the session service.
//
// Every conversation (thread, else sender) has an operator session, and
// with nothing closing them a holder of the channel's token who wrote on
// 1000 threads took every session the operator may have open. The bound
// is the session service's to hold (NewSessionRequest's
// max_open_of_surface, the alias's surface "channel:<alias>"): at it, the
// least recently active idle conversation is closed (its history kept:
// its next message reopens it) in the transaction that opens the new
// one. Each sandbox replica held it over the conversations it had opened
// itself, and replicas share a channel's listener: N replicas kept N
// times the bound open.
const DefaultMaxSessions = 256

// maxReopens bounds how often one delivery reopens its conversation's
// session that the bound closed between its NewSession and its Prompt
// (another replica's new conversation made room).
const maxReopens = 5

// messageKey is msg's idempotency key in its conversation's session
// (PromptRequest's idempotency_key): a message delivered again, after a
// rebind cut its turn or when its sender sends it again, is answered by
// the turn it had, resumed when it was cut, and its tools do not run a
// second time. It is made of the plugin's message id and the content, so
// that a plugin that reuses an id for another message still has each
// answered; a message without an id was given one by the host when it
// was polled (hostMessageID), which keeps it over a rebind.
//
// The id and the content are joined with a NUL, which is unambiguous
// only because an id holds no NUL (validMessageID, checked before a
// message is delivered): the key's input splits at its first NUL. With
// ids unchecked, id "a\x00b" and text "c" met id "a" and text "b\x00c"
// in one key, and the second message was answered with the first's
// turn. The encoding is kept rather than replaced by a length-prefixed
// one because the session service stores the keys' hashes
// (turns.idempotency_key): no migration can rewrite a hash, and a
// message cut by the upgrade and delivered again after it must still
// find its turn. Every key of a valid id is the same as before.
func messageKey(msg *wasmhost.ChannelMessage) string {
	sum := sha256.Sum256([]byte(msg.ID + "\x00" + msg.Content))
	return "chanmsg_" + hex.EncodeToString(sum[:16])
}

// hostIDPrefix begins the ids the host gives messages.
const hostIDPrefix = "hostmsg_"

// hostMessageID gives msg, polled without an id, one of the host's: the
// one the spool kept with the queued message it was read from (files,
// the first of them), so that it is the same at every delivery of the
// message, else a new one (no spool, or a message the plugin made of
// none queued).
func hostMessageID(msg *wasmhost.ChannelMessage, files []string) {
	if msg == nil || msg.ID != "" {
		return
	}
	if len(files) > 0 {
		if id := hostIDOf(files[0]); id != "" {
			msg.ID = id
			return
		}
	}
	msg.ID = ids.New(hostIDPrefix)
}

// validHostID reports whether id has the form of a host id (ids.New).
func validHostID(id string) bool {
	rest, ok := strings.CutPrefix(id, hostIDPrefix)
	return ok && ids.LowerHex(rest, 24)
}

// maxMessageIDLen bounds the id a plugin gives a message: a chat
// service's ids are far shorter, and the id is logged with every line of
// the message's delivery.
const maxMessageIDLen = 256

// validMessageID reports whether id, the id a plugin gave a message (a
// webhook's sender chooses it), may become part of an idempotency key
// (messageKey) and of log lines: at most maxMessageIDLen bytes of valid
// UTF-8 without control characters, among them the NUL that joins the
// key. Empty is valid: the host gives the message its own id.
func validMessageID(id string) bool {
	if len(id) > maxMessageIDLen || !utf8.ValidString(id) {
		return false
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
