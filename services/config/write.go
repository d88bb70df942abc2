package config

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
)

// Batch bounds of config/set-many (seed 000).
const (
	MinBatch = 1
	MaxBatch = 256
)

// Sentinel errors of the write path; the gRPC layer maps them with
// toStatus. An entryError carries the index of the batch entry at fault.
var (
	// ErrForbidden: the caller lacks Config:Update or a grant for a path.
	ErrForbidden = errors.New("forbidden")
	// ErrInvalid: an entry or the candidate as a whole breaks the schema.
	ErrInvalid = errors.New("invalid")
	// ErrNotFound: a delete named something that is not set.
	ErrNotFound = errors.New("not found")
	// ErrCommit: the database refused or lost the commit; nothing changed.
	ErrCommit = errors.New("commit failed")
	// errRevisionTaken: the database's newest revision is not the one
	// the commit builds on: it holds the revision the commit was about
	// to store (another config process committed it, or a commit of
	// unknown outcome landed after the reload), or another one (a
	// history restored into it, a row rewritten, before follow read
	// it); commit stages the write again on what the database holds.
	errRevisionTaken = errors.New("the database's newest revision is not the one the write builds on")
)

// entryError is a refusal of kind (one of the sentinels above) of one
// batch entry (index >= 0) or of the batch (index -1). Its message is
// written for the client and does not repeat the kind.
type entryError struct {
	index int
	kind  error
	err   error
}

func (e *entryError) Error() string       { return e.err.Error() }
func (e *entryError) Unwrap() []error     { return []error{e.kind, e.err} }
func refuse(i int, kind, err error) error { return &entryError{index: i, kind: kind, err: err} }
func atIndex(i int, kind error, format string, args ...any) error {
	return refuse(i, kind, fmt.Errorf(format, args...))
}

// write is one staged change: a value to set, or a deletion.
type write struct {
	prop   string
	value  any
	delete bool
}

// commitRequest is one write of the config document.
type commitRequest struct {
	// principal is the caller; nil for the launcher, which needs no grant.
	principal *commonv1.Principal
	who       audit
	writes    []write
	// skipUnchanged commits nothing when the candidate equals the stored
	// document (the launcher's --set on a restart).
	skipUnchanged bool
}

// commit applies a batch: under the write lock it resolves the caller's
// authority for every path, stages every write into one candidate
// (later writes of a prop win), validates the whole candidate, stores it
// as the next revision, and only then installs it as live and publishes
// it. Any refusal or failure leaves the stored and the live config as
// they were. It returns the live snapshot after the call.
func (s *Server) commit(ctx context.Context, req commitRequest) (*snapshot, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.unlock()
	snap, err := s.commitLocked(ctx, req)
	if errors.Is(err, errRevisionTaken) {
		// The snapshot was behind the database (another config process
		// committed before follow read it, or a commit of unknown
		// outcome landed late): the caller's write was sound, and failed
		// as an internal error. Reload and stage it again, once; the
		// cross-process policy lock held keeps a second miss to a
		// commit landing late again.
		if err := s.reconcile(ctx); err != nil {
			return nil, err
		}
		snap, err = s.commitLocked(ctx, req)
	}
	return snap, err
}

// commitLocked is commit under the write lock.
func (s *Server) commitLocked(ctx context.Context, req commitRequest) (*snapshot, error) {
	cur := s.current()

	// Authority first, under the lock, before anything is staged.
	if req.principal != nil {
		for i, w := range req.writes {
			if d := cur.authorize(req.principal, PermConfigUpdate, w.prop); !d.allowed {
				return nil, atIndex(i, ErrForbidden, "%s", d.reason)
			}
		}
	}

	candidate := configschema.Clone(cur.stored)
	props := make([]string, len(req.writes))
	for i, w := range req.writes {
		props[i] = w.prop
		if kind, err := stage(candidate, w); err != nil {
			return nil, refuse(i, kind, err)
		}
	}
	if err := withinBound(candidate, cur.stored, req.writes); err != nil {
		return nil, err
	}
	effective := configschema.Effective(candidate)
	if err := configschema.Validate(effective); err != nil {
		return nil, refuse(configschema.Blame(err, props), ErrInvalid, err)
	}
	if req.skipUnchanged && configschema.Equal(candidate, cur.stored) {
		return cur, nil
	}

	next := cur.revision + 1
	changed := unique(props)
	unpair := usersComeOrGone(cur.doc, effective)
	history, err := newHistory(next)
	if err != nil {
		return nil, err
	}
	digest, err := s.store(ctx, cur, next, history, candidate, req.who, changed, unpair)
	if err != nil {
		return nil, err
	}
	if history == "" {
		history = cur.history
	}
	tokens := cur.tokens
	if len(unpair) > 0 {
		tokens = maps.Clone(tokens)
		maps.DeleteFunc(tokens, func(_, user string) bool { return slices.Contains(unpair, user) })
	}
	snap := &snapshot{revision: next, history: history, digest: digest, stored: candidate, doc: effective, masked: configschema.Mask(effective), tokens: tokens}
	s.snap.Store(snap)
	s.publish(snap, cur.digest, changed)
	s.log.Info("config committed", zap.Int64("revision", next), zap.String("by", req.who.by), zap.Strings("props", changed))
	return snap, nil
}

// usersComeOrGone lists the users that exist in one document and not in
// the other. Their tokens are unpaired with the commit: a token names its
// user by name alone, so one of a removed user left paired reached
// whoever was later created under the same name, with that user's
// profiles. A name created anew unpairs what an older version left
// paired with it.
func usersComeOrGone(before, after map[string]any) []string {
	was, _ := before["users"].(map[string]any)
	is, _ := after["users"].(map[string]any)
	var out []string
	for name := range was {
		if _, ok := is[name]; !ok {
			out = append(out, name)
		}
	}
	for name := range is {
		if _, ok := was[name]; !ok {
			out = append(out, name)
		}
	}
	return out
}

// withinBound refuses a candidate past configschema.MaxDocumentBytes,
// unless it is no larger than the stored document (a config stored past
// the bound by an older version can still be made smaller). The refusal
// names the largest value the batch sets.
func withinBound(candidate, stored map[string]any, writes []write) error {
	size, err := configschema.DocumentBytes(candidate)
	if err != nil {
		return refuse(0, ErrInvalid, err)
	}
	if size <= configschema.MaxDocumentBytes {
		return nil
	}
	if was, err := configschema.DocumentBytes(stored); err == nil && size <= was {
		return nil
	}
	blame, largest := 0, -1
	for i, w := range writes {
		if w.delete {
			continue
		}
		if b, err := json.Marshal(w.value); err == nil && len(b) > largest {
			blame, largest = i, len(b)
		}
	}
	return atIndex(blame, ErrInvalid, "the config would be %d bytes; the limit is %d", size, configschema.MaxDocumentBytes)
}

// stage applies one write to the candidate; a refusal says its kind.
func stage(candidate map[string]any, w write) (kind, err error) {
	if w.delete {
		if configschema.EntryMap(w.prop) == nil {
			if _, err := configschema.LookupLeaf(w.prop); err != nil {
				return ErrInvalid, err
			}
		}
		if !configschema.Delete(candidate, w.prop) {
			return ErrNotFound, fmt.Errorf("`%s` is not set", w.prop)
		}
		return nil, nil
	}
	p, err := configschema.LookupLeaf(w.prop)
	if err != nil {
		return ErrInvalid, err
	}
	v, err := p.Check(w.value)
	if err != nil {
		return ErrInvalid, fmt.Errorf("`%s`: %w", w.prop, err)
	}
	if p.Secret && holdsMask(v) {
		// A client writing back what it read (the whole document, say)
		// replaced the secret with the mask, and the real one was gone.
		// Refused here, not in Check: a document an older version
		// stored so must still load.
		return ErrInvalid, fmt.Errorf("`%s`: %q is what a secret reads as, not a secret; send the secret itself", w.prop, configschema.Masked)
	}
	if err := configschema.Set(candidate, w.prop, v); err != nil {
		return ErrInvalid, err
	}
	return nil, nil
}

// holdsMask reports whether a secret's value is, or holds as one of its
// object's values, what secrets read as.
func holdsMask(v any) bool {
	switch x := v.(type) {
	case string:
		return x == configschema.Masked
	case map[string]any:
		for _, it := range x {
			if it == configschema.Masked {
				return true
			}
		}
	}
	return false
}

// store inserts the revision in one transaction, with it unpairing the
// tokens of the users named in unpair. A failed COMMIT is checked against
// the database, since the commit may have happened before the connection
// was lost: then the candidate is live after all.
//
// base is the snapshot the candidate was staged on: the database's newest
// revision must still be it (baseHeld), or nothing is stored.
func (s *Server) store(ctx context.Context, base *snapshot, rev int64, history string, stored map[string]any, who audit, props, unpair []string) (string, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: begin: %w", ErrCommit, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after a commit it is a no-op
	if err := baseHeld(ctx, tx, base); err != nil {
		if errors.Is(err, errRevisionTaken) {
			s.unsure.Store(true) // commit reloads (reconcile) and stages again
		}
		return "", fmt.Errorf("%w: %w", ErrCommit, err)
	}
	digest, err := s.insertRevision(ctx, tx, rev, history, stored, who, props)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
			// The database holds this revision already: a commit whose
			// outcome looked settled landed after all (a COMMIT still
			// running when the check read), or another config process
			// committed it: commit reloads and stages again.
			s.unsure.Store(true)
			return "", fmt.Errorf("%w: %w: %w", ErrCommit, errRevisionTaken, err)
		}
		return "", fmt.Errorf("%w: %w", ErrCommit, err)
	}
	if len(unpair) > 0 {
		if _, err := tx.Exec(ctx, "UPDATE tokens SET revoked_at = now() WHERE username = ANY($1) AND revoked_at IS NULL", unpair); err != nil {
			return "", fmt.Errorf("%w: unpair the tokens of users removed or created: %w", ErrCommit, err)
		}
	}
	if s.hooks.beforeCommit != nil {
		if err := s.hooks.beforeCommit(ctx, tx); err != nil {
			return "", fmt.Errorf("%w: %w", ErrCommit, err)
		}
	}
	commitErr := tx.Commit(ctx)
	if commitErr == nil {
		return digest, nil
	}
	checkCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	got, err := s.storedRevision(checkCtx)
	switch {
	case err == nil && got == rev:
		s.log.Warn("commit reported an error but is stored", zap.Int64("revision", rev), zap.Error(commitErr))
		return digest, nil
	default:
		// The revision may be stored all the same, or still be: a
		// COMMIT the server is running when the check reads lands after
		// it. The next write, or Run, reloads the snapshot first.
		s.unsure.Store(true)
		s.log.Warn("commit of unknown outcome", zap.Int64("revision", rev), zap.Error(commitErr), zap.NamedError("check", err))
	}
	return "", fmt.Errorf("%w: %w", ErrCommit, commitErr)
}

// baseHeld checks, inside the commit's transaction, that the database's
// newest revision and history are base's. Only the unique revision
// number was checked: a history restored into the database (an older dump
// put back) within follow's second of a write left the number after the
// live snapshot's free, and the write stored the old history's document
// with its change on top of the restored one, the restored values lost.
// The read holds its tables against a restore's DROP until the
// transaction ends, so none lands between the check and the insert.
func baseHeld(ctx context.Context, tx pgx.Tx, base *snapshot) error {
	var (
		rev             int64
		digest, history string
	)
	err := tx.QueryRow(ctx, "SELECT coalesce((SELECT revision FROM revisions ORDER BY revision DESC LIMIT 1), 0), "+
		"coalesce((SELECT "+docDigest+" FROM revisions ORDER BY revision DESC LIMIT 1), ''), "+
		"(SELECT coalesce(max(id), '') FROM history)").Scan(&rev, &digest, &history)
	if err != nil {
		return fmt.Errorf("read the newest revision: %w", err)
	}
	if rev != base.revision || digest != base.digest || history != base.history {
		return fmt.Errorf("%w: the database holds revision %d, the write builds on %d", errRevisionTaken, rev, base.revision)
	}
	return nil
}

// publish announces a commit on the bus: its revision and changed props,
// and the digest of the revision it was staged on (parent), nothing of
// the document; consumers read the revision with Live. A failed publish
// is logged; consumers catch up at their next resync.
func (s *Server) publish(snap *snapshot, parent string, props []string) {
	if s.nc == nil {
		return
	}
	if err := bus.PublishConfigRevision(s.nc, snap.history, snap.digest, parent, snap.revision, props); err != nil {
		s.log.Warn("config change not published", zap.Int64("revision", snap.revision), zap.Error(err))
	}
}

// unique keeps the first occurrence of each prop, in order.
func unique(props []string) []string {
	seen := make(map[string]bool, len(props))
	out := make([]string, 0, len(props))
	for _, p := range props {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// toStatus maps a write-path error to the gRPC status the edge reads. A
// database that cannot be reached (refused, or lost mid-commit) is named
// as the process frame names it: Unavailable "database unavailable"; a
// statement it gave up on (pg.IsBusy) likewise, "database busy".
func toStatus(err error) error {
	if pg.IsUnavailable(err) {
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, pg.ErrUnavailable.Error())
	}
	if pg.IsBusy(err) {
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, pg.ErrBusy.Error())
	}
	index := rpcerr.NoIndex
	var ee *entryError
	if errors.As(err, &ee) {
		index = ee.index
	}
	msg := err.Error()
	switch {
	case errors.Is(err, ErrForbidden):
		return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, index, msg)
	case errors.Is(err, ErrNotFound):
		return rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, index, msg)
	case errors.Is(err, ErrInvalid):
		return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, index, msg)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return rpcerr.Error(codes.DeadlineExceeded, "", rpcerr.NoIndex, msg)
	}
	return rpcerr.Error(codes.Internal, "", rpcerr.NoIndex, msg)
}
