-- When the holder of the session's active claim last said it is working on
-- it (an `agent-state` report `working` naming the claim; null: it never
-- did, and a claim whose holder never does is released by no clock). The
-- broker releases the claim of a holder silent for `--holder-silence`
-- (default 5 minutes); a new claim starts with null.
alter table sessions add column holder_heard_at integer;
