-- The clinic's tables.
CREATE TABLE IF NOT EXISTS doctors (
    name    text    PRIMARY KEY,
    shift   int     NOT NULL,
    on_call boolean NOT NULL
);

CREATE TABLE IF NOT EXISTS ledger (
    acct    text PRIMARY KEY,
    balance int  NOT NULL
);

CREATE TABLE IF NOT EXISTS bookings (
    id    serial PRIMARY KEY,
    room  int    NOT NULL,
    day   text   NOT NULL,
    guest text   NOT NULL
);
