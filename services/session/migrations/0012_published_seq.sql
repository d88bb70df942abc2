-- published_seq is the last session/update sequence number a process
-- used for the session, stored with each turn's end (the number its
-- turn_complete takes) and at a clean stop; NULL while a turn runs, as a
-- turn's updates are numbered without a write, and on rows from before
-- this column. update_seq is a reservation, a block past what was used:
-- after a crash, it is all a gateway was told, and the followers of
-- every session were closed, nothing lost (UpdateSeqs).
ALTER TABLE sessions ADD COLUMN published_seq bigint;
