-- The chunked uploads each stored file came from: a commit's answer,
-- read back by upload-staging (CommittedUpload) for a commit sent again
-- after it restarted, when it no longer knows the upload. Only the
-- principal that committed an upload id is answered. filename, mime_type
-- and deduplicated are this upload's, for its entry's marker. The rows go
-- with their file (its session deleted), and StoreFile keeps at most the
-- newest few of each file (files.go, maxUploadsPerFile).
CREATE TABLE session_file_uploads (
    principal    text NOT NULL,
    upload_id    text NOT NULL,
    session_id   text NOT NULL,
    sha256       text NOT NULL,
    filename     text NOT NULL,
    mime_type    text NOT NULL,
    deduplicated boolean NOT NULL,
    seq          bigserial NOT NULL,
    PRIMARY KEY (principal, upload_id),
    FOREIGN KEY (session_id, sha256) REFERENCES session_files ON DELETE CASCADE
);
CREATE INDEX session_file_uploads_file ON session_file_uploads (session_id, sha256, seq);
