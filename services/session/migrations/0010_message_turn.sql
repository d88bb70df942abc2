-- turn_id names the turn that wrote a transcript row (its prompt
-- included), so that the durable bridge can show a turn's rows as the
-- turn's followers saw them: its thoughts among them, its reply once.
-- Rows written before this column, and rows no turn wrote, read ''.
ALTER TABLE messages ADD COLUMN turn_id text NOT NULL DEFAULT '';
