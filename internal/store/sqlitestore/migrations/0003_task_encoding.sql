-- The text encoding a CSV input was read with, detected or asked for, so that
-- an operator can see how the bytes were read ("" for xlsx).
ALTER TABLE tasks ADD COLUMN encoding TEXT NOT NULL DEFAULT '';
