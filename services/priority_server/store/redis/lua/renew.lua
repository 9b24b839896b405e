-- renew.lua: extend a live lease (store/base.py docstring, "renew").
-- KEYS[1]  stats        hash   id -> "n s1 s2 pool score"
-- KEYS[2]  heap         zset   score = priority
-- KEYS[3]  solved       zset   score = last tested step (policy version with retest_versions > 0)
-- KEYS[4]  unsolved     zset   score = last tested step (policy version with retest_versions > 0)
-- KEYS[5]  leases       hash   lease id -> lease record
-- KEYS[6]  deadlines    zset   lease id by deadline
-- KEYS[7]  counters     hash   StoreStats counters (lease_expiries)
-- KEYS[8]  tomb:reported zset  lease id -> time reported
-- KEYS[9]  tomb:expired zset    lease id -> time expired
-- KEYS[10] owners       hash   lease id -> JSON [worker id, request id] (absent: both "")
-- KEYS[11] requests     hash   request id -> "lease id\t..." (the lease a sample with that id made)
-- KEYS[12] requests:due zset   score = that lease's deadline, member = request id
-- KEYS[13] parts        set    members of this lease reported by earlier parts (report.lua)
-- ARGV[1]  now          '' (Redis TIME: the lease clock, lib.lua clock_now), or a test's injected
--                       clock reading, unix seconds
-- ARGV[2]  lease_id
-- ARGV[3]  worker_id    "" or the renewing worker; must equal the lease's holder
-- ARGV[4]  lease_s      the new lease timeout, seconds: the deadline becomes now + lease_s
-- Returns {0, reason} when the lease is not live (a due lease is expired: problems returned,
-- lease_expiries += 1); {-1, holder} when another worker holds it (nothing changed);
-- {1, deadline, problems still held} when renewed.
local k = { stats = KEYS[1], heap = KEYS[2], solved = KEYS[3], unsolved = KEYS[4], leases = KEYS[5],
            deadlines = KEYS[6], counters = KEYS[7], tomb_reported = KEYS[8], tomb_expired = KEYS[9],
            owners = KEYS[10], requests = KEYS[11], requests_due = KEYS[12], parts = KEYS[13] }
local sets = { k.heap, k.solved, k.unsolved }
local lease_id, worker = ARGV[2], ARGV[3]
local now_s, now = clock_now(ARGV[1])
local deadline = fmt(now + tonumber(ARGV[4]))

local record = redis.call('HGET', k.leases, lease_id)
if not record then
  if redis.call('ZSCORE', k.tomb_reported, lease_id) then return { 0, 'already reported' } end
  if redis.call('ZSCORE', k.tomb_expired, lease_id) then return { 0, 'expired' } end
  return { 0, 'unknown lease' }
end
-- "step\tdeadline" then the problems: only the deadline is rewritten (no split of a large lease)
local step, old_deadline, problems = string.match(record, '^([^\t]+)\t([^\t]+)(.*)$')
if tonumber(old_deadline) <= now then
  expire_one(k, sets, lease_id, record, now_s)
  return { 0, 'expired' }
end
local holder, request_id = '', ''
local owner = redis.call('HGET', k.owners, lease_id)
if owner then
  local o = cjson.decode(owner)
  holder, request_id = o[1], o[2]
end
if holder ~= worker then return { -1, holder } end

-- the new deadline: the record's second field, the deadline index, the request id's memory
redis.call('HSET', k.leases, lease_id, step .. '\t' .. deadline .. problems)
redis.call('ZADD', k.deadlines, deadline, lease_id)
if request_id ~= '' then
  local seen = redis.call('HGET', k.requests, request_id)
  if seen and split_tabs(seen)[1] == lease_id then redis.call('ZADD', k.requests_due, deadline, request_id) end
end
if redis.call('EXISTS', k.parts) == 1 then  -- as report.lua: kept a day past the deadline
  redis.call('EXPIRE', k.parts, math.max(1, math.ceil(tonumber(deadline) - now)) + 86400)
end
local _, tabs = string.gsub(problems, '\t', '')
return { 1, deadline, tabs / 3 }  -- "\tmember\tsource\tscore" per problem
