-- timeout_secs is the approval request's timeout_secs as published, so
-- that Resend can send the request again as it was (the agent's setting
-- may have changed since); NULL on rows from before this column, whose
-- turns' update maps hold no approval request. The index serves
-- Resend's read of a turn's requests.
ALTER TABLE approvals ADD COLUMN timeout_secs bigint;
CREATE INDEX approvals_turn ON approvals (turn_id);
