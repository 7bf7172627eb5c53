-- One conversation per terminal (issue 55): a session remembers the
-- terminal its agent ran in (`terminal`: an opaque digest the hooks give,
-- null when they cannot tell), and a new host session bound from the same
-- terminal continues it: the old one closes naming the new
-- (`continued_in`), the new one names the old (`continued_from`).
alter table sessions add column terminal text;
alter table sessions add column continued_in text;
alter table sessions add column continued_from text;
