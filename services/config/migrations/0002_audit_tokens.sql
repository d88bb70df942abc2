-- The audit of a commit names the peer as well as the principal; a
-- launcher commit has neither.
ALTER TABLE revisions
    ADD COLUMN peer_uid integer,
    ADD COLUMN peer_pid integer;

-- Revoking by user scans a user's live tokens.
CREATE INDEX tokens_username_live ON tokens (username) WHERE revoked_at IS NULL;
