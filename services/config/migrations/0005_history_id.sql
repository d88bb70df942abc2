-- The identity of this database's history of revisions, a random id.
-- Consumers follow the config by revision number; a database replaced by
-- another, or reset, starts a new history whose numbers may reach the
-- ones they read with other documents. The id, served with every
-- revision (LiveResponse.history, ConfigChanged.history), tells the
-- histories apart. One row: a new database gets a new id as its
-- migrations run, and the first revision of a history begun again on
-- emptied revisions replaces it (services/config, insertRevision).
CREATE TABLE history (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    id       text NOT NULL
);
INSERT INTO history (id) VALUES (md5(random()::text || clock_timestamp()::text));
