-- What the sessions of each user hold in stored files, so that a user's
-- store is checked against uploads.max_user_stored_bytes and
-- uploads.max_user_stored_files without summing its files (files.go,
-- chargeStored). Raised with each new index row, lowered when a session
-- is deleted (store.deleteSession). The operator's files are not counted:
-- its disk is its own, and its stores take no lock for this.
CREATE TABLE stored_usage (
    owner text PRIMARY KEY,
    bytes bigint NOT NULL CHECK (bytes >= 0),
    files bigint NOT NULL CHECK (files >= 0)
);

INSERT INTO stored_usage (owner, bytes, files)
SELECT s.owner, sum(f.size_bytes), count(*)
FROM session_files f JOIN sessions s ON s.session_id = f.session_id
WHERE s.owner <> 'shared-operator'
GROUP BY s.owner;
