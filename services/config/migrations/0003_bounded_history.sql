-- Config history is bounded: every commit keeps its audit row (revision,
-- when, by whom, from which peer, which props), but only the newest
-- revisions keep their full document (store.go: KeepDocuments); older
-- documents are dropped as commits come. The partial index makes finding
-- the documents still held cheap however long the history grows.
ALTER TABLE revisions ALTER COLUMN document DROP NOT NULL;
CREATE INDEX revisions_with_document ON revisions (revision) WHERE document IS NOT NULL;
