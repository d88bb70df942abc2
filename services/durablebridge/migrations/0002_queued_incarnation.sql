-- A text queued for a pane's next turn names the incarnation of the
-- session the pane showed when it was typed: a session deleted and made
-- again under the same id is another session, and the text is not run
-- in it (the session service refuses StartTurn of another incarnation).
-- Texts queued before this column wait for whichever session has the id
-- (0: any), as they did.
ALTER TABLE queued_sends ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;
