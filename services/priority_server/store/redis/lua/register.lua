-- register.lua: upsert one chunk of problems (store/base.py docstring, "register").
-- KEYS[1]  stats        hash   id -> "n s1 s2 pool score"
-- KEYS[2]  heap         zset   score = priority, member = store.tie_member
-- KEYS[3]  problems     hash   id -> JSON [prompt, answer, verifier, metadata]
-- KEYS[4]  solved       zset   score = last tested step (policy version with retest_versions > 0)
-- KEYS[5]  unsolved     zset   score = last tested step (policy version with retest_versions > 0)
-- KEYS[6]  quarantine   hash   id -> the pool (1..3) a quarantined problem returns to
-- KEYS[7]  counters     hash   StoreStats counters: problems_seen counts a new warm problem with n > 0
-- ARGV[1]  initial      "n s1 s2 pool score" of a new problem: "0 0 0 1 <priority>"
-- ARGV[2]  priority     a new problem's heap score as a %.17g string (Store.registered_score: rules.priority(Stats()),
--                       or -1, the unseen band, while the prior for unseen problems is on)
-- ARGV[3]  chunk        one line per problem, "id\tmember\tJSON" joined by "\n" (ids hold no
--                       control characters and compact JSON escapes them, so the split is
--                       exact; one argument keeps the client's packing cheap). Ids are unique.
-- ARGV[4]  replace      '1': another prompt or answer replaces the registered one; '0': a chunk
--                       holding such an id is refused whole (store/base.py docstring, "register")
-- ARGV[5]  warm         one line per problem of the chunk in the warm-start file (prioreplay/warm_start.py),
--                       "id\tn s1 s2 1 priority": a NEW such problem starts with these statistics and heap
--                       score instead of ARGV[1] / ARGV[2] (Python twin: MemoryStore._register); '' for none
-- A quarantined problem registered again returns to its pool with its score (stats unchanged).
-- Returns {created, updated}, or {-1, id, ...} (every clashing id, chunk order) when refused:
-- nothing changed.
local sets = { KEYS[2], KEYS[4], KEYS[5] }
local warm = {}
for id, st in string.gmatch(ARGV[5] or '', '([^\t\n]+)\t([^\n]+)') do warm[id] = st end
local created, updated, warm_seen = 0, 0, 0
local pattern = '([^\t\n]+)\t([^\t\n]+)\t([^\n]+)'

-- Python twin: store.same_text: same prompt and answer (JSON slots 1 and 2); verifier and
-- metadata may differ.
local function same_text(old, new)
  local a, b = cjson.decode(old), cjson.decode(new)
  return a[1] == b[1] and a[2] == b[2]
end

if ARGV[4] == '0' then
  local clashes = { -1 }
  for id, _, record in string.gmatch(ARGV[3], pattern) do
    local old = redis.call('HGET', KEYS[3], id)
    if old and not same_text(old, record) then clashes[#clashes + 1] = id end
  end
  if #clashes > 1 then return clashes end
end
for id, member, record in string.gmatch(ARGV[3], pattern) do
  redis.call('HSET', KEYS[3], id, record)
  local st = warm[id]
  if redis.call('HSETNX', KEYS[1], id, st or ARGV[1]) == 1 then
    local score = ARGV[2]
    if st then
      score = string.match(st, '(%S+)$')
      if tonumber(string.match(st, '^(%S+)')) > 0 then warm_seen = warm_seen + 1 end  -- seen: n > 0 (docs/METHOD.md)
    end
    redis.call('ZADD', KEYS[2], score, member)
    created = created + 1
  else
    updated = updated + 1
    local home = redis.call('HGET', KEYS[6], id)
    if home then
      local _, _, _, _, score = split_stats(redis.call('HGET', KEYS[1], id))
      place(KEYS[1], sets, member, home, score)
      redis.call('HDEL', KEYS[6], id)
    end
  end
end
-- Python twin: MemoryStore._seen; report.lua counts the first report of a problem with n == 0
if warm_seen > 0 then redis.call('HINCRBY', KEYS[7], 'problems_seen', warm_seen) end
return { created, updated }
