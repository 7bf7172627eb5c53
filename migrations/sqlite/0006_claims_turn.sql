-- Deleting a turn checks that no claim references it (the foreign key):
-- without this index each pruned turn would scan the whole claims table.
create index claims_turn on claims (turn_id);
