-- The message a turn answers, when its caller named one (PromptRequest's
-- idempotency_key: a channel's message). A prompt sent again with the key
-- is answered with the turn's result, or resumes the turn when it was
-- cut, rather than running the message a second time with its tools
-- (rpc_prompt.go, keyedTurn). Turns started before this column read ''.
ALTER TABLE turns ADD COLUMN idempotency_key text NOT NULL DEFAULT '';

CREATE INDEX turns_idempotency ON turns (session_id, idempotency_key, started_at DESC) WHERE idempotency_key <> '';
