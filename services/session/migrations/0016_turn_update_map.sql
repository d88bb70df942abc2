-- update_map is where each update an ended turn published lives in its
-- checkpoint events, so that Resend can send again the updates of a turn
-- a gateway missed part of (a hole mid-turn): triples of the update's
-- number, the checkpoint event's seq, and for a text or thought chunk
-- the byte offset its text ends at in the event's content (-1 for a tool
-- call or result). Written with the turn's end, in the statement that
-- already ends it; NULL when not known (a turn ended before this
-- migration, cut by a crash, or past the bound on its updates).
ALTER TABLE turns ADD COLUMN update_map bigint[];
