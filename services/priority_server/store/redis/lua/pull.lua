-- pull.lua: deliver up to max trajectory groups to a consumer (store/base.py docstring, "pull").
-- KEYS[1]  stream       stream trajectory groups (field "p" = payload), consumer group ARGV[1]
-- ARGV[1]  group        consumer group name
-- ARGV[2]  consumer     consumer name
-- ARGV[3]  max          groups delivered at most
-- ARGV[4]  own          1: first re-deliver this consumer's own pending groups
-- ARGV[5]  min_idle_ms  redelivery timeout in milliseconds. Idle times are measured by
--                       Redis's own clock (XAUTOCLAIM), not by the store's injected clock.
-- ARGV[6]  watch        1: end the list with what a waiting pull blocks on (below)
-- Returns a flat list: group id, payload, delivery count (this delivery included), ...
-- With watch = 1, two more items end it: the consumer group's last-delivered id ('0-0' without
-- a stream: XREAD BLOCK from it ends at the next XADD) and the milliseconds until the first of
-- (at most 64 of) the pending deliveries turns idle (-1: none pending), both only when nothing
-- was delivered (else '', -1).
local stream, grp, consumer = KEYS[1], ARGV[1], ARGV[2]
local max = tonumber(ARGV[3])
local out, seen, count = {}, {}, 0
if redis.call('EXISTS', stream) == 0 then
  if ARGV[6] == '1' then out[1] = '0-0'; out[2] = -1 end
  return out
end

local function deliver(entry, deliveries)
  local id = entry[1]
  out[#out + 1] = id
  out[#out + 1] = entry[2][2]
  out[#out + 1] = deliveries
  seen[id] = true
  count = count + 1
end

-- 1. this consumer's own pending deliveries
if ARGV[4] == '1' then
  local pend = redis.call('XPENDING', stream, grp, '-', '+', max, consumer)
  if #pend > 0 then
    local ids, times = {}, {}
    for _, p in ipairs(pend) do ids[#ids + 1] = p[1]; times[p[1]] = p[4] end
    local claimed = redis.call('XCLAIM', stream, grp, consumer, 0, unpack(ids))
    for _, e in ipairs(claimed) do
      if e and e[2] then deliver(e, times[e[1]] + 1) end
    end
  end
end

-- 2. deliveries idle >= the redelivery timeout, reclaimed by this consumer
local cursor = '0-0'
while count < max do
  local r = redis.call('XAUTOCLAIM', stream, grp, consumer, ARGV[5], cursor, 'COUNT', max - count)
  for _, e in ipairs(r[2]) do
    if not seen[e[1]] and count < max then
      local p = redis.call('XPENDING', stream, grp, e[1], e[1], 1)
      deliver(e, p[1][4])
    end
  end
  cursor = r[1]
  if cursor == '0-0' then break end
end

-- 3. new groups, in report order
if count < max then
  local r = redis.call('XREADGROUP', 'GROUP', grp, consumer, 'COUNT', max - count, 'STREAMS', stream, '>')
  if r then
    for _, e in ipairs(r[1][2]) do deliver(e, 1) end
  end
end

-- 4. what a waiting pull blocks on
if ARGV[6] == '1' then
  local mark, idle_in = '', -1
  if count == 0 then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local f = {}
      for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
      if f['name'] == grp then mark = f['last-delivered-id'] end
    end
    if mark == '' then mark = '0-0' end
    local min_idle = tonumber(ARGV[5])
    for _, p in ipairs(redis.call('XPENDING', stream, grp, '-', '+', 64)) do
      local left = math.max(1, min_idle - p[3])
      if idle_in < 0 or left < idle_in then idle_in = left end
    end
  end
  out[#out + 1] = mark
  out[#out + 1] = idle_in
end
return out
