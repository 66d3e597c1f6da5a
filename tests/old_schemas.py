# ruff: noqa: E501  (the statements are kept to the letter)
"""The schemas of older durable_turns versions, as those versions created them (their
``MIGRATIONS`` lists, copied verbatim from the code of schema version 4, commit ce07366), for
the tests that open a database an older engine made. The store's own migrations are written
against what these left, so these must never be derived from them."""

from __future__ import annotations

PG_HISTORY: list[str] = [
    """
    CREATE TABLE sessions (
        sid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        agent TEXT NOT NULL,
        session TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'new',
        generation INTEGER NOT NULL DEFAULT 0,
        epoch BIGINT NOT NULL DEFAULT 0,
        lease_until TIMESTAMPTZ,
        UNIQUE (agent, session)
    );
    CREATE TABLE turns (
        ordinal BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        sid BIGINT NOT NULL REFERENCES sessions (sid),
        turn_id TEXT NOT NULL,
        kind TEXT NOT NULL DEFAULT 'turn',
        status TEXT NOT NULL,
        opening TEXT NOT NULL,
        event TEXT, policy TEXT, request TEXT,
        text TEXT, error TEXT, reason TEXT, cancel TEXT,
        data TEXT,
        UNIQUE (sid, turn_id)
    );
    CREATE INDEX turns_open ON turns (sid) WHERE status IN ('queued', 'running', 'suspended');
    CREATE INDEX turns_by_id ON turns (turn_id);
    CREATE TABLE messages (
        sid BIGINT NOT NULL, gen INTEGER NOT NULL, idx INTEGER NOT NULL,
        turn_id TEXT, body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, idx)
    );
    CREATE TABLE steps (
        sid BIGINT NOT NULL, gen INTEGER NOT NULL, step_id TEXT NOT NULL,
        turn_id TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, gen, step_id)
    );
    CREATE TABLE events (
        sid BIGINT NOT NULL, seq BIGINT NOT NULL, turn_id TEXT NOT NULL,
        type TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, seq)
    );
    """,
    """
    ALTER TABLE sessions ADD COLUMN lease_owner TEXT;
    CREATE INDEX turns_runnable ON turns (sid) WHERE status IN ('queued', 'running');
    """,
    """
    CREATE TABLE log (
        sid BIGINT NOT NULL, seq BIGINT NOT NULL, sub INTEGER NOT NULL,
        gen INTEGER NOT NULL, n INTEGER NOT NULL, turn_id TEXT,
        body TEXT, step TEXT, memo TEXT, events TEXT,
        PRIMARY KEY (sid, seq, sub)
    );
    CREATE INDEX log_lookup ON log (sid, gen, step) WHERE memo IS NOT NULL AND (step IS NULL OR (substr(step, 1, 6) <> 'model:' AND substr(step, 1, 5) <> 'tool:'));INSERT INTO log (sid, seq, sub, gen, n, turn_id, body)
    SELECT sid, 0, row_number() OVER (PARTITION BY sid ORDER BY gen, idx), gen, idx + 1,
           turn_id, body FROM messages;INSERT INTO log (sid, seq, sub, gen, n, turn_id, step, memo)
    SELECT sid, 0, (SELECT count(*) FROM messages m WHERE m.sid = s.sid)
           + row_number() OVER (PARTITION BY sid ORDER BY gen, step_id), gen, 0, turn_id,
           step_id, data FROM steps s;INSERT INTO log (sid, seq, sub, gen, n, turn_id, events)
    SELECT sid, seq, 0, 0, 0, turn_id, '[["' || type || '",' || data || ']]' FROM events;INSERT INTO log (sid, seq, sub, gen, n)
    SELECT s.sid, coalesce((SELECT max(seq) FROM events e WHERE e.sid = s.sid), 0),
           (SELECT count(*) FROM messages m WHERE m.sid = s.sid)
           + (SELECT count(*) FROM steps t WHERE t.sid = s.sid) + 1,
           s.generation,
           (SELECT coalesce(max(idx) + 1, 0) FROM messages m
            WHERE m.sid = s.sid AND m.gen = s.generation)
    FROM sessions s;DROP TABLE messages;DROP TABLE steps;DROP TABLE events""",
    """
    CREATE TABLE log_transcript (
        sid BIGINT NOT NULL, gen INTEGER NOT NULL, n INTEGER NOT NULL, seq BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, n)
    );
    """,
]
"""``PG_HISTORY[:v]`` makes the tables of a version-``v`` database, empty (several
statements each, separated by ``;``)."""

SQLITE_HISTORY: list[str] = [
    """
    CREATE TABLE sessions (
        sid INTEGER PRIMARY KEY,
        agent TEXT NOT NULL,
        session TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'new',
        generation INTEGER NOT NULL DEFAULT 0,
        UNIQUE (agent, session)
    );
    CREATE TABLE turns (
        ordinal INTEGER PRIMARY KEY,
        sid INTEGER NOT NULL,
        turn_id TEXT NOT NULL,
        kind TEXT NOT NULL DEFAULT 'turn',
        status TEXT NOT NULL,
        opening TEXT NOT NULL,
        event TEXT, policy TEXT, request TEXT,
        text TEXT, error TEXT, reason TEXT, cancel TEXT,
        UNIQUE (sid, turn_id)
    );
    CREATE INDEX turns_open ON turns (sid) WHERE status IN ('queued', 'running', 'suspended');
    CREATE TABLE messages (
        sid INTEGER NOT NULL, gen INTEGER NOT NULL, idx INTEGER NOT NULL,
        turn_id TEXT, body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, idx)
    ) WITHOUT ROWID;
    CREATE TABLE steps (
        sid INTEGER NOT NULL, gen INTEGER NOT NULL, step_id TEXT NOT NULL,
        turn_id TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, gen, step_id)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        sid INTEGER NOT NULL, seq INTEGER NOT NULL, turn_id TEXT NOT NULL,
        type TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, seq)
    ) WITHOUT ROWID;
    """,
    """
    ALTER TABLE sessions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN data TEXT;
    """,
    """
    CREATE TABLE log (
        sid INTEGER NOT NULL, seq INTEGER NOT NULL, sub INTEGER NOT NULL,
        gen INTEGER NOT NULL, n INTEGER NOT NULL, turn_id TEXT,
        body TEXT, step TEXT, memo TEXT, events TEXT,
        PRIMARY KEY (sid, seq, sub)
    ) WITHOUT ROWID;
    CREATE INDEX log_lookup ON log (sid, gen, step) WHERE memo IS NOT NULL AND (step IS NULL OR (substr(step, 1, 6) <> 'model:' AND substr(step, 1, 5) <> 'tool:'));INSERT INTO log (sid, seq, sub, gen, n, turn_id, body)
    SELECT sid, 0, row_number() OVER (PARTITION BY sid ORDER BY gen, idx), gen, idx + 1,
           turn_id, body FROM messages;INSERT INTO log (sid, seq, sub, gen, n, turn_id, step, memo)
    SELECT sid, 0, (SELECT count(*) FROM messages m WHERE m.sid = s.sid)
           + row_number() OVER (PARTITION BY sid ORDER BY gen, step_id), gen, 0, turn_id,
           step_id, data FROM steps s;INSERT INTO log (sid, seq, sub, gen, n, turn_id, events)
    SELECT sid, seq, 0, 0, 0, turn_id, '[["' || type || '",' || data || ']]' FROM events;INSERT INTO log (sid, seq, sub, gen, n)
    SELECT s.sid, coalesce((SELECT max(seq) FROM events e WHERE e.sid = s.sid), 0),
           (SELECT count(*) FROM messages m WHERE m.sid = s.sid)
           + (SELECT count(*) FROM steps t WHERE t.sid = s.sid) + 1,
           s.generation,
           (SELECT coalesce(max(idx) + 1, 0) FROM messages m
            WHERE m.sid = s.sid AND m.gen = s.generation)
    FROM sessions s;DROP TABLE messages;DROP TABLE steps;DROP TABLE events""",
    """
    CREATE TABLE log_transcript (
        sid INTEGER NOT NULL, gen INTEGER NOT NULL, n INTEGER NOT NULL, seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, n)
    ) WITHOUT ROWID;
    """,
]
"""``SQLITE_HISTORY[:v]`` makes the tables of a version-``v`` database, empty (several
statements each, separated by ``;``)."""
