-- A page of transcript is bounded by its messages as JSON, the form a
-- client reads them in (store.pageSQL): json_size is what a row's content
-- takes as a JSON string, measured when it is written. Rows written
-- before this column are NULL and counted at six bytes a byte, the most
-- any character can take.
ALTER TABLE messages ADD COLUMN json_size integer;
