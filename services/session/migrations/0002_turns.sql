-- Sessions, turns, tool calls and approvals of the agent loop (issue 5).

ALTER TABLE sessions
    ADD COLUMN cwd            text   NOT NULL DEFAULT '',
    -- message_count is the next transcript index: appends take it under
    -- the row lock, so indexes are dense and never reused.
    ADD COLUMN message_count  bigint NOT NULL DEFAULT 0,
    -- update_seq bounds the session/update sequence numbers already used:
    -- blocks are reserved ahead, and a restart resumes above it.
    ADD COLUMN update_seq     bigint NOT NULL DEFAULT 0,
    -- always_allowed holds the tools an allow_always decision approved.
    ADD COLUMN always_allowed text[] NOT NULL DEFAULT '{}';

CREATE INDEX sessions_owner_updated ON sessions (owner, updated_at DESC);

CREATE TABLE turns (
    turn_id                text PRIMARY KEY,
    session_id             text NOT NULL REFERENCES sessions ON DELETE CASCADE,
    connection_id          text NOT NULL DEFAULT '',
    client_turn_generation bigint,
    -- state is running until the turn ends, then done.
    state                  text NOT NULL DEFAULT 'running',
    outcome                text NOT NULL DEFAULT '',
    stop_reason            text NOT NULL DEFAULT '',
    content                text NOT NULL DEFAULT '',
    started_at             timestamptz NOT NULL DEFAULT now(),
    ended_at               timestamptz
);

CREATE INDEX turns_running ON turns (session_id) WHERE state = 'running';

CREATE TABLE approvals (
    request_id        text PRIMARY KEY,
    session_id        text NOT NULL REFERENCES sessions ON DELETE CASCADE,
    turn_id           text NOT NULL,
    tool_call_id      text NOT NULL,
    tool_name         text NOT NULL,
    arguments_summary text NOT NULL,
    -- status: pending, then decided (by a person or the timeout) or
    -- cancelled (the turn ended first).
    status            text NOT NULL DEFAULT 'pending',
    decision          text NOT NULL DEFAULT '',
    surface           text NOT NULL DEFAULT '',
    replacement       text NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL DEFAULT now(),
    decided_at        timestamptz
);
