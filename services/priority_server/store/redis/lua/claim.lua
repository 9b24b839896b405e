-- claim.lua: a starting server claims the namespace's identity (store/identity.py), atomically, so
-- that every server of a run (and every process of --processes N) claims the same one.
-- KEYS[1]  identity     string "<generation>:<run id>"
-- KEYS[2]  lost         string JSON loss marker {"identity", "found", "how", "at"} (or none)
-- KEYS[3]  settings     string the run settings (whether it exists; written NX by a creation or reset)
-- KEYS[4]  counters     hash   StoreStats counters (field step written NX by a creation or reset)
-- ARGV[1]  run_id       a fresh random run id, used when this call creates or resets the identity
-- ARGV[2]  accept_loss  "1": --accept-namespace-loss (start anew on a lost namespace), else "0"
-- ARGV[3]  settings     JSON of this server's run settings (store.run_settings), the value a creation
--                       or reset stores when none is: with the identity, in one step, the keys every
--                       namespace must hold exist (namespace_check.lua), so no other server's check
--                       sees a new generation without them
-- Called with no identity to check (the namespace check's claimed identity is "").
-- Returns {status, identity, marker}: status
--   'JOINED'    the namespace has an identity and no loss marker: claim it (a normal restart)
--   'CREATED'   no identity, no marker, no settings: a new namespace, generation 1
--   'ADOPTED'   no identity, no marker, but run settings: made before identities existed, generation 1
--   'RESTORED'  a marker names the stored identity and the namespace holds every key it must
--               (namespace_check.lua's namespace_complete): the lost data is back; the marker is deleted
--   'LOST'      a marker names another identity (or none is stored), without accept_loss: refuse
--   'ACCEPTED'  the same with accept_loss: the next generation (1 + the larger of the marker's and
--               the stored one), a new run id; the marker is deleted
local function generation(ident)
  if not ident then return 0 end
  return tonumber(string.match(ident, '^(%d+):')) or 0
end

local ident = redis.call('GET', KEYS[1])
local marker = redis.call('GET', KEYS[2])
if marker then
  local ok, doc = pcall(cjson.decode, marker)
  local lost = (ok and type(doc) == 'table' and type(doc.identity) == 'string') and doc.identity or ''
  if ident and ident == lost and namespace_complete() then
    redis.call('DEL', KEYS[2])
    return { 'RESTORED', ident, marker }
  end
  if ARGV[2] ~= '1' then
    return { 'LOST', ident or '', marker }
  end
  local gen = math.max(generation(lost), generation(ident)) + 1
  local new = string.format('%d:%s', gen, ARGV[1])
  redis.call('SET', KEYS[1], new)
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[3], ARGV[3], 'NX')
  redis.call('HSETNX', KEYS[4], 'step', '0')
  return { 'ACCEPTED', new, marker }
end
if ident then
  return { 'JOINED', ident, '' }
end
local new = '1:' .. ARGV[1]
redis.call('SET', KEYS[1], new)
redis.call('HSETNX', KEYS[4], 'step', '0')
if redis.call('EXISTS', KEYS[3]) == 1 then
  return { 'ADOPTED', new, '' }
end
redis.call('SET', KEYS[3], ARGV[3])
return { 'CREATED', new, '' }
