-- How many of a turn's provider steps have their text in the transcript
-- already: a step that asks for tools has its text written as an
-- assistant row before the rows of its tool calls (turn.go, showText),
-- so the transcript keeps the order the turn's updates had. Recovery of
-- an interrupted turn adds the text of the later steps only. A turn
-- started before this column existed reads 0: all its text is added, as
-- it was then.
ALTER TABLE turns ADD COLUMN shown_steps integer NOT NULL DEFAULT 0;
