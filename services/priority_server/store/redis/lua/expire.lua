-- expire.lua: expire due leases (store/base.py docstring, "expire_leases").
-- KEYS[1]  stats        hash   id -> "n s1 s2 pool score"
-- KEYS[2]  heap         zset   score = priority
-- KEYS[3]  solved       zset   score = last tested step (policy version with retest_versions > 0)
-- KEYS[4]  unsolved     zset   score = last tested step (policy version with retest_versions > 0)
-- KEYS[5]  leases       hash   lease id -> lease record
-- KEYS[6]  deadlines    zset   lease id by deadline
-- KEYS[7]  counters     hash   StoreStats counters (lease_expiries)
-- KEYS[8]  tomb:reported zset  lease id -> time reported
-- KEYS[9]  tomb:expired zset    lease id -> time expired
-- KEYS[10] owners       hash   lease id -> JSON [worker id, request id] (dropped with the lease)
-- ARGV[1]  now          '' (Redis TIME: the lease clock, lib.lua clock_now), or a test's injected
--                       clock reading, unix seconds
-- ARGV[2]  limit        leases expired at most, oldest deadline first
-- (tombstones are trimmed by sample.lua only, as in the memory store)
-- Returns the number of leases expired.
local k = { stats = KEYS[1], heap = KEYS[2], solved = KEYS[3], unsolved = KEYS[4], leases = KEYS[5],
            deadlines = KEYS[6], counters = KEYS[7], tomb_reported = KEYS[8], tomb_expired = KEYS[9],
            owners = KEYS[10] }
local sets = { k.heap, k.solved, k.unsolved }
local now_s = clock_now(ARGV[1])
return expire_due(k, sets, now_s, tonumber(ARGV[2]))
