// Package uploads holds what the upload-staging service, the session
// service and the gateway share about files (docs/spec.md §6): the fixed limits,
// the refusal messages (exact texts, written once), the checks of the
// fields a client declares, and the file entry's ref_id and marker.
//
// The configurable limits (uploads.*) come from the live config through
// configclient.Uploads, never from here.
package uploads

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"mime"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

// Fixed parts of the contract.
const (
	// MaxFilenameBytes bounds a declared filename.
	MaxFilenameBytes = 255
	// DefaultFilename names a file sent without one.
	DefaultFilename = "upload"
	// RefPrefix starts every ref_id; the SHA-256 of the content follows
	// in lower-case hexadecimal.
	RefPrefix = "sha256:"
	// IDHexLen is the length of an upload_id: 32 hexadecimal characters.
	IDHexLen = 32
	// MaxAttachments bounds the attachments of one prompt. Each is looked
	// up in the session's file index and adds its marker to the prompt:
	// unbounded, one 8 MiB frame listed some 100,000 and held the session
	// service for tens of minutes (10,000 took 23 s).
	MaxAttachments = 64
)

// TooManyAttachments refuses a prompt with more than MaxAttachments.
func TooManyAttachments(n int) string {
	return fmt.Sprintf("`attachments` lists %d files; the limit is %d", n, MaxAttachments)
}

// BadUploadID refuses an upload_id not of the form upload-staging makes
// (IDHexLen lower-case hexadecimal characters).
const BadUploadID = "`upload_id` must be 32 lower-case hexadecimal characters"

// The refusal messages of docs/spec.md §6, each sent as -32602.

// UnknownUpload: no such upload on this connection (or it expired).
func UnknownUpload(id string) string { return fmt.Sprintf("Unknown or expired upload `%s`", id) }

// FileTooLarge: a declared or sent file is over the file limit.
func FileTooLarge(n, limit int64) string {
	return fmt.Sprintf("Upload of %d bytes exceeds the %s file limit", n, SizeWords(limit))
}

// FilenameTooLong: a filename over MaxFilenameBytes.
func FilenameTooLong(n int) string {
	return fmt.Sprintf("`filename` is %d bytes; the limit is %d", n, MaxFilenameBytes)
}

// BadSHA256 refuses a declared hash that is not 64 hexadecimal characters.
const BadSHA256 = "`sha256` must be 64 hexadecimal characters"

// TooManyForConnection: the connection's staged uploads are at the limit.
func TooManyForConnection(limit int) string {
	return fmt.Sprintf("This connection already has %d uploads in progress; commit them or let them expire before beginning another", limit)
}

// OverBudget: the daemon-wide staging budget is spent (after reclaiming
// idle uploads).
const OverBudget = "The daemon is staging too many uploads to accept this one now; retry after in-progress uploads finish"

// UserStagingFull: a new upload would take what its principal stages past
// uploads.max_user_staged_bytes.
func UserStagingFull(held, n, limit int64) string {
	return fmt.Sprintf("You are staging %d bytes of uploads; %d more would pass your limit of %d; commit them or let them expire before beginning another", held, n, limit)
}

// StoredBytesFull: storing n more bytes would take the stored files of the
// session's owner past its limit (uploads.max_user_stored_bytes).
func StoredBytesFull(held, n, limit int64) string {
	return fmt.Sprintf("The session's owner holds %d bytes of stored files; %d more would pass its limit of %d; delete sessions it no longer needs to free their files", held, n, limit)
}

// StoredFilesFull: the session's owner holds as many stored files as it
// may (uploads.max_user_stored_files).
func StoredFilesFull(limit int64) string {
	return fmt.Sprintf("The session's owner holds %d stored files, its limit; delete sessions it no longer needs to free their files", limit)
}

// ChunkSize: a chunk of no bytes or more than the chunk limit.
func ChunkSize(limit int64) string {
	return fmt.Sprintf("A chunk must carry between 1 and %d decoded bytes", limit)
}

// ChunkGap: a chunk after the next expected offset.
func ChunkGap(offset, received int64) string {
	return fmt.Sprintf("Chunk at offset %d leaves a gap; the next offset is %d", offset, received)
}

// ChunkOverlap: a chunk over received bytes that is not an identical resend.
func ChunkOverlap(offset, received int64) string {
	return fmt.Sprintf("Chunk at offset %d overlaps received data; the next offset is %d", offset, received)
}

// ChunkPastSize: a chunk ending after the declared size.
func ChunkPastSize(end, size int64) string {
	return fmt.Sprintf("Chunk ends at byte %d, past the declared size of %d", end, size)
}

// Incomplete: commit before every declared byte arrived.
func Incomplete(received, size int64) string {
	return fmt.Sprintf("Upload has %d of %d declared bytes; send the rest before committing", received, size)
}

// Committing: a commit of an upload whose commit is still running.
func Committing(id string) string {
	return fmt.Sprintf("Upload `%s` is being committed; its first commit answers with the file", id)
}

// PathForbidden: a file named by path, from a principal that is neither
// the operator nor an admin.
const PathForbidden = "A file named by `path` is read as the daemon's user; only the operator or an admin may attach one. Send its bytes in `data_b64` or through file/upload"

// HandOverUnknown refuses a StoreFile whose file token the session
// service does not hold (internal/filepass): unknown, expired, another
// caller's, or passed before it restarted. upload-staging then sends the
// bytes in the message; no client sees it.
const HandOverUnknown = "File hand-over token unknown or expired"

// ScratchUnknown refuses a chunk naming a scratch upload-staging does not
// hold for its gateway and connection (internal/filepass): replaced,
// dropped, evicted, another's, or passed before it restarted. The
// gateway then sends the bytes in the message; no client sees it.
const ScratchUnknown = "Upload scratch unknown"

// ScratchAndData refuses a chunk that names a scratch and carries bytes.
const ScratchAndData = "a chunk names a scratch or carries `data`, not both"

// HashMismatch: the content is not what begin declared.
const HashMismatch = "Upload content does not match the SHA-256 declared at begin; begin again"

// SizeWords writes a byte limit as docs/spec.md §6 does: whole mebibytes as
// "N MB" (10485760 is "10 MB"), anything else in bytes.
func SizeWords(n int64) string {
	if n > 0 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// NormalizeSHA256 trims and lower-cases a declared hash; ok is false when
// the result is not 64 hexadecimal characters. An empty input is ok and
// declares nothing.
func NormalizeSHA256(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return "", true
	}
	if len(s) != 64 {
		return "", false
	}
	if _, err := hex.DecodeString(s); err != nil {
		return "", false
	}
	return s, true
}

// BadMIME refuses a declared mime_type that is not a MIME type.
const BadMIME = "`mime_type` must be a MIME type such as image/png"

// NormalizeMIME checks and normalizes a declared mime_type: type/subtype,
// parameters dropped, lower case; ok is false when it is not one. An
// empty input is ok and declares nothing. The session service stores a
// file under it; upload-staging checks it at begin and for each file of
// an attach, before any byte is sent or stored.
func NormalizeMIME(s string) (string, bool) {
	if s == "" {
		return "", true
	}
	mt, _, err := mime.ParseMediaType(s)
	if err != nil || len(mt) > 127 || !strings.Contains(mt, "/") {
		return "", false
	}
	return mt, true
}

// CheckFilename returns the refusal of a declared filename, or "" when it
// is acceptable: at most MaxFilenameBytes of valid UTF-8 with no control
// characters (a newline would forge a line of the prompt the marker goes
// into).
func CheckFilename(name string) string {
	if len(name) > MaxFilenameBytes {
		return FilenameTooLong(len(name))
	}
	if !utf8.ValidString(name) {
		return "`filename` must be valid UTF-8"
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return "`filename` must not contain control characters"
		}
	}
	return ""
}

// Sum is the hexadecimal SHA-256 of data: what a declared hash is checked
// against and what a stored file is named and referred to by.
func Sum(data []byte) string {
	hashed.Add(int64(len(data)))
	d := sha256.Sum256(data)
	return hex.EncodeToString(d[:])
}

// hashed counts the bytes Sum hashed in this process.
var hashed atomic.Int64

// HashedBytes is how many bytes Sum has hashed in this process. An
// upload's content is to be hashed once, by the session service that
// names the file by it (a 10 MB upload's hash was its commit's longest
// step, docs/performance.md); tests count the passes with it. One
// atomic add a file costs nothing beside the hash it counts.
func HashedBytes() int64 { return hashed.Load() }

// RefID is the ref_id of content whose SHA-256 is sum (hexadecimal).
func RefID(sum string) string { return RefPrefix + sum }

// ParseRefID returns the hexadecimal SHA-256 a ref_id names.
func ParseRefID(ref string) (string, bool) {
	sum, ok := strings.CutPrefix(ref, RefPrefix)
	if !ok || len(sum) != 64 || strings.ToLower(sum) != sum {
		return "", false
	}
	if _, err := hex.DecodeString(sum); err != nil {
		return "", false
	}
	return sum, true
}

// IsImage reports whether a MIME type is image/*.
func IsImage(mimeType string) bool { return strings.HasPrefix(mimeType, "image/") }

// Marker is the text a prompt carries for a stored file:
// "[IMAGE:<path>]" for image/*, else "[Document: <filename>] <path>".
func Marker(mimeType, filename, path string) string {
	if IsImage(mimeType) {
		return "[IMAGE:" + path + "]"
	}
	return "[Document: " + filename + "] " + path
}
