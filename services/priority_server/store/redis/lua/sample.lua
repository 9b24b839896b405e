-- sample.lua: lease a batch (store/base.py docstring, "sample"): expire due leases, run the sampler's
-- branch (one file per sampler, lua/samplers/<name>.lua; Python twins in priority_server/samplers/<name>.py), record
-- the lease.
-- KEYS[1]  stats        hash   id -> "n s1 s2 pool score"
-- KEYS[2]  heap         zset   score = priority, member = store.tie_member
-- KEYS[3]  solved       zset   score = last tested step (policy version with run.retest_versions > 0)
-- KEYS[4]  unsolved     zset   score = last tested step (policy version with run.retest_versions > 0)
-- KEYS[5]  leases       hash   lease id -> lease record
-- KEYS[6]  deadlines    zset   score = lease deadline (unix s), member = lease id
-- KEYS[7]  counters     hash   step and the StoreStats counters
-- KEYS[8]  tomb:reported zset  lease id -> time reported (unix s, lease clock)
-- KEYS[9]  tomb:expired zset    lease id -> time expired
-- KEYS[10] problems     hash   id -> JSON [prompt, answer, verifier, metadata]
-- KEYS[11] policy       hash   version, uri
-- KEYS[12] requests     hash   request id -> "lease id\tmember\tgroup_size..." (the lease a sample with
--                              that id made, and each problem's group_size)
-- KEYS[13] requests:due zset   score = that lease's deadline, member = request id
-- KEYS[14] tokens       hash   id -> "completions tokens" (decayed sums: the running mean of
--                              completion tokens, written by report.lua)
-- KEYS[15] owners       hash   lease id -> JSON [worker id, request id] (renew.lua checks the holder;
--                              written only when either is set)
-- KEYS[16] stream       stream trajectory groups, consumer group run.group (read only: the pace bound)
-- ARGV[1]  now          '' (Redis TIME: the lease clock, lib.lua clock_now), or a test's injected
--                       clock reading, unix seconds (a %.17g / repr string)
-- ARGV[2]  batch_size   B >= 1
-- ARGV[3]  lease_s      the lease timeout, seconds: the deadline is now + lease_s
-- ARGV[4]  lease_id     random 128-bit hex id
-- ARGV[5]  expected_step  the step the caller computed ARGV[6] for; -1: no RNG needed
-- ARGV[6]  seed32       samplers.step_seed(seed, expected_step + 1)
-- ARGV[7]  request_id   "" or the request's id (store/base.py, "Retried requests")
-- ARGV[8]  worker_id    "" or the lease's holder, the one worker renew.lua accepts
-- ARGV[9]  run          JSON of the run's settings (RedisStore._sample): retest_rate (f*B, 0 for a
--                       sampler without retests; quota as samplers.retest_quota), interval
--                       (retest_interval, batches), expire_limit (leases expired at most, 64),
--                       tomb_ttl (seconds tombstones are kept), prior_alpha / prior_beta (alpha0 /
--                       beta0 of the statistics), retest_versions (0: the pools' scores are steps,
--                       the paper; k >= 1: policy versions, rules.pool_score: the pools' clock is the
--                       current version and a problem is due k versions after its last test;
--                       interval unused), unseen (the prior for unseen problems, scripts.sample_run:
--                       on, fit, value, base, k0; on: the heap's unseen band, score -1, is read at
--                       omega_unseen, prioreplay/unseen_prior.py); the pace bound (step 1b): pace_batches
--                       (K, 0: off), pace_batch_groups (the learner's batch until one is declared), group
--                       (the stream's consumer group), retest_fraction (f; the quota of a cut batch B')
-- ARGV[10] sampler      JSON of the sampler (samplers.SamplerSpec.lua_args): name (its branch, a
--                       file lua/samplers/<name>.lua) and its parameters (docs/SAMPLERS.md), read
--                       as S.<parameter>; probe_unseen / probe_retests (screened samplers) are
--                       applied below, after the branch
-- Returns {'PACE', step, version, uri, earliest deadline or '', now} when the pace bound leaves no room
-- (nothing changed but step 1's expiries); {'SAME', lease step, version, uri, earliest deadline, n,
--  omega_unseen, then per problem: member, source, stats, problem JSON, group_size, then lease id,
--  deadline, now} when request_id names a live lease (nothing changed); {'STEP', step} when
--  expected_step is stale (nothing changed); otherwise {'OK', step, version, uri,
--  earliest_other_deadline or '', n_taken, omega_unseen, then per problem: member, source, stats,
--  problem JSON, group_size (0: the worker's own G), then deadline, now}. omega_unseen (%.17g): the
--  priority of a problem from the heap's unseen band now; deadline and now as %.17g strings (a short
--  batch's retry hint is earliest deadline - now).
local k = { stats = KEYS[1], heap = KEYS[2], solved = KEYS[3], unsolved = KEYS[4], leases = KEYS[5],
            deadlines = KEYS[6], counters = KEYS[7], tomb_reported = KEYS[8], tomb_expired = KEYS[9],
            problems = KEYS[10], policy = KEYS[11], requests = KEYS[12], requests_due = KEYS[13],
            tokens = KEYS[14], owners = KEYS[15], stream = KEYS[16] }
local sets = { k.heap, k.solved, k.unsolved }
local now_s, now = clock_now(ARGV[1])
local deadline_s = fmt(now + tonumber(ARGV[3]))
local B = tonumber(ARGV[2])
local expected = tonumber(ARGV[5])
local request_id = ARGV[7]
local run = cjson.decode(ARGV[9])
local S = cjson.decode(ARGV[10])
local retest_rate = run.retest_rate
local interval = run.interval
local pa, pb = run.prior_alpha, run.prior_beta
local retest_versions = run.retest_versions
local n_retests = 0  -- the first n_retests of `taken` are the retests R

-- Python twin: unseen_prior.unseen_priority: omega_unseen, the priority of every problem of the heap's
-- unseen band; fitted: (K0 * omega0 + sum) / (K0 + K) over the first visits report.lua counts
local function unseen_priority()
  local U = run.unseen
  if not U.fit then return U.value end
  local c = redis.call('HMGET', k.counters, 'first_visits', 'first_visit_priority_sum')
  return (U.k0 * U.base + tonumber(c[2] or '0')) / (U.k0 + tonumber(c[1] or '0'))
end
local omega = unseen_priority()

-- 0. a retried request whose lease is live gets that lease again (read only)
if request_id ~= '' then
  local seen = redis.call('HGET', k.requests, request_id)
  local lid, sizes = nil, {}
  if seen then
    local parts = split_tabs(seen)
    lid = parts[1]
    for i = 2, #parts - 1, 2 do sizes[parts[i]] = parts[i + 1] end
  end
  local record = lid and redis.call('HGET', k.leases, lid)
  if record then
    local f = split_tabs(record)
    if tonumber(f[LEASE.deadline]) > now then
      local earliest = redis.call('ZRANGE', k.deadlines, 0, 0, 'WITHSCORES')
      local pol = redis.call('HMGET', k.policy, 'version', 'uri')
      local out = { 'SAME', f[LEASE.step], pol[1] or '0', pol[2] or '', earliest[2] or '', (#f - LEASE.first + 1) / LEASE.stride, fmt(omega) }
      for i = LEASE.first, #f, LEASE.stride do
        local id = member_id(f[i])
        out[#out + 1] = f[i]; out[#out + 1] = f[i + 1]
        out[#out + 1] = redis.call('HGET', k.stats, id); out[#out + 1] = redis.call('HGET', k.problems, id)
        out[#out + 1] = sizes[f[i]] or '0'
      end
      out[#out + 1] = lid; out[#out + 1] = f[LEASE.deadline]; out[#out + 1] = now_s
      return out
    end
  end
end

local step = tonumber(redis.call('HGET', k.counters, 'step') or '0')
if expected >= 0 and expected ~= step then
  return { 'STEP', step }
end
refuse_when_out_of_memory(k.counters)

-- step' and the RNG
local step2 = step + 1
-- the pools' clock (samplers.SampleRequest.pool_now): the step, or the policy version
local pool_now = step2
if retest_versions > 0 then
  pool_now = tonumber(redis.call('HGET', k.policy, 'version') or '0')
  interval = retest_versions
end
local quota = math.floor(retest_rate * step2) - math.floor(retest_rate * (step2 - 1))  -- samplers.retest_quota
local rng = xs_new(tonumber(ARGV[6]))
local taken = {}  -- {member, source, score}

local function take(member, source, score)
  redis.call('ZREM', sets[source], member)
  taken[#taken + 1] = { member, source, score }
end

-- merge up to `want` entries of two WITHSCORES lists: (score asc, solved first, member asc)
local function take_merged(s, u, want)
  local i, j = 1, 1
  while want > 0 and (i <= #s or j <= #u) do
    if j > #u or (i <= #s and tonumber(s[i + 1]) <= tonumber(u[j + 1])) then
      take(s[i], 2, s[i + 1]); i = i + 2
    else
      take(u[j], 3, u[j + 1]); j = j + 2
    end
    want = want - 1
  end
end

-- R: up to `quota` retests whose score <= pool_now - interval (samplers.RetestThenHeap.retests)
local function take_retests()
  if quota > 0 then
    local thr = pool_now - interval
    local s = redis.call('ZRANGEBYSCORE', k.solved, '-inf', thr, 'WITHSCORES', 'LIMIT', 0, quota)
    local u = redis.call('ZRANGEBYSCORE', k.unsolved, '-inf', thr, 'WITHSCORES', 'LIMIT', 0, quota)
    take_merged(s, u, quota)
  end
end

-- Python twin: samplers.posterior_variance, operation for operation (MoPPS, arXiv 2507.04632):
-- expected p(1 - p) under Beta(prior + w*s1, prior + w*(n - s1)), w = decay^age.
local function posterior_variance(n, s1, age)
  local w = S.posterior_decay ^ age
  local a = S.posterior_prior + w * s1
  local b = S.posterior_prior + w * (n - s1)
  local t = a + b
  return a * b / (t * (t + 1.0))
end

-- R of `posterior`: window = the 4*quota oldest due pooled problems (merged order); its first is
-- always taken, then the quota - 1 highest posterior_variance (ties: window order)
-- (samplers.PosteriorSampler.retests)
local function take_retests_posterior()
  if quota <= 0 then return end
  local thr = pool_now - interval
  local W = 4 * quota
  local s = redis.call('ZRANGEBYSCORE', k.solved, '-inf', thr, 'WITHSCORES', 'LIMIT', 0, W)
  local u = redis.call('ZRANGEBYSCORE', k.unsolved, '-inf', thr, 'WITHSCORES', 'LIMIT', 0, W)
  local win = {}
  local i, j = 1, 1
  while #win < W and (i <= #s or j <= #u) do
    if j > #u or (i <= #s and tonumber(s[i + 1]) <= tonumber(u[j + 1])) then
      win[#win + 1] = { s[i], 2, s[i + 1] }; i = i + 2
    else
      win[#win + 1] = { u[j], 3, u[j + 1] }; j = j + 2
    end
  end
  if #win == 0 then return end
  local scored = {}
  for x = 2, #win do
    local n, s1 = split_stats(redis.call('HGET', k.stats, member_id(win[x][1])))
    scored[#scored + 1] = { posterior_variance(tonumber(n), tonumber(s1), pool_now - tonumber(win[x][3])), x }
  end
  table.sort(scored, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] < b[2]
  end)
  take(win[1][1], win[1][2], win[1][3])
  for q = 1, math.min(quota - 1, #scored) do
    local e = win[scored[q][2]]
    take(e[1], e[2], e[3])
  end
end

-- F: fill from the pools regardless of score (samplers.take_from_pools)
local function take_fill()
  local want = B - #taken
  if want > 0 then
    local s = redis.call('ZRANGE', k.solved, 0, want - 1, 'WITHSCORES')
    local u = redis.call('ZRANGE', k.unsolved, 0, want - 1, 'WITHSCORES')
    take_merged(s, u, want)
  end
end

-- R, then H = take_heap(B - |R|), then F (samplers.RetestThenHeap.sample)
local function retests_then_heap(take_heap, retests)
  (retests or take_retests)()
  n_retests = #taken
  local want = B - #taken
  if want > 0 then take_heap(want) end
  take_fill()
end

-- H of `heap`: the top of the heap (samplers.HeapSampler). With the prior for unseen problems on, the
-- heap order with the unseen band (score -1) at omega: slot by slot the seen top when (score, member) >
-- (omega, the band's top member), else the band's (Python twin: MemorySamplerView._merged)
local function heap_top(want)
  if not run.unseen.on then
    local top = redis.call('ZREVRANGE', k.heap, 0, want - 1, 'WITHSCORES')
    for i = 1, #top, 2 do take(top[i], 1, top[i + 1]) end
    return
  end
  local seen = redis.call('ZREVRANGEBYSCORE', k.heap, '+inf', '(-1', 'WITHSCORES', 'LIMIT', 0, want)
  local band = redis.call('ZREVRANGEBYSCORE', k.heap, '-1', '-1', 'LIMIT', 0, want)
  local i, j = 1, 1
  while want > 0 and (i <= #seen or j <= #band) do
    local s = seen[i + 1] and tonumber(seen[i + 1])
    if i <= #seen and (j > #band or s > omega or (s == omega and member_after(seen[i], band[j]))) then
      take(seen[i], 1, seen[i + 1]); i = i + 2
    else
      take(band[j], 1, '-1'); j = j + 1
    end
    want = want - 1
  end
end

-- the running mean of completion tokens per completion of a member, or nil (MemoryStore view twin)
local function completion_tokens(member)
  local cur = redis.call('HGET', k.tokens, member_id(member))
  if not cur then return nil end
  local tn, tt = string.match(cur, '^(%S+) (%S+)$')
  tn, tt = tonumber(tn), tonumber(tt)
  if tn > 0.0 then return tt / tn end
  return nil
end

-- costs of members: their token mean, else the mean of those that have one (in order), else 1.0
-- (samplers.cost_aware.window_costs, samplers.knapsack.pick_costs)
local function member_costs(members)
  local known, sum, cnt = {}, 0.0, 0
  for x, m in ipairs(members) do
    local t = completion_tokens(m)
    if t ~= nil and t > 0.0 then known[x] = t; sum = sum + t; cnt = cnt + 1 end
  end
  local fallback = 1.0
  if cnt > 0 then fallback = sum / cnt end
  local costs = {}
  for x = 1, #members do costs[x] = known[x] or fallback end
  return costs
end

-- the sampler's branch: one entry per samplers.SAMPLERS row with a lua_branch, each added by its
-- file lua/samplers/<name>.lua (scripts.load_scripts puts them all at the line below)
local branches = {}
--@samplers
local branch = branches[S.name]
if branch == nil then
  return redis.error_reply('sample.lua has no branch ' .. tostring(S.name))  -- before any change
end

-- 1. expire due leases
expire_due(k, sets, now_s, run.expire_limit)
trim_tombstones(k, now, run.tomb_ttl)
if request_id ~= '' then  -- forget request ids whose lease deadline passed
  local done = redis.call('ZRANGEBYSCORE', k.requests_due, '-inf', now_s, 'LIMIT', 0, run.expire_limit)
  for _, rid in ipairs(done) do
    redis.call('HDEL', k.requests, rid)
    redis.call('ZREM', k.requests_due, rid)
  end
end

-- 1b. the pace bound: at most K learner batches ahead of the learner (store/pace.py, pace_room)
if run.pace_batches > 0 then
  local ahead = 0
  if redis.call('EXISTS', k.stream) == 1 then  -- undelivered = entries - pending (acknowledged ones are deleted)
    ahead = redis.call('XLEN', k.stream) - redis.call('XPENDING', k.stream, run.group)[1]
  end
  for _, rec in ipairs(redis.call('HVALS', k.leases)) do ahead = ahead + (#split_tabs(rec) - LEASE.first + 1) / LEASE.stride end
  local lb = tonumber(redis.call('HGET', k.policy, 'learner_batch') or '0')
  if lb == 0 then lb = run.pace_batch_groups end
  if lb == 0 then lb = B end
  local room = run.pace_batches * lb - ahead
  if room < 1 then
    local first = redis.call('ZRANGE', k.deadlines, 0, 0, 'WITHSCORES')
    local pol = redis.call('HMGET', k.policy, 'version', 'uri')
    return { 'PACE', step, pol[1] or '0', pol[2] or '', first[2] or '', now_s }
  end
  if room < B then  -- B' = room, and its retest quota (samplers.retest_quota, the same doubles)
    B = room
    retest_rate = B * run.retest_fraction
    quota = math.floor(retest_rate * step2) - math.floor(retest_rate * (step2 - 1))
  end
end

-- 2.-3. the sampler takes the batch (R, H, F or a uniform draw)
branch()

local earliest = redis.call('ZRANGE', k.deadlines, 0, 0, 'WITHSCORES')
local earliest_s = earliest[2] or ''
local pol = redis.call('HMGET', k.policy, 'version', 'uri')
local version, uri = pol[1] or '0', pol[2] or ''
if #taken == 0 then
  return { 'OK', step, version, uri, earliest_s, 0, fmt(omega), deadline_s, now_s }
end

-- 4. record the lease
redis.call('HSET', k.counters, 'step', step2)
local out = { 'OK', step2, version, uri, earliest_s, #taken, fmt(omega) }
local rec = { tostring(step2), deadline_s }
local sizes = {}
for x, t in ipairs(taken) do
  local member, source, score = t[1], t[2], t[3]
  local id = member_id(member)
  local st = redis.call('HGET', k.stats, id)
  local n, s1, s2 = split_stats(st)
  local gs = 0
  if (S.probe_retests and x <= n_retests) or (S.probe_unseen and source == 1 and tonumber(n) == 0) then
    gs = S.probe_size
  end
  if t[4] then gs = t[4] end  -- a group size the sampler chose (knapsack)
  redis.call('HSET', k.stats, id, n .. ' ' .. s1 .. ' ' .. s2 .. ' 4 ' .. score)
  rec[#rec + 1] = member; rec[#rec + 1] = tostring(source); rec[#rec + 1] = score
  out[#out + 1] = member; out[#out + 1] = source; out[#out + 1] = st
  out[#out + 1] = redis.call('HGET', k.problems, id)
  out[#out + 1] = gs
  sizes[#sizes + 1] = member; sizes[#sizes + 1] = tostring(gs)
end
redis.call('HSET', k.leases, ARGV[4], table.concat(rec, '\t'))
redis.call('ZADD', k.deadlines, deadline_s, ARGV[4])
if request_id ~= '' then
  redis.call('HSET', k.requests, request_id, ARGV[4] .. '\t' .. table.concat(sizes, '\t'))
  redis.call('ZADD', k.requests_due, deadline_s, request_id)
end
if ARGV[8] ~= '' or request_id ~= '' then
  redis.call('HSET', k.owners, ARGV[4], cjson.encode({ ARGV[8], request_id }))
end
out[#out + 1] = deadline_s; out[#out + 1] = now_s
return out
