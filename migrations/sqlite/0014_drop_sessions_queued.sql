-- `sessions_queued` (sessions with queued turns) took an entry each time a
-- session's queue went from empty to one turn and lost it when the turn was
-- claimed: two index pages written per cycle on the hot path, for a reader
-- that runs once per scrape (/metrics). The scrape now reads the queued turns
-- themselves through `turns_queued`, the index the claims already keep.
drop index if exists sessions_queued;
