-- The sample shop's tables. Idempotent: applied by bench.shop.db.apply_schema before every run.
-- REPLICA IDENTITY FULL so Debezium's "before" image carries every column, not just the key.

CREATE TABLE IF NOT EXISTS orders (
    id      int  PRIMARY KEY,
    status  text NOT NULL,
    amount  int  NOT NULL,
    version int  NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS inventory (
    sku   text PRIMARY KEY,
    stock int  NOT NULL
);

CREATE TABLE IF NOT EXISTS charges (
    id              serial PRIMARY KEY,
    order_id        int    NOT NULL,
    amount          int    NOT NULL,
    idempotency_key text   UNIQUE  -- NULLs are distinct: the buggy path inserts none, the clean path relies on it
);

-- Order ids for seeding and for orders created by checkout (never reused across runs).
CREATE SEQUENCE IF NOT EXISTS shop_order_ids START 1000;

ALTER TABLE orders REPLICA IDENTITY FULL;
ALTER TABLE inventory REPLICA IDENTITY FULL;
ALTER TABLE charges REPLICA IDENTITY FULL;
