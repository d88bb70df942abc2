-- end_seq is the number its turn's turn_complete took (the session's
-- published_seq at the turn's end, or the one recovery published for a
-- turn cut by a crash), NULL when not known; error is a failed turn's
-- message. With the turn's checkpoint events and its end they let a
-- gateway that missed the turn's updates be sent them again (Resend).
ALTER TABLE turns ADD COLUMN end_seq bigint, ADD COLUMN error text NOT NULL DEFAULT '';
CREATE INDEX turns_end_seq ON turns (session_id, end_seq) WHERE end_seq IS NOT NULL;
