-- A turn whose start trimmed the session's retained context (its
-- history_trimmed update) records how many messages the trim dropped
-- and when, so that a durable pane rebuilt from the session shows the
-- same notice its followers saw ("Older history was trimmed (N
-- messages)"): the update was the notice's only trace, and a rebuilt
-- pane showed the turn as if nothing had been trimmed. 0: no trim (and
-- every turn from before this column).
ALTER TABLE turns ADD COLUMN trimmed_messages integer NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN trimmed_at timestamptz;
