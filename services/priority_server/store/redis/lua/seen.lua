-- seen.lua: backfill the problems_seen counter (store/base.py, "stats": unseen = problems - problems_seen)
-- of a namespace written before report.lua kept it: such a namespace has reported problems but no
-- counter, so every problem read as unseen. Counts the problems whose statistics have n > 0 (a
-- report covered them; n is decayed but stays > 0) and stores the count; a no-op once the field
-- exists, so it runs once per namespace. Atomic: no report lands between the count and the write.
-- KEYS[1]  counters     hash   StoreStats counters (problems_seen)
-- KEYS[2]  stats        hash   id -> "n s1 s2 pool score"
-- Returns the counter's value.
local have = redis.call('HGET', KEYS[1], 'problems_seen')
if have then return tonumber(have) end
-- HSCAN may return an id twice (a rehash between calls): count each id once
local counted, seen, cursor = {}, 0, '0'
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 1000)
  cursor = page[1]
  local kv = page[2]
  for i = 1, #kv, 2 do
    local n = split_stats(kv[i + 1])
    if n and tonumber(n) > 0 and not counted[kv[i]] then
      counted[kv[i]] = true
      seen = seen + 1
    end
  end
until cursor == '0'
redis.call('HSET', KEYS[1], 'problems_seen', seen)
return seen
