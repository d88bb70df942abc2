-- Staged bytes live in memory; this is the record of committed uploads, so
-- an operator can see what reached which session.
CREATE TABLE committed_uploads (
    upload_id    text PRIMARY KEY,
    session_id   text NOT NULL,
    principal_id text NOT NULL,
    ref_id       text NOT NULL,
    size_bytes   bigint NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now()
);
