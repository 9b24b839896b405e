-- namespace_check.lua: the namespace identity check (store/identity.py), prepended to every script
-- of this folder after lib.lua, so it runs before the script's own code. The store calls each
-- script with two more KEYS and one more ARGV in front of the script's own, taken off here, so
-- that the script's KEYS and ARGV are numbered as its header says:
--   identity key (string "<generation>:<run id>"), loss marker key ('lost'), and the identity
--   the calling server claimed ('' before it claimed one: no check).
-- A stored identity other than the claimed one (gone, older, another run), or any loss marker,
-- refuses the call before it reads or changes anything: an error reply
-- 'NAMESPACE_CHANGED <stored identity or nothing>' that the store turns into NamespaceLost.
local IDENTITY_KEY = table.remove(KEYS, 1)
local LOST_KEY = table.remove(KEYS, 1)
local CLAIMED = table.remove(ARGV, 1)
if CLAIMED ~= '' then
  local stored = redis.call('GET', IDENTITY_KEY)
  if stored ~= CLAIMED or redis.call('EXISTS', LOST_KEY) == 1 then
    return redis.error_reply('NAMESPACE_CHANGED ' .. (stored or ''))
  end
end
