-- One row per process start: the durable wire's epoch.
CREATE TABLE epochs (
    epoch      text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- Request-id memory for replaying POSTs (seed 004).
CREATE TABLE request_ids (
    request_id text PRIMARY KEY,
    route      text NOT NULL,
    status     integer NOT NULL,
    response   jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
