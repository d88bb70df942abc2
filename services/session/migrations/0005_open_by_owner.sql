-- NewSession counts the sessions a principal has open (store.admitOpen):
-- this keeps that count to the owner's open rows, however many sessions
-- the table holds.
CREATE INDEX sessions_open_by_owner ON sessions (owner) WHERE state IN ('idle', 'running');
