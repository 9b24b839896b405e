-- namespace_check.lua: the namespace identity check (store/identity.py), prepended to every script
-- of this folder after lib.lua, so it runs before the script's own code. The store calls each
-- script with seven more KEYS and one more ARGV in front of the script's own, taken off here, so
-- that the script's KEYS and ARGV are numbered as its header says:
--   identity key (string "<generation>:<run id>"), loss marker key ('lost'), the keys a namespace
--   must always hold ('settings', 'counters'), 'problems', 'stats' and 'heap' (whose sizes must
--   agree), and the identity the calling server claimed ('' before it claimed one and its
--   settings: no check).
-- A stored identity other than the claimed one (gone, older, another run), any loss marker, or a
-- missing key (namespace_complete: evicted by a maxmemory-policy other than noeviction, or deleted)
-- refuses the call before it reads or changes anything: an error reply
-- 'NAMESPACE_CHANGED <stored identity or nothing>' that the store turns into NamespaceLost.
local IDENTITY_KEY = table.remove(KEYS, 1)
local LOST_KEY = table.remove(KEYS, 1)
local HOLD = {}
for _, name in ipairs({ 'settings', 'counters', 'problems', 'stats', 'heap' }) do HOLD[name] = table.remove(KEYS, 1) end
local CLAIMED = table.remove(ARGV, 1)

-- Python twin: identity.missing_keys (empty list <=> true): settings and counters exist, every
-- registered problem has statistics, and the heap holds no problem without them. O(1) each.
local function namespace_complete()
  if redis.call('EXISTS', HOLD.settings, HOLD.counters) ~= 2 then return false end
  local stats = redis.call('HLEN', HOLD.stats)
  return redis.call('HLEN', HOLD.problems) == stats and redis.call('ZCARD', HOLD.heap) <= stats
end

if CLAIMED ~= '' then
  local stored = redis.call('GET', IDENTITY_KEY)
  if stored ~= CLAIMED or redis.call('EXISTS', LOST_KEY) == 1 or not namespace_complete() then
    return redis.error_reply('NAMESPACE_CHANGED ' .. (stored or ''))
  end
end
