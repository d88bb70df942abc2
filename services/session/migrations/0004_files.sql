-- Files stored into session workspaces (file/attach and chunked uploads).

-- incarnation is new for every session row: a session deleted and created
-- again with the same id restarts at generation 1, so an upload begun in
-- the old one is told apart by this.
CREATE SEQUENCE session_incarnations;
ALTER TABLE sessions ADD COLUMN incarnation bigint NOT NULL DEFAULT nextval('session_incarnations');

-- The attachment index: one row per distinct content per session. path is
-- relative to the session's workspace (uploads/<sha256><.ext>); filename
-- and mime_type are those of the first store, used for the marker of an
-- attachment named only by its ref_id.
CREATE TABLE session_files (
    session_id text NOT NULL REFERENCES sessions ON DELETE CASCADE,
    sha256     text NOT NULL,
    path       text NOT NULL,
    size_bytes bigint NOT NULL,
    filename   text NOT NULL,
    mime_type  text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, sha256)
);
