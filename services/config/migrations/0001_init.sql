-- Every commit of the config document is a revision; the newest row is the
-- stored config. Secrets inside document are encrypted at rest.
CREATE TABLE revisions (
    revision     bigint PRIMARY KEY,
    document     jsonb NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    committed_by text NOT NULL,
    props        text[] NOT NULL DEFAULT '{}'
);

-- Paired tokens, stored as SHA-256 hashes only.
CREATE TABLE tokens (
    token_hash text PRIMARY KEY,
    username   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
