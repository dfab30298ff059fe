-- When a cache entry stops being reused (Unix milliseconds); NULL for the
-- entries written before the TTL, which keep being reused.
ALTER TABLE cache ADD COLUMN expires_at INTEGER;
