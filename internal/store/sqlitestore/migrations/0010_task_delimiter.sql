-- The field separator a CSV input was read with, which a CSV result keeps.
ALTER TABLE tasks ADD COLUMN delimiter TEXT NOT NULL DEFAULT '';
