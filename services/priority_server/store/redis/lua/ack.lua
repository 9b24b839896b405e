-- ack.lua: acknowledge delivered groups; acknowledged groups are deleted (store/base.py, "ack").
-- KEYS[1]  stream       stream trajectory groups
-- KEYS[2]  counters     hash   StoreStats counters (groups_acked)
-- ARGV[1]  group        consumer group name
-- ARGV[2...] group_ids  the group ids (distinct). An id that is not pending (unknown, never delivered,
-- already acknowledged or malformed) is left alone and not counted.
-- Returns the number acknowledged.
local acked = 0
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 2, #ARGV do
  local n = redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[i])
  if type(n) == 'number' and n == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    acked = acked + 1
  end
end
if acked > 0 then redis.call('HINCRBY', KEYS[2], 'groups_acked', acked) end
return acked
