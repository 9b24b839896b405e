-- lib.lua: helpers prepended to every other script of this folder at load time.
-- KEYS: none of its own.  ARGV: none of its own.
--
-- Numbers are IEEE doubles (as in Python); every float written to Redis goes through fmt()
-- ('%.17g', which round-trips exactly), never through Lua's default '%.14g' conversion.
-- Statistics value (hash `stats`, field = problem id): "n s1 s2 pool score"
--   pool: 1 heap, 2 solved, 3 unsolved, 4 leased, 5 quarantined (rules.Pool, prioreplay/rules.py);
--   score: heap priority (with run.heap_age_decay < 1 its fresh_key; -1 for an unseen problem while the prior for
--   unseen problems is on: the unseen band); solved/unsolved: last tested step (policy version with retest_versions > 0);
--   leased or quarantined: the score it returns with.
-- Lease record (hash `leases`, field = lease id): "step\tdeadline" then one
--   "\tmember\tsource\tscore" per problem (ids hold no control characters).

local TWO32 = 4294967296

-- The first write of a script that grows memory (sample, report): a denyoom command, so Redis
-- over maxmemory refuses the whole script with OOM before it changes anything (Redis lets a
-- script that has already written go on past maxmemory, so a later refusal would never come).
-- A read-only replica refuses it the same way (READONLY). Field `oom_guard` of `counters` = "1".
local function refuse_when_out_of_memory(counters)
  redis.call('HSET', counters, 'oom_guard', '1')
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- The lease clock: Redis's own (TIME), so that every server replica and process reads one clock
-- for a data set, whatever its host's clock says (store/base.py docstring, "Clarifications: Clock").
-- `arg` is the script's ARGV `now`: '' (production), or a test's injected clock reading
-- (RedisStore(clock=...), the differential tests' fake clock). Redis 7 replicates scripts by
-- their effects, so TIME may precede writes. Returns the reading as a %.17g string and a number.
local function clock_now(arg)
  if arg ~= '' then return arg, tonumber(arg) end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  return fmt(now), now
end

-- Python twin: samplers.XorShift32 (services/priority_server/samplers/base.py), Marsaglia 13, 17, 5,
-- here on LuaBitOp's signed 32-bit integers.
local function xs_new(seed)
  local x = seed % TWO32
  if x == 0 then x = 1 end
  return { x = bit.tobit(x) }
end

local function xs_next(st)
  local x = st.x
  x = bit.bxor(x, bit.lshift(x, 13))
  x = bit.bxor(x, bit.rshift(x, 17))
  x = bit.bxor(x, bit.lshift(x, 5))
  st.x = x
  if x < 0 then return x + TWO32 end
  return x
end

-- samplers.XorShift32.random: next_u32() / 2^32, in [0, 1).
local function xs_random(st)
  return xs_next(st) / 4294967296.0
end

-- Python twin: rules.priority (prioreplay/rules.py), operation for operation
-- (Fatemi 2026, arXiv 2601.02648: omega = p(1 - p)).
local function priority(n, s1, s2, pa, pb)
  local denom = n + pa + pb
  if denom <= 0.0 then return 0.25 end
  local m1 = (s1 + pa) / denom
  local m2 = (s2 + pa) / denom
  local v = m2 - m1 * m1
  -- rules.ZERO_VARIANCE_REL: a constant group's rounding residue (~1e-17) is exactly 0
  if v <= 1e-12 * m2 then return 0.0 end
  if v > 0.25 then return 0.25 end
  return v
end

-- Python twin: rules.fresh_key (prioreplay/rules.py), operation for operation: the heap score of a
-- problem reported at policy `version` with priority `prio` when the heap ages toward the prior's
-- priority `prior` by gamma_h per version (FreshPER, arXiv 2604.16918): sign(d) (ln|d| + version
-- ln(1/gamma_h) + 800), d = prio - prior, 0 when d = 0; its order is the aged priorities' order at
-- every later version, so no member is rescored when the version moves.
local function fresh_key(prio, prior, version, gh)
  local d = prio - prior
  if d == 0.0 then return 0.0 end
  local mag = math.log(math.abs(d)) + version * -math.log(gh) + 800.0
  if d > 0.0 then return mag end
  return -mag
end

-- a > b for two sorted-set members, byte by byte (Redis's own order of equal scores, and Python's str
-- order of the memory store; Lua's `>` would use the C library's collation).
local function member_after(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end

-- "n s1 s2 pool score" -> the five raw strings.
-- A problem without statistics (its `stats` field, or the hash, gone: evicted or deleted) is a namespace
-- that lost keys, not a type error: the store reads the namespace again and answers NamespaceLost.
local function split_stats(s)
  if not s then error({ err = 'NAMESPACE_CHANGED a problem has no statistics (key stats)' }) end
  return string.match(s, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
end

-- Record layouts, field -> 1-based position (their one declaration: store/redis/layouts.py; the
-- unit test tests/unit/store/test_layouts.py checks these lines against it). A layout with repeated
-- items names the first item's position (first), the item's width (stride) and each item field's
-- offset in it (each_<field>).
local OUTCOME = { member = 1, kind = 2, group_size = 3, sum_r = 4, sum_r2 = 5, forgetting = 6, breakthrough = 7, tokens = 8, evidence = 9 }
local LEASE = { step = 1, deadline = 2, first = 3, stride = 3, each_member = 0, each_source = 1, each_score = 2 }

local function split_tabs(s)
  local out = {}
  for tok in string.gmatch(s, '[^\t]+') do out[#out + 1] = tok end
  return out
end

-- The id inside a sorted-set member (store.member_id: 8 hex chars of tie-break, then the id).
local function member_id(member)
  return string.sub(member, 9)
end

-- Put a problem back into `pool` (1..3) with `score` (a string), statistics unchanged.
local function place(stats_key, sets, member, pool, score)
  local id = member_id(member)
  local n, s1, s2 = split_stats(redis.call('HGET', stats_key, id))
  redis.call('HSET', stats_key, id, n .. ' ' .. s1 .. ' ' .. s2 .. ' ' .. pool .. ' ' .. score)
  redis.call('ZADD', sets[tonumber(pool)], score, member)
end

-- Expire one lease: its problems return to (source, score), lease_expiries += 1, tombstone; its
-- holder is forgotten (k.owners: hash `owners`, lease id -> JSON [worker id, request id]).
local function expire_one(k, sets, lease_id, record, now_s)
  local f = split_tabs(record)
  for i = LEASE.first, #f, LEASE.stride do
    place(k.stats, sets, f[i + LEASE.each_member], f[i + LEASE.each_source], f[i + LEASE.each_score])
  end
  redis.call('HDEL', k.leases, lease_id)
  redis.call('HDEL', k.owners, lease_id)
  redis.call('ZREM', k.deadlines, lease_id)
  redis.call('ZADD', k.tomb_expired, now_s, lease_id)
  redis.call('HINCRBY', k.counters, 'lease_expiries', 1)
end

-- Expire up to `limit` leases with deadline <= now, oldest deadline first (ties: lease id).
local function expire_due(k, sets, now_s, limit)
  local due = redis.call('ZRANGEBYSCORE', k.deadlines, '-inf', now_s, 'LIMIT', 0, limit)
  for _, lease_id in ipairs(due) do
    expire_one(k, sets, lease_id, redis.call('HGET', k.leases, lease_id), now_s)
  end
  return #due
end

-- Drop tombstones older than ttl seconds (by the lease clock, clock_now).
local function trim_tombstones(k, now, ttl)
  local cutoff = fmt(now - ttl)
  redis.call('ZREMRANGEBYSCORE', k.tomb_reported, '-inf', '(' .. cutoff)
  redis.call('ZREMRANGEBYSCORE', k.tomb_expired, '-inf', '(' .. cutoff)
end

