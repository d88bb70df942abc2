-- update_marks is where the updates a turn published since its previous
-- batch of checkpoint events live, as turns.update_map (migration 0016)
-- holds them (triples of the update's number, the event's seq and a
-- chunk's end offset), packed as little-endian int64s, on the last event
-- of the turn's batch, written with it. A turn cut by a crash has them up
-- to its last batch, so that Resend can send again the middle of a turn
-- whose end nothing recorded; a turn's end stores in update_map only
-- those no batch carried. NULL: none.
ALTER TABLE checkpoint_events ADD COLUMN update_marks bytea;
