-- A Unix uid is an unsigned 32-bit value; peer_uid was an integer, so a
-- uid past 2^31-1 (it travels as an int32 on gRPC) was stored wrapped,
-- 4294967294 as -2. Stored rows are unwrapped; -1 was the gateway's "no
-- credentials", no uid at all, like a launcher commit's.
ALTER TABLE revisions
    ALTER COLUMN peer_uid TYPE bigint USING CASE
        WHEN peer_uid = -1 THEN NULL
        WHEN peer_uid < 0 THEN peer_uid::bigint + 4294967296
        ELSE peer_uid
    END;
ALTER TABLE revisions
    ADD CONSTRAINT revisions_peer_uid_range CHECK (peer_uid BETWEEN 0 AND 4294967294);
